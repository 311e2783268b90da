package session_test

// A minimal in-test Edge: real loopback TLS with certificates from
// identity.InitPKI, frames through internal/wire, scripted step by step by
// the test goroutine. It deliberately does not import internal/edge.

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/node/session"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

const (
	nodeID   = "gpu-1"
	edgeName = "edge-1"
	// waitFor bounds every wait on an event in these tests.
	waitFor = 5 * time.Second
)

// newPKI writes a dev PKI (CA, edge-1, gpu-1) into a temp dir.
func newPKI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: edgeName, Nodes: []string{nodeID}}); err != nil {
		t.Fatalf("InitPKI: %v", err)
	}
	return dir
}

type fakeEdge struct {
	t     *testing.T
	ln    net.Listener
	cfg   *tls.Config
	conns chan net.Conn
	done  chan struct{}

	mu   sync.Mutex
	open []net.Conn
}

// startEdge listens on 127.0.0.1 with the edge-1 certificate; connections are
// handed to the test through next. Cleanup closes everything and waits for
// the accept loop.
func startEdge(t *testing.T, dir string) *fakeEdge {
	t.Helper()
	cfg, err := identity.ServerConfig(identity.ServerOptions{
		CertFile:  filepath.Join(dir, identity.CertFileName(edgeName)),
		KeyFile:   filepath.Join(dir, identity.KeyFileName(edgeName)),
		CAFile:    filepath.Join(dir, "ca.crt"),
		EdgeName:  edgeName,
		AllowNode: func(n string) bool { return n == nodeID },
	})
	if err != nil {
		t.Fatalf("ServerConfig: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveEdge(t, ln, cfg)
}

// startPipeEdge is startEdge on net.Pipe pairs instead of loopback TCP, for
// tests in a testing/synctest bubble (the PKI must be made inside the
// bubble, whose clock starts in 2000). Give dial to the node as
// session.Options.Dial.
func startPipeEdge(t *testing.T, dir string) (e *fakeEdge, dial func(context.Context, string, string) (net.Conn, error)) {
	t.Helper()
	cfg, err := identity.ServerConfig(identity.ServerOptions{
		CertFile:  filepath.Join(dir, identity.CertFileName(edgeName)),
		KeyFile:   filepath.Join(dir, identity.KeyFileName(edgeName)),
		CAFile:    filepath.Join(dir, "ca.crt"),
		EdgeName:  edgeName,
		AllowNode: func(n string) bool { return n == nodeID },
	})
	if err != nil {
		t.Fatalf("ServerConfig: %v", err)
	}
	pl := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	return serveEdge(t, pl, cfg), pl.dial
}

// pipeListener hands out the server ends of net.Pipe pairs.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial is session.Options.Dial: the client end of a fresh pipe whose
// server end the listener accepts.
func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "127.0.0.1:1" }

// serveEdge accepts connections on ln and hands them to the test through
// next.
func serveEdge(t *testing.T, ln net.Listener, cfg *tls.Config) *fakeEdge {
	t.Helper()
	e := &fakeEdge{t: t, ln: ln, cfg: cfg, conns: make(chan net.Conn, 16), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.open = append(e.open, c)
			e.mu.Unlock()
			select {
			case e.conns <- c:
			default:
				c.Close()
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-e.done
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, c := range e.open {
			c.Close()
		}
	})
	return e
}

func (e *fakeEdge) addr() string { return e.ln.Addr().String() }

// next returns the next connection after a completed TLS handshake.
func (e *fakeEdge) next() *edgeConn {
	e.t.Helper()
	select {
	case c := <-e.conns:
		tc := tls.Server(c, e.cfg)
		c.SetDeadline(time.Now().Add(waitFor))
		if err := tc.Handshake(); err != nil {
			e.t.Fatalf("edge handshake: %v", err)
		}
		c.SetDeadline(time.Time{})
		return &edgeConn{t: e.t, raw: c, c: tc, r: wire.NewReader(tc, wire.DefaultMaxFrame), w: wire.NewWriter(tc, wire.DefaultMaxFrame)}
	case <-time.After(waitFor):
		e.t.Fatal("no connection from the node")
		return nil
	}
}

type edgeConn struct {
	t     *testing.T
	raw   net.Conn
	c     *tls.Conn
	r     *wire.Reader
	w     *wire.Writer
	pings int // pings from the node seen by recv
}

func (c *edgeConn) send(env *iop.Envelope) {
	c.t.Helper()
	c.raw.SetWriteDeadline(time.Now().Add(waitFor))
	if err := c.w.WriteEnvelope(env); err != nil {
		c.t.Fatalf("edge send %T: %v", env.Kind, err)
	}
}

func (c *edgeConn) sendRaw(body []byte) {
	c.t.Helper()
	c.raw.SetWriteDeadline(time.Now().Add(waitFor))
	if err := c.w.WriteFrame(body); err != nil {
		c.t.Fatalf("edge send raw: %v", err)
	}
}

// recvAny reads the next envelope, heartbeats included.
func (c *edgeConn) recvAny() (*iop.Envelope, error) {
	c.raw.SetReadDeadline(time.Now().Add(waitFor))
	env := new(iop.Envelope)
	err := c.r.ReadEnvelope(env)
	return env, err
}

// recv reads the next envelope that is not a heartbeat ping.
func (c *edgeConn) recv() *iop.Envelope {
	c.t.Helper()
	for {
		env, err := c.recvAny()
		if err != nil {
			c.t.Fatalf("edge recv: %v", err)
		}
		if env.GetPing() != nil {
			c.pings++
			continue
		}
		return env
	}
}

// expectClosed reads until the node closes the connection.
func (c *edgeConn) expectClosed() {
	c.t.Helper()
	for {
		env, err := c.recvAny()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatal("node did not close the connection")
			}
			return
		}
		if env.GetPing() == nil {
			c.t.Fatalf("got %T, want the node to close", env.Kind)
		}
	}
}

