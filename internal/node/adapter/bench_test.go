package adapter_test

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

const benchChunks = 1000

// benchChunk is one 100-byte SSE event.
func benchChunk() []byte {
	head := `data: {"choices":[{"index":0,"delta":{"content":"`
	tail := `"}}]}` + "\n\n"
	return []byte(head + strings.Repeat("x", 100-len(head)-len(tail)) + tail)
}

// chunkBody yields one 100-byte chunk per Read, like a backend that flushes
// every token.
type chunkBody struct {
	chunk []byte
	left  int
}

func (c *chunkBody) Read(p []byte) (int, error) {
	if c.left == 0 {
		return 0, io.EOF
	}
	c.left--
	return copy(p, c.chunk), nil
}

func (c *chunkBody) Close() error { return nil }

// memTransport answers every request with a 1,000-chunk SSE stream from
// memory, so that only the node-side relay allocates.
type memTransport struct {
	chunk  []byte
	chunks int // per response; 0 = benchChunks
	body   chunkBody
	resp   http.Response
}

func (m *memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	n := m.chunks
	if n == 0 {
		n = benchChunks
	}
	m.body = chunkBody{chunk: m.chunk, left: n}
	m.resp = http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: &m.body, Request: r}
	return &m.resp, nil
}

// BenchmarkTunnelRelaySSE: node-side tunnel relay of a 1,000-chunk SSE
// stream of 100-byte chunks (SPEC T2). "loopback" reads it from an httptest
// fake that flushes every chunk (allocations include the fake server's);
// "memory" reads it from an in-memory transport, so allocs/body-frame is the
// relay's own. "owned" gives every BODY frame its own Body (the default);
// "reuse" is Options.ReuseBodyBuffers.
func BenchmarkTunnelRelaySSE(b *testing.B) {
	chunk := benchChunk()
	loopback := newFake(b, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := 0; i < benchChunks; i++ {
			_, _ = w.Write(chunk)
			_ = rc.Flush()
		}
	})
	cases := []struct {
		name   string
		client *http.Client
		reuse  bool
	}{
		{"loopback/owned", nil, false},
		{"memory/owned", &http.Client{Transport: &memTransport{chunk: chunk}}, false},
		{"memory/reuse", &http.Client{Transport: &memTransport{chunk: chunk}}, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			s := newSet(b, adapter.Options{HTTPClient: tc.client, ReuseBodyBuffers: tc.reuse},
				compatAdapter("llama", llamaProfile(loopback.URL), 0))
			req := &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: protocol.OpChatCompletions, Body: []byte(`{"model":"tiny","stream":true}`)}
			var frames, bytesSeen int
			var last iop.TunnelFrameKind
			emit := func(f *iop.ProviderTunnelFrame) {
				if f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_BODY {
					frames++
					bytesSeen += len(f.GetBody())
				}
				last = f.GetKind()
			}
			var ms0, ms1 runtime.MemStats
			b.ReportAllocs()
			runtime.ReadMemStats(&ms0)
			start := time.Now()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.Tunnel(context.Background(), "bench", req, emit)
			}
			b.StopTimer()
			elapsed := time.Since(start)
			runtime.ReadMemStats(&ms1)
			if last != iop.TunnelFrameKind_TUNNEL_FRAME_END || bytesSeen != b.N*benchChunks*len(chunk) {
				b.Fatalf("relay ended %v after %d bytes, want END after %d", last, bytesSeen, b.N*benchChunks*len(chunk))
			}
			b.ReportMetric(float64(b.N*benchChunks)/elapsed.Seconds(), "chunks/s")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(frames), "allocs/body-frame")
			b.ReportMetric(float64(frames)/float64(b.N), "body-frames/op")
		})
	}
}

// T2: the relay's allocations per BODY frame stay within budget: ≤ 2 with
// an owned body, ≤ 1 reused. The per-frame cost is the difference between
// a 2,000-frame and a 1,000-frame tunnel, so per-request setup cancels out.
func TestTunnelRelayAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation measurement skipped in -short mode")
	}
	chunk := benchChunk()
	for _, tc := range []struct {
		name   string
		reuse  bool
		budget float64
	}{{"T2 owned body", false, 2}, {"T2 reused body", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			mt := &memTransport{chunk: chunk}
			s := newSet(t, adapter.Options{HTTPClient: &http.Client{Transport: mt}, ReuseBodyBuffers: tc.reuse},
				compatAdapter("llama", llamaProfile("http://127.0.0.1:1"), 0))
			req := &iop.ProviderTunnelRequest{Adapter: "llama", Operation: protocol.OpChatCompletions, Body: []byte(`{}`)}
			frames := 0
			emit := func(f *iop.ProviderTunnelFrame) {
				if f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_BODY {
					frames++
				}
			}
			measure := func(n int) float64 {
				mt.chunks = n
				s.Tunnel(context.Background(), "warm", req, emit)
				return testing.AllocsPerRun(5, func() { s.Tunnel(context.Background(), "a", req, emit) })
			}
			a1, a2 := measure(1000), measure(2000)
			if frames != 7*1000+7*2000 {
				t.Fatalf("got %d BODY frames, want one per chunk", frames)
			}
			if per := (a2 - a1) / 1000; per > tc.budget+0.05 { // +0.05: AllocsPerRun noise
				t.Fatalf("%.2f allocs per BODY frame (%.0f and %.0f per tunnel of 1,000 and 2,000 frames), want ≤ %.0f", per, a1, a2, tc.budget)
			}
		})
	}
}

// BenchmarkTunnelShort: one whole tunnel of a one-chunk answer from an
// in-memory transport: the node's per-request cost around the call (the
// lookup, the capacity gate, supervise and its watchdog, the frames),
// without sockets (SPEC H1, T2).
func BenchmarkTunnelShort(b *testing.B) {
	s := newSet(b, adapter.Options{HTTPClient: &http.Client{Transport: &memTransport{chunk: benchChunk(), chunks: 1}}},
		compatAdapter("llama", llamaProfile("http://127.0.0.1:1"), 0))
	req := &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: protocol.OpChatCompletions, Body: []byte(`{"model":"tiny"}`)}
	var last iop.TunnelFrameKind
	emit := func(f *iop.ProviderTunnelFrame) { last = f.GetKind() }
	b.ReportAllocs()
	for b.Loop() {
		s.Tunnel(context.Background(), "bench", req, emit)
	}
	if last != iop.TunnelFrameKind_TUNNEL_FRAME_END {
		b.Fatalf("tunnel ended %v, want END", last)
	}
}
