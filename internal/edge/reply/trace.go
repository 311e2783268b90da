package reply

import (
	"context"
	"errors"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	"iop/internal/edge/tracing"
	iop "iop/proto/gen/iop"
)

// Tracer takes the spans of every sampled request (internal/edge/tracing;
// *tracing.Exporter satisfies it): Export never blocks, Drop counts spans
// dropped before Export (a node's invalid ones).
type Tracer interface {
	Export(spans []tracing.Span)
	Drop(r tracing.DropReason, n int)
}

// Span names and attribute keys: the OpenTelemetry semantic conventions'
// (HTTP server spans, gen_ai.*) where they have one, iop.* for ours.
const (
	spanQueue        = "queue"
	spanAttempt      = "attempt"
	eventFirstByte   = "first_byte"
	attrAttempt      = "iop.attempt"
	attrRedispatched = "iop.redispatched"
)

// Trace is one request's trace (docs/operating.md "Tracing"), kept in
// its Recorder and owned by the request's goroutine. With tracing off it
// is the zero value and costs nothing; an unsampled request propagates its
// context (the backend sees the flag clear) and allocates no span; a
// sampled one collects its queue, attempt and node spans here and hands
// them, with the request's own span built from the access record, to the
// Tracer at the request's end.
type Trace struct {
	on bool // tracing is on: the context goes to the node on each attempt
	// ctx: the trace id, this request's span id (the parent of its queue
	// and attempt spans), the sampled flag and the client's tracestate.
	ctx    tracing.Context
	parent tracing.SpanID // the client's span (its traceparent), zero = a root
	method string         // http.request.method: a known method or _OTHER
	route  string         // http.route: the endpoint's path, "" for an unknown one
	// spans: sampled only (nil otherwise): the finished and current spans.
	spans   []tracing.Span
	attempt int  // index in spans of the current attempt span, -1 = none
	first   bool // the current attempt's first envelope arrived
	n       int  // attempts begun
}

// begin continues the client's W3C trace context when it is valid
// (its sampled flag decides), else starts a trace sampled at ratio
// (SPEC: docs/operating.md "Tracing"; W3C Trace Context §3.2); route is
// http.route ("" for an unknown path).
func (t *Trace) begin(r *http.Request, ratio float64, route string) {
	c, ok := tracing.Parse(r.Header[tracing.HeaderTraceparent], r.Header[tracing.HeaderTracestate])
	if ok {
		t.parent = c.SpanID
	} else {
		c = tracing.Context{TraceID: tracing.NewTraceID()}
		c.Sampled = tracing.Sample(c.TraceID, ratio)
	}
	c.SpanID = tracing.NewSpanID()
	t.on, t.ctx, t.attempt = true, c, -1
	if !c.Sampled {
		return
	}
	t.spans = make([]tracing.Span, 0, 4)
	switch r.Method {
	case http.MethodGet, http.MethodPost, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions:
		t.method = r.Method
	default:
		t.method = "_OTHER"
	}
	t.route = route
}

// span starts a span of the request's trace, a child of the request span.
func (t *Trace) span(name string, kind tracing.Kind, start time.Time) tracing.Span {
	return tracing.Span{TraceID: t.ctx.TraceID, SpanID: tracing.NewSpanID(), Parent: t.ctx.SpanID, State: t.ctx.State,
		Name: name, Kind: kind, Start: start}
}

// queue records one wait in Pool.Acquire that ended now after waited, with
// lease l or err.
func (t *Trace) queue(waited time.Duration, l *pool.Lease, err error) {
	if t.spans == nil {
		return
	}
	end := time.Now()
	s := t.span(spanQueue, tracing.KindInternal, end.Add(-waited))
	s.End = end
	result := "leased"
	if l == nil {
		result = queueResult(err)
		s.Error, s.Message = true, result
	}
	s.Attrs = []tracing.Attr{tracing.String("iop.queue.result", result), tracing.Int(attrAttempt, int64(t.n+1))}
	t.spans = append(t.spans, s)
}

