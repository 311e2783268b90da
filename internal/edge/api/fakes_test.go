package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/pool"
	iop "iop/proto/gen/iop"
)

// waitFor is the deadline of every wait on a signal in these tests.
const waitFor = 5 * time.Second

func keySum(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// testConfig is an Edge config with models "tiny" and "other", one
// provider each (so nothing is re-dispatched); keys maps principal → key
// (none = open mode).
func testConfig(keys map[string]string) *config.Config {
	c := &config.Config{
		Models: []config.Model{
			{Name: "tiny", Providers: []config.ModelProvider{{Node: "n1", Provider: "ollama", Target: "tiny:latest"}}},
			{Name: "other", Providers: []config.ModelProvider{{Node: "n1", Provider: "llama", Target: "other-gguf"}}},
		},
		HTTP: config.HTTP{MaxBodyBytes: 4096},
	}
	for p, k := range keys {
		c.APIKeys = append(c.APIKeys, config.APIKey{Principal: p, KeySHA256: keySum(k)})
	}
	return c
}

// retryConfig is testConfig with n providers for "tiny" (n1/ollama,
// n2/ollama, n3/ollama …): a request may go to each once (SPEC H11).
func retryConfig(n int) *config.Config {
	c := testConfig(nil)
	c.Models[0].Providers = nil
	for i := 1; i <= n; i++ {
		c.Models[0].Providers = append(c.Models[0].Providers,
			config.ModelProvider{Node: fmt.Sprintf("n%d", i), Provider: "ollama", Target: "tiny:latest"})
	}
	return c
}

// fakePool grants leases from a template, or fails with err, or (block)
// waits for the caller's context like a queued waiter.
type fakePool struct {
	mu        sync.Mutex
	lease     pool.Lease
	err       error
	block     bool
	reqs      []pool.Request
	principal []string
	acquired  int
	releases  atomic.Int32
	queued    chan struct{} // closed when a blocking Acquire is waiting
	left      chan struct{} // closed when a blocking Acquire saw ctx done
}

func newFakePool(typ string) *fakePool {
	return &fakePool{
		lease:  pool.Lease{Key: pool.Key{Node: "n1", Provider: "prov"}, Generation: 7, Target: "tiny:latest", Type: typ, StallTimeoutMs: 60000},
		queued: make(chan struct{}), left: make(chan struct{}),
	}
}

func (p *fakePool) Acquire(ctx context.Context, r pool.Request) (*pool.Lease, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, r)
	pr, _ := PrincipalFromContext(ctx)
	p.principal = append(p.principal, pr)
	block, err := p.block, p.err
	p.mu.Unlock()
	if block {
		close(p.queued)
		<-ctx.Done()
		close(p.left)
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.acquired++
	p.mu.Unlock()
	l := p.lease
	return &l, nil
}

func (p *fakePool) Release(l *pool.Lease) bool {
	p.releases.Add(1)
	return true
}

func (p *fakePool) requests() []pool.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pool.Request(nil), p.reqs...)
}

// fakeStream is a dispatch.Stream fed by the test through send/sendErr.
type fakeStream struct {
	id      string
	ch      chan recvItem
	cancels atomic.Int32
	closes  atomic.Int32
	mu      sync.Mutex
	reasons []string
	cancel  chan struct{} // closed at the first Cancel
	closed  chan struct{} // closed at the first Close
	dead    chan struct{} // closed by kill: Recv fails with ErrSessionLost
	// noTerminalOnCancel: Cancel does not make the stream end by itself.
	noTerminalOnCancel bool
	once               sync.Once
	// adapter, target: the request's, which Recv puts on every envelope
	// that names none, as the node does (SPEC H8: typed identity).
	adapter, target string
}

// bind sets the identity Recv stamps (the dispatched request's).
func (s *fakeStream) bind(adapter, target string) {
	s.mu.Lock()
	s.adapter, s.target = adapter, target
	s.mu.Unlock()
}

// stamp puts the stream's adapter and target on env, like the node's
// runStream and tunnelStream (a tunnel BODY carries none), unless env names
// its own.
func (s *fakeStream) stamp(env *iop.Envelope) {
	if env == nil {
		return
	}
	s.mu.Lock()
	a, t := s.adapter, s.target
	s.mu.Unlock()
	if ev := env.GetRunEvent(); ev != nil && ev.Adapter == "" && ev.Target == "" {
		ev.Adapter, ev.Target = a, t
	}
	if f := env.GetTunnelFrame(); f != nil && f.Kind != iop.TunnelFrameKind_TUNNEL_FRAME_BODY && f.Adapter == "" && f.Target == "" {
		f.Adapter, f.Target = a, t
	}
}

// kill makes every later Recv fail with ErrSessionLost, so a failed test
// never leaves a handler waiting on its stream.
func (s *fakeStream) kill() { s.once.Do(func() { close(s.dead) }) }

type recvItem struct {
	env *iop.Envelope
	err error
}

func newFakeStream(id string) *fakeStream {
	return &fakeStream{id: id, ch: make(chan recvItem, 64), cancel: make(chan struct{}), closed: make(chan struct{}), dead: make(chan struct{})}
}

func (s *fakeStream) RunID() string { return s.id }

