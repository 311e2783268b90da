package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/events"
	"iop/internal/edge/registry"
	"iop/internal/identity"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// wait bounds every wait on a signal in these tests (real time); it is a
// deadline, not a sleep.
const wait = 5 * time.Second

// testConfig returns an edge config with nodes gpu-1 and gpu-2 and the
// given heartbeat settings in ms (0 = defaults).
func testConfig(t testing.TB, intervalMs, nodeTimeoutMs, timeoutMs int, capacity int) *config.Config {
	t.Helper()
	js := fmt.Sprintf(`{
	  "tls": {"cert_file": "edge-1.crt", "key_file": "edge-1.key", "ca_file": "ca.crt"},
	  "heartbeat": {"interval_ms": %d, "node_timeout_ms": %d, "timeout_ms": %d},
	  "nodes": [
	    {"id": "gpu-1", "adapters": [{"name": "ollama", "type": "ollama", "capacity": %d, "base_url": "http://127.0.0.1:11434"}]},
	    {"id": "gpu-2", "adapters": [{"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434"}]}
	  ],
	  "models": [{"name": "tiny", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"}]}]
	}`, intervalMs, nodeTimeoutMs, timeoutMs, capacity)
	c, err := config.Parse([]byte(js))
	if err != nil {
		t.Fatalf("test config: %v", err)
	}
	return c
}

type hookCall struct {
	kind string // "ready", "fence" or "draining"
	node string
	gen  uint64
}

func (h hookCall) String() string { return fmt.Sprintf("%s(%s,%d)", h.kind, h.node, h.gen) }

// harness is an edge transport serving on a listener with a dev PKI.
type harness struct {
	t      testing.TB
	logs   *logBuffer
	pki    string
	cfg    atomic.Pointer[config.Config]
	srv    *Server
	ln     net.Listener
	dialer func() (net.Conn, error)
	hooks  chan hookCall
	events <-chan events.Event
	bus    *events.Bus
	stop   func()
}

type harnessOpts struct {
	cfg    *config.Config
	ln     net.Listener // nil = TCP on 127.0.0.1:0
	dial   func() (net.Conn, error)
	modify func(*Options)
	setup  func(*Server) // runs before Serve starts (test hooks)
}

// newHarness starts a Server. PKI: CA, edge-1, and nodes gpu-1, gpu-2,
// gpu-3 (gpu-3 is allowed by TLS but not configured).
func newHarness(t testing.TB, ho harnessOpts) *harness {
	t.Helper()
	h := &harness{t: t, logs: &logBuffer{}, pki: t.TempDir(), hooks: make(chan hookCall, 64), bus: &events.Bus{}}
	if err := identity.InitPKI(h.pki, identity.PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1", "gpu-2", "gpu-3"}}); err != nil {
		t.Fatalf("InitPKI: %v", err)
	}
	if ho.cfg == nil {
		ho.cfg = testConfig(t, 0, 0, 0, 4)
	}
	h.cfg.Store(ho.cfg)
	tlsCfg, err := identity.ServerConfig(identity.ServerOptions{
		CertFile: h.file("edge-1.crt"), KeyFile: h.file("edge-1.key"), CAFile: h.file("ca.crt"),
		EdgeName: "edge-1", AllowNode: func(name string) bool { return strings.HasPrefix(name, "gpu-") },
	})
	if err != nil {
		t.Fatalf("ServerConfig: %v", err)
	}
	ev, cancelEv := h.bus.Subscribe(64)
	h.events = ev
	o := Options{
		TLS:    tlsCfg,
		Config: h.cfg.Load,
		Logger: slog.New(slog.NewTextHandler(testWriter{t, h.logs}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Events: h.bus,
		Hooks: Hooks{
			OnReady:    func(n string, g uint64) { h.hooks <- hookCall{"ready", n, g} },
			OnFence:    func(n string, g uint64) { h.hooks <- hookCall{"fence", n, g} },
			OnDraining: func(n string, g uint64) { h.hooks <- hookCall{"draining", n, g} },
		},
	}
	if ho.modify != nil {
		ho.modify(&o)
	}
	h.srv = New(o)
	if ho.setup != nil {
		ho.setup(h.srv)
	}
	h.ln, h.dialer = ho.ln, ho.dial
	if h.ln == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		h.ln = ln
		h.dialer = func() (net.Conn, error) { return net.DialTimeout("tcp", ln.Addr().String(), wait) }
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.srv.Serve(ctx, h.ln) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-served:
				if err != nil {
					t.Errorf("Serve returned %v, want nil after cancel", err)
				}
			case <-time.After(wait):
				t.Errorf("Serve did not return within %v of cancel", wait)
			}
			cancelEv()
		})
	}
	t.Cleanup(h.stop)
	return h
}

