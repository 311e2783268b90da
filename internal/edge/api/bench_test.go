package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/edge/pool"
	"iop/internal/edge/tracing"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// discardWriter is an http.ResponseWriter and http.Flusher that keeps
// nothing, so benchmarks measure the surface alone.
type discardWriter struct {
	h http.Header
	n int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}

// replayStream replays a fixed envelope list; reset rewinds it.
type replayStream struct {
	envs []*iop.Envelope
	i    int
}

func (s *replayStream) RunID() string { return "bench" }
func (s *replayStream) Recv(ctx context.Context) (*iop.Envelope, error) {
	if s.i == len(s.envs) {
		return nil, io.EOF
	}
	s.i++
	return s.envs[s.i-1], nil
}
func (s *replayStream) Pending() bool { return s.i < len(s.envs) }
func (s *replayStream) Cancel(string) {}
func (s *replayStream) Close()        {}

type replayDispatcher struct{ s *replayStream }

func (d *replayDispatcher) StartRun(dispatch.Target, *iop.RunRequest) (dispatch.Stream, error) {
	d.s.i = 0
	return d.s, nil
}

func (d *replayDispatcher) StartTunnel(dispatch.Target, *iop.ProviderTunnelRequest) (dispatch.Stream, error) {
	d.s.i = 0
	return d.s, nil
}

type staticPool struct{ l pool.Lease }

func (p *staticPool) Acquire(context.Context, pool.Request) (*pool.Lease, error) { return &p.l, nil }
func (p *staticPool) Release(*pool.Lease) bool                                   { return true }

func benchHandler(typ string, envs []*iop.Envelope) *Handler {
	cfg := testConfig(map[string]string{"p": "sk-bench"})
	return New(Options{Config: func() *config.Config { return cfg },
		Pool:       &staticPool{l: pool.Lease{Key: pool.Key{Node: "n1", Provider: "p"}, Target: "tiny:latest", Type: typ, StallTimeoutMs: 60000}},
		Dispatcher: &replayDispatcher{s: &replayStream{envs: envs}}, Now: fixedNow, NewID: func() string { return "x" }})
}

func runHandler(b *testing.B, h *Handler, body []byte) {
	runHandlerPath(b, h, "/v1/chat/completions", body)
}

func runHandlerPath(b *testing.B, h *Handler, path string, body []byte) {
	req := httptest.NewRequest("POST", path, nil)
	req.Header.Set("Authorization", "Bearer sk-bench")
	req.Header.Set("Content-Type", "application/json")
	rd := bytes.NewReader(body)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rd.Reset(body)
		req.Body = io.NopCloser(rd)
		req.ContentLength = int64(len(body))
		clear(w.h)
		h.ServeHTTP(w, req)
	}
}

// BenchmarkTunnelRoundTrip: one non-stream tunnel request through the
// surface (auth, body read, head parse, model splice, frames to the
// client), node transport excluded.
func BenchmarkTunnelRoundTrip(b *testing.B) {
	up := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}`)
	envs := []*iop.Envelope{
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fStart(200, "Content-Type", "application/json")}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fBody(up)}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fEnd()}},
	}
	runHandler(b, benchHandler(protocol.TypeOpenAICompat, envs), []byte(chatBody))
}

// BenchmarkRunStream100: a streamed run of 100 deltas converted to
// chat.completion.chunk events (the 100-chunk stream of the overhead benchmark, BENCHMARKS.md).
func BenchmarkRunStream100(b *testing.B) {
	envs := []*iop.Envelope{{Kind: &iop.Envelope_RunEvent{RunEvent: evStart()}}}
	for i := range 100 {
		envs = append(envs, &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: evDelta(uint64(i+2), " token")}})
	}
	envs = append(envs, &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: evComplete(102, "", "stop", usage(5, 100), nil)}})
	body := []byte(`{"model":"tiny","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	runHandler(b, benchHandler(protocol.TypeOllama, envs), body)
}

// BenchmarkRunStreamSurface100: the 100-delta streamed run of
// BenchmarkRunStream100 through each run-path surface: chat
// completions, Anthropic Messages, Responses; surface only (request
// conversion, event encoding, writes), node transport excluded.
func BenchmarkRunStreamSurface100(b *testing.B) {
	envs := []*iop.Envelope{{Kind: &iop.Envelope_RunEvent{RunEvent: evStart()}}}
	for i := range 100 {
		envs = append(envs, &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: evDelta(uint64(i+2), " token")}})
	}
	envs = append(envs, &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: evComplete(102, "", "stop", usage(5, 100), nil)}})
	for _, s := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"messages", "/v1/messages", `{"model":"tiny","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"hi"}]}`},
		{"responses", "/v1/responses", `{"model":"tiny","stream":true,"input":"hi"}`},
	} {
		b.Run(s.name, func(b *testing.B) {
			runHandlerPath(b, benchHandler(protocol.TypeOllama, envs), s.path, []byte(s.body))
		})
	}
}

