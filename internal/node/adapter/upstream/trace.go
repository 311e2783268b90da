package upstream

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"
)

// W3C Trace Context header names (§3.2, §3.3).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Trace is the W3C trace context of one traced provider call and what its
// HTTP requests observed (the node's upstream span, adapter's
// spanRecorder). Every request made under a context carrying it
// (WithTrace) sends its traceparent and tracestate; a tunnel's client
// headers never carry their own (the tunnel's header allow-list, SPEC
// T4). Its methods are safe for concurrent use.
type Trace struct {
	traceparent, tracestate string
	mu                      sync.Mutex
	method, path            string    // of the last request built
	status                  int       // of the last response head; 0 = none
	sent, head              time.Time // the first request sent, the first response head
}

// NewTrace returns a Trace whose requests send traceparent (and
// tracestate unless ""); both must be valid header values.
func NewTrace(traceparent, tracestate string) *Trace {
	return &Trace{traceparent: traceparent, tracestate: tracestate}
}

type traceKey struct{}

// WithTrace returns ctx carrying t for every upstream request made under
// it; a nil t leaves ctx as it is.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	if t == nil {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, t)
}

func traceOf(ctx context.Context) *Trace {
	t, _ := ctx.Value(traceKey{}).(*Trace)
	return t
}

// request sets the trace headers on h and notes the request's method and
// path (rel without its query).
func (t *Trace) request(h http.Header, method, rel string) {
	h[HeaderTraceparent] = []string{t.traceparent}
	if t.tracestate != "" {
		h[HeaderTracestate] = []string{t.tracestate}
	}
	p, _, _ := strings.Cut(rel, "?")
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	t.mu.Lock()
	t.method, t.path = method, p
	t.mu.Unlock()
}

func (t *Trace) sending() {
	t.mu.Lock()
	if t.sent.IsZero() {
		t.sent = time.Now()
	}
	t.mu.Unlock()
}

func (t *Trace) answered(status int) {
	t.mu.Lock()
	if t.head.IsZero() {
		t.head = time.Now()
	}
	t.status = status
	t.mu.Unlock()
}

// Observed returns what the call's requests observed: the last request's
// method and path, the last response status (0 = none), when the first
// request was sent (zero = none was) and when the first response head came
// (zero = none did).
func (t *Trace) Observed() (method, path string, status int, sent, head time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.method, t.path, t.status, t.sent, t.head
}