func (s *fakeStream) Recv(ctx context.Context) (*iop.Envelope, error) {
	select {
	case it := <-s.ch:
		s.stamp(it.env)
		return it.env, it.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.dead:
		return nil, dispatch.ErrSessionLost
	}
}

func (s *fakeStream) Pending() bool { return len(s.ch) > 0 }

func (s *fakeStream) Cancel(reason string) {
	s.mu.Lock()
	s.reasons = append(s.reasons, reason)
	s.mu.Unlock()
	if s.cancels.Add(1) == 1 {
		close(s.cancel)
		if s.noTerminalOnCancel {
			return
		}
		// Like a node: a cancelled stream still ends with its terminal
		// (SPEC E5), after which Recv reports io.EOF.
		select {
		case s.ch <- recvItem{err: io.EOF}:
		default:
		}
	}
}

func (s *fakeStream) Close() {
	if s.closes.Add(1) == 1 {
		close(s.closed)
	}
}

func (s *fakeStream) cancelReasons() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reasons...)
}

func (s *fakeStream) run(evs ...*iop.RunEvent) {
	for _, ev := range evs {
		s.ch <- recvItem{env: &iop.Envelope{RunId: s.id, Kind: &iop.Envelope_RunEvent{RunEvent: ev}}}
	}
}

func (s *fakeStream) frames(fs ...*iop.ProviderTunnelFrame) {
	for _, f := range fs {
		s.ch <- recvItem{env: &iop.Envelope{RunId: s.id, Kind: &iop.Envelope_TunnelFrame{TunnelFrame: f}}}
	}
}

// fakeDispatcher hands out pre-made streams and records requests.
type fakeDispatcher struct {
	mu      sync.Mutex
	stream  *fakeStream
	err     error
	targets []dispatch.Target
	runs    []*iop.RunRequest
	tunnels []*iop.ProviderTunnelRequest
	started chan struct{} // closed at the first start
}

func newFakeDispatcher(s *fakeStream) *fakeDispatcher {
	return &fakeDispatcher{stream: s, started: make(chan struct{})}
}

func (d *fakeDispatcher) start(t dispatch.Target, adapter, target string) (dispatch.Stream, error) {
	d.targets = append(d.targets, t)
	if len(d.targets) == 1 {
		close(d.started)
	}
	if d.err != nil {
		return nil, d.err
	}
	d.stream.bind(adapter, target)
	return d.stream, nil
}

func (d *fakeDispatcher) StartRun(t dispatch.Target, req *iop.RunRequest) (dispatch.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.runs = append(d.runs, req)
	return d.start(t, req.GetAdapter(), req.GetTarget())
}

func (d *fakeDispatcher) StartTunnel(t dispatch.Target, req *iop.ProviderTunnelRequest) (dispatch.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tunnels = append(d.tunnels, req)
	return d.start(t, req.GetAdapter(), req.GetTarget())
}

func (d *fakeDispatcher) lastTunnel() *iop.ProviderTunnelRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.tunnels) == 0 {
		return nil
	}
	return d.tunnels[len(d.tunnels)-1]
}

func (d *fakeDispatcher) lastRun() *iop.RunRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.runs) == 0 {
		return nil
	}
	return d.runs[len(d.runs)-1]
}

// seqIDs returns a deterministic NewID: "id1", "id2", …
func seqIDs() func() string {
	var n atomic.Int64
	return func() string { return fmt.Sprintf("id%d", n.Add(1)) }
}

var fixedNow = func() time.Time { return time.Unix(1700000000, 0) }

type rig struct {
	h   *Handler
	p   Pool
	fp  *fakePool
	d   *fakeDispatcher
	st  *fakeStream
	srv *httptest.Server
	cfg *config.Config
}

// newRig starts a Handler on a real HTTP server with a fake pool granting
// leases of type typ and a fake dispatcher with one stream.
func newRig(t *testing.T, typ string, keys map[string]string) *rig {
	t.Helper()
	r := &rig{fp: newFakePool(typ), st: newFakeStream("run-1"), cfg: testConfig(keys)}
	r.p = r.fp
	r.d = newFakeDispatcher(r.st)
	r.start(t)
	return r
}

func (r *rig) start(t *testing.T) {
	cfg := r.cfg
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs()})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	t.Cleanup(r.st.kill) // runs first: unblocks a handler a failed test left waiting
}

func (r *rig) do(t *testing.T, method, path, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	resp := r.send(t, context.Background(), method, path, body, hdr...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, string(b)
}

func (r *rig) send(t *testing.T, ctx context.Context, method, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, r.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

type result struct {
	resp *http.Response
	err  error
}

// sendAsync sends a POST from a goroutine (a streamed response's headers
// arrive only with its first byte) and delivers the result on the channel.
func (r *rig) sendAsync(ctx context.Context, path, body string) <-chan result {
	done := make(chan result, 1)
	req, err := http.NewRequestWithContext(ctx, "POST", r.srv.URL+path, strings.NewReader(body))
	if err != nil {
		done <- result{err: err}
		return done
	}
	go func() {
		resp, err := r.srv.Client().Do(req)
		done <- result{resp, err}
	}()
	return done
}

// waitClosed waits for ch to close or fails with what.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
	}
}
