package adapter_test

import (
	"context"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	iop "iop/proto/gen/iop"
)

// The node's side of a trace (docs/operating.md "Tracing"; W3C Trace
// Context): with a sampled TraceContext the upstream request carries
// "traceparent: 00-{trace}-{upstream span}-01" and the tracestate, and the
// terminal relays the node's span (parent: the Edge's attempt) and the
// upstream span (parent: the node's span, the backend's status and first
// byte); unsampled, the header says -00 and no span is relayed; without a
// context, or with an invalid one, nothing is sent.
func TestTraceRunAndTunnel(t *testing.T) {
	leakcheck.Check(t)
	tid := []byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	parent := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	ollama := newFake(t, replay(200, "application/x-ndjson", sample(t, "ollama_api_chat_stream.ndjson")))
	compat := newFake(t, replay(200, "application/json", []byte(`{"choices":[]}`)))
	s := newSet(t, adapter.Options{}, ollamaAdapter("ollama", ollama.URL, 2), compatAdapter("compat", llamaProfile(compat.URL), 2))
	for _, tc := range []struct {
		name        string
		trace       *iop.TraceContext
		header      string // the traceparent's flags, "" = no header
		spans       bool
		wantState   string
		tunnel      bool
		upstreamFor string
	}{
		{"run sampled", &iop.TraceContext{TraceId: tid, ParentSpanId: parent, Sampled: true, Tracestate: "congo=t61"}, "-01", true, "congo=t61", false, "/api/chat"},
		{"tunnel sampled", &iop.TraceContext{TraceId: tid, ParentSpanId: parent, Sampled: true}, "-01", true, "", true, "/v1/chat/completions"},
		{"run unsampled", &iop.TraceContext{TraceId: tid, ParentSpanId: parent}, "-00", false, "", false, ""},
		{"tunnel untraced", nil, "", false, "", true, ""},
		{"short trace id", &iop.TraceContext{TraceId: tid[:8], ParentSpanId: parent, Sampled: true}, "", false, "", false, ""},
		{"zero parent", &iop.TraceContext{TraceId: tid, ParentSpanId: make([]byte, 8), Sampled: true}, "", false, "", true, ""},
		{"tracestate with a newline", &iop.TraceContext{TraceId: tid, ParentSpanId: parent, Sampled: true, Tracestate: "a=b\r\nx: y"}, "", false, "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spans []*iop.NodeSpan
			up := ollama
			if tc.tunnel {
				up = compat
				frs := tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "compat", Target: "tiny",
					Operation: "chat_completions", Body: []byte(`{"model":"tiny"}`), Trace: tc.trace})
				last, status, _, _ := checkTunnel(t, frs)
				if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || status != 200 {
					t.Fatalf("tunnel ended %v %d", last.GetKind(), status)
				}
				spans = last.GetTraceSpans()
			} else {
				last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "ollama", Stream: true, Target: "tiny",
					Input: userInput("Hi"), Trace: tc.trace}))
				if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
					t.Fatalf("run ended %v %q", last.GetType(), last.GetError())
				}
				spans = last.GetTraceSpans()
			}
			reqs := up.requests()
			h := reqs[len(reqs)-1].Header
			got := h.Get("Traceparent")
			if tc.header == "" {
				if got != "" || h.Get("Tracestate") != "" {
					t.Fatalf("traceparent %q tracestate %q sent, want none", got, h.Get("Tracestate"))
				}
				if len(spans) != 0 {
					t.Fatalf("%d spans relayed, want none", len(spans))
				}
				return
			}
			if !strings.HasPrefix(got, "00-"+hex.EncodeToString(tid)+"-") || !strings.HasSuffix(got, tc.header) || len(got) != 55 {
				t.Fatalf("traceparent %q, want 00-<trace>-<span>%s", got, tc.header)
			}
			if h.Get("Tracestate") != tc.wantState {
				t.Errorf("tracestate %q, want %q", h.Get("Tracestate"), tc.wantState)
			}
			if !tc.spans {
				if len(spans) != 0 {
					t.Fatalf("%d spans relayed unsampled", len(spans))
				}
				return
			}
			if len(spans) != 2 {
				t.Fatalf("%d spans, want the node's and the upstream's: %+v", len(spans), spans)
			}
			node, upSpan := spans[0], spans[1]
			wantKind := iop.NodeSpanKind_NODE_SPAN_RUN
			if tc.tunnel {
				wantKind = iop.NodeSpanKind_NODE_SPAN_TUNNEL
			}
			if node.GetKind() != wantKind || string(node.GetParentSpanId()) != string(parent) || node.GetFailureCode() != "" {
				t.Errorf("node span %+v", node)
			}
			if upSpan.GetKind() != iop.NodeSpanKind_NODE_SPAN_UPSTREAM || string(upSpan.GetParentSpanId()) != string(node.GetSpanId()) ||
				upSpan.GetMethod() != http.MethodPost || upSpan.GetPath() != tc.upstreamFor || upSpan.GetStatusCode() != 200 ||
				upSpan.GetFirstByteNs() <= 0 || upSpan.GetStartOffsetNs()+upSpan.GetDurationNs() > node.GetDurationNs() {
				t.Errorf("upstream span %+v under node span %+v", upSpan, node)
			}
			if want := hex.EncodeToString(upSpan.GetSpanId()); got[36:52] != want {
				t.Errorf("traceparent parent-id %s, want the upstream span %s", got[36:52], want)
			}
		})
	}
}
