package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// heldListener hands out connections that report on held when the server
// has read at least want bytes from them and asks for more: its handler
// took the whole request head and the body's first byte and waits for the
// rest.
type heldListener struct {
	net.Listener
	want int64
	held chan struct{} // one send per connection, buffered by the caller
}

func (l *heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &heldConn{Conn: c, l: l}, nil
}

type heldConn struct {
	net.Conn
	l    *heldListener
	read atomic.Int64
	once sync.Once
}

func (c *heldConn) Read(p []byte) (int, error) {
	if c.read.Load() >= c.l.want {
		c.once.Do(func() { c.l.held <- struct{}{} })
	}
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// BenchmarkHeldBodies is the held-bodies attack (B1) against a whole Edge
// (edge.Serve, in process): IOP_BENCH_HELD connections (default 1,000), with
// a valid API key, each send POST /v1/chat/completions declaring
// Content-Length 8 MiB, write one byte ("{") and hold. Reported:
//
//	heap-B/conn    growth of the process's in-use heap per held connection,
//	               once every handler waits for its body (target ≤ 65536;
//	               the client side of each socket, a few hundred bytes, is
//	               in it too)
//	stack-B/conn   goroutine stack per held connection (the server's
//	               connection goroutine)
//	models-p50-ms, models-p99-ms
//	               GET /v1/models latency over 2,000 sequential requests on
//	               one keep-alive connection while the connections are held
//	quiet-p99-ms   the same before the attack, for comparison
//
// Run: go test -run '^$' -bench BenchmarkHeldBodies -benchtime 1x ./internal/e2e/
func BenchmarkHeldBodies(b *testing.B) {
	leakcheck.Check(b)
	n := 1000
	if s := os.Getenv("IOP_BENCH_HELD"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("IOP_BENCH_HELD=%q", s)
		}
		n = v
	}
	n = min(n, fleetSize(b, n)) // two descriptors per connection in this process
	const key = "sk-bench"
	sum := sha256.Sum256([]byte(key))
	p := newPKI(b, "gpu-1")
	cfg := edgeConfig(b, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", "http://127.0.0.1:9", 4)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, func(c *config.Config) {
			c.APIKeys = []config.APIKey{{Principal: "attacker", KeySHA256: hex.EncodeToString(sum[:])}}
		})
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer " + key +
		"\r\nContent-Type: application/json\r\nContent-Length: 8388608\r\n\r\n{"
	hc := newHTTPClient(b)
	for range b.N {
		b.StopTimer()
		var hl *heldListener
		e := startEdge(b, cfg, nil, slog.New(slog.DiscardHandler), func(o *edge.Options) {
			hl = &heldListener{Listener: o.HTTPListener, want: int64(len(head)), held: make(chan struct{}, n)}
			o.HTTPListener = hl
		})
		quiet := modelsLatency(b, hc, e.httpURL, key, 2000)
		heap0, stack0 := heapInuse()
		b.StartTimer()
		conns := make([]net.Conn, 0, n)
		for range n {
			c, err := net.Dial("tcp", hl.Addr().String())
			if err != nil {
				b.Fatalf("dial: %v", err)
			}
			conns = append(conns, c)
			if _, err := io.WriteString(c, head); err != nil {
				b.Fatalf("write: %v", err)
			}
		}
		deadline := time.After(60 * time.Second)
		for i := range n {
			select {
			case <-hl.held:
			case <-deadline:
				b.Fatalf("only %d of %d handlers wait for their bodies after 60 s", i, n)
			}
		}
		b.StopTimer()
		heap1, stack1 := heapInuse()
		attack := modelsLatency(b, hc, e.httpURL, key, 2000)
		b.ReportMetric(float64(int64(heap1)-int64(heap0))/float64(n), "heap-B/conn")
		b.ReportMetric(float64(int64(stack1)-int64(stack0))/float64(n), "stack-B/conn")
		b.ReportMetric(ms(attack[len(attack)/2]), "models-p50-ms")
		b.ReportMetric(ms(attack[len(attack)*99/100]), "models-p99-ms")
		b.ReportMetric(ms(quiet[len(quiet)*99/100]), "quiet-p99-ms")
		b.ReportMetric(float64(n), "conns")
		for _, c := range conns {
			c.Close()
		}
		hc.CloseIdleConnections()
		if err := e.stop(); err != nil {
			b.Fatal(err)
		}
	}
}

// modelsLatency returns the sorted latencies of n sequential GET
// /v1/models requests.
func modelsLatency(b *testing.B, hc *http.Client, base, key string, n int) []time.Duration {
	b.Helper()
	out := make([]time.Duration, 0, n)
	for range n {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatalf("GET /v1/models: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, time.Since(start))
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET /v1/models: %s", resp.Status)
		}
	}
	slices.Sort(out)
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