// testWriter sends log lines to the test log and keeps them for asserts.
type testWriter struct {
	t    testing.TB
	keep *logBuffer
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	w.keep.mu.Lock()
	w.keep.b.Write(p)
	w.keep.mu.Unlock()
	return len(p), nil
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (h *harness) file(name string) string { return filepath.Join(h.pki, name) }

// wantHooks waits for exactly these hook calls, in order.
func (h *harness) wantHooks(want ...hookCall) {
	h.t.Helper()
	for i, w := range want {
		select {
		case got := <-h.hooks:
			if got != w {
				h.t.Fatalf("hook call %d = %v, want %v", i, got, w)
			}
		case <-time.After(wait):
			h.t.Fatalf("hook call %d: none within %v, want %v", i, wait, w)
		}
	}
}

// noHooks checks that no hook call is pending. Only meaningful where every
// effect of the transitions so far has run (effects run before replies are
// read by the node, or the caller synchronized otherwise).
func (h *harness) noHooks() {
	h.t.Helper()
	select {
	case got := <-h.hooks:
		h.t.Fatalf("unexpected hook call %v", got)
	default:
	}
}

// wantEvent waits for the next event and checks its type and node.
func (h *harness) wantEvent(typ, node string) events.Event {
	h.t.Helper()
	select {
	case e := <-h.events:
		if e.Type != typ || e.Node != node {
			h.t.Fatalf("event = %+v, want %s %s", e, typ, node)
		}
		return e
	case <-time.After(wait):
		h.t.Fatalf("no %s event for %s within %v", typ, node, wait)
	}
	return events.Event{}
}

func (h *harness) noEvents() {
	h.t.Helper()
	select {
	case e, ok := <-h.events:
		if ok {
			h.t.Fatalf("unexpected event %+v", e)
		}
	default:
	}
}

func (h *harness) node(id string) NodeState {
	for _, n := range h.srv.Nodes() {
		if n.ID == id {
			return n
		}
	}
	h.t.Fatalf("Nodes() has no %s", id)
	return NodeState{}
}

// fakeNode is a minimal node speaking the wire protocol directly.
type fakeNode struct {
	t    testing.TB
	conn *tls.Conn
	r    *wire.Reader
	w    *wire.Writer
	mu   sync.Mutex // serializes writes from the test and a pinger
	// realDeadlines: set read deadlines (real sockets); in a synctest
	// bubble the fake clock bounds waits instead.
	realDeadlines bool
}

// dial connects with the certificate of name (role node), verifying the
// edge's identity as a real node does.
func (h *harness) dial(name string) *fakeNode {
	h.t.Helper()
	cfg, err := identity.ClientConfig(identity.ClientOptions{
		CertFile: h.file(name + ".crt"), KeyFile: h.file(name + ".key"), CAFile: h.file("ca.crt"),
		ExpectedEdgeName: "edge-1",
	})
	if err != nil {
		h.t.Fatalf("ClientConfig %s: %v", name, err)
	}
	return h.dialTLS(cfg)
}

func (h *harness) dialTLS(cfg *tls.Config) *fakeNode {
	h.t.Helper()
	raw, err := h.dialer()
	if err != nil {
		h.t.Fatalf("dial: %v", err)
	}
	conn := tls.Client(raw, cfg)
	_, real := raw.(*net.TCPConn)
	n := &fakeNode{t: h.t, conn: conn, realDeadlines: real,
		r: wire.NewReader(bufio.NewReader(conn), wire.DefaultMaxFrame), w: wire.NewWriter(conn, wire.DefaultMaxFrame)}
	h.t.Cleanup(func() { conn.Close() })
	return n
}

func (n *fakeNode) send(env *iop.Envelope) {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.w.WriteEnvelope(env); err != nil {
		n.t.Fatalf("fake node write: %v", err)
	}
}

func (n *fakeNode) sendRaw(b []byte) {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, err := n.conn.Write(b); err != nil {
		n.t.Fatalf("fake node raw write: %v", err)
	}
}

// next reads the next envelope that is not a heartbeat ping.
func (n *fakeNode) next() (*iop.Envelope, error) {
	for {
		if n.realDeadlines {
			n.conn.SetReadDeadline(time.Now().Add(wait))
		}
		env := new(iop.Envelope)
		if err := n.r.ReadEnvelope(env); err != nil {
			return nil, err
		}
		if env.GetPing() == nil {
			return env, nil
		}
	}
}

func (n *fakeNode) recv() *iop.Envelope {
	n.t.Helper()
	env, err := n.next()
	if err != nil {
		n.t.Fatalf("fake node read: %v", err)
	}
	return env
}

func (n *fakeNode) register(id string) *iop.RegisterResponse {
	n.t.Helper()
	n.send(&iop.Envelope{Kind: &iop.Envelope_RegisterRequest{RegisterRequest: &iop.RegisterRequest{NodeId: id, Version: "test"}}})
	env := n.recv()
	if env.GetRegisterResponse() == nil {
		n.t.Fatalf("got %T, want RegisterResponse", env.Kind)
	}
	return env.GetRegisterResponse()
}

func (n *fakeNode) ready(id string) *iop.NodeReadyResponse {
	n.t.Helper()
	n.send(&iop.Envelope{Kind: &iop.Envelope_ReadyRequest{ReadyRequest: &iop.NodeReadyRequest{NodeId: id}}})
	env := n.recv()
	if env.GetReadyResponse() == nil {
		n.t.Fatalf("got %T, want NodeReadyResponse", env.Kind)
	}
	return env.GetReadyResponse()
}

// connect registers and readies id, failing the test otherwise.
func (n *fakeNode) connect(id string) {
	n.t.Helper()
	if r := n.register(id); !r.GetAccepted() {
		n.t.Fatalf("register %s refused: %s", id, r.GetReason())
	}
	if r := n.ready(id); !r.GetReady() {
		n.t.Fatalf("ready %s refused: %s", id, r.GetReason())
	}
}

func (n *fakeNode) ping(nonce uint64) {
	n.send(&iop.Envelope{Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{Nonce: nonce}}})
}

// roundTrip sends a ping and waits for its pong: proof the connection is
// alive and that everything the edge queued before the pong was read.
// Envelopes read on the way are returned.
func (n *fakeNode) roundTrip(nonce uint64) []*iop.Envelope {
	n.t.Helper()
	n.ping(nonce)
	var before []*iop.Envelope
	for {
		env := n.recv()
		if p := env.GetPong(); p != nil && p.GetNonce() == nonce {
			return before
		}
		before = append(before, env)
	}
}

// expectClosed reads until the edge closes the connection, returning the
// envelopes read before.
func (n *fakeNode) expectClosed() []*iop.Envelope {
	n.t.Helper()
	var got []*iop.Envelope
	for {
		env, err := n.next()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				n.t.Fatalf("connection still open after %v", wait)
			}
			return got
		}
		got = append(got, env)
	}
}

// connIDs are assigned in accept order starting at 1.
func connID(n int) registry.ConnID { return registry.ConnID(n) }
