package api

import (
	"context"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// recorder is the ResponseWriter every part of the HTTP layer writes one
// request's response through. It notes the status line and the time of the
// first byte in the request's access Record, which the rest of the layer
// fills as the request goes (principal, model, lease, queue wait, tokens,
// the client leaving, the error written) and end writes once (A1:
// one access-log line, one iop_edge_requests_total sample per request).
// Owned by the request's goroutine.
type recorder struct {
	http.ResponseWriter
	flushErr func() error // the writer's FlushError, or nil
	rec      access.Record
	wrote    bool     // the status line went out
	gone     bool     // the client left before the response was complete
	failed   bool     // an error response or error event was written, or the body was cut
	usage    bool     // the provider reported token usage (setUsage)
	inFlight string   // model label counted in flight (Metrics.Begin), "" when none
	tr       reqTrace // the request's trace (trace.go)
}

func (rw *recorder) WriteHeader(code int) {
	if !rw.wrote && code >= 200 {
		rw.wrote = true
		rw.rec.Status = code
		rw.rec.TTFB = time.Since(rw.rec.Start)
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *recorder) Write(p []byte) (int, error) {
	if !rw.wrote {
		rw.WriteHeader(http.StatusOK)
	}
	return rw.ResponseWriter.Write(p)
}

// FlushError flushes the response and reports the error, as net/http's
// writer does (output.flush relies on it).
func (rw *recorder) FlushError() error {
	if !rw.wrote {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.flushErr != nil {
		return rw.flushErr()
	}
	return http.NewResponseController(rw.ResponseWriter).Flush()
}

func (rw *recorder) Flush() { _ = rw.FlushError() }

// Unwrap lets http.ResponseController reach the server's writer (read
// deadlines).
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

// fail notes the error written to the client (an error response, or an
// error event after bytes).
func (rw *recorder) fail(e *apiError) {
	rw.failed = true
	rw.rec.Code, rw.rec.Error = e.code, access.BoundError(e.msg)
}

// leave notes that the client went away (a disconnect noticed while
// queued or streaming, or a failed write).
func (rw *recorder) leave() { rw.gone = true }

// noteError records e on w when w is the request's recorder.
func noteError(w http.ResponseWriter, e *apiError) {
	if rw, ok := w.(*recorder); ok {
		rw.fail(e)
	}
}

// setModel records the model a request names and counts it in flight.
func (h *Handler) setModel(rw *recorder, v *view, model string) {
	rw.rec.Model = truncate(model, access.MaxModelLen)
	rw.rec.Known = v.cfg != nil && v.cfg.ModelByName(model) != nil
	if h.o.Metrics != nil && rw.inFlight == "" {
		rw.inFlight = access.ModelLabel(model, rw.rec.Known)
		h.o.Metrics.Begin(rw.inFlight)
	}
}

// setLease records the lease a request runs on (nil with err, when
// Pool.Acquire gave none) and how long it waited: in the access record and
// as the trace's queue span.
func setLease(rw *recorder, l *pool.Lease, waited time.Duration, err error) {
	rw.rec.QueueWait += waited
	rw.tr.queue(waited, l, err)
	if l == nil {
		return
	}
	rw.rec.Node, rw.rec.Provider = l.Node, l.Provider
	rw.rec.Path = access.PathRun
	if l.Type == protocol.TypeOpenAICompat {
		rw.rec.Path = access.PathTunnel
	}
}

// setUsage records the token usage a provider reported (the latest report
// wins: a stream's usage grows).
func setUsage(rw *recorder, u *iop.Usage) {
	if u == nil {
		return
	}
	rw.usage = true
	if u.PromptTokens > 0 {
		rw.rec.PromptTokens = u.PromptTokens
	}
	if u.CompletionTokens > 0 {
		rw.rec.CompletionTokens = u.CompletionTokens
	}
}

// begin starts the accounting of one request: its id (the client's
// X-Request-Id, sanitized, or a new one), returned on the response whatever
// it turns out to be.
func (h *Handler) begin(w http.ResponseWriter, r *http.Request, start time.Time) *recorder {
	rw := &recorder{ResponseWriter: w}
	if f, ok := w.(interface{ FlushError() error }); ok {
		rw.flushErr = f.FlushError
	}
	rw.rec.Start = start
	rw.rec.RequestID = access.RequestID(r.Header.Get(access.HeaderRequestID), h.o.NewID)
	rw.rec.Surface = surfaceOther
	w.Header().Set(access.HeaderRequestID, rw.rec.RequestID)
	h.beginTrace(rw, r)
	if rw.tr.on {
		rw.rec.TraceID = rw.tr.ctx.TraceID
	}
	return rw
}

// surfaceOther is the access record's surface of requests for no model
// endpoint (unknown paths).
const surfaceOther = "other"

// end writes the request's one access-log line and metrics sample.
func (h *Handler) end(ctx context.Context, rw *recorder) {
	r := &rw.rec
	now := time.Now()
	r.Duration = now.Sub(r.Start)
	switch {
	case !rw.wrote && rw.gone:
		r.Status = access.StatusClientClosed
	case !rw.wrote:
		r.Status = http.StatusOK // net/http sends 200 for a handler that wrote nothing
	}
	if r.Outcome == "" {
		if rw.gone {
			r.Outcome = access.ClientCancelled
		} else {
			r.Outcome = access.Classify(r.Status, r.Code, rw.failed)
		}
	}
	h.endTrace(rw, now)
	r.Log(ctx, h.o.AccessLog)
	if m := h.o.Metrics; m != nil {
		m.Observe(r)
		if rw.inFlight != "" {
			m.End(rw.inFlight)
		}
	}
	if h.o.Recent != nil {
		h.o.Recent.Add(r, now)
	}
}
