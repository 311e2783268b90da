package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// counting wraps a handler and counts the model requests (POSTs) it got.
type counting struct {
	n    atomic.Int64
	next http.Handler
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		c.n.Add(1)
	}
	c.next.ServeHTTP(w, r)
}

// statusBackend answers every model request with status and an error body
// in the route's shape (Ollama {"error":"…"}, OpenAI {"error":{…}}), with
// Retry-After when set; everything else (the node's probes) goes to next.
func statusBackend(status int, retryAfter string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		if r.URL.Path == "/api/chat" {
			fmt.Fprintf(w, `{"error":"upstream says %d"}`, status)
			return
		}
		fmt.Fprintf(w, `{"error":{"message":"upstream says %d","type":"server_error"}}`, status)
	})
}

// stallBackend reads a model request and then sends nothing until the
// caller goes away; the probes go to next (so the node's exact-target probe
// says "available" and the provider stays a candidate, SPEC H8).
func stallBackend(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	})
}

// rawBackend is a TCP server speaking just enough HTTP/1.1 to fail the way
// real servers do on the connection level. Per connection it answers the
// first `serve` requests through next (keep-alive, Content-Length), then
// reads one more request whole and resets the connection without a byte
// of answer: serve 0 is "reset before the first byte"; serve 1 is the
// keep-alive race — the backend closing a connection just as a request
// arrives on it after an answered one, as llama-server does at its 5 s idle
// timeout. posts counts every request read (the ones reset included).
type rawBackend struct {
	ln    net.Listener
	serve int
	next  http.Handler
	posts atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startRawBackend(t testing.TB, serve int, next http.Handler) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{ln: ln, serve: serve, next: next, conns: map[net.Conn]bool{}}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns[c] = true
			b.mu.Unlock()
			b.wg.Add(1)
			go b.conn(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *rawBackend) url() string { return "http://" + b.ln.Addr().String() }

func (b *rawBackend) conn(c net.Conn) {
	defer b.wg.Done()
	defer func() {
		b.mu.Lock()
		delete(b.conns, c)
		b.mu.Unlock()
		c.Close()
	}()
	br := bufio.NewReader(c)
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		if req.Method == http.MethodPost {
			b.posts.Add(1)
		}
		if i >= b.serve && req.Method == http.MethodPost {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // RST: the request is not answered
			}
			return
		}
		rec := httptest.NewRecorder()
		b.next.ServeHTTP(rec, req)
		resp := rec.Result()
		resp.ContentLength = int64(rec.Body.Len())
		resp.Body = io.NopCloser(bytes.NewReader(rec.Body.Bytes()))
		resp.Header.Del("Transfer-Encoding")
		if err := resp.Write(c); err != nil {
			return
		}
	}
}

