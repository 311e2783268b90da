package openai

import (
	"math"
	"strconv"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// Chat turns the RunEvents of one normalized run into exactly what the
// OpenAI chat completions API returns (SPEC T5; OpenAI API reference, "The
// chat completion object" and "The chat completion chunk object"):
//
//   - non-stream: one chat.completion with choices[0].message {role,
//     content, tool_calls}, finish_reason and usage;
//   - stream: chat.completion.chunk events, each `data: <json>\n\n`: the
//     role in the first delta, content deltas, tool-call deltas (index, id,
//     type, function name, then the arguments), a chunk with
//     finish_reason, then — with stream_options.include_usage — one chunk
//     with "choices": [] and the usage (every earlier chunk then carries
//     "usage": null), then `data: [DONE]`.
//
// The model's reasoning (RunEvent.reasoning_delta, COMPLETE's reasoning)
// is "reasoning_content" on the message and on stream deltas ({"delta":
// {"reasoning_content": …}}), before the content: the field llama-server
// (common/chat.cpp and tools/server/server-chat.cpp at e95dae18), vLLM and
// DeepSeek use, so one client reads the same field on both paths (Ollama's
// own /v1 calls it "reasoning"; the Edge reads both back as history).
//
// finish_reason is "tool_calls" whenever the message carries tool calls,
// else the run's "length" or "content_filter" ("stop" for anything else).
//
// When the request declared tools, a streamed run's content from its first
// '{' or '`' on is held until COMPLETE: only then is it known whether the
// run used the text tool-call fallback (SPEC E9), whose JSON must become
// tool_calls and never reach the client as content. Text before that point
// streams as usual. That holding is on only with ChatOptions.Hold.
//
// With ChatOptions.Logprobs every content chunk (and the non-stream choice)
// carries "logprobs": {"content": [...], "refusal": null} from the events'
// token log probabilities; otherwise "logprobs" is null. With MaxToolCalls
// 1 (parallel_tool_calls false) only the first tool call is returned.
//
// The zero value is not usable; call Init. Not safe for concurrent use; one
// per request.
type Chat struct {
	model        string // the client's requested model name
	id           string // "chatcmpl-…"
	created      int64  // Unix seconds
	stream       bool
	includeUsage bool
	logprobs     bool
	maxCalls     int      // 0 = any number of tool calls
	tools        []string // declared tool names (text tool-call fallback)
	newID        func() string

	roleSent bool
	text     surface.Text
	reason   []byte              // the reasoning so far
	lp       []*iop.TokenLogprob // logprobs not sent yet
	prefix   []byte              // `data: {"id":…,"choices":[`
}

// ChatOptions describe one chat response: Model is the client's model name
// (echoed), ID the response id ("chatcmpl-…"), Created its Unix time in
// seconds, Stream and IncludeUsage the request's stream and
// stream_options.include_usage, Tools the declared tool names (from
// ChatInput), Hold whether text that may be a text tool call is held (see
// Chat), Logprobs the request's logprobs, MaxToolCalls the most tool calls
// returned (0 = any) and NewID the source of fresh "call_<id>" suffixes.
type ChatOptions struct {
	Model        string
	ID           string
	Created      int64
	Stream       bool
	IncludeUsage bool
	Tools        []string
	Hold         bool
	Logprobs     bool
	MaxToolCalls int
	NewID        func() string
}

// Init makes c ready for one response described by o.
func (c *Chat) Init(o ChatOptions) {
	*c = Chat{model: o.Model, id: o.ID, created: o.Created, stream: o.Stream,
		includeUsage: o.IncludeUsage && o.Stream, logprobs: o.Logprobs, maxCalls: o.MaxToolCalls,
		tools: o.Tools, newID: o.NewID}
	c.text.Init(o.Stream, o.Hold && len(o.Tools) > 0)
	if o.Stream {
		// The chunk prefix, sized for ids and names that need no escaping.
		p := make([]byte, 0, 104+len(o.ID)+len(o.Model))
		p = append(p, `data: {"id":`...)
		p = surface.AppendString(p, o.ID)
		p = append(p, `,"object":"chat.completion.chunk","created":`...)
		p = strconv.AppendInt(p, o.Created, 10)
		p = append(p, `,"model":`...)
		p = surface.AppendString(p, o.Model)
		p = append(p, `,"choices":[`...)
		c.prefix = p
	}
}

// Event implements surface.Encoder.
func (c *Chat) Event(dst []byte, ev *iop.RunEvent) ([]byte, bool, *surface.Error) {
	switch ev.Type {
	case iop.RunEventType_RUN_EVENT_DELTA:
		if ev.ReasoningDelta != "" {
			var err *surface.Error
			if dst, err = c.reasoning(dst, ev.ReasoningDelta); err != nil {
				return dst, true, err
			}
		}
		return c.delta(dst, ev), false, nil
	case iop.RunEventType_RUN_EVENT_COMPLETE:
		out, err := c.complete(dst, ev)
		return out, true, err
	default:
		return dst, false, nil // START; unknown kinds from a newer node (SPEC W5)
	}
}

// AppendError implements surface.Encoder: `data: {"error":{...}}`.
func (c *Chat) AppendError(dst []byte, e *surface.Error) []byte {
	dst = append(dst, "data: "...)
	dst = surface.AppendOpenAIError(dst, e)
	return append(dst, '\n', '\n')
}

// reasoning takes the next piece of reasoning: a reasoning_content chunk
// for a stream, kept for the message otherwise. More than
// surface.MaxReasoningBytes is a 502.
func (c *Chat) reasoning(dst []byte, s string) ([]byte, *surface.Error) {
	if len(c.reason)+len(s) > surface.MaxReasoningBytes {
		return dst, surface.BadGateway("provider_error", "the provider's reasoning exceeded "+strconv.Itoa(surface.MaxReasoningBytes)+" bytes")
	}
	c.reason = append(c.reason, s...)
	if !c.stream {
		return dst, nil
	}
	dst = c.appendRole(dst)
	dst = append(dst, c.prefix...)
	dst = append(dst, `{"index":0,"delta":{"reasoning_content":`...)
	dst = surface.AppendString(dst, s)
	dst = append(dst, `},"logprobs":null,"finish_reason":null}`...)
	return c.endChunk(dst), nil
}

func (c *Chat) delta(dst []byte, ev *iop.RunEvent) []byte {
	if c.logprobs {
		c.lp = append(c.lp, ev.Logprobs...)
	}
	d := c.text.Delta(ev.Delta)
	if d == "" {
		return dst
	}
	dst = c.appendRole(dst)
	return c.appendContent(dst, d)
}

func (c *Chat) complete(dst []byte, ev *iop.RunEvent) ([]byte, *surface.Error) {
	if c.logprobs {
		c.lp = append(c.lp, ev.Logprobs...)
	}
	if len(c.reason) == 0 && ev.Reasoning != "" {
		var err *surface.Error
		if dst, err = c.reasoning(dst, ev.Reasoning); err != nil {
			return dst, err
		}
	}
	pending := c.text.Rest(ev.Content)
	calls, pending, err := surface.CompleteToolCalls(ev.Metadata, pending, c.tools, c.newID)
	if err != nil {
		return dst, surface.BadGateway("provider_error", "provider returned malformed tool calls")
	}
	if c.maxCalls > 0 && len(calls) > c.maxCalls {
		calls = calls[:c.maxCalls]
	}
	finish := ev.FinishReason
	switch {
	case len(calls) > 0:
		finish = "tool_calls"
	case finish == "length", finish == "content_filter":
	default:
		finish = "stop"
	}
	if c.stream {
		return c.finishStream(dst, pending, calls, finish, ev.Usage), nil
	}
	return c.finishJSON(dst, pending, calls, finish, ev.Usage), nil
}

func (c *Chat) finishStream(b []byte, pending string, calls []surface.ToolCall, finish string, u *iop.Usage) []byte {
	b = c.appendRole(b)
	if pending != "" {
		b = c.appendContent(b, pending)
	}
	for i := range calls {
		b = c.appendToolCall(b, i, &calls[i])
	}
	b = append(b, c.prefix...)
	b = append(b, `{"index":0,"delta":{},"logprobs":null,"finish_reason":`...)
	b = surface.AppendString(b, finish)
	b = append(b, '}')
	b = c.endChunk(b)
	if c.includeUsage {
		b = append(b, c.prefix...)
		b = append(b, `],"usage":`...)
		b = AppendUsage(b, u)
		b = append(b, "}\n\n"...)
	}
	return append(b, "data: [DONE]\n\n"...)
}

func (c *Chat) finishJSON(b []byte, text string, calls []surface.ToolCall, finish string, u *iop.Usage) []byte {
	b = append(b, `{"id":`...)
	b = surface.AppendString(b, c.id)
	b = append(b, `,"object":"chat.completion","created":`...)
	b = strconv.AppendInt(b, c.created, 10)
	b = append(b, `,"model":`...)
	b = surface.AppendString(b, c.model)
	b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	if text == "" && len(calls) > 0 {
		b = append(b, "null"...)
	} else {
		b = surface.AppendString(b, text)
	}
	if len(c.reason) > 0 {
		b = append(b, `,"reasoning_content":`...)
		b = surface.AppendString(b, string(c.reason))
	}
	if len(calls) > 0 {
		b = append(b, `,"tool_calls":[`...)
		for i := range calls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = surface.AppendString(b, calls[i].ID)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = surface.AppendString(b, calls[i].Name)
			b = append(b, `,"arguments":`...)
			b = surface.AppendString(b, calls[i].Arguments)
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	b = append(b, `},"logprobs":`...)
	b = c.appendLogprobs(b)
	b = append(b, `,"finish_reason":`...)
	b = surface.AppendString(b, finish)
	b = append(b, `}],"usage":`...)
	b = AppendUsage(b, u)
	return append(b, '}')
}

func (c *Chat) endChunk(b []byte) []byte {
	b = append(b, ']')
	if c.includeUsage {
		b = append(b, `,"usage":null`...)
	}
	return append(b, "}\n\n"...)
}

func (c *Chat) appendRole(b []byte) []byte {
	if c.roleSent {
		return b
	}
	c.roleSent = true
	b = append(b, c.prefix...)
	b = append(b, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`...)
	return c.endChunk(b)
}

func (c *Chat) appendContent(b []byte, s string) []byte {
	b = append(b, c.prefix...)
	b = append(b, `{"index":0,"delta":{"content":`...)
	b = surface.AppendString(b, s)
	b = append(b, `},"logprobs":`...)
	b = c.appendLogprobs(b)
	b = append(b, `,"finish_reason":null}`...)
	return c.endChunk(b)
}

// appendLogprobs appends the choice's logprobs: null without the request's
// logprobs, else {"content":[…],"refusal":null} with the log probabilities
// not sent yet (OpenAI API reference, "The chat completion object").
func (c *Chat) appendLogprobs(b []byte) []byte {
	if !c.logprobs {
		return append(b, "null"...)
	}
	b = append(b, `{"content":`...)
	b = AppendTokenLogprobs(b, c.lp, true)
	c.lp = c.lp[:0]
	return append(b, `,"refusal":null}`...)
}

// AppendTokenLogprobs appends lps as OpenAI's array of {"token","logprob",
// "bytes","top_logprobs"} (top only with top; "bytes" from the token's
// bytes, else its text's).
func AppendTokenLogprobs(b []byte, lps []*iop.TokenLogprob, top bool) []byte {
	b = append(b, '[')
	for i, lp := range lps {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"token":`...)
		b = surface.AppendString(b, lp.Token)
		b = append(b, `,"logprob":`...)
		b = appendLogprob(b, lp.Logprob)
		b = append(b, `,"bytes":[`...)
		raw := lp.Bytes
		if raw == nil {
			raw = []byte(lp.Token)
		}
		for j, x := range raw {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(x), 10)
		}
		b = append(b, ']')
		if top {
			b = append(b, `,"top_logprobs":`...)
			b = AppendTokenLogprobs(b, lp.TopLogprobs, false)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendToolCall appends two chunks for call i: its index, id, type and
// function name with empty arguments, then the arguments fragment.
func (c *Chat) appendToolCall(b []byte, i int, tc *surface.ToolCall) []byte {
	b = append(b, c.prefix...)
	b = append(b, `{"index":0,"delta":{"tool_calls":[{"index":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `,"id":`...)
	b = surface.AppendString(b, tc.ID)
	b = append(b, `,"type":"function","function":{"name":`...)
	b = surface.AppendString(b, tc.Name)
	b = append(b, `,"arguments":""}}]},"logprobs":null,"finish_reason":null}`...)
	b = c.endChunk(b)
	b = append(b, c.prefix...)
	b = append(b, `{"index":0,"delta":{"tool_calls":[{"index":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `,"function":{"arguments":`...)
	b = surface.AppendString(b, tc.Arguments)
	b = append(b, `}}]},"logprobs":null,"finish_reason":null}`...)
	return c.endChunk(b)
}

// AppendUsage appends OpenAI's usage object {"prompt_tokens",
// "completion_tokens","total_tokens"} (tokens); a missing usage is all
// zeros, a missing total is the sum.
func AppendUsage(b []byte, u *iop.Usage) []byte {
	var p, cpl, t int64
	if u != nil {
		p, cpl, t = u.PromptTokens, u.CompletionTokens, u.TotalTokens
	}
	if t == 0 {
		t = p + cpl
	}
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, p, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, cpl, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, t, 10)
	return append(b, '}')
}

var _ surface.Encoder = (*Chat)(nil)

// appendLogprob appends a log probability; one JSON cannot hold (-Inf,
// NaN) is written as OpenAI's floor for "practically impossible", -9999.
func appendLogprob(b []byte, v float64) []byte {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		v = -9999
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}
