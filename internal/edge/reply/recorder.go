package reply

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Recorder is the ResponseWriter every part of the HTTP layer writes one
// request's response through. It notes the status line and the time of the
// first byte in the request's access Record (Rec), which the rest of the
// layer fills as the request goes (principal, model, lease, queue wait,
// tokens, the client leaving, the error written) and End writes once (A1:
// one access-log line, one iop_edge_requests_total sample per request).
// Owned by the request's goroutine.
type Recorder struct {
	http.ResponseWriter
	flushErr func() error // the writer's FlushError, or nil
	Rec      access.Record
	wrote    bool   // the status line went out
	gone     bool   // the client left before the response was complete
	failed   bool   // an error response or error event was written, or the body was cut
	usage    bool   // the provider reported token usage (SetUsage)
	inFlight string // model label counted in flight (Metrics.Begin), "" when none
	// MinTokens is what the answer is known to have cost at least, in
	// tokens, should the provider report no usage (K5): the prompt's
	// estimate (body bytes ÷ 4, set at admission) plus what the tunnel
	// relayed (one per event of an event stream, bytes ÷ 4 of another
	// body). A key is charged the larger of it and its estimate.
	MinTokens int64
	// Trace is the request's trace (trace.go).
	Trace Trace
}

func (rw *Recorder) WriteHeader(code int) {
	if !rw.wrote && code >= 200 {
		rw.wrote = true
		rw.Rec.Status = code
		rw.Rec.TTFB = time.Since(rw.Rec.Start)
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *Recorder) Write(p []byte) (int, error) {
	if !rw.wrote {
		rw.WriteHeader(http.StatusOK)
	}
	return rw.ResponseWriter.Write(p)
}

// FlushError flushes the response and reports the error, as net/http's
// writer does (Output.Flush relies on it).
func (rw *Recorder) FlushError() error {
	if !rw.wrote {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.flushErr != nil {
		return rw.flushErr()
	}
	return http.NewResponseController(rw.ResponseWriter).Flush()
}

func (rw *Recorder) Flush() { _ = rw.FlushError() }

// Unwrap lets http.ResponseController reach the server's writer (read
// deadlines).
func (rw *Recorder) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

// Fail notes the error written to the client (an error response, or an
// error event after bytes).
func (rw *Recorder) Fail(e *Error) {
	rw.failed = true
	rw.Rec.Code, rw.Rec.Error = e.Code, access.BoundError(e.Message)
}

// Cut notes that the response's body was cut (the connection is aborted).
func (rw *Recorder) Cut() { rw.failed = true }

// Leave notes that the client went away (a disconnect noticed while
// queued or streaming, or a failed write).
func (rw *Recorder) Leave() { rw.gone = true }

// Gone reports whether the client went away (Leave).
func (rw *Recorder) Gone() bool { return rw.gone }

// Wrote reports whether the status line went out.
func (rw *Recorder) Wrote() bool { return rw.wrote }

// Reported reports whether the provider reported token usage (SetUsage).
func (rw *Recorder) Reported() bool { return rw.usage }

// NoteError records e on w when w is the request's Recorder.
func NoteError(w http.ResponseWriter, e *Error) {
	if rw, ok := w.(*Recorder); ok {
		rw.Fail(e)
	}
}

// SetModel records the model a request names (known: a configured group)
// and counts it in flight on m (nil: none).
func (rw *Recorder) SetModel(model string, known bool, m *access.Metrics) {
	rw.Rec.Model = Truncate(model, access.MaxModelLen)
	rw.Rec.Known = known
	if m != nil && rw.inFlight == "" {
		rw.inFlight = access.ModelLabel(model, rw.Rec.Known)
		m.Begin(rw.inFlight)
	}
}

// SetLease records the lease a request runs on (nil with err, when
// Pool.Acquire gave none) and how long it waited: in the access record and
// as the trace's queue span.
func (rw *Recorder) SetLease(l *pool.Lease, waited time.Duration, err error) {
	rw.Rec.QueueWait += waited
	rw.Trace.queue(waited, l, err)
	if l == nil {
		return
	}
	rw.Rec.Node, rw.Rec.Provider = l.Node, l.Provider
	rw.Rec.Path = access.PathRun
	if l.Type == protocol.TypeOpenAICompat {
		rw.Rec.Path = access.PathTunnel
	}
}

// SetUsage records the token usage a provider reported (the latest report
// wins: a stream's usage grows).
func (rw *Recorder) SetUsage(u *iop.Usage) {
	if u == nil {
		return
	}
	rw.usage = true
	if u.PromptTokens > 0 {
		rw.Rec.PromptTokens = u.PromptTokens
	}
	if u.CompletionTokens > 0 {
		rw.Rec.CompletionTokens = u.CompletionTokens
	}
}

// SurfaceOther is the access record's surface of requests for no model
// endpoint (unknown paths).
const SurfaceOther = "other"

// Books are where each request's record goes: its id, its trace, its one
// access-log line and metrics sample. Every field may be nil but NewID.
type Books struct {
	NewID      func() string // a fresh request id when the client sent none
	Tracer     Tracer        // nil: tracing off
	TraceRatio float64       // the share of new traces sampled (0 to 1)
	AccessLog  *slog.Logger  // one "access" line per request
	Metrics    *access.Metrics
	Recent     *access.Recent
}

// Begin starts the accounting of one request: its id (the client's
// X-Request-Id, sanitized, or a new one), returned on the response whatever
// it turns out to be, and its trace (route: the endpoint's path, "" for an
// unknown one).
func (b *Books) Begin(w http.ResponseWriter, r *http.Request, start time.Time, route string) *Recorder {
	rw := &Recorder{ResponseWriter: w}
	if f, ok := w.(interface{ FlushError() error }); ok {
		rw.flushErr = f.FlushError
	}
	rw.Rec.Start = start
	rw.Rec.RequestID = access.RequestID(r.Header.Get(access.HeaderRequestID), b.NewID)
	rw.Rec.Surface = SurfaceOther
	w.Header().Set(access.HeaderRequestID, rw.Rec.RequestID)
	if b.Tracer != nil {
		rw.Trace.begin(r, b.TraceRatio, route)
	}
	if rw.Trace.on {
		rw.Rec.TraceID = rw.Trace.ctx.TraceID
	}
	return rw
}

// End writes the request's one access-log line and metrics sample.
func (b *Books) End(ctx context.Context, rw *Recorder) {
	r := &rw.Rec
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
	b.endTrace(rw, now)
	r.Log(ctx, b.AccessLog)
	if m := b.Metrics; m != nil {
		m.Observe(r)
		if rw.inFlight != "" {
			m.End(rw.inFlight)
		}
	}
	if b.Recent != nil {
		b.Recent.Add(r, now)
	}
}
