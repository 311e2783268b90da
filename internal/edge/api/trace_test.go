package api

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"iop/internal/edge/config"
	"iop/internal/edge/pool"
	"iop/internal/edge/tracing"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// fakeTracer records what the Handler exports.
type fakeTracer struct {
	mu      sync.Mutex
	batches [][]tracing.Span
	dropped map[tracing.DropReason]int
}

func (f *fakeTracer) Export(s []tracing.Span) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, s)
}

func (f *fakeTracer) Drop(r tracing.DropReason, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped == nil {
		f.dropped = map[tracing.DropReason]int{}
	}
	f.dropped[r] += n
}

func (f *fakeTracer) last(t *testing.T) []tracing.Span {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) == 0 {
		t.Fatal("nothing exported")
	}
	return f.batches[len(f.batches)-1]
}

// tracedRig is newRig with a Tracer at ratio.
func tracedRig(t *testing.T, typ string, ratio float64) (*rig, *fakeTracer) {
	r := &rig{fp: newFakePool(typ), st: newFakeStream("run-1"), cfg: testConfig(nil)}
	r.p, r.d = r.fp, newFakeDispatcher(r.st)
	ft := &fakeTracer{}
	cfg := r.cfg
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(),
		Tracer: ft, TraceRatio: ratio})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	t.Cleanup(r.st.kill)
	return r, ft
}

func byName(spans []tracing.Span, name string) []tracing.Span {
	var out []tracing.Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

const tracedChat = `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`

// W5: the trace context rides the RunRequest (the attempt span is the
// node's parent); a terminal without spans — an old node — leaves the
// request, queue and attempt spans; a node's span that breaks a bound is
// dropped and counted, the valid one kept under the attempt.
func TestTraceRunRequest(t *testing.T) {
	r, ft := tracedRig(t, protocol.TypeOllama, 1)
	r.st.run(evStart(), evComplete(2, "hello", "stop", nil, nil))
	resp, body := r.do(t, "POST", "/v1/chat/completions", tracedChat,
		"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate", "congo=t61")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	tc := r.d.lastRun().GetTrace()
	spans := ft.last(t)
	if len(spans) != 3 {
		t.Fatalf("%d spans, want request, queue, attempt: %+v", len(spans), spans)
	}
	req, att := byName(spans, "POST /v1/chat/completions")[0], byName(spans, "attempt")[0]
	if req.TraceID.String() != "4bf92f3577b34da6a3ce929d0e0e4736" || req.Parent.String() != "00f067aa0ba902b7" || req.State != "congo=t61" {
		t.Errorf("request span %+v, want the client's trace as parent", req)
	}
	if string(tc.GetTraceId()) != string(req.TraceID[:]) || string(tc.GetParentSpanId()) != string(att.SpanID[:]) || !tc.GetSampled() ||
		tc.GetTracestate() != "congo=t61" {
		t.Errorf("RunRequest.trace %+v, want the trace, the attempt span %s, sampled, the tracestate", tc, att.SpanID)
	}
	if att.Parent != req.SpanID || byName(spans, "queue")[0].Parent != req.SpanID || len(att.Events) != 1 {
		t.Errorf("attempt %+v", att)
	}

	// A node relaying one good span and one with a foreign parent.
	r2, ft2 := tracedRig(t, protocol.TypeOllama, 1)
	go func() {
		<-r2.d.started
		tc := r2.d.lastRun().GetTrace()
		done := evComplete(2, "hello", "stop", nil, nil)
		done.TraceSpans = []*iop.NodeSpan{
			{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: []byte{1, 2, 3, 4, 5, 6, 7, 8}, ParentSpanId: tc.GetParentSpanId()},
			{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: []byte{8, 7, 6, 5, 4, 3, 2, 1}, ParentSpanId: []byte{9, 9, 9, 9, 9, 9, 9, 9}},
		}
		r2.st.run(evStart(), done)
	}()
	if resp, body := r2.do(t, "POST", "/v1/chat/completions", tracedChat); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	spans = ft2.last(t)
	nodes := byName(spans, "node run")
	if len(nodes) != 1 || nodes[0].Parent != byName(spans, "attempt")[0].SpanID || nodes[0].Node != "n1" {
		t.Errorf("node spans %+v, want the one under the attempt, on n1", nodes)
	}
	if ft2.dropped[tracing.DropNodeInvalid] != 1 {
		t.Errorf("node_invalid %d, want 1", ft2.dropped[tracing.DropNodeInvalid])
	}
	if req := byName(spans, "POST /v1/chat/completions")[0]; !req.Parent.IsZero() {
		t.Errorf("request without traceparent has parent %s, want a root", req.Parent)
	}
}

// Parent-based sampling and tracing off: an unsampled request propagates
// its context (flag clear) and exports nothing; with no Tracer the
// request carries no context at all.
func TestTraceUnsampledAndOff(t *testing.T) {
	r, ft := tracedRig(t, protocol.TypeOpenAICompat, 0)
	r.st.frames(fStart(200, "Content-Type", "application/json"), fBody([]byte(`{}`)), fEnd())
	if resp, body := r.do(t, "POST", "/v1/chat/completions", tracedChat); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	tc := r.d.lastTunnel().GetTrace()
	if tc == nil || tc.GetSampled() || len(tc.GetTraceId()) != 16 || len(tc.GetParentSpanId()) != 8 {
		t.Errorf("tunnel trace %+v, want a propagated unsampled context", tc)
	}
	if len(ft.batches) != 0 {
		t.Errorf("%d batches exported for an unsampled request", len(ft.batches))
	}
	off := newRig(t, protocol.TypeOpenAICompat, nil)
	off.st.frames(fStart(200, "Content-Type", "application/json"), fBody([]byte(`{}`)), fEnd())
	off.do(t, "POST", "/v1/chat/completions", tracedChat, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if tc := off.d.lastTunnel().GetTrace(); tc != nil {
		t.Errorf("tracing off sent %+v", tc)
	}
}

// The request span's status follows OpenTelemetry's HTTP server rule: a
// 4xx leaves it unset, a 5xx is an error.
func TestTraceRequestStatus(t *testing.T) {
	r, ft := tracedRig(t, protocol.TypeOllama, 1)
	if resp, _ := r.do(t, "POST", "/v1/chat/completions", `{"model":"tiny"}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if s := ft.last(t); len(s) != 1 || s[0].Error || s[0].Kind != tracing.KindServer {
		t.Errorf("400: %+v, want one SERVER span, status unset", s)
	}
	r.fp.err = errNoLease
	if resp, _ := r.do(t, "POST", "/v1/chat/completions", tracedChat); resp.StatusCode < 500 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	s := ft.last(t)
	req, q := byName(s, "POST /v1/chat/completions"), byName(s, "queue")
	if len(req) != 1 || !req[0].Error || len(q) != 1 || !q[0].Error {
		t.Errorf("5xx: %+v, want the request and queue spans errors", s)
	}
}

// errNoLease is a queue wait that ran out (503 no_provider_available).
var errNoLease = pool.ErrWaitTimeout
