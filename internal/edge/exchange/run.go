package exchange

import (
	"iop/internal/edge/reply"
	"net/http"

	"iop/internal/edge/access"
	"strconv"

	"iop/internal/edge/dispatch"
	apisurface "iop/internal/edge/surface"
	"iop/internal/edge/surface/anthropic"
	"iop/internal/edge/surface/openai"
	"iop/internal/edge/surface/responses"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// RunKind is the run-path surface of an endpoint: which package converts
// its requests and encodes its responses.
type RunKind uint8

const (
	RunNone        RunKind = iota // tunnel only
	RunChat                       // surface/openai Chat
	RunMessages                   // surface/anthropic Messages
	RunCountTokens                // surface/anthropic Count
	RunResponses                  // surface/responses Encoder
	RunEmbeddings                 // surface/openai Embeddings
)

// run sends the normalized RunRequest (SPEC Q3) built by the endpoint's
// surface from the client's body; its sink encodes the run's events in that
// surface's response shape (SPEC T5).
func (h *Engine) run(x *Exchange) (dispatch.Stream, sink) {
	s, req, e := h.runSurface(x)
	if e != nil {
		reply.WriteError(x.out.W, x.Endpoint.Surface, e)
		return nil, nil
	}
	l := x.lease
	req.Adapter, req.Target, req.ResponseStallTimeoutMs = l.Provider, l.Target, l.StallTimeoutMs
	req.RequestId = x.Acc.Rec.RequestID
	req.Trace = x.Acc.Trace.BeginAttempt(l, access.PathRun)
	var ok bool
	if req.CredentialLease, req.CredentialBinding, ok = h.credential(x); !ok {
		return nil, nil
	}
	st, err := h.o.Dispatcher.StartRun(dispatch.Target{Node: l.Node, Generation: l.Generation}, req)
	if err != nil {
		h.startFailed(x, err)
		return nil, nil
	}
	return st, s
}

// runSurface converts x's body with its endpoint's surface into the
// RunRequest's input and returns the sink that encodes the answer.
func (h *Engine) runSurface(x *Exchange) (sink, *iop.RunRequest, *apisurface.Error) {
	hold := x.lease.Type != protocol.TypeOllama // text tool calls (E9) only on openai_compat adapters
	switch x.Endpoint.Run {
	case RunChat:
		in, p, e := openai.ChatInputPolicy(x.Body, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		s := &runSink[openai.Chat, *openai.Chat]{h: h, x: x, stream: x.Stream}
		s.enc.Init(openai.ChatOptions{Model: x.Model, ID: "chatcmpl-" + h.o.NewID(), Created: h.o.Now().Unix(),
			Stream: x.Stream, IncludeUsage: x.IncludeUsage, Tools: p.Tools, Hold: hold,
			Logprobs: p.Logprobs, MaxToolCalls: p.MaxToolCalls, NewID: h.o.NewID})
		return s, &iop.RunRequest{Input: in, Stream: x.Stream}, nil
	case RunMessages:
		in, p, e := anthropic.InputPolicy(x.Body, false, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		s := &runSink[anthropic.Messages, *anthropic.Messages]{h: h, x: x, stream: x.Stream}
		s.enc.Init(anthropic.Options{Model: x.Model, ID: "msg_" + h.o.NewID(), Stream: x.Stream, Tools: p.Tools,
			MaxToolCalls: p.MaxToolCalls, Hold: hold, NewID: h.o.NewID, OmitThinking: p.OmitThinking})
		return s, &iop.RunRequest{Input: in, Stream: x.Stream}, nil
	case RunCountTokens:
		in, p, e := anthropic.InputPolicy(x.Body, true, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		return &runSink[anthropic.Count, *anthropic.Count]{h: h, x: x}, &iop.RunRequest{Input: in}, nil
	case RunResponses:
		in, p, e := responses.InputPolicy(x.Body, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		s := &runSink[responses.Encoder, *responses.Encoder]{h: h, x: x, stream: x.Stream}
		s.enc.Init(responses.Options{Model: x.Model, ID: "resp_" + h.o.NewID(), Created: h.o.Now().Unix(), Stream: x.Stream,
			Tools: p.Tools, MaxToolCalls: p.MaxToolCalls, Echo: p.Echo, Hold: hold, NewID: h.o.NewID, Namespaces: p.Namespaces})
		return s, &iop.RunRequest{Input: in, Stream: x.Stream}, nil
	case RunEmbeddings:
		in, b64, e := openai.EmbeddingsInput(x.Body)
		if e != nil {
			return nil, nil, e
		}
		s := &runSink[openai.Embeddings, *openai.Embeddings]{h: h, x: x}
		s.enc.Init(x.Model, b64)
		return s, &iop.RunRequest{Input: in, Operation: protocol.RunEmbeddings}, nil
	}
	return nil, nil, apisurface.BadRequest("", "%s has no run-path surface", x.Endpoint.Path)
}

// reportIgnored reports what the run path accepted without sending to
// the backend (surface.Ignored: unknown members under "report", tools the
// model is not offered): the response header surface.IgnoredHeader, the
// access line's ignored_fields and the metric
// iop_edge_ignored_fields_total{surface,field} (field: the table row,
// bounded). The header is set before any byte, so a failure answered
// later carries it too.
func reportIgnored(x *Exchange, ig *apisurface.Ignored) {
	if ig.Total == 0 {
		return
	}
	v := ig.Header()
	x.out.W.Header().Set(apisurface.IgnoredHeader, v)
	rec := &x.Acc.Rec
	rec.IgnoredFields = v
	rec.IgnoredRows = rec.IgnoredRows[:0]
	for _, f := range ig.Fields {
		rec.IgnoredRows = append(rec.IgnoredRows, f.Row)
	}
}

// encoder is a surface encoder held by value in its runSink, so that a
// request's sink is one allocation: *T implements surface.Encoder.
type encoder[T any] interface {
	*T
	apisurface.Encoder
}

// runSink writes one run's events to the client through the surface's
// encoder: a stream's SSE events are written and flushed as produced (the
// headers go with the first), a non-stream body is written whole with a
// Content-Length. A node's ERROR or CANCELLED terminal, or a malformed
// COMPLETE, ends the response with exactly one error outcome: an HTTP error
// in the surface's shape before any byte, the encoder's error event after.
type runSink[T any, E encoder[T]] struct {
	h      *Engine
	x      *Exchange
	enc    T
	stream bool // SSE events, else one JSON body

	committed bool // status line written
	finished  bool // a terminal outcome was written
	failed    *reply.Error
	text      int // DELTA bytes so far (maxRunText)
}

// maxRunText bounds the assistant text a run may stream as DELTA events, in
// bytes: an encoder may hold all of it until COMPLETE (a
// non-stream answer, text that may be a tool call), so a node that sends
// without end fails the run (502) instead of growing the Edge's memory. A
// COMPLETE's own content is bounded by the frame cap (16 MiB).
const maxRunText = 8 << 20

func (s *runSink[T, E]) handle(env *iop.Envelope) (bool, error) {
	ev := env.GetRunEvent()
	if ev == nil {
		return false, nil
	}
	switch ev.Type {
	case iop.RunEventType_RUN_EVENT_COMPLETE:
		if ev.Usage != nil {
			s.x.Acc.SetUsage(ev.Usage)
			if s.h.o.OnUsage != nil {
				s.h.o.OnUsage(s.x.Principal, s.x.Model, ev.Usage)
			}
		}
	case iop.RunEventType_RUN_EVENT_ERROR:
		return true, s.fail(runFailure(ev))
	case iop.RunEventType_RUN_EVENT_CANCELLED:
		return true, s.fail(nodeFailure(protocol.CodeCancelled.String(), "", ev.Error, 0, nil))
	case iop.RunEventType_RUN_EVENT_DELTA:
		if s.text += len(ev.Delta) + len(ev.ReasoningDelta); s.text > maxRunText { // the reasoning is held too
			e := reply.BadGateway("provider_error", "the provider's answer exceeded "+strconv.Itoa(maxRunText)+" bytes")
			return true, s.fail(e)
		}
	}
	bp := s.h.takeBuf()
	out, done, e := E(&s.enc).Event(*bp, ev)
	var err error
	switch {
	case e != nil:
		done, err = true, s.fail(e)
	case len(out) > 0:
		err = s.write(out)
	}
	s.h.giveBuf(bp, out)
	if done && e == nil {
		s.finished = true
	}
	return done, err
}

// write sends p: the stream's next events, or the whole non-stream body.
func (s *runSink[T, E]) write(p []byte) error {
	w := s.x.out.W
	if !s.stream {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(p)))
		w.WriteHeader(http.StatusOK)
		s.committed = true
		_, err := w.Write(p)
		return err
	}
	if !s.committed {
		s.committed = true
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
	}
	return s.x.out.Send(p)
}

// fail ends the response with e unless a terminal outcome was written: an
// HTTP error when nothing was written yet, else the surface's error event.
func (s *runSink[T, E]) fail(e *reply.Error) error {
	if s.finished {
		return nil
	}
	s.finished, s.failed = true, e
	if !s.committed {
		s.committed = true
		reply.WriteError(s.x.out.W, s.x.Endpoint.Surface, e)
		return nil
	}
	bp := s.h.takeBuf()
	b := E(&s.enc).AppendError(*bp, e)
	err := s.x.out.Send(b)
	s.h.giveBuf(bp, b)
	return err
}

func (s *runSink[T, E]) failure() *reply.Error { return s.failed }

func (s *runSink[T, E]) wrote() bool { return s.committed }

// maxPooledBuf bounds the encoding buffer given back to the pool (bytes):
// a rare huge event's buffer is left to the GC.
const maxPooledBuf = 64 << 10

// takeBuf returns an empty encoding buffer from the Engine's pool. It is
// taken for one event and given back once written, so a stream parked
// between two tokens holds none.
func (h *Engine) takeBuf() *[]byte {
	if bp, ok := h.bufs.Get().(*[]byte); ok {
		*bp = (*bp)[:0]
		return bp
	}
	b := make([]byte, 0, 1024)
	return &b
}

// giveBuf returns b, the grown *bp, to the pool; neither may be used after.
func (h *Engine) giveBuf(bp *[]byte, b []byte) {
	if cap(b) <= maxPooledBuf {
		*bp = b[:0]
		h.bufs.Put(bp)
	}
}