// register answers the node's registration with cfg and acks ready=true.
func (c *edgeConn) register(cfg *iop.NodeConfigPayload) {
	c.t.Helper()
	c.expectRegister()
	c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: cfg}}})
	c.expectReady()
	c.send(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Ready: true}}})
}

func (c *edgeConn) expectRegister() {
	c.t.Helper()
	env := c.recv()
	if got := env.GetRegisterRequest().GetNodeId(); got != nodeID {
		c.t.Fatalf("first frame %v, want RegisterRequest{node_id %q}", env, nodeID)
	}
}

func (c *edgeConn) expectReady() {
	c.t.Helper()
	env := c.recv()
	if got := env.GetReadyRequest().GetNodeId(); got != nodeID {
		c.t.Fatalf("got %v, want NodeReadyRequest{node_id %q}", env, nodeID)
	}
}

// ---- node side ----

type connectResult struct {
	ready bool
	err   error
	at    time.Time
}

func nodeOptions(t *testing.T, dir, addr string, f *fakeFactory) session.Options {
	t.Helper()
	tc, err := identity.ClientConfig(identity.ClientOptions{
		CertFile:         filepath.Join(dir, identity.CertFileName(nodeID)),
		KeyFile:          filepath.Join(dir, identity.KeyFileName(nodeID)),
		CAFile:           filepath.Join(dir, "ca.crt"),
		ExpectedEdgeName: edgeName,
		NodeName:         nodeID,
	})
	if err != nil {
		t.Fatalf("ClientConfig: %v", err)
	}
	return session.Options{
		NodeID: nodeID, Addr: addr, TLS: tc, NewExecutor: f.build, Version: "test",
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// startConnect runs session.Connect on a goroutine; cancel ends it. The
// test's cleanup releases f's held runs, cancels and waits for Connect.
func startConnect(t *testing.T, o session.Options, f *fakeFactory) (res <-chan connectResult, cancel context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan connectResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ready, err := session.Connect(ctx, o)
		ch <- connectResult{ready, err, time.Now()}
	}()
	t.Cleanup(func() {
		f.releaseAll()
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Error("Connect did not return after cancel")
		}
	})
	return ch, cancel
}

func waitResult(t *testing.T, ch <-chan connectResult) connectResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitFor):
		t.Fatal("Connect did not return")
		return connectResult{}
	}
}

func recvOn[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// J5: a node whose certificate expired while it was away (it could not
// renew) is refused by the edge at the handshake, and its error says so
// and what to do, not only the edge's TLS alert.
func TestExpiredCertificateSaysSo(t *testing.T) {
	leakcheck.Check(t)
	dir := newPKI(t)
	ca, err := identity.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	id := identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: nodeID}
	key, err := identity.NewNodeKey(id)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignNode(key.CSR, id, time.Now().Add(-2*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, identity.CertFileName(nodeID)), identity.CertificatePEM(der), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, identity.KeyFileName(nodeID)), key.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, dir)
	f := newFactory()
	res, _ := startConnect(t, nodeOptions(t, dir, e.addr(), f), f)
	select {
	case c := <-e.conns: // the edge's side of the handshake, which refuses the certificate
		c.SetDeadline(time.Now().Add(waitFor))
		if err := tls.Server(c, e.cfg).Handshake(); err == nil {
			t.Fatal("the edge accepted an expired certificate")
		}
		c.Close()
	case <-time.After(waitFor):
		t.Fatal("no connection from the node")
	}
	r := waitResult(t, res)
	if r.ready || !strings.Contains(errText(r.err), "this node's certificate expired at") || !strings.Contains(errText(r.err), "node join") {
		t.Fatalf("J5 an expired certificate: ready=%v err=%v, want an error saying it expired and how to join again", r.ready, r.err)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
