package responses

import (
	"bytes"
	"encoding/json"
	"strconv"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// Encoder turns the RunEvents of one normalized run into exactly what the
// OpenAI Responses API returns (OpenAI API reference, "The response
// object" and "Streaming events"):
//
//   - non-stream: one response object: status "completed" (or
//     "incomplete" with incomplete_details.reason "max_output_tokens" on the
//     token limit), output [a message item with one output_text part, then
//     one function_call item per tool call], usage, and the request's
//     echoed settings;
//   - stream: `event: <type>` + `data: <json>` SSE events, each with its
//     sequence_number: response.created and response.in_progress, for the
//     text response.output_item.added, response.content_part.added,
//     response.output_text.delta…, response.output_text.done,
//     response.content_part.done, response.output_item.done, for each
//     tool call response.output_item.added,
//     response.function_call_arguments.delta (the whole arguments),
//     response.function_call_arguments.done, response.output_item.done,
//     then response.completed or response.incomplete with the whole
//     response; a failure after bytes is response.failed.
//
// The model's reasoning (RunEvent.reasoning_delta, COMPLETE's reasoning)
// is a reasoning item before the message (as llama-server e95dae18's
// tools/server/server-task.cpp streams it, and the Responses API returns
// the raw reasoning of open-weight models): {"type":"reasoning","id":
// "rs_…","summary":[],"content":[{"type":"reasoning_text","text"}],
// "encrypted_content"} — encrypted_content is surface.EncodeReasoning of
// the text, so that a client that sends back only that (Codex CLI)
// round-trips it. Streamed: response.output_item.added,
// response.reasoning_text.delta…, response.reasoning_text.done,
// response.output_item.done; the message and calls then take the next
// output indexes.
//
// The first events go out with the first text or at COMPLETE, so a failure
// before any output is still an HTTP error. The zero value is not usable;
// call Init. Not safe for concurrent use; one per request.
type Encoder struct {
	o        Options
	text     surface.Text
	seq      int64
	started  bool   // response.created and .in_progress sent
	open     bool   // the message item and its output_text part were added
	msgID    string // "msg_…"
	full     []byte // the whole text sent (stream)
	rsID     string // "rs_…", once there is reasoning
	reason   []byte // the reasoning so far
	thinking bool   // the reasoning item is open (stream)
	next     int    // the next output_index
	msgIndex int    // the message item's output_index
}

// Options describe one response: Model is the client's model name
// (echoed), ID the response id ("resp_…"), Created its Unix time in
// seconds, Stream the request's stream, Tools, MaxToolCalls and Echo from
// Input, Hold whether text that may be a text tool call is held (see
// surface.Text) and NewID the source of fresh item ids.
type Options struct {
	Model        string
	ID           string
	Created      int64
	Stream       bool
	Tools        []string
	MaxToolCalls int
	Echo         []byte
	Hold         bool
	NewID        func() string
	// Namespaces: a namespaced function's name → its namespace
	// (Params.Namespaces), echoed on its function_call items.
	Namespaces map[string]string
}

// Init makes e ready for one response described by o.
func (e *Encoder) Init(o Options) {
	*e = Encoder{o: o}
	e.text.Init(o.Stream, o.Hold && len(o.Tools) > 0)
}

// Event implements surface.Encoder.
func (e *Encoder) Event(dst []byte, ev *iop.RunEvent) ([]byte, bool, *surface.Error) {
	switch ev.Type {
	case iop.RunEventType_RUN_EVENT_DELTA:
		if ev.ReasoningDelta != "" {
			var err *surface.Error
			if dst, err = e.appendReasoning(dst, ev.ReasoningDelta); err != nil {
				return dst, true, err
			}
		}
		if d := e.text.Delta(ev.Delta); d != "" {
			dst = e.appendDelta(dst, d)
		}
		return dst, false, nil
	case iop.RunEventType_RUN_EVENT_COMPLETE:
		out, err := e.complete(dst, ev)
		return out, true, err
	default:
		return dst, false, nil // START; unknown kinds from a newer node (SPEC W5)
	}
}

// AppendError implements surface.Encoder: response.failed with the error.
func (e *Encoder) AppendError(dst []byte, err *surface.Error) []byte {
	dst = e.event(dst, "response.failed")
	dst = append(dst, `,"response":`...)
	dst = e.appendResponse(dst, "failed", err, nil, nil, nil)
	return append(dst, "}\n\n"...)
}

type call struct {
	id string // "fc_…"
	surface.ToolCall
}

func (e *Encoder) complete(dst []byte, ev *iop.RunEvent) ([]byte, *surface.Error) {
	if len(e.reason) == 0 && ev.Reasoning != "" {
		var err *surface.Error
		if dst, err = e.appendReasoning(dst, ev.Reasoning); err != nil {
			return dst, err
		}
	}
	rest := e.text.Rest(ev.Content)
	tcs, rest, err := surface.CompleteToolCalls(ev.Metadata, rest, e.o.Tools, e.o.NewID)
	if err == nil {
		for _, c := range tcs {
			if a := bytes.TrimSpace([]byte(c.Arguments)); !json.Valid(a) {
				err = surface.ErrBadToolCalls
			}
		}
	}
	if err != nil {
		return dst, surface.BadGateway("provider_error", "provider returned malformed tool calls")
	}
	if e.o.MaxToolCalls > 0 && len(tcs) > e.o.MaxToolCalls {
		tcs = tcs[:e.o.MaxToolCalls]
	}
	calls := make([]call, len(tcs))
	for i := range tcs {
		calls[i] = call{id: "fc_" + e.o.NewID(), ToolCall: tcs[i]}
	}
	status := "completed"
	if ev.FinishReason == "length" {
		status = "incomplete"
	}
	if !e.o.Stream {
		if rest != "" {
			e.msgID = "msg_" + e.o.NewID()
			e.full = append(e.full, rest...)
		}
		return e.appendResponse(dst, status, nil, calls, ev.Usage, e.full), nil
	}
	if rest != "" {
		dst = e.appendDelta(dst, rest)
	}
	dst = e.start(dst)
	dst = e.closeReasoning(dst)
	if e.open {
		dst = e.closeMessage(dst, status)
	}
	for i := range calls {
		dst = e.appendCall(dst, e.next, &calls[i])
		e.next++
	}
	typ := "response.completed"
	if status == "incomplete" {
		typ = "response.incomplete"
	}
	dst = e.event(dst, typ)
	dst = append(dst, `,"response":`...)
	dst = e.appendResponse(dst, status, nil, calls, ev.Usage, e.full)
	return append(dst, "}\n\n"...), nil
}

// event appends `event: <typ>\ndata: {"type":<typ>,"sequence_number":n`.
func (e *Encoder) event(dst []byte, typ string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, typ...)
	dst = append(dst, `","sequence_number":`...)
	dst = strconv.AppendInt(dst, e.seq, 10)
	e.seq++
	return dst
}

