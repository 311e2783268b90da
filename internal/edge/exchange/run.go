package exchange

import (
	"net/http"
	"strconv"

	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

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

// MaxRunText is maxRunText, for the tests that meet it from outside.
const MaxRunText = maxRunText

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
