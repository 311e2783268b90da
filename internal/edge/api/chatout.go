package api

import (
	"net/http"
	"strconv"
	"strings"
	"sync"

	iop "iop/proto/gen/iop"
)

// output is a response being written: every send is written and flushed at
// once, so each SSE event reaches the client as it is produced.
type output struct {
	w http.ResponseWriter
	// batch: more frames of the stream are already queued; flush is left
	// to the last of them (one client write per burst, SPEC T2). dirty: a
	// flush was skipped for it; endBurst does it.
	batch, dirty bool
}

func newOutput(w http.ResponseWriter) *output { return &output{w: w} }

// send writes p and flushes; an error means the client is gone.
func (o *output) send(p []byte) error {
	if _, err := o.w.Write(p); err != nil {
		return err
	}
	return o.flush()
}

// endBurst flushes what a burst left unflushed: its last frame may write
// nothing of its own (USAGE, RESPONSE_START) and so never flush.
func (o *output) endBurst() error {
	if o.batch || !o.dirty {
		return nil
	}
	return o.flush()
}

// flush flushes the response, reporting the error when the writer can (as
// net/http's does); wrapped writers go through http.ResponseController.
func (o *output) flush() error {
	if o.batch {
		o.dirty = true
		return nil
	}
	o.dirty = false
	switch f := o.w.(type) {
	case interface{ FlushError() error }:
		return f.FlushError()
	case http.Flusher:
		f.Flush()
		return nil
	default:
		return http.NewResponseController(o.w).Flush()
	}
}

// chatConv turns the RunEvents of one normalized run into exactly what the
// OpenAI chat completions API returns (SPEC T5; OpenAI API reference, "The
// chat completion object" and "The chat completion chunk object"):
//
//   - non-stream: one chat.completion with choices[0].message {role,
//     content, tool_calls}, finish_reason and usage;
//   - stream: chat.completion.chunk events, each `data: <json>\n\n` and
//     flushed as produced: the role in the first delta, content deltas,
//     tool-call deltas (index, id, type, function name, then the arguments),
//     a chunk with finish_reason, then — with stream_options.include_usage —
//     one chunk with "choices": [] and the usage (every earlier chunk then
//     carries "usage": null), then `data: [DONE]`.
//
// finish_reason is "tool_calls" whenever the message carries tool calls,
// else the run's "stop" or "length" ("stop" for anything else).
//
// When the request declared tools, a streamed run's content from its first
// '{' or '`' on is held until COMPLETE: only then is it known whether the
// run used the text tool-call fallback (SPEC E9), whose JSON must become
// tool_calls and never reach the client as content. Text before that point
// streams as usual. Not safe for concurrent use; one per request.
type chatConv struct {
	out          *output
	model        string // the client's requested model name
	id           string // "chatcmpl-…"
	created      int64  // Unix seconds
	stream       bool
	includeUsage bool
	tools        []string // declared tool names; non-nil enables holding
	hasTools     bool
	newID        func() string

	committed bool // status line written
	finished  bool // a terminal outcome was written
	failed    *apiError
	roleSent  bool
	streamed  bool // any content delta was sent
	holding   bool // content from the first '{' or '`' on is held (tools)
	held      []byte
	text      []byte // non-stream: accumulated deltas
	prefix    []byte // `data: {"id":…,"choices":[`
	// buf is the event being encoded: taken from bufs (bp) for one event
	// and given back once it is written, so a stream parked between two
	// tokens holds no encoding buffer (issue 7).
	buf  []byte
	bp   *[]byte
	bufs *sync.Pool // of *[]byte
}

// maxPooledBuf bounds the encoding buffer given back to the pool (bytes):
// a rare huge event's buffer is left to the GC.
const maxPooledBuf = 64 << 10

func newChatConv(o *output, model, id string, created int64, stream, includeUsage bool, tools []string, hasTools bool, newID func() string) *chatConv {
	c := new(chatConv)
	c.init(o, model, id, created, stream, includeUsage, tools, hasTools, newID)
	c.bufs = new(sync.Pool)
	return c
}

