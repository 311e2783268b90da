package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// gotSpan is one span as an in-process collector decoded it from the
// Edge's OTLP/HTTP JSON export (docs/operating.md "Tracing").
type gotSpan struct {
	service, node                  string // resource service.name and service.instance.id
	traceID, spanID, parent, state string
	name                           string
	kind                           int
	start, end                     int64
	attrs                          map[string]string // every value as written (intValue strings, bools as true/false)
	events                         []string
	errored                        bool
	message                        string
}

// collector is an OTLP/HTTP JSON trace collector from httptest: it decodes
// every export request into gotSpans. hold, when set, makes it hold each
// request until the test ends (a collector that never answers).
type collector struct {
	url   string
	spans *recorder[gotSpan]
	mu    sync.Mutex
	posts int
}

func startCollector(t *testing.T, hold bool) *collector {
	c := &collector{spans: newRecorder[gotSpan]()}
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.posts++
		c.mu.Unlock()
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("export to %s as %q", r.URL.Path, r.Header.Get("Content-Type"))
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if hold {
			select {
			case <-stop:
			case <-r.Context().Done():
			}
			return
		}
		for _, s := range decodeExport(t, body) {
			c.spans.add(s)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(func() { close(stop); srv.Close() })
	c.url = srv.URL
	return c
}

func (c *collector) requests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posts
}