// BenchmarkTunnelRoundTripAccounted: BenchmarkTunnelRoundTrip with the
// Edge's accounting on, as edge.Serve wires it: the JSON access
// line (into io.Discard), the request metrics and the recent errors.
func BenchmarkTunnelRoundTripAccounted(b *testing.B) {
	up := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}`)
	envs := []*iop.Envelope{
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fStart(200, "Content-Type", "application/json")}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fBody(up)}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fEnd()}},
	}
	h := benchHandler(protocol.TypeOpenAICompat, envs)
	h.o.AccessLog = slog.New(slog.NewJSONHandler(io.Discard, nil))
	h.o.Metrics, h.o.Recent = access.NewMetrics(), access.NewRecent(0)
	runHandler(b, h, []byte(chatBody))
}

// BenchmarkTunnelRoundTripKeys: BenchmarkTunnelRoundTrip with the request's
// key in a key store of 1 and of 10,000 keys (docs/keys.md; scope, every
// bound, expiry: authenticate, admit, reserve, headers, settle), against
// the same request with an api_keys key without bounds. p50-ns/request is
// the median of per-request times over batches of 64.
func BenchmarkTunnelRoundTripKeys(b *testing.B) {
	up := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}`)
	envs := []*iop.Envelope{
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fStart(200, "Content-Type", "application/json")}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fBody(up)}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fEnd()}},
	}
	for _, n := range []int{0, 1, 10000} {
		name := fmt.Sprintf("store=%d", n)
		if n == 0 {
			name = "api_keys"
		}
		b.Run(name, func(b *testing.B) {
			h := benchHandler(protocol.TypeOpenAICompat, envs)
			key := "sk-bench"
			if n > 0 {
				st := keystore.New()
				for i := range n {
					k, err := st.Create(keystore.Spec{Name: fmt.Sprintf("team-%05d", i), Models: []string{"tiny", "qwen3*"},
						Limits:    keystore.Limits{RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 40, TokensPerDay: 1 << 40, MaxConcurrent: 1 << 20},
						ExpiresAt: fixedNow().Add(time.Hour)}, fixedNow().Add(-time.Hour))
					if err != nil {
						b.Fatal(err)
					}
					if i == n/2 {
						key = k
					}
				}
				set, err := keys.Build(nil, st, true, 1)
				if err != nil {
					b.Fatal(err)
				}
				h.keys, h.ownKeys = keys.New(set), false
			}
			medianPerRequest(b, h, key)
		})
	}
}

// BenchmarkTunnelRoundTripTracing: BenchmarkTunnelRoundTrip with tracing
// off, at sampling ratio 0.01 and 1.0 (a running tracing.Exporter sending
// to an httptest collector that discards), and at 1.0 with the collector
// down (a closed port: spans queue, then drop). p50-ns/request is the
// median of per-request times over batches of 64; the exporter's goroutine
// shares the CPU with the requests, as in the edge.
func BenchmarkTunnelRoundTripTracing(b *testing.B) {
	up := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}`)
	envs := []*iop.Envelope{
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fStart(200, "Content-Type", "application/json")}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fBody(up)}},
		{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fEnd()}},
	}
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	}))
	defer collector.Close()
	for _, c := range []struct {
		name  string
		ratio float64
		url   string // "" = tracing off
	}{
		{"off", 0, ""},
		{"ratio=0.01", 0.01, collector.URL},
		{"ratio=1", 1, collector.URL},
		{"ratio=1/collector_down", 1, "http://127.0.0.1:1"},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := benchHandler(protocol.TypeOpenAICompat, envs)
			var exp *tracing.Exporter
			if c.url != "" {
				exp = tracing.New(tracing.Options{Endpoint: tracing.Endpoint(c.url), Timeout: time.Second})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); exp.Run(ctx) }()
				defer func() { cancel(); <-done }()
				h.o.Tracer, h.o.TraceRatio = exp, c.ratio
			}
			medianPerRequest(b, h, "sk-bench")
			if exp != nil {
				b.ReportMetric(float64(exp.Dropped(tracing.DropQueueFull)+exp.Dropped(tracing.DropExportFailed))/float64(b.N*64), "dropped-spans/request")
			}
		})
	}
}

// medianPerRequest runs BenchmarkTunnelRoundTrip's request with key in
// batches of 64 and reports p50-ns/request: the median of the batches'
// per-request times.
func medianPerRequest(b *testing.B, h *Handler, key string) {
	body := []byte(chatBody)
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	rd := bytes.NewReader(body)
	w := &discardWriter{h: http.Header{}}
	const batch = 64
	var lat []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		for range batch {
			rd.Reset(body)
			req.Body = io.NopCloser(rd)
			req.ContentLength = int64(len(body))
			clear(w.h)
			h.ServeHTTP(w, req)
		}
		lat = append(lat, time.Since(start)/batch)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns/request")
	b.ReportMetric(0, "ns/op")
}