func (c *chatConv) init(o *output, model, id string, created int64, stream, includeUsage bool, tools []string, hasTools bool, newID func() string) {
	*c = chatConv{out: o, model: model, id: id, created: created, stream: stream,
		includeUsage: includeUsage && stream, tools: tools, hasTools: hasTools, newID: newID}
	if stream {
		// The chunk prefix, sized for ids and names that need no escaping.
		p := make([]byte, 0, 104+len(id)+len(model))
		p = append(p, `data: {"id":`...)
		p = appendJSONString(p, id)
		p = append(p, `,"object":"chat.completion.chunk","created":`...)
		p = strconv.AppendInt(p, created, 10)
		p = append(p, `,"model":`...)
		p = appendJSONString(p, model)
		p = append(p, `,"choices":[`...)
		c.prefix = p
	}
}

// take sets c.buf to an empty encoding buffer from the pool.
func (c *chatConv) take() {
	if bp, ok := c.bufs.Get().(*[]byte); ok {
		c.bp, c.buf = bp, (*bp)[:0]
		return
	}
	c.bp, c.buf = new([]byte), make([]byte, 0, 1024)
}

// give returns c.buf to the pool; c.buf must not be used until the next
// take.
func (c *chatConv) give() {
	if cap(c.buf) <= maxPooledBuf {
		*c.bp = c.buf[:0]
		c.bufs.Put(c.bp)
	}
	c.bp, c.buf = nil, nil
}

// event consumes one RunEvent. done is true after the terminal; err is a
// write error (the client is gone) and ends the request.
func (c *chatConv) event(ev *iop.RunEvent) (done bool, err error) {
	switch ev.Type {
	case iop.RunEventType_RUN_EVENT_START:
		return false, nil
	case iop.RunEventType_RUN_EVENT_DELTA:
		return false, c.delta(ev.Delta)
	case iop.RunEventType_RUN_EVENT_COMPLETE:
		return true, c.complete(ev)
	case iop.RunEventType_RUN_EVENT_ERROR:
		return true, c.fail(nodeFailure(ev.FailureCode, ev.Error, ev.UpstreamStatus, ev.Failure))
	case iop.RunEventType_RUN_EVENT_CANCELLED:
		return true, c.fail(badGateway("run_cancelled", "the provider run was cancelled"))
	default:
		return false, nil // unknown kinds from a newer node are ignored (SPEC W5)
	}
}

func (c *chatConv) delta(d string) error {
	if d == "" {
		return nil
	}
	if !c.stream {
		c.text = append(c.text, d...)
		return nil
	}
	if c.holding {
		c.held = append(c.held, d...)
		return nil
	}
	if c.hasTools {
		// A text tool call (SPEC E9 fallback) is only known at COMPLETE;
		// hold what could be one so it is never sent as content first.
		if k := strings.IndexAny(d, "{`"); k >= 0 {
			c.holding = true
			c.held = append(c.held, d[k:]...)
			d = d[:k]
			if d == "" {
				return nil
			}
		}
	}
	c.take()
	c.appendRole()
	c.appendContent(d)
	c.streamed = true
	return c.send()
}

func (c *chatConv) complete(ev *iop.RunEvent) error {
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
	var calls []toolCall
	if meta := ev.Metadata[MetaToolCalls]; meta != "" {
		var err error
		if calls, err = nativeToolCalls(meta, c.newID); err != nil {
			return c.fail(badGateway("provider_error", "provider returned malformed tool calls"))
		}
	} else if ev.Metadata[MetaTextToolFallback] == "true" {
		if tc, rest, ok := textToolCalls(pending, c.tools, c.newID); ok {
			calls, pending = tc, rest
		}
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
		return c.finishStream(pending, calls, finish, ev.Usage)
	}
	return c.finishJSON(pending, calls, finish, ev.Usage)
}

func (c *chatConv) finishStream(pending string, calls []toolCall, finish string, u *iop.Usage) error {
	c.take()
	c.appendRole()
	if pending != "" {
		c.appendContent(pending)
	}
	for i := range calls {
		c.appendToolCall(i, &calls[i])
	}
	c.buf = append(c.buf, c.prefix...)
	c.buf = append(c.buf, `{"index":0,"delta":{},"logprobs":null,"finish_reason":`...)
	c.buf = appendJSONString(c.buf, finish)
	c.buf = append(c.buf, '}')
	c.endChunk()
	if c.includeUsage {
		c.buf = append(c.buf, c.prefix...)
		c.buf = append(c.buf, `],"usage":`...)
		c.buf = appendUsage(c.buf, u)
		c.buf = append(c.buf, "}\n\n"...)
	}
	c.buf = append(c.buf, "data: [DONE]\n\n"...)
	c.finished = true
	return c.send()
}

