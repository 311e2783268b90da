package anthropic

import (
	"bytes"
	"encoding/json"
	"strconv"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// Messages turns the RunEvents of one normalized run into exactly what the
// Anthropic Messages API returns (Anthropic API reference, "Messages" and
// "Streaming Messages"):
//
//   - non-stream: one message object {id, type, role, model, content:
//     [text and tool_use blocks], stop_reason, stop_sequence, usage};
//   - stream: `event: <type>` + `data: <json>` SSE events: message_start
//     (usage 0/0: the run reports its token counts only at the end), for
//     each text block content_block_start, content_block_delta
//     (text_delta)…, content_block_stop, for each tool call
//     content_block_start (tool_use, input {}), one content_block_delta
//     (input_json_delta with the whole arguments), content_block_stop,
//     then message_delta (stop_reason, stop_sequence, usage with
//     input_tokens and output_tokens) and message_stop.
//
// The model's reasoning (RunEvent.reasoning_delta, COMPLETE's reasoning)
// comes first as a thinking block (Anthropic API reference, "Extended
// thinking"): streamed as content_block_start {"type":"thinking",
// "thinking":"","signature":""}, thinking_delta…, one signature_delta,
// content_block_stop; in a non-stream message as {"type":"thinking",
// "thinking","signature"}. The signature is surface.EncodeReasoning of the
// text (a carrier, not a proof). With Options.OmitThinking
// (thinking.display "omitted") the thinking text is "" and only the
// signature carries it.
//
// message_start goes out with the first text or at COMPLETE, so a failure
// before any output is still an HTTP error. stop_reason is "tool_use"
// whenever the message carries tool calls, "max_tokens" on the token limit,
// else "end_turn" ("stop_sequence" is never reported: Ollama's done_reason
// does not tell a stop sequence from the end of the turn). The zero value
// is not usable; call Init. Not safe for concurrent use; one per request.
type Messages struct {
	o        Options
	text     surface.Text
	started  bool   // message_start sent
	open     bool   // a text block is open
	thinking bool   // a thinking block is open
	nblocks  int    // content blocks started
	reason   []byte // the reasoning so far
}

// Options describe one Messages response: Model is the client's model name
// (echoed), ID the message id ("msg_…"), Stream the request's stream,
// Tools and MaxToolCalls from Input, Hold whether text that may be a text
// tool call is held (see surface.Text) and NewID the source of fresh tool
// call id suffixes.
type Options struct {
	Model        string
	ID           string
	Stream       bool
	Tools        []string
	MaxToolCalls int
	Hold         bool
	NewID        func() string
	// OmitThinking: thinking blocks carry "" and the text only in their
	// signature (Params.OmitThinking).
	OmitThinking bool
}

// Init makes m ready for one response described by o.
func (m *Messages) Init(o Options) {
	*m = Messages{o: o}
	m.text.Init(o.Stream, o.Hold && len(o.Tools) > 0)
}

// Event implements surface.Encoder.
func (m *Messages) Event(dst []byte, ev *iop.RunEvent) ([]byte, bool, *surface.Error) {
	switch ev.Type {
	case iop.RunEventType_RUN_EVENT_DELTA:
		if ev.ReasoningDelta != "" {
			var err *surface.Error
			if dst, err = m.appendThinking(dst, ev.ReasoningDelta); err != nil {
				return dst, true, err
			}
		}
		if d := m.text.Delta(ev.Delta); d != "" {
			dst = m.appendText(dst, d)
		}
		return dst, false, nil
	case iop.RunEventType_RUN_EVENT_COMPLETE:
		out, err := m.complete(dst, ev)
		return out, true, err
	default:
		return dst, false, nil // START; unknown kinds from a newer node (SPEC W5)
	}
}

// AppendError implements surface.Encoder: `event: error` with Anthropic's
// error object.
func (m *Messages) AppendError(dst []byte, e *surface.Error) []byte {
	dst = append(dst, "event: error\ndata: "...)
	dst = surface.AppendAnthropicError(dst, e)
	return append(dst, '\n', '\n')
}

func (m *Messages) complete(dst []byte, ev *iop.RunEvent) ([]byte, *surface.Error) {
	rest := m.text.Rest(ev.Content)
	calls, rest, err := surface.CompleteToolCalls(ev.Metadata, rest, m.o.Tools, m.o.NewID)
	if err == nil {
		err = checkInputs(calls)
	}
	if err != nil {
		return dst, surface.BadGateway("provider_error", "provider returned malformed tool calls")
	}
	if m.o.MaxToolCalls > 0 && len(calls) > m.o.MaxToolCalls {
		calls = calls[:m.o.MaxToolCalls]
	}
	stop := "end_turn"
	switch {
	case len(calls) > 0:
		stop = "tool_use"
	case ev.FinishReason == "length":
		stop = "max_tokens"
	}
	if len(m.reason) == 0 && ev.Reasoning != "" {
		var err *surface.Error
		if dst, err = m.appendThinking(dst, ev.Reasoning); err != nil {
			return dst, err
		}
	}
	if !m.o.Stream {
		return m.appendMessage(dst, rest, calls, stop, ev.Usage), nil
	}
	if rest != "" {
		dst = m.appendText(dst, rest)
	}
	dst = m.start(dst)
	dst = m.closeThinking(dst)
	dst = m.closeText(dst)
	for i := range calls {
		dst = m.appendToolUse(dst, &calls[i])
	}
	dst = append(dst, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"...)
	dst = surface.AppendString(dst, stop)
	dst = append(dst, `,"stop_sequence":null},"usage":`...)
	dst = appendUsage(dst, ev.Usage)
	dst = append(dst, "}\n\n"...)
	return append(dst, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...), nil
}

// checkInputs verifies that every call's arguments are a JSON object: a
// tool_use input must be one.
func checkInputs(calls []surface.ToolCall) error {
	for _, c := range calls {
		a := bytes.TrimSpace([]byte(c.Arguments))
		if len(a) == 0 || a[0] != '{' || !json.Valid(a) {
			return surface.ErrBadToolCalls
		}
	}
	return nil
}

// start appends message_start once.
func (m *Messages) start(dst []byte) []byte {
	if m.started {
		return dst
	}
	m.started = true
	dst = append(dst, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":"...)
	dst = surface.AppendString(dst, m.o.ID)
	dst = append(dst, `,"type":"message","role":"assistant","model":`...)
	dst = surface.AppendString(dst, m.o.Model)
	return append(dst, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`+"\n\n"...)
}

// appendThinking takes the next piece of reasoning: for a stream a
// thinking_delta (opening the thinking block first), else it is kept for
// the message. More than surface.MaxReasoningBytes is a 502.
func (m *Messages) appendThinking(dst []byte, s string) ([]byte, *surface.Error) {
	if len(m.reason)+len(s) > surface.MaxReasoningBytes {
		return dst, surface.BadGateway("provider_error", "the provider's reasoning exceeded "+strconv.Itoa(surface.MaxReasoningBytes)+" bytes")
	}
	m.reason = append(m.reason, s...)
	if !m.o.Stream || m.open {
		return dst, nil // reasoning after the text has started: kept for the signature only
	}
	dst = m.start(dst)
	if !m.thinking {
		m.thinking = true
		dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
		dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
		dst = append(dst, `,"content_block":{"type":"thinking","thinking":"","signature":""}}`+"\n\n"...)
	}
	if m.o.OmitThinking {
		return dst, nil
	}
	dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
	dst = append(dst, `,"delta":{"type":"thinking_delta","thinking":`...)
	dst = surface.AppendString(dst, s)
	return append(dst, "}}\n\n"...), nil
}

// closeThinking ends an open thinking block with its signature.
func (m *Messages) closeThinking(dst []byte) []byte {
	if !m.thinking {
		return dst
	}
	m.thinking = false
	dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
	dst = append(dst, `,"delta":{"type":"signature_delta","signature":`...)
	dst = surface.AppendString(dst, surface.EncodeReasoning(string(m.reason)))
	dst = append(dst, "}}\n\n"...)
	return m.appendBlockStop(dst)
}

// appendText appends a text_delta, opening a text block first (and
// closing the thinking block).
func (m *Messages) appendText(dst []byte, s string) []byte {
	dst = m.start(dst)
	dst = m.closeThinking(dst)
	if !m.open {
		m.open = true
		dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
		dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
		dst = append(dst, `,"content_block":{"type":"text","text":""}}`+"\n\n"...)
	}
	dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
	dst = append(dst, `,"delta":{"type":"text_delta","text":`...)
	dst = surface.AppendString(dst, s)
	return append(dst, "}}\n\n"...)
}

func (m *Messages) closeText(dst []byte) []byte {
	if !m.open {
		return dst
	}
	m.open = false
	dst = m.appendBlockStop(dst)
	return dst
}

func (m *Messages) appendBlockStop(dst []byte) []byte {
	dst = append(dst, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
	m.nblocks++
	return append(dst, "}\n\n"...)
}

func (m *Messages) appendToolUse(dst []byte, c *surface.ToolCall) []byte {
	dst = m.closeThinking(dst)
	dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
	dst = append(dst, `,"content_block":{"type":"tool_use","id":`...)
	dst = surface.AppendString(dst, c.ID)
	dst = append(dst, `,"name":`...)
	dst = surface.AppendString(dst, c.Name)
	dst = append(dst, `,"input":{}}}`+"\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(m.nblocks), 10)
	dst = append(dst, `,"delta":{"type":"input_json_delta","partial_json":`...)
	dst = surface.AppendString(dst, c.Arguments)
	dst = append(dst, "}}\n\n"...)
	return m.appendBlockStop(dst)
}

// appendMessage appends the non-stream message object.
func (m *Messages) appendMessage(b []byte, text string, calls []surface.ToolCall, stop string, u *iop.Usage) []byte {
	b = append(b, `{"id":`...)
	b = surface.AppendString(b, m.o.ID)
	b = append(b, `,"type":"message","role":"assistant","model":`...)
	b = surface.AppendString(b, m.o.Model)
	b = append(b, `,"content":[`...)
	n := 0
	if len(m.reason) > 0 {
		b = append(b, `{"type":"thinking","thinking":`...)
		if m.o.OmitThinking {
			b = append(b, `""`...)
		} else {
			b = surface.AppendString(b, string(m.reason))
		}
		b = append(b, `,"signature":`...)
		b = surface.AppendString(b, surface.EncodeReasoning(string(m.reason)))
		b = append(b, '}')
		n++
	}
	if text != "" {
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"type":"text","text":`...)
		b = surface.AppendString(b, text)
		b = append(b, '}')
		n++
	}
	for i := range calls {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, `{"type":"tool_use","id":`...)
		b = surface.AppendString(b, calls[i].ID)
		b = append(b, `,"name":`...)
		b = surface.AppendString(b, calls[i].Name)
		b = append(b, `,"input":`...)
		b = append(b, bytes.TrimSpace([]byte(calls[i].Arguments))...)
		b = append(b, '}')
	}
	b = append(b, `],"stop_reason":`...)
	b = surface.AppendString(b, stop)
	b = append(b, `,"stop_sequence":null,"usage":`...)
	b = appendUsage(b, u)
	return append(b, '}')
}

// appendUsage appends {"input_tokens","output_tokens"}; a missing usage is
// zeros.
func appendUsage(b []byte, u *iop.Usage) []byte {
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, u.GetPromptTokens(), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, u.GetCompletionTokens(), 10)
	return append(b, '}')
}

var _ surface.Encoder = (*Messages)(nil)
