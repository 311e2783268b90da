package sdk

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// otlpSpan is one span as the OpenTelemetry collector's own OTLP JSON
// unmarshaler (pdata/ptrace) read it.
type otlpSpan struct {
	service, instance string
	span              ptrace.Span
}

// otlpCollector is an OTLP/HTTP receiver for traces in the JSON encoding,
// decoding with the collector's pdata: an export it cannot read fails the
// test (hex ids, string integers, field names: the OTLP specification's
// JSON mapping, not the Edge's own idea of it).
type otlpCollector struct {
	url   string
	mu    sync.Mutex
	spans []otlpSpan
}

func newOTLPCollector(t *testing.T) *otlpCollector {
	c := &otlpCollector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("export to %s as %q", r.URL.Path, r.Header.Get("Content-Type"))
		}
		td, err := (&ptrace.JSONUnmarshaler{}).UnmarshalTraces(body)
		if err != nil {
			t.Errorf("the collector's OTLP JSON unmarshaler refused the export: %v\n%s", err, body)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for i := 0; i < td.ResourceSpans().Len(); i++ {
			rs := td.ResourceSpans().At(i)
			svc, _ := rs.Resource().Attributes().Get("service.name")
			inst, _ := rs.Resource().Attributes().Get("service.instance.id")
			for j := 0; j < rs.ScopeSpans().Len(); j++ {
				ss := rs.ScopeSpans().At(j)
				for k := 0; k < ss.Spans().Len(); k++ {
					c.spans = append(c.spans, otlpSpan{service: svc.Str(), instance: inst.Str(), span: ss.Spans().At(k)})
				}
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

// trace waits (≤ 15 s) for want spans of trace tid.
func (c *otlpCollector) trace(t *testing.T, tid string, want int) []otlpSpan {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var got []otlpSpan
		c.mu.Lock()
		for _, s := range c.spans {
			if s.span.TraceID().String() == tid {
				got = append(got, s)
			}
		}
		c.mu.Unlock()
		if len(got) >= want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s: %d spans arrived, want %d", tid, len(got), want)
		}
		time.Sleep(50 * time.Millisecond) // a bounded poll of the collector's list
	}
}

// TestTracingOTLP: the spans bin/edge and bin/node export for a request
// on the run path ("tiny") and one on the tunnel path ("tiny-oa"), sent by
// the official OpenAI SDK with a W3C traceparent, decode with the
// OpenTelemetry collector's own OTLP JSON unmarshaler and form one trace:
// the request span (SERVER, iop-edge) the child of the client's span, the
// queue and attempt spans its children, the node's span (SERVER, resource
// iop-node gpu-1) the attempt's child and the upstream call (CLIENT) the
// node span's.
func TestTracingOTLP(t *testing.T) {
	col := newOTLPCollector(t)
	s := newStack(t, withConfig(func(ec, _ map[string]any) {
		ec["tracing"] = map[string]any{"otlp_endpoint": col.url}
	}))
	for i, model := range []string{"tiny", "tiny-oa"} {
		t.Run(model, func(t *testing.T) {
			tid := fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e47%02x", i)
			const parent = "00f067aa0ba902b7"
			_, err := s.openai(option.WithHeader("traceparent", "00-"+tid+"-"+parent+"-01"),
				option.WithHeader("tracestate", "congo=t61rcWkgMzE")).Chat.Completions.New(reqCtx(t), helloParams(model))
			if err != nil {
				t.Fatalf("Chat.Completions.New(%s): %v", model, err)
			}
			spans := col.trace(t, tid, 5)
			byParent := map[string][]otlpSpan{}
			var req *otlpSpan
			for i := range spans {
				sp := spans[i].span
				if sp.TraceState().AsRaw() != "congo=t61rcWkgMzE" {
					t.Errorf("%s: traceState %q", sp.Name(), sp.TraceState().AsRaw())
				}
				if sp.SpanID().IsEmpty() || sp.EndTimestamp() < sp.StartTimestamp() || sp.StartTimestamp() == 0 {
					t.Errorf("%s: id %s, times %d..%d", sp.Name(), sp.SpanID(), sp.StartTimestamp(), sp.EndTimestamp())
				}
				byParent[sp.ParentSpanID().String()] = append(byParent[sp.ParentSpanID().String()], spans[i])
				if sp.Name() == "POST /v1/chat/completions" && spans[i].service == "iop-edge" {
					req = &spans[i]
				}
			}
			if req == nil || req.service != "iop-edge" || req.span.Kind() != ptrace.SpanKindServer || req.span.ParentSpanID().String() != parent {
				for _, s := range spans {
					t.Logf("%s %s kind %v parent %s", s.service, s.span.Name(), s.span.Kind(), s.span.ParentSpanID())
				}
				t.Fatalf("no SERVER request span under the client's %s", parent)
			}
			if st, _ := req.span.Attributes().Get("http.response.status_code"); st.Int() != 200 {
				t.Errorf("request span status %v", st.AsRaw())
			}
			var attempt *otlpSpan
			for i, c := range byParent[req.span.SpanID().String()] {
				switch c.span.Name() {
				case "attempt":
					attempt = &byParent[req.span.SpanID().String()][i]
				case "queue":
				default:
					t.Errorf("unexpected child %q of the request span", c.span.Name())
				}
			}
			if attempt == nil || attempt.span.Kind() != ptrace.SpanKindClient {
				t.Fatalf("no attempt span under the request span: %+v", byParent)
			}
			nodes := byParent[attempt.span.SpanID().String()]
			if len(nodes) != 1 || nodes[0].service != "iop-node" || nodes[0].instance != "gpu-1" || nodes[0].span.Kind() != ptrace.SpanKindServer {
				t.Fatalf("node spans under the attempt: %+v", nodes)
			}
			ups := byParent[nodes[0].span.SpanID().String()]
			if len(ups) != 1 || ups[0].span.Kind() != ptrace.SpanKindClient || ups[0].span.Status().Code() == ptrace.StatusCodeError {
				t.Fatalf("upstream spans under %s: %+v", nodes[0].span.Name(), ups)
			}
			t.Logf("%s: %s → %s → %s → %s (%s)", model, req.span.Name(), attempt.span.Name(), nodes[0].span.Name(), ups[0].span.Name(),
				time.Duration(ups[0].span.EndTimestamp()-ups[0].span.StartTimestamp()))
		})
	}
}
