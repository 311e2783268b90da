package backend

import (
	"strconv"
	"time"
)

// llama-server formats of the OpenAI-compatible routes (samples llama_v1_*).

// llamaChatFormat renders /v1/chat/completions as llama-server does: the
// role once with "content":null, a finish_reason chunk, an optional usage
// chunk with "choices":[], then "data: [DONE]".
type llamaChatFormat struct{}

func (llamaChatFormat) contentType() string { return "text/event-stream" }

// tail appends the fields after "choices" of a chunk:
// `,"created":T,"id":"chatcmpl-…","model":M,"system_fingerprint":"b0-unknown","object":"chat.completion.chunk"`.
func (llamaChatFormat) tail(c *call, dst []byte) []byte {
	dst = append(dst, `,"created":`...)
	dst = strconv.AppendInt(dst, c.created, 10)
	dst = append(dst, `,"id":"chatcmpl-`...)
	dst = append(dst, c.idArr[:]...)
	dst = append(dst, `","model":`...)
	dst = append(dst, c.modelJSON...)
	return append(dst, `,"system_fingerprint":"b0-unknown","object":"chat.completion.chunk"`...)
}

func (l llamaChatFormat) begin(c *call, dst []byte) []byte {
	dst = append(dst, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}]`...)
	dst = l.tail(c, dst)
	return append(dst, "}\n\n"...)
}

func (l llamaChatFormat) chunk(c *call, dst []byte, i int) []byte {
	if c.plan.kind == kindTool {
		dst = append(dst, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"`...)
		dst = append(dst, c.toolArr[:]...)
		dst = append(dst, `","type":"function","function":{"name":"`...)
		dst = append(dst, c.plan.toolName()...)
		dst = append(dst, `","arguments":`...)
		dst = appendJSONString(dst, c.plan.toolArgsLlama())
		dst = append(dst, `}}]}}]`...)
	} else if t, ok := c.thought(i); ok {
		dst = append(dst, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"`...)
		dst = append(dst, t...)
		dst = append(dst, `"}}]`...)
	} else {
		dst = append(dst, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"`...)
		dst = append(dst, c.plan.token(i)...)
		dst = append(dst, `"}}]`...)
	}
	dst = l.tail(c, dst)
	return append(dst, "}\n\n"...)
}

func (l llamaChatFormat) end(c *call, dst []byte) []byte {
	dst = append(dst, `data: {"choices":[{"finish_reason":"`...)
	dst = append(dst, openAIFinish(c.plan.finish)...)
	dst = append(dst, `","index":0,"delta":{}}]`...)
	dst = l.tail(c, dst)
	if c.includeUsage {
		dst = append(dst, "}\n\n"...)
		dst = append(dst, `data: {"choices":[]`...)
		dst = l.tail(c, dst)
		dst = appendLlamaUsage(c, dst)
	}
	// Without include_usage llama-server puts "timings" on the finish chunk.
	dst = append(dst, `,"timings":`...)
	dst = appendCallTimings(c, dst)
	return append(dst, "}\n\ndata: [DONE]\n\n"...)
}

func (l llamaChatFormat) whole(c *call, dst []byte, pad int) []byte {
	dst = append(dst, `{"choices":[{"finish_reason":"`...)
	dst = append(dst, openAIFinish(c.plan.finish)...)
	dst = append(dst, `","index":0,"message":{"role":"assistant","content":"`...)
	if c.plan.kind == kindTool {
		dst = append(dst, `","tool_calls":[{"type":"function","function":{"name":"`...)
		dst = append(dst, c.plan.toolName()...)
		dst = append(dst, `","arguments":`...)
		dst = appendJSONString(dst, c.plan.toolArgsLlama())
		dst = append(dst, `},"id":"`...)
		dst = append(dst, c.toolArr[:]...)
		dst = append(dst, `"}]`...)
	} else {
		for i := range c.plan.n {
			dst = append(dst, c.plan.token(i)...)
		}
		dst = appendPadding(dst, pad)
		dst = append(dst, '"')
		if c.plan.think > 0 {
			dst = append(dst, `,"reasoning_content":"`...)
			dst = c.appendThoughts(dst)
			dst = append(dst, '"')
		}
	}
	dst = append(dst, `}}],"created":`...)
	dst = strconv.AppendInt(dst, c.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"system_fingerprint":"b0-unknown","object":"chat.completion"`...)
	dst = appendLlamaUsage(c, dst)
	dst = append(dst, `,"id":"chatcmpl-`...)
	dst = append(dst, c.idArr[:]...)
	dst = append(dst, `","timings":`...)
	dst = appendCallTimings(c, dst)
	return append(dst, '}')
}

func openAIFinish(f finish) string {
	switch f {
	case finishLength:
		return "length"
	case finishTool:
		return "tool_calls"
	}
	return "stop"
}

// appendLlamaUsage appends `,"usage":{…}` (tokens); cached_tokens counts the
// prompt tokens served from the prefix cache, as llama-server reports them.
func appendLlamaUsage(c *call, dst []byte) []byte {
	dst = append(dst, `,"usage":{"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.plan.completion), 10)
	dst = append(dst, `,"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.prompt), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.prompt+c.plan.completion), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.cached), 10)
	return append(dst, `}}`...)
}

// appendCallTimings appends llama-server's timings measured on this request.
func appendCallTimings(c *call, dst []byte) []byte {
	now := c.clock()
	first := c.firstTok
	if first.IsZero() {
		first = now
	}
	return appendTimings(dst, c.cached, c.prompt-c.cached, c.plan.completion, first.Sub(c.decoded), now.Sub(first))
}

// renderV1Models renders llama-server's /v1/models for the served models
// ("created" is now, as llama-server reports).
func (b *Backend) renderV1Models(dst []byte, now time.Time) []byte {
	dst = append(dst, `{"models":[`...)
	for i, m := range b.models {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"name":"`+m.name+`","model":"`+m.name+`","modified_at":"","size":"","digest":"","type":"model","description":"","tags":[""],"capabilities":["completion"],"parameters":"","details":{"parent_model":"","format":"gguf","family":"","families":[""],"parameter_size":"","quantization_level":""}}`...)
	}
	dst = append(dst, `],"object":"list","data":[`...)
	for i, m := range b.models {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":"`+m.name+`","aliases":["`+m.name+`"],"tags":[],"object":"model","created":`...)
		dst = strconv.AppendInt(dst, now.Unix(), 10)
		dst = append(dst, `,"owned_by":"llamacpp","meta":{"vocab_type":1,"n_vocab":475,"n_ctx":2048,"n_ctx_train":4096,"n_embd":128,"n_params":449920,"size":1799680}}`...)
	}
	return append(dst, `]}`...)
}

// llamaCompletionFormat renders /v1/completions as llama-server (commit
// e95dae18) does (captures llama_v1_completions_*): one text_completion
// chunk per token, an empty-text chunk for the end-of-sequence token when
// the answer ended by itself, then a finish_reason chunk carrying usage and
// timings whether or not stream_options asked for usage, then
// "data: [DONE]".
type llamaCompletionFormat struct{}

func (llamaCompletionFormat) contentType() string { return "text/event-stream" }

func (llamaCompletionFormat) begin(_ *call, dst []byte) []byte { return dst }

// tail appends the fields after "choices":
// `,"created":T,"model":M,"system_fingerprint":"b0-unknown","object":"text_completion"`.
func (llamaCompletionFormat) tail(c *call, dst []byte) []byte {
	dst = append(dst, `,"created":`...)
	dst = strconv.AppendInt(dst, c.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, c.modelJSON...)
	return append(dst, `,"system_fingerprint":"b0-unknown","object":"text_completion"`...)
}

func (llamaCompletionFormat) id(c *call, dst []byte) []byte {
	dst = append(dst, `,"id":"chatcmpl-`...)
	dst = append(dst, c.idArr[:]...)
	return append(dst, '"')
}

func (l llamaCompletionFormat) textChunk(c *call, dst []byte, text string) []byte {
	dst = append(dst, `data: {"choices":[{"text":"`...)
	dst = append(dst, text...)
	dst = append(dst, `","index":0,"logprobs":null,"finish_reason":null}]`...)
	dst = l.tail(c, dst)
	dst = l.id(c, dst)
	return append(dst, "}\n\n"...)
}

func (l llamaCompletionFormat) chunk(c *call, dst []byte, i int) []byte {
	return l.textChunk(c, dst, c.plan.token(i))
}

func (l llamaCompletionFormat) end(c *call, dst []byte) []byte {
	if c.plan.finish != finishLength {
		dst = l.textChunk(c, dst, "") // the end-of-sequence token
	}
	dst = append(dst, `data: {"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"`...)
	dst = append(dst, openAIFinish(c.plan.finish)...)
	dst = append(dst, `"}]`...)
	dst = l.tail(c, dst)
	dst = appendLlamaUsage(c, dst)
	dst = l.id(c, dst)
	dst = append(dst, `,"timings":`...)
	dst = appendCallTimings(c, dst)
	return append(dst, "}\n\ndata: [DONE]\n\n"...)
}

func (l llamaCompletionFormat) whole(c *call, dst []byte, pad int) []byte {
	dst = append(dst, `{"choices":[{"text":"`...)
	for i := range c.plan.n {
		dst = append(dst, c.plan.token(i)...)
	}
	dst = appendPadding(dst, pad)
	dst = append(dst, `","index":0,"logprobs":null,"finish_reason":"`...)
	dst = append(dst, openAIFinish(c.plan.finish)...)
	dst = append(dst, `"}]`...)
	dst = l.tail(c, dst)
	dst = appendLlamaUsage(c, dst)
	dst = l.id(c, dst)
	dst = append(dst, `,"timings":`...)
	dst = appendCallTimings(c, dst)
	return append(dst, '}')
}
