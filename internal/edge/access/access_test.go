package access

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A1: every way a request ends maps to exactly one outcome.
func TestClassify(t *testing.T) {
	rows := []struct {
		name   string
		status int
		code   string
		failed bool
		want   Outcome
	}{
		{"200 complete", 200, "", false, OK},
		{"tunnel 204", 204, "", false, OK},
		{"H1 stall before any byte 504", 504, CodeStalled, true, Stalled},
		{"H1 stall as an error event after 200", 200, CodeStalled, true, Stalled},
		{"response-wait timeout 504", 504, CodeResponseTimeout, true, Timeout},
		{"Q4 wait timeout 503", 503, CodeNoProvider, true, Timeout},
		{"drain timeout ended the stream", 200, CodeShutdown, true, Timeout},
		{"the node's drain timeout ended the stream", 200, CodeNodeShutdown, true, Timeout},
		{"the node's drain timeout before any byte 503", 503, CodeNodeShutdown, true, Timeout},
		{"body read timeout 408", 408, "request_timeout", true, Timeout},
		{"Q4 queue full 429", 429, "queue_full", true, RateLimited},
		{"provider's own 429 passed through", 429, "", false, RateLimited},
		{"per-key limit 429", 429, "rate_limit_exceeded", true, RateLimited},
		{"over http.max_connections 503", 503, CodeTooManyConnections, true, RateLimited},
		{"body memory bound 503", 503, CodeOverloaded, true, RateLimited},
		{"new request while draining 503", 503, CodeDraining, true, Rejected},
		{"bad input 400", 400, "", true, Rejected},
		{"401", 401, "invalid_api_key", true, Rejected},
		{"unknown model 404", 404, "model_not_found", true, Rejected},
		{"413", 413, "request_too_large", true, Rejected},
		{"provider 4xx passed through", 422, "", false, Rejected},
		{"provider failure 502", 502, "provider_error", true, UpstreamError},
		{"node capacity gate 503", 503, "over_capacity", true, UpstreamError},
		{"provider 500 passed through", 500, "", false, UpstreamError},
		{"error event after 200", 200, "provider_error", true, UpstreamError},
		{"body cut after 200", 200, "", true, UpstreamError},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if got := Classify(r.status, r.code, r.failed); got != r.want {
				t.Errorf("Classify(%d, %q, %v) = %q, want %q", r.status, r.code, r.failed, got, r.want)
			}
		})
	}
}

// A1: X-Request-Id is the client's when it is safe, sanitized and
// bounded otherwise, minted when absent or nothing is left.
func TestRequestID(t *testing.T) {
	mint := func() string { return "minted" }
	long := strings.Repeat("a", 200)
	rows := []struct{ name, in, want string }{
		{"absent", "", "minted"},
		{"kept", "req-42_a.b:c", "req-42_a.b:c"},
		{"spaces and quotes removed", `ab "c" d`, "abcd"},
		{"CR LF removed (no header or log injection)", "a\r\nX-Evil: 1", "aX-Evil:1"},
		{"cut to 128 bytes", long, long[:MaxRequestIDLen]},
		{"nothing usable", "\"\" <>", "minted"},
		{"non-ASCII removed", "id-é", "id-"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if got := RequestID(r.in, mint); got != r.want {
				t.Errorf("RequestID(%q) = %q, want %q", r.in, got, r.want)
			}
		})
	}
}

// A1, P4: the access line has every field, durations in ms, and
// nothing else.
func TestRecordLog(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, nil))
	r := Record{RequestID: "r1", Principal: "team-a", Surface: "chat_completions", Model: "tiny", Known: true,
		Node: "gpu-1", Provider: "ollama", Path: PathRun, Status: 200, Outcome: OK,
		QueueWait: 1500 * time.Microsecond, TTFB: 20 * time.Millisecond, Duration: 250 * time.Millisecond,
		PromptTokens: 12, CompletionTokens: 34, Retries: 1, IgnoredFields: "client_metadata, tools[3]",
		ServedModel: "small", Fallback: "unavailable"}
	r.Log(context.Background(), l)
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("not one JSON line: %q", buf.String())
	}
	want := map[string]any{"msg": Msg, "request_id": "r1", "principal": "team-a", "surface": "chat_completions",
		"model": "tiny", "served_model": "small", "fallback": "unavailable", "node": "gpu-1", "provider": "ollama", "path": "run", "status": 200.0, "outcome": "ok",
		"code": "", "error": "", "queue_wait_ms": 2.0, "ttfb_ms": 20.0, "duration_ms": 250.0, "prompt_tokens": 12.0,
		"completion_tokens": 34.0, "retries": 1.0, "ignored_fields": "client_metadata, tools[3]", "trace_id": "", "level": "INFO"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok && k != "time" {
			t.Errorf("unexpected key %q in the access line", k)
		}
	}
}