func decodeExport(t *testing.T, body []byte) []gotSpan {
	type anyValue struct {
		StringValue *string `json:"stringValue"`
		IntValue    *string `json:"intValue"`
		BoolValue   *bool   `json:"boolValue"`
	}
	type kv struct {
		Key   string   `json:"key"`
		Value anyValue `json:"value"`
	}
	str := func(v anyValue) string {
		switch {
		case v.StringValue != nil:
			return *v.StringValue
		case v.IntValue != nil:
			return *v.IntValue
		case v.BoolValue != nil:
			return strconv.FormatBool(*v.BoolValue)
		}
		return "?"
	}
	var req struct {
		ResourceSpans []struct {
			Resource struct {
				Attributes []kv `json:"attributes"`
			} `json:"resource"`
			ScopeSpans []struct {
				Spans []struct {
					TraceID      string `json:"traceId"`
					SpanID       string `json:"spanId"`
					ParentSpanID string `json:"parentSpanId"`
					TraceState   string `json:"traceState"`
					Name         string `json:"name"`
					Kind         int    `json:"kind"`
					Start        string `json:"startTimeUnixNano"`
					End          string `json:"endTimeUnixNano"`
					Attributes   []kv   `json:"attributes"`
					Events       []struct {
						Name string `json:"name"`
					} `json:"events"`
					Status *struct {
						Code    int    `json:"code"`
						Message string `json:"message"`
					} `json:"status"`
				} `json:"spans"`
			} `json:"scopeSpans"`
		} `json:"resourceSpans"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Errorf("export body is not OTLP JSON: %v\n%s", err, body)
		return nil
	}
	var out []gotSpan
	for _, rs := range req.ResourceSpans {
		res := map[string]string{}
		for _, a := range rs.Resource.Attributes {
			res[a.Key] = str(a.Value)
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				g := gotSpan{service: res["service.name"], node: res["service.instance.id"], traceID: s.TraceID, spanID: s.SpanID,
					parent: s.ParentSpanID, state: s.TraceState, name: s.Name, kind: s.Kind, attrs: map[string]string{}}
				g.start, _ = strconv.ParseInt(s.Start, 10, 64)
				g.end, _ = strconv.ParseInt(s.End, 10, 64)
				for _, a := range s.Attributes {
					g.attrs[a.Key] = str(a.Value)
				}
				for _, e := range s.Events {
					g.events = append(g.events, e.Name)
				}
				if s.Status != nil && s.Status.Code == 2 {
					g.errored, g.message = true, s.Status.Message
				}
				out = append(out, g)
			}
		}
	}
	return out
}

// trace waits for the spans of the request with X-Request-Id id: its
// request span and every span of the same trace, once want of them came.
func (c *collector) trace(t *testing.T, id string, want int) []gotSpan {
	t.Helper()
	var got []gotSpan
	_, err := c.spans.waitFor(10*time.Second, func(all []gotSpan) bool {
		got = got[:0]
		tid := ""
		for _, s := range all {
			if s.attrs["iop.request_id"] == id {
				tid = s.traceID
			}
		}
		for _, s := range all {
			if tid != "" && s.traceID == tid {
				got = append(got, s)
			}
		}
		return len(got) >= want
	})
	if err != nil {
		t.Fatalf("request %s: %d spans arrived, want %d: %+v", id, len(got), want, got)
	}
	return got
}

// traceparents records the traceparent and tracestate each request to the
// backend carried.
type traceparents struct {
	next http.Handler
	mu   sync.Mutex
	seen []string
}

func (h *traceparents) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.seen = append(h.seen, r.Header.Get("Traceparent")+" "+r.Header.Get("Tracestate"))
	h.mu.Unlock()
	h.next.ServeHTTP(w, r)
}

func (h *traceparents) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) == 0 {
		return ""
	}
	return h.seen[len(h.seen)-1]
}

// only returns the only span named name whose service (when service is
// set) or parent (when parent is set) matches, failing otherwise.
func only(t *testing.T, spans []gotSpan, name, service, parent string) gotSpan {
	t.Helper()
	var found []gotSpan
	for _, s := range spans {
		if s.name == name && (service == "" || s.service == service) && (parent == "" || s.parent == parent) {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans %q (service %q, parent %q), want 1: %+v", len(found), name, service, parent, spans)
	}
	return found[0]
}

func all(spans []gotSpan, name string) []gotSpan {
	var out []gotSpan
	for _, s := range spans {
		if s.name == name {
			out = append(out, s)
		}
	}
	return out
}

// tracedStack starts a backend behind a traceparent recorder, an Edge
// exporting to col at ratio 1 and node gpu-1 serving models:
// "tiny" (run path, ollama), "tiny-oa" (tunnel path, llamacpp) and
// "retry" (ordered: an ollama adapter nothing listens on, then the good
// one).
func tracedStack(t *testing.T, col *collector, tweak func(*config.Tracing)) (*apiClient, *adminClient, *traceparents) {
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	tp := &traceparents{next: bp.b}
	url := bp.serve(t, tp)
	retry := modelGroup("retry", provider("gpu-1", "dead", "tiny"), provider("gpu-1", "ollama", "tiny"))
	retry.Routing = "ordered"
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{
		ollamaAdapter("ollama", url, 8), compatAdapter("compat", url, 8), ollamaAdapter("dead", closedURL(t), 8)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny")), modelGroup("tiny-oa", provider("gpu-1", "compat", "tiny")), retry},
		func(c *config.Config) {
			off := false
			c.OutlierDetection.Enabled = &off
			c.Tracing.OTLPEndpoint = col.url
			if tweak != nil {
				tweak(&c.Tracing)
			}
		})
	_, adm, api := startReady(t, p, cfg, logs)
	return api, adm, tp
}

// chatTraced posts a chat request with X-Request-Id id and the given
// trace headers ("" = none) and returns its status and body.
func chatTraced(t *testing.T, api *apiClient, model, id, traceparent, tracestate string, stream bool) (int, string) {
	t.Helper()
	body := chatRequest{model: model, stream: stream}.body()
	req, err := http.NewRequest(http.MethodPost, api.url+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	if tracestate != "" {
		req.Header.Set("tracestate", tracestate)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := api.hc.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read: %v", id, err)
	}
	return resp.StatusCode, string(b)
}

// A run request (ollama adapter), a tunnel request (llamacpp adapter) and
// a re-dispatched request (the first provider refuses the connection,
// SPEC H11) arrive at the collector as one trace each: the request span
// (SERVER) as the root or as the child of the client's traceparent, its
// queue and attempt spans as its children, the node's span (SERVER, resource
// iop-node gpu-1) as the attempt's child and the upstream span (CLIENT) as
// the node span's; the backend's request carries a traceparent naming the
// upstream span and the client's tracestate (W3C Trace Context).
func TestTracingSpans(t *testing.T) {
	leakcheck.Check(t)
	col := startCollector(t, false)
	api, adm, tp := tracedStack(t, col, nil)
	const clientSpan = "00f067aa0ba902b7"
	n := 0

	type want struct {
		model, upstream, nodeSpan, path string
		parent                          bool // the client sends a traceparent
		attempts                        int
	}
	for _, tc := range []want{
		{"tiny", "POST /api/chat", "node run", "run", true, 1},
		{"tiny-oa", "POST /v1/chat/completions", "node tunnel", "tunnel", false, 1},
		{"retry", "POST /api/chat", "node run", "run", false, 2},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", tc.model, stream), func(t *testing.T) {
				id := fmt.Sprintf("trace-%s-%v", tc.model, stream)
				n++
				clientTrace := fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e47%02x", n)
				parent, state := "", ""
				if tc.parent {
					parent, state = "00-"+clientTrace+"-"+clientSpan+"-01", "congo=t61rcWkgMzE"
				}
				status, body := chatTraced(t, api, tc.model, id, parent, state, stream)
				if status != http.StatusOK {
					t.Fatalf("status %d: %s", status, body)
				}
				// The request span, and per attempt its queue, attempt, node
				// and upstream spans (a refused connection was a request
				// sent too).
				spans := col.trace(t, id, 1+4*tc.attempts)
				req := only(t, spans, "POST /v1/chat/completions", "iop-edge", "")
				if req.kind != 2 || req.attrs["http.response.status_code"] != "200" || req.attrs["gen_ai.request.model"] != tc.model ||
					req.attrs["iop.path"] != tc.path || req.attrs["iop.outcome"] != "ok" || req.errored {
					t.Errorf("request span %+v", req)
				}
				if tc.parent {
					if req.traceID != clientTrace || req.parent != clientSpan || req.state != "congo=t61rcWkgMzE" {
						t.Errorf("request span trace %s parent %s state %q, want the client's", req.traceID, req.parent, req.state)
					}
				} else if req.parent != "" {
					t.Errorf("request span parent %q, want a root", req.parent)
				}
				queues, attempts := all(spans, "queue"), all(spans, "attempt")
				if len(queues) != tc.attempts || len(attempts) != tc.attempts {
					t.Fatalf("%d queue and %d attempt spans, want %d each: %+v", len(queues), len(attempts), tc.attempts, spans)
				}
				for _, s := range append(queues, attempts...) {
					if s.parent != req.spanID {
						t.Errorf("%s span's parent %s, want the request span %s", s.name, s.parent, req.spanID)
					}
				}
				last := attempts[len(attempts)-1]
				node := only(t, spans, tc.nodeSpan, "", last.spanID)
				if node.parent != last.spanID || node.node != "gpu-1" || node.kind != 2 || node.errored {
					t.Errorf("node span %+v, want a SERVER child of the last attempt %s on gpu-1", node, last.spanID)
				}
				up := only(t, spans, tc.upstream, "", node.spanID)
				if up.service != "iop-node" || up.parent != node.spanID || up.kind != 3 || up.attrs["http.response.status_code"] != "200" || len(up.events) != 1 {
					t.Errorf("upstream span %+v, want a CLIENT child of the node span %s with status 200 and first_byte", up, node.spanID)
				}
				if up.start < last.start || up.end > last.end || node.start < last.start || node.end > last.end {
					t.Errorf("node spans [%d,%d] [%d,%d] outside the attempt [%d,%d]", node.start, node.end, up.start, up.end, last.start, last.end)
				}
				wantTP := "00-" + req.traceID + "-" + up.spanID + "-01 " + state
				if got := tp.last(); got != wantTP {
					t.Errorf("backend got traceparent/tracestate %q, want %q", got, wantTP)
				}
				if tc.attempts == 2 {
					first := attempts[0]
					if !first.errored || first.message != "connect" || first.attrs["iop.redispatched"] != "true" {
						t.Errorf("first attempt %+v, want an error 'connect', redispatched", first)
					}
					dead := all(spans, "node run")
					if len(dead) != 2 {
						t.Fatalf("%d node run spans, want 2", len(dead))
					}
					for _, d := range dead {
						if d.parent == first.spanID && (!d.errored || d.message != "upstream_connect") {
							t.Errorf("the refused attempt's node span %+v, want upstream_connect", d)
						}
					}
					if req.attrs["iop.retries"] != "1" {
						t.Errorf("request span iop.retries %q, want 1", req.attrs["iop.retries"])
					}
				}
			})
		}
	}
	m, err := adm.metrics()
	if err != nil {
		t.Fatal(err)
	}
	if m[`iop_edge_trace_spans_exported_total`] == 0 || m[`iop_edge_trace_spans_dropped_total{reason="node_invalid"}`] != 0 {
		t.Errorf("trace metrics: exported %v, node_invalid %v", m[`iop_edge_trace_spans_exported_total`],
			m[`iop_edge_trace_spans_dropped_total{reason="node_invalid"}`])
	}
}

// Parent-based sampling: a client's traceparent with the sampled flag clear
// exports nothing and still reaches the backend, flag clear, as a child of
// the node's upstream span id; at ratio 0 a request without one is not
// sampled either (and propagates the same way).
func TestTracingUnsampled(t *testing.T) {
	leakcheck.Check(t)
	col := startCollector(t, false)
	api, _, tp := tracedStack(t, col, func(tr *config.Tracing) {
		zero := 0.0
		tr.SamplingRatio = &zero
	})
	const tid = "4bf92f3577b34da6a3ce929d0e0e4736"
	status, body := chatTraced(t, api, "tiny", "unsampled-1", "00-"+tid+"-00f067aa0ba902b7-00", "", false)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	got := tp.last()
	if !strings.HasPrefix(got, "00-"+tid+"-") || !strings.HasSuffix(strings.TrimSpace(got), "-00") || strings.Contains(got, "00f067aa0ba902b7") {
		t.Errorf("backend got %q, want the client's trace, a node span id, flag 00", got)
	}
	status, _ = chatTraced(t, api, "tiny-oa", "unsampled-2", "", "", false)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	if got := tp.last(); len(got) < 55 || !strings.HasSuffix(strings.TrimSpace(got), "-00") {
		t.Errorf("backend got %q, want a new trace with flag 00", got)
	}
	// A sampled request after them: it is the only one the collector sees.
	status, _ = chatTraced(t, api, "tiny", "sampled-3", "00-"+tid+"-00f067aa0ba902b7-01", "", false)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	col.trace(t, "sampled-3", 5)
	items, _ := col.spans.snapshot()
	for _, s := range items {
		if id := s.attrs["iop.request_id"]; id == "unsampled-1" || id == "unsampled-2" {
			t.Errorf("unsampled request %s exported", id)
		}
	}
}

// The collector down changes no answer and a collector that never
// answers slows no request: the answers match those of an Edge without
// tracing (status, text), the requests finish while the collector holds an
// export request with a timeout far beyond the test's, and the spans that
// do not fit the queue are dropped and counted.
func TestTracingCollectorDown(t *testing.T) {
	leakcheck.Check(t)
	answers := func(api *apiClient) []string {
		var out []string
		for i, model := range []string{"tiny", "tiny-oa", "retry", "tiny", "tiny-oa"} {
			for _, stream := range []bool{false, true} {
				res, err := api.chat(context.Background(), chatRequest{model: model, stream: stream})
				if err != nil {
					t.Fatalf("%s #%d: %v", model, i, err)
				}
				out = append(out, fmt.Sprintf("%s stream=%v: %d %q %q %v", model, stream, res.status, res.text, res.finish, res.errs))
			}
		}
		return out
	}
	base := answers(func() *apiClient {
		// Tracing off: a stack whose collector URL is never used.
		col := startCollector(t, false)
		api, _, _ := tracedStack(t, col, func(tr *config.Tracing) { tr.OTLPEndpoint = "" })
		return api
	}())
	for _, tc := range []struct {
		name string
		url  func() (string, *collector)
	}{
		{"closed port", func() (string, *collector) { return closedURL(t), nil }},
		{"never answers", func() (string, *collector) { c := startCollector(t, true); return c.url, c }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, col := tc.url()
			api, adm, _ := tracedStack(t, &collector{url: url}, func(tr *config.Tracing) {
				tr.TimeoutMs, tr.QueueSpans = config.MaxTraceTimeoutMs, config.MinTraceQueue
			})
			got := answers(api)
			if strings.Join(got, "\n") != strings.Join(base, "\n") {
				t.Errorf("answers with the collector %s:\n%s\nwant those without tracing:\n%s", tc.name, strings.Join(got, "\n"), strings.Join(base, "\n"))
			}
			eventually(t, 10*time.Second, "spans dropped beyond the queue, an export request held", func() (bool, string) {
				m, err := adm.metrics()
				if err != nil {
					return false, err.Error()
				}
				d := m[`iop_edge_trace_spans_dropped_total{reason="queue_full"}`]
				held := col == nil || col.requests() > 0
				return d > 0 && held && m[`iop_edge_trace_spans_exported_total`] == 0,
					fmt.Sprintf("queue_full %v exported %v collector held a request %v", d, m[`iop_edge_trace_spans_exported_total`], held)
			})
		})
	}
}