// start appends response.created and response.in_progress once.
func (e *Encoder) start(dst []byte) []byte {
	if e.started {
		return dst
	}
	e.started = true
	for _, typ := range [...]string{"response.created", "response.in_progress"} {
		dst = e.event(dst, typ)
		dst = append(dst, `,"response":`...)
		dst = e.appendResponse(dst, "in_progress", nil, nil, nil, nil)
		dst = append(dst, "}\n\n"...)
	}
	return dst
}

// itemHead appends `,"item_id":…,"output_index":n,"content_index":0`.
func (e *Encoder) itemHead(dst []byte) []byte {
	return appendHead(dst, e.msgID, e.msgIndex)
}

func appendHead(dst []byte, id string, index int) []byte {
	dst = append(dst, `,"item_id":`...)
	dst = surface.AppendString(dst, id)
	dst = append(dst, `,"output_index":`...)
	dst = strconv.AppendInt(dst, int64(index), 10)
	return append(dst, `,"content_index":0`...)
}

// appendReasoning takes the next piece of reasoning: for a stream a
// response.reasoning_text.delta (adding the reasoning item first), else it
// is kept for the response. More than surface.MaxReasoningBytes is a 502.
func (e *Encoder) appendReasoning(dst []byte, s string) ([]byte, *surface.Error) {
	if len(e.reason)+len(s) > surface.MaxReasoningBytes {
		return dst, surface.BadGateway("provider_error", "the provider's reasoning exceeded "+strconv.Itoa(surface.MaxReasoningBytes)+" bytes")
	}
	e.reason = append(e.reason, s...)
	if e.rsID == "" {
		e.rsID = "rs_" + e.o.NewID()
	}
	if !e.o.Stream || e.open {
		return dst, nil // after the message started: kept for the item only
	}
	dst = e.start(dst)
	if !e.thinking {
		e.thinking = true
		dst = e.event(dst, "response.output_item.added")
		dst = append(dst, `,"output_index":`...)
		dst = strconv.AppendInt(dst, int64(e.next), 10)
		dst = append(dst, `,"item":`...)
		dst = e.appendReasoningItem(dst, "in_progress", false)
		dst = append(dst, "}\n\n"...)
	}
	dst = e.event(dst, "response.reasoning_text.delta")
	dst = appendHead(dst, e.rsID, e.next)
	dst = append(dst, `,"delta":`...)
	dst = surface.AppendString(dst, s)
	return append(dst, "}\n\n"...), nil
}

