package openai

import (
	"strconv"
	"strings"

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
// finish_reason is "tool_calls" whenever the message carries tool calls,
// else the run's "length" or "content_filter" ("stop" for anything else).
//
// When the request declared tools, a streamed run's content from its first
// '{' or '`' on is held until COMPLETE: only then is it known whether the
// run used the text tool-call fallback (SPEC E9), whose JSON must become
// tool_calls and never reach the client as content. Text before that point
// streams as usual. The zero value is not usable; call Init. Not safe for
// concurrent use; one per request.
type Chat struct {
	model        string // the client's requested model name
	id           string // "chatcmpl-…"
	created      int64  // Unix seconds
	stream       bool
	includeUsage bool
	tools        []string // declared tool names (text tool-call fallback)
	newID        func() string

	roleSent bool
	streamed bool // any content delta was sent
	holding  bool // content from the first '{' or '`' on is held (tools)
	held     []byte
	text     []byte // non-stream: accumulated deltas
	prefix   []byte // `data: {"id":…,"choices":[`
}

// ChatOptions describe one chat response: Model is the client's model name
// (echoed), ID the response id ("chatcmpl-…"), Created its Unix time in
// seconds, Stream and IncludeUsage the request's stream and
// stream_options.include_usage, Tools the declared tool names (from
// ChatInput) and NewID the source of fresh "call_<id>" suffixes.
type ChatOptions struct {
	Model        string
	ID           string
	Created      int64
	Stream       bool
	IncludeUsage bool
	Tools        []string
	NewID        func() string
}

// Init makes c ready for one response described by o.
func (c *Chat) Init(o ChatOptions) {
	*c = Chat{model: o.Model, id: o.ID, created: o.Created, stream: o.Stream,
		includeUsage: o.IncludeUsage && o.Stream, tools: o.Tools, newID: o.NewID}
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
		return c.delta(dst, ev.Delta), false, nil
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

func (c *Chat) delta(dst []byte, d string) []byte {
	if d == "" {
		return dst
	}
	if !c.stream {
		c.text = append(c.text, d...)
		return dst
	}
	if c.holding {
		c.held = append(c.held, d...)
		return dst
	}
	if len(c.tools) > 0 {
		// A text tool call (SPEC E9 fallback) is only known at COMPLETE;
		// hold what could be one so it is never sent as content first.
		if k := strings.IndexAny(d, "{`"); k >= 0 {
			c.holding = true
			c.held = append(c.held, d[k:]...)
			d = d[:k]
			if d == "" {
				return dst
			}
		}
	}
	dst = c.appendRole(dst)
	dst = c.appendContent(dst, d)
	c.streamed = true
	return dst
}

func (c *Chat) complete(dst []byte, ev *iop.RunEvent) ([]byte, *surface.Error) {
	var pending string
	switch {
	case !c.stream:
		pending = ev.Content
		if pending == "" {
			pending = string(c.text)
		}
	case c.holding:
		pending = string(c.held)
	case !c.streamed:
		pending = ev.Content
	}
	calls, pending, err := surface.CompleteToolCalls(ev.Metadata, pending, c.tools, c.newID)
	if err != nil {
		return dst, surface.BadGateway("provider_error", "provider returned malformed tool calls")
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
	b = append(b, `},"logprobs":null,"finish_reason":`...)
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
	b = append(b, `},"logprobs":null,"finish_reason":null}`...)
	return c.endChunk(b)
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