// closedURL is an http URL nothing listens on (connection refused).
func closedURL(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// TestResilienceTable (SPEC H11, Q2) runs the resilience table
// through the real Edge and Node: failure kind (connect refused, reset
// before the first byte, idle-close race, 500, 502, 503, 429 with and
// without Retry-After, stall) × path (run: ollama adapters, tunnel:
// openai_compat llamacpp adapters) × stream/non-stream. Each model group
// is [the failing provider, a healthy one] on one node; outlier ejection is
// off here so that every request meets the failing provider first
// (ejection has its own test). For every request: the client gets the
// healthy provider's answer with exactly one terminal; the failing
// backend saw the request exactly once (the node never resent it) and the
// healthy one answered it once; at the end every lease and waiter is back
// (iop_edge_leases, iop_edge_waiters = 0) and the retry counter names
// each reason.
func TestResilienceTable(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})

	type kind struct {
		name   string
		reason string // iop_edge_request_retries_total label
		// upstream returns the failing backend's URL and its POST counter.
		upstream func() (string, func() int64)
		warm     bool // one request to the failing provider alone first (the race needs a used connection)
		stall    bool
	}
	counted := func(h http.Handler) (string, func() int64) {
		c := &counting{next: h}
		return bp.serve(t, c), c.n.Load
	}
	kinds := []kind{
		{name: "connect refused", reason: "connect", upstream: func() (string, func() int64) {
			return closedURL(t), func() int64 { return 1 } // no process: nothing to count
		}},
		{name: "reset before the first byte", reason: "reset", upstream: func() (string, func() int64) {
			rb := startRawBackend(t, 0, bp.b)
			return rb.url(), rb.posts.Load
		}},
		{name: "idle-close race", reason: "reset", warm: true, upstream: func() (string, func() int64) {
			rb := startRawBackend(t, 1, bp.b)
			return rb.url(), rb.posts.Load
		}},
		{name: "500", reason: "status", upstream: func() (string, func() int64) { return counted(statusBackend(500, "", bp.b)) }},
		{name: "502", reason: "status", upstream: func() (string, func() int64) { return counted(statusBackend(502, "", bp.b)) }},
		{name: "503", reason: "status", upstream: func() (string, func() int64) { return counted(statusBackend(503, "", bp.b)) }},
		{name: "429 with Retry-After", reason: "rate_limited", upstream: func() (string, func() int64) {
			return counted(statusBackend(429, "5", bp.b))
		}},
		{name: "429 without Retry-After", reason: "rate_limited", upstream: func() (string, func() int64) {
			return counted(statusBackend(429, "", bp.b))
		}},
		{name: "stall", reason: "stall", stall: true, upstream: func() (string, func() int64) { return counted(stallBackend(bp.b)) }},
	}
	okBackend := &counting{next: bp.b}
	okURL := bp.serve(t, okBackend)

	var adapters []config.Adapter
	var models []config.Model
	counts := map[string]func() int64{}
	for i, k := range kinds {
		url, n := k.upstream()
		for _, path := range []string{"run", "tunnel"} {
			bad, good := fmt.Sprintf("bad%d-%s", i, path), "good-"+path
			if path == "run" {
				adapters = append(adapters, ollamaAdapter(bad, url, 8))
			} else {
				adapters = append(adapters, compatAdapter(bad, url, 8))
			}
			badProv := provider("gpu-1", bad, "tiny")
			if k.stall {
				badProv.ResponseStallTimeoutMs = 300
			}
			models = append(models, modelGroup(bad, badProv, provider("gpu-1", good, "tiny")),
				modelGroup(bad+"-alone", badProv))
			counts[bad] = n
		}
	}
	adapters = append(adapters, ollamaAdapter("good-run", okURL, 64), compatAdapter("good-tunnel", okURL, 64))
	off := false
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: adapters}}, models, func(c *config.Config) {
		c.OutlierDetection.Enabled = &off
	})
	_, adm, api := startReady(t, p, cfg, logs)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	retries := map[string]float64{}
	for i, k := range kinds {
		for _, path := range []string{"run", "tunnel"} {
			bad := fmt.Sprintf("bad%d-%s", i, path)
			if k.warm {
				// A used keep-alive connection to the failing backend,
				// so the next request meets it closing (the race).
				res, err := api.chat(ctx, chatRequest{model: bad + "-alone"})
				if err != nil || res.status != http.StatusOK {
					t.Fatalf("%s warm-up: %v %d %s", bad, err, res.status, res.raw)
				}
			}
			for _, stream := range []bool{false, true} {
				name := fmt.Sprintf("H11 %s %s stream=%v", k.name, path, stream)
				t.Run(name, func(t *testing.T) {
					badBefore, goodBefore := counts[bad](), okBackend.n.Load()
					res, err := api.chat(ctx, chatRequest{model: bad, stream: stream})
					if err != nil || res.status != http.StatusOK || res.text != answer || len(res.errs) != 0 {
						t.Fatalf("got err %v, %d %s; want 200 %q from the healthy provider", err, res.status, res.raw, answer)
					}
					if stream && !res.done {
						t.Errorf("stream without its one terminal [DONE]: %s", res.raw)
					}
					if d := counts[bad]() - badBefore; k.name != "connect refused" && d != 1 {
						t.Errorf("the failing backend saw the request %d times, want exactly once (never resent)", d)
					}
					if d := okBackend.n.Load() - goodBefore; d != 1 {
						t.Errorf("the healthy backend answered %d times, want once", d)
					}
					retries[k.reason]++
				})
				if k.warm { // the race again needs a fresh used connection
					res, err := api.chat(ctx, chatRequest{model: bad + "-alone"})
					if err != nil || res.status != http.StatusOK {
						t.Fatalf("%s warm-up: %v %d %s", bad, err, res.status, res.raw)
					}
				}
			}
		}
	}
	adm.waitGauges(t, 10*time.Second, 0, 0) // Q2: every lease and waiter back
	m, err := adm.metrics()
	if err != nil {
		t.Fatal(err)
	}
	for reason, want := range retries {
		if got := m[`iop_edge_request_retries_total{reason="`+reason+`"}`]; got != want {
			t.Errorf(`iop_edge_request_retries_total{reason=%q} = %v, want %v`, reason, got, want)
		}
	}
}