// closeReasoning ends an open reasoning item (stream).
func (e *Encoder) closeReasoning(dst []byte) []byte {
	if !e.thinking {
		return dst
	}
	e.thinking = false
	dst = e.event(dst, "response.reasoning_text.done")
	dst = appendHead(dst, e.rsID, e.next)
	dst = append(dst, `,"text":`...)
	dst = surface.AppendString(dst, string(e.reason))
	dst = append(dst, "}\n\n"...)
	dst = e.event(dst, "response.output_item.done")
	dst = append(dst, `,"output_index":`...)
	dst = strconv.AppendInt(dst, int64(e.next), 10)
	dst = append(dst, `,"item":`...)
	dst = e.appendReasoningItem(dst, "completed", true)
	e.next++
	return append(dst, "}\n\n"...)
}

// appendReasoningItem appends the reasoning item; with full its text and
// encrypted_content.
func (e *Encoder) appendReasoningItem(dst []byte, status string, full bool) []byte {
	dst = append(dst, `{"id":`...)
	dst = surface.AppendString(dst, e.rsID)
	dst = append(dst, `,"type":"reasoning","status":`...)
	dst = surface.AppendString(dst, status)
	dst = append(dst, `,"summary":[],"content":[`...)
	if full {
		dst = append(dst, `{"type":"reasoning_text","text":`...)
		dst = surface.AppendString(dst, string(e.reason))
		dst = append(dst, `}],"encrypted_content":`...)
		dst = surface.AppendString(dst, surface.EncodeReasoning(string(e.reason)))
		return append(dst, '}')
	}
	return append(dst, `]}`...)
}

func (e *Encoder) appendDelta(dst []byte, d string) []byte {
	dst = e.start(dst)
	dst = e.closeReasoning(dst)
	if !e.open {
		e.open = true
		e.msgID = "msg_" + e.o.NewID()
		e.msgIndex = e.next
		e.next++
		dst = e.event(dst, "response.output_item.added")
		dst = append(dst, `,"output_index":`...)
		dst = strconv.AppendInt(dst, int64(e.msgIndex), 10)
		dst = append(dst, `,"item":`...)
		dst = e.appendMessageItem(dst, "in_progress", nil, false)
		dst = append(dst, "}\n\n"...)
		dst = e.event(dst, "response.content_part.added")
		dst = e.itemHead(dst)
		dst = append(dst, `,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}}`+"\n\n"...)
	}
	e.full = append(e.full, d...)
	dst = e.event(dst, "response.output_text.delta")
	dst = e.itemHead(dst)
	dst = append(dst, `,"delta":`...)
	dst = surface.AppendString(dst, d)
	return append(dst, `,"logprobs":[]}`+"\n\n"...)
}

func (e *Encoder) closeMessage(dst []byte, status string) []byte {
	dst = e.event(dst, "response.output_text.done")
	dst = e.itemHead(dst)
	dst = append(dst, `,"text":`...)
	dst = surface.AppendString(dst, string(e.full))
	dst = append(dst, `,"logprobs":[]}`+"\n\n"...)
	dst = e.event(dst, "response.content_part.done")
	dst = e.itemHead(dst)
	dst = append(dst, `,"part":`...)
	dst = appendTextPart(dst, e.full)
	dst = append(dst, "}\n\n"...)
	dst = e.event(dst, "response.output_item.done")
	dst = append(dst, `,"output_index":`...)
	dst = strconv.AppendInt(dst, int64(e.msgIndex), 10)
	dst = append(dst, `,"item":`...)
	dst = e.appendMessageItem(dst, status, e.full, true)
	return append(dst, "}\n\n"...)
}

func (e *Encoder) appendCall(dst []byte, index int, c *call) []byte {
	dst = e.event(dst, "response.output_item.added")
	dst = append(dst, `,"output_index":`...)
	dst = strconv.AppendInt(dst, int64(index), 10)
	dst = append(dst, `,"item":`...)
	dst = e.appendCallItem(dst, c, "in_progress", "")
	dst = append(dst, "}\n\n"...)
	dst = e.event(dst, "response.function_call_arguments.delta")
	dst = e.callHead(dst, index, c)
	dst = append(dst, `,"delta":`...)
	dst = surface.AppendString(dst, c.Arguments)
	dst = append(dst, "}\n\n"...)
	dst = e.event(dst, "response.function_call_arguments.done")
	dst = e.callHead(dst, index, c)
	dst = append(dst, `,"name":`...)
	dst = surface.AppendString(dst, c.Name)
	dst = append(dst, `,"arguments":`...)
	dst = surface.AppendString(dst, c.Arguments)
	dst = append(dst, "}\n\n"...)
	dst = e.event(dst, "response.output_item.done")
	dst = append(dst, `,"output_index":`...)
	dst = strconv.AppendInt(dst, int64(index), 10)
	dst = append(dst, `,"item":`...)
	dst = e.appendCallItem(dst, c, "completed", c.Arguments)
	return append(dst, "}\n\n"...)
}