func (c *chatConv) finishJSON(text string, calls []toolCall, finish string, u *iop.Usage) error {
	b := make([]byte, 0, 256+len(text)+len(c.model))
	b = append(b, `{"id":`...)
	b = appendJSONString(b, c.id)
	b = append(b, `,"object":"chat.completion","created":`...)
	b = strconv.AppendInt(b, c.created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, c.model)
	b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	if text == "" && len(calls) > 0 {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, text)
	}
	if len(calls) > 0 {
		b = append(b, `,"tool_calls":[`...)
		for i := range calls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendJSONString(b, calls[i].id)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = appendJSONString(b, calls[i].name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, calls[i].arguments)
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	b = append(b, `},"logprobs":null,"finish_reason":`...)
	b = appendJSONString(b, finish)
	b = append(b, `}],"usage":`...)
	b = appendUsage(b, u)
	b = append(b, '}')
	h := c.out.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	c.out.w.WriteHeader(http.StatusOK)
	c.committed, c.finished = true, true
	_, err := c.out.w.Write(b)
	return err
}

// fail ends the response with e: an HTTP error in OpenAI shape when nothing
// was written yet, else a `data: {"error":{...}}` event that closes the
// stream. Only the first terminal outcome is written.
func (c *chatConv) fail(e *apiError) error {
	if c.finished {
		return nil
	}
	c.finished, c.failed = true, e
	if !c.committed {
		c.committed = true
		writeError(c.out.w, surfaceOpenAI, e)
		return nil
	}
	c.take()
	c.buf = appendErrorEvent(c.buf, surfaceOpenAI, e)
	err := c.out.send(c.buf)
	c.give()
	return err
}

// send commits the SSE response headers on first use, writes c.buf and
// gives it back.
func (c *chatConv) send() error {
	if !c.committed {
		c.committed = true
		h := c.out.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		c.out.w.WriteHeader(http.StatusOK)
	}
	err := c.out.send(c.buf)
	c.give()
	return err
}

func (c *chatConv) endChunk() {
	c.buf = append(c.buf, ']')
	if c.includeUsage {
		c.buf = append(c.buf, `,"usage":null`...)
	}
	c.buf = append(c.buf, "}\n\n"...)
}

func (c *chatConv) appendRole() {
	if c.roleSent {
		return
	}
	c.roleSent = true
	c.buf = append(c.buf, c.prefix...)
	c.buf = append(c.buf, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`...)
	c.endChunk()
}

func (c *chatConv) appendContent(s string) {
	c.buf = append(c.buf, c.prefix...)
	c.buf = append(c.buf, `{"index":0,"delta":{"content":`...)
	c.buf = appendJSONString(c.buf, s)
	c.buf = append(c.buf, `},"logprobs":null,"finish_reason":null}`...)
	c.endChunk()
}

// appendToolCall appends two chunks for call i: its index, id, type and
// function name with empty arguments, then the arguments fragment.
func (c *chatConv) appendToolCall(i int, tc *toolCall) {
	c.buf = append(c.buf, c.prefix...)
	c.buf = append(c.buf, `{"index":0,"delta":{"tool_calls":[{"index":`...)
	c.buf = strconv.AppendInt(c.buf, int64(i), 10)
	c.buf = append(c.buf, `,"id":`...)
	c.buf = appendJSONString(c.buf, tc.id)
	c.buf = append(c.buf, `,"type":"function","function":{"name":`...)
	c.buf = appendJSONString(c.buf, tc.name)
	c.buf = append(c.buf, `,"arguments":""}}]},"logprobs":null,"finish_reason":null}`...)
	c.endChunk()
	c.buf = append(c.buf, c.prefix...)
	c.buf = append(c.buf, `{"index":0,"delta":{"tool_calls":[{"index":`...)
	c.buf = strconv.AppendInt(c.buf, int64(i), 10)
	c.buf = append(c.buf, `,"function":{"arguments":`...)
	c.buf = appendJSONString(c.buf, tc.arguments)
	c.buf = append(c.buf, `}}]},"logprobs":null,"finish_reason":null}`...)
	c.endChunk()
}

// appendUsage appends {"prompt_tokens","completion_tokens","total_tokens"};
// a missing usage is all zeros, a missing total is the sum.
func appendUsage(b []byte, u *iop.Usage) []byte {
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