func TestRecent(t *testing.T) {
	rc := NewRecent(3)
	for i, o := range []Outcome{UpstreamError, OK, ClientCancelled, Stalled, Rejected, Timeout} {
		rc.Add(&Record{RequestID: string(rune('a' + i)), Outcome: o}, time.Unix(int64(i), 0))
	}
	var ids []string
	for _, e := range rc.List() {
		ids = append(ids, e.RequestID)
	}
	if got := strings.Join(ids, ","); got != "f,e,d" {
		t.Errorf("recent errors newest first = %s, want f,e,d (ok and client_cancelled are not errors; 3 kept)", got)
	}
}

// A1: label values are bounded (unconfigured models fold into
// OtherModel) and escaped; histograms are cumulative with +Inf, _sum and
// _count. (The e2e suite parses the whole /metrics with Prometheus' own
// parser.)
func TestMetricsText(t *testing.T) {
	m := NewMetrics()
	m.Begin("tiny")
	m.Observe(&Record{Model: "tiny", Known: true, Surface: "chat_completions", Path: PathTunnel, Status: 200, Outcome: OK,
		QueueWait: 2 * time.Millisecond, TTFB: 30 * time.Millisecond, Duration: 200 * time.Millisecond,
		PromptTokens: 5, CompletionTokens: 7})
	m.Observe(&Record{Model: "no-such\"model", Known: false, Surface: "chat_completions", Status: 404, Outcome: Rejected,
		Duration: time.Millisecond})
	var buf bytes.Buffer
	if err := m.WritePrometheus(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		`iop_edge_requests_total{model="tiny",surface="chat_completions",path="tunnel",code="200",outcome="ok"} 1`,
		`iop_edge_requests_total{model="_other",surface="chat_completions",path="none",code="404",outcome="rejected"} 1`,
		`iop_edge_request_duration_seconds_bucket{model="tiny",path="tunnel",le="0.1"} 0`,
		`iop_edge_request_duration_seconds_bucket{model="tiny",path="tunnel",le="0.25"} 1`,
		`iop_edge_request_duration_seconds_bucket{model="tiny",path="tunnel",le="+Inf"} 1`,
		`iop_edge_request_duration_seconds_count{model="tiny",path="tunnel"} 1`,
		`iop_edge_time_to_first_byte_seconds_count{model="tiny",path="tunnel"} 1`,
		`iop_edge_queue_wait_seconds_sum{model="tiny",path="tunnel"} 0.002`,
		`iop_edge_tokens_total{model="tiny",direction="prompt"} 5`,
		`iop_edge_tokens_total{model="tiny",direction="completion"} 7`,
		`iop_edge_requests_in_flight{model="tiny"} 1`,
		"# TYPE iop_edge_request_duration_seconds histogram",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing line %s", want)
		}
	}
	if strings.Contains(out, "no-such") {
		t.Error("an unconfigured model name became a label value")
	}
	if strings.Contains(out, `iop_edge_time_to_first_byte_seconds_count{model="_other"`) {
		t.Error("a request that wrote nothing was observed in the TTFB histogram")
	}
	if got := EscapeLabel("a\"b\\c\nd"); got != `a\"b\\c\nd` {
		t.Errorf("EscapeLabel = %s", got)
	}
}

// BenchmarkObserve: one finished request into the metrics (A1).
func BenchmarkObserve(b *testing.B) {
	m := NewMetrics()
	r := &Record{Model: "tiny", Known: true, Surface: "chat_completions", Path: PathTunnel, Status: 200, Outcome: OK,
		QueueWait: time.Millisecond, TTFB: 30 * time.Millisecond, Duration: 200 * time.Millisecond, PromptTokens: 5, CompletionTokens: 7}
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(r)
	}
}

// BenchmarkLog: one access line through slog's JSON handler into a
// discarding writer (A1).
func BenchmarkLog(b *testing.B) {
	l := slog.New(slog.NewJSONHandler(io.Discard, nil))
	r := &Record{RequestID: "Q2XJ7V4M3KZ5N6P8R9S0T1U2VW", Principal: "team-a", Surface: "chat_completions", Model: "tiny",
		Known: true, Node: "gpu-1", Provider: "ollama", Path: PathRun, Status: 200, Outcome: OK,
		QueueWait: time.Millisecond, TTFB: 30 * time.Millisecond, Duration: 200 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		r.Log(context.Background(), l)
	}
}