func (e *Encoder) callHead(dst []byte, index int, c *call) []byte {
	dst = append(dst, `,"item_id":`...)
	dst = surface.AppendString(dst, c.id)
	dst = append(dst, `,"output_index":`...)
	return strconv.AppendInt(dst, int64(index), 10)
}

func appendTextPart(dst, text []byte) []byte {
	dst = append(dst, `{"type":"output_text","annotations":[],"logprobs":[],"text":`...)
	dst = surface.AppendString(dst, string(text))
	return append(dst, '}')
}

// appendMessageItem appends the assistant message item; with part its one
// output_text part.
func (e *Encoder) appendMessageItem(dst []byte, status string, text []byte, part bool) []byte {
	dst = append(dst, `{"id":`...)
	dst = surface.AppendString(dst, e.msgID)
	dst = append(dst, `,"type":"message","status":`...)
	dst = surface.AppendString(dst, status)
	dst = append(dst, `,"content":[`...)
	if part {
		dst = appendTextPart(dst, text)
	}
	return append(dst, `],"role":"assistant"}`...)
}

func (e *Encoder) appendCallItem(dst []byte, c *call, status, args string) []byte {
	dst = append(dst, `{"id":`...)
	dst = surface.AppendString(dst, c.id)
	dst = append(dst, `,"type":"function_call","status":`...)
	dst = surface.AppendString(dst, status)
	dst = append(dst, `,"arguments":`...)
	dst = surface.AppendString(dst, args)
	dst = append(dst, `,"call_id":`...)
	dst = surface.AppendString(dst, c.ID)
	dst = append(dst, `,"name":`...)
	dst = surface.AppendString(dst, c.Name)
	if ns := e.o.Namespaces[c.Name]; ns != "" {
		dst = append(dst, `,"namespace":`...)
		dst = surface.AppendString(dst, ns)
	}
	return append(dst, '}')
}

// appendResponse appends the response object with status; failed carries
// err; the output holds the message (when text is non-empty) and calls;
// usage is null while in progress.
func (e *Encoder) appendResponse(dst []byte, status string, err *surface.Error, calls []call, u *iop.Usage, text []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = surface.AppendString(dst, e.o.ID)
	dst = append(dst, `,"object":"response","created_at":`...)
	dst = strconv.AppendInt(dst, e.o.Created, 10)
	dst = append(dst, `,"status":`...)
	dst = surface.AppendString(dst, status)
	dst = append(dst, `,"background":false,"error":`...)
	if err != nil {
		dst = append(dst, `{"code":`...)
		code := err.Code
		if code == "" {
			code = "server_error"
		}
		dst = surface.AppendString(dst, code)
		dst = append(dst, `,"message":`...)
		dst = surface.AppendString(dst, err.Message)
		dst = append(dst, '}')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"incomplete_details":`...)
	if status == "incomplete" {
		dst = append(dst, `{"reason":"max_output_tokens"}`...)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, ',')
	dst = append(dst, e.o.Echo...)
	dst = append(dst, `,"model":`...)
	dst = surface.AppendString(dst, e.o.Model)
	dst = append(dst, `,"output":[`...)
	n := 0
	if len(e.reason) > 0 && status != "in_progress" && status != "failed" {
		dst = e.appendReasoningItem(dst, "completed", true)
		n++
	}
	if len(text) > 0 {
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = e.appendMessageItem(dst, msgStatus(status), text, true)
		n++
	}
	for i := range calls {
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = e.appendCallItem(dst, &calls[i], "completed", calls[i].Arguments)
		n++
	}
	dst = append(dst, `],"usage":`...)
	if status == "in_progress" || status == "failed" {
		dst = append(dst, "null"...)
	} else {
		dst = appendUsage(dst, u)
	}
	return append(dst, '}')
}

func msgStatus(status string) string {
	if status == "incomplete" {
		return "incomplete"
	}
	return "completed"
}

// appendUsage appends the Responses usage object (tokens).
func appendUsage(b []byte, u *iop.Usage) []byte {
	p, c := u.GetPromptTokens(), u.GetCompletionTokens()
	t := u.GetTotalTokens()
	if t == 0 {
		t = p + c
	}
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, p, 10)
	b = append(b, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
	b = strconv.AppendInt(b, c, 10)
	b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
	b = strconv.AppendInt(b, t, 10)
	return append(b, '}')
}

var _ surface.Encoder = (*Encoder)(nil)