// TestOutlierEjection (passive health, docs/config.md "What cools a
// provider"): group [A answering 503, B]; the first
// request fails on A and is answered by B; A is ejected (cooling in
// /status with its end, one "provider ejected" log line, the ejection
// counter) and the next requests go straight to B; when the window ends A
// is re-admitted (one log line) and tried again.
func TestOutlierEjection(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	bad := &counting{next: statusBackend(503, "", bp.b)}
	badURL, goodURL := bp.serve(t, bad), bp.serve(t, nil)
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("a", badURL, 4), ollamaAdapter("b", goodURL, 4)}}},
		[]config.Model{modelGroup("pair", provider("gpu-1", "a", "tiny"), provider("gpu-1", "b", "tiny"))},
		func(c *config.Config) { c.OutlierDetection.BaseEjectionMs = 1500 })
	_, adm, api := startReady(t, p, cfg, logs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	aStatus := func() providerStatus {
		n, _ := adm.mustStatus(t).node("gpu-1")
		for _, ps := range n.Providers {
			if ps.ProviderID == "a" {
				return ps
			}
		}
		t.Fatalf("no provider a in %+v", n)
		return providerStatus{}
	}
	for i := range 5 {
		res, err := api.chat(ctx, chatRequest{model: "pair"})
		if err != nil || res.status != http.StatusOK || res.text != answer {
			t.Fatalf("request %d: %v %d %s", i, err, res.status, res.raw)
		}
	}
	if n := bad.n.Load(); n != 1 {
		t.Errorf("A saw %d requests, want 1: a cooling provider is skipped while B can answer", n)
	}
	ps := aStatus()
	var cooling struct {
		Until  string `json:"cooling_until"`
		Reason string `json:"cooling_reason"`
	}
	raw, _ := adm.get("/status")
	if i := bytes.Index(raw, []byte(`"provider_id":"a"`)); i < 0 || !strings.Contains(string(raw[i:]), `"cooling_reason":"status"`) {
		t.Errorf("/status does not show a cooling with its reason: %s", raw)
	}
	_ = cooling
	if ps.Status != "unavailable" || ps.Health != "cooling" {
		t.Errorf("A shows %+v, want unavailable/cooling", ps)
	}
	m, err := adm.metrics()
	if err != nil {
		t.Fatal(err)
	}
	if v := m[`iop_edge_provider_ejections_total{reason="status"}`]; v != 1 {
		t.Errorf(`iop_edge_provider_ejections_total{reason="status"} = %v, want 1`, v)
	}
	if v := m[`iop_edge_request_retries_total{reason="status"}`]; v != 1 {
		t.Errorf(`iop_edge_request_retries_total{reason="status"} = %v, want 1`, v)
	}
	if _, err := logs.recs.waitFor(10*time.Second, func(lines []string) bool {
		return countContaining(lines, "provider re-admitted") == 1
	}); err != nil {
		t.Fatalf("no re-admission log line: %v", err)
	}
	if n := logs.messages("provider ejected"); n != 1 {
		t.Errorf("%d ejection log lines, want 1", n)
	}
	eventually(t, 5*time.Second, "A healthy after its window", func() (bool, string) {
		ps := aStatus()
		return ps.Health == "healthy", fmt.Sprintf("%+v", ps)
	})
	res, err := api.chat(ctx, chatRequest{model: "pair"})
	if err != nil || res.status != http.StatusOK {
		t.Fatalf("after re-admission: %v %d %s", err, res.status, res.raw)
	}
	if n := bad.n.Load(); n != 2 {
		t.Errorf("A saw %d requests after its re-admission, want 2 (tried again)", n)
	}
	adm.waitGauges(t, 10*time.Second, 0, 0)
}

func countContaining(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}