// queueResult names why Pool.Acquire gave no lease (iop.queue.result).
func queueResult(err error) string {
	var qf *pool.QueueFullError
	var wt *pool.WaitTimeoutError
	switch {
	case errors.As(err, &qf), errors.Is(err, pool.ErrQueueFull):
		return "full"
	case errors.As(err, &wt), errors.Is(err, pool.ErrWaitTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, pool.ErrAllTried):
		return "all_tried"
	case errors.Is(err, pool.ErrUnavailable): // SPEC V1: a fallback decision follows
		return "unavailable"
	case errors.Is(err, pool.ErrUnknownModel):
		return "unknown_model"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return "no_lease"
}

// BeginAttempt starts the span of an attempt on lease l by path (run or
// tunnel) and returns the trace context the node gets (SPEC W5: an old
// node ignores it); nil with tracing off.
func (t *Trace) BeginAttempt(l *pool.Lease, path string) *iop.TraceContext {
	if !t.on {
		return nil
	}
	t.n++
	id := tracing.NewSpanID()
	if t.spans != nil {
		s := t.span(spanAttempt, tracing.KindClient, time.Now())
		s.SpanID = id
		s.Attrs = []tracing.Attr{tracing.Int(attrAttempt, int64(t.n)), tracing.String("iop.node", l.Node),
			tracing.String("iop.provider", l.Provider), tracing.String("iop.target", l.Target), tracing.String("iop.path", path),
			tracing.String("iop.served_model", l.Model)} // SPEC V1: the group that served it (a fallback's)
		t.attempt, t.first = len(t.spans), false
		t.spans = append(t.spans, s)
	}
	return &iop.TraceContext{TraceId: t.ctx.TraceID[:], ParentSpanId: id[:], Sampled: t.ctx.Sampled, Tracestate: t.ctx.State}
}

// Envelope notes an envelope of the current attempt on lease l: the first
// one is the attempt's first_byte event; a terminal's relayed node spans
// (tracing.NodeSpans: checked, anchored at the attempt's start, clamped to
// its window) join the trace, the dropped ones counted on tr.
func (t *Trace) Envelope(terminal bool, spans []*iop.NodeSpan, l *pool.Lease, tr Tracer) {
	if t.attempt < 0 {
		return
	}
	a := &t.spans[t.attempt]
	if !t.first {
		t.first = true
		a.Events = append(a.Events, tracing.Event{Name: eventFirstByte, Time: time.Now()})
	}
	if terminal && len(spans) > 0 {
		out, dropped := tracing.NodeSpans(a, time.Now(), l.Node, l.Provider, l.Target, spans)
		tr.Drop(tracing.DropNodeInvalid, dropped)
		t.spans = append(t.spans, out...)
	}
}

// EndAttempt ends the current attempt's span: failed says with which
// code, redispatched that another attempt follows.
func (t *Trace) EndAttempt(failed string, redispatched bool) {
	if t.attempt < 0 {
		return
	}
	a := &t.spans[t.attempt]
	a.End = time.Now()
	if failed != "" {
		a.Error, a.Message = true, failed
	}
	if redispatched {
		a.Attrs = append(a.Attrs, tracing.Bool(attrRedispatched, true))
	}
	t.attempt = -1
}

// endTrace builds the request's span from its access record r and hands
// the request's spans to the Tracer (sampled requests only).
func (b *Books) endTrace(rw *Recorder, end time.Time) {
	t := &rw.Trace
	if t.spans == nil {
		return
	}
	t.EndAttempt("", false) // an attempt still open (the handler aborted)
	r := &rw.Rec
	s := tracing.Span{TraceID: t.ctx.TraceID, SpanID: t.ctx.SpanID, Parent: t.parent, State: t.ctx.State,
		Name: t.method, Kind: tracing.KindServer, Start: r.Start, End: end}
	if t.route != "" {
		s.Name = t.method + " " + t.route
	}
	a := make([]tracing.Attr, 0, 16)
	a = append(a, tracing.String("http.request.method", t.method))
	if t.route != "" {
		a = append(a, tracing.String("http.route", t.route))
	}
	a = append(a, tracing.Int("http.response.status_code", int64(r.Status)),
		tracing.String("iop.request_id", r.RequestID), tracing.String("iop.surface", r.Surface),
		tracing.String("iop.outcome", string(r.Outcome)))
	if r.Model != "" {
		a = append(a, tracing.String("gen_ai.request.model", access.ModelLabel(r.Model, r.Known)))
	}
	if r.Principal != "" {
		a = append(a, tracing.String("iop.principal", r.Principal))
	}
	path := r.Path
	if path == "" {
		path = access.PathNone
	}
	a = append(a, tracing.String("iop.path", path))
	if r.Code != "" {
		a = append(a, tracing.String("iop.code", r.Code))
	}
	if r.Retries > 0 {
		a = append(a, tracing.Int("iop.retries", int64(r.Retries)))
	}
	if r.PromptTokens > 0 {
		a = append(a, tracing.Int("gen_ai.usage.input_tokens", r.PromptTokens))
	}
	if r.CompletionTokens > 0 {
		a = append(a, tracing.Int("gen_ai.usage.output_tokens", r.CompletionTokens))
	}
	s.Attrs = a
	if rw.wrote {
		s.Events = []tracing.Event{{Name: eventFirstByte, Time: r.Start.Add(r.TTFB)}}
	}
	// OpenTelemetry's HTTP server rule: a 5xx is the server's error, a 4xx
	// the client's (status unset); an error event after a 2xx head is an
	// error too, a client leaving is not.
	if r.Status >= 500 || r.Status < 400 && rw.failed && !rw.gone {
		s.Error, s.Message = true, r.Code
		if s.Message == "" {
			s.Message = string(r.Outcome)
		}
	}
	b.Tracer.Export(append(t.spans, s))
	t.spans = nil
}

// Sampled reports whether the request's spans are collected (a sampled
// trace); an unsampled one only propagates its context.
func (t *Trace) Sampled() bool { return t.spans != nil }
