package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/events"
	"iop/internal/edge/registry"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/ratelog"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// L3, L5, N3, N5: a node connects, receives its config, is pending (not
// connected, no hook, no event) until ready, then is connected with
// ready_since, OnReady and node.connected; closing it fences once.
func TestNodeConnectsReceivesConfigAndBecomesReady(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n := h.dial("gpu-1")

	resp := n.register("gpu-1")
	if !resp.GetAccepted() || resp.GetReason() != "" {
		t.Fatalf("RegisterResponse = %v, want accepted", resp)
	}
	want := h.cfg.Load().NodePayload("gpu-1")
	if !proto.Equal(resp.GetConfig(), want) {
		t.Fatalf("config payload = %v, want %v", resp.GetConfig(), want)
	}
	// L3, P3: pending is not connected, gets no event and no hook.
	if st := h.node("gpu-1"); st.Connected || !st.Pending || st.Generation != 1 || !st.ReadySince.IsZero() {
		t.Fatalf("pending state = %+v, want pending generation 1, not connected", st)
	}
	h.noHooks()
	h.noEvents()

	if r := n.ready("gpu-1"); !r.GetReady() {
		t.Fatalf("NodeReadyResponse = %v, want ready", r)
	}
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	e := h.wantEvent(events.TypeConnected, "gpu-1")
	st := h.node("gpu-1")
	if !st.Connected || st.Pending || st.ReadySince.IsZero() || !st.ReadySince.Equal(e.Time) {
		t.Fatalf("ready state = %+v, want connected since %v", st, e.Time)
	}
	if other := h.node("gpu-2"); other.Connected || other.Pending {
		t.Fatalf("gpu-2 = %+v, want not connected", other)
	}

	n.conn.Close()
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
	if e := h.wantEvent(events.TypeDisconnected, "gpu-1"); e.Reason == "" {
		t.Fatalf("disconnect event has no reason: %+v", e)
	}
	if st := h.node("gpu-1"); st.Connected || st.Pending {
		t.Fatalf("state after close = %+v, want not connected", st)
	}
}

// I3, L2: refused registrations get a reason and the connection is closed;
// nothing becomes pending or ready.
func TestRegistrationRefused(t *testing.T) {
	tests := []struct {
		name, cert, id, reason string
		sentinel               error
	}{
		{"I3 certificate gpu-1 registering gpu-2", "gpu-1", "gpu-2", "certificate", registry.ErrNameMismatch},
		{"L2 unknown node id", "gpu-3", "gpu-3", "unknown node id", registry.ErrUnknownNode},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			h := newHarness(t, harnessOpts{})
			n := h.dial(tc.cert)
			r := n.register(tc.id)
			if r.GetAccepted() || !strings.Contains(r.GetReason(), tc.reason) || r.GetConfig() != nil {
				t.Fatalf("RegisterResponse = %v, want refused with reason containing %q and no config", r, tc.reason)
			}
			if !strings.Contains(r.GetReason(), tc.sentinel.Error()) {
				t.Fatalf("reason %q does not name %q", r.GetReason(), tc.sentinel)
			}
			if rest := n.expectClosed(); len(rest) != 0 {
				t.Fatalf("frames after refusal: %v", rest)
			}
			for _, st := range h.srv.Nodes() {
				if st.Connected || st.Pending {
					t.Fatalf("%s = %+v after a refused registration", st.ID, st)
				}
			}
			h.stop()
			h.noHooks()
			h.noEvents()
		})
	}
}

// I2: a certificate with role edge dialing as a node is refused in the
// handshake, before registration: its RegisterRequest is never answered.
// Both the edge certificate as issued (serverAuth only) and a role-edge
// certificate that does carry clientAuth (so only the SPIFFE role check can
// refuse it) are tried.
func TestEdgeRoleCertificateRefusedBeforeRegistration(t *testing.T) {
	tests := []struct {
		name    string
		cert    func(h *harness) tls.Certificate
		wantLog string
	}{
		{"I2 edge certificate as issued", func(h *harness) tls.Certificate {
			pair, err := tls.LoadX509KeyPair(h.file("edge-1.crt"), h.file("edge-1.key"))
			if err != nil {
				t.Fatal(err)
			}
			return pair
		}, "handshake refused"},
		{"I2 role edge with clientAuth", func(h *harness) tls.Certificate {
			return issueFromCA(t, h, "spiffe://iop.local/edge/gpu-1", x509.ExtKeyUsageClientAuth)
		}, identity.ErrWrongRole.Error()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			h := newHarness(t, harnessOpts{})
			caPEM, err := os.ReadFile(h.file("ca.crt"))
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(caPEM)
			// The edge's certificate has no DNS name for Go's host check;
			// the server's identity is not what this test is about, so the
			// client skips verifying it (this test proves the connection fails).
			n := h.dialTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{tc.cert(h)},
				RootCAs: roots, InsecureSkipVerify: true})
			n.conn.Handshake() // TLS 1.3: the client may finish before the server refuses
			n.conn.Write([]byte{0, 0, 0, 2, 0x52, 0})
			if env, err := n.next(); err == nil {
				t.Fatalf("edge-role peer got %v, want the connection refused", env)
			}
			h.stop()
			for _, st := range h.srv.Nodes() {
				if st.Connected || st.Pending {
					t.Fatalf("%s = %+v after an edge-role peer", st.ID, st)
				}
			}
			h.noHooks()
			if logs := h.logs.String(); !strings.Contains(logs, tc.wantLog) || strings.Contains(logs, "registered") {
				t.Fatalf("edge log lacks %q or shows a registration:\n%s", tc.wantLog, logs)
			}
		})
	}
}

// issueFromCA signs a leaf certificate with the dev CA's key for a URI SAN
// and extended key usage that InitPKI would never issue.
func issueFromCA(t *testing.T, h *harness, uri string, eku x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	caPair, err := tls.LoadX509KeyPair(h.file("ca.crt"), h.file("ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(4242), URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caPair.Leaf, &key.PublicKey, caPair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// L1: a second registration on one connection, same id or another, is
// refused; the connection keeps its binding and generation and can still
// say ready.
func TestDuplicateRegistrationOnOneConnection(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n := h.dial("gpu-1")
	if r := n.register("gpu-1"); !r.GetAccepted() {
		t.Fatalf("first registration refused: %s", r.GetReason())
	}
	for _, id := range []string{"gpu-1", "gpu-2"} {
		r := n.register(id)
		if r.GetAccepted() || !strings.Contains(r.GetReason(), registry.ErrAlreadyRegistered.Error()) {
			t.Fatalf("second registration as %s = %v, want refused: already registered", id, r)
		}
	}
	if st := h.node("gpu-1"); st.Generation != 1 || !st.Pending {
		t.Fatalf("gpu-1 = %+v, want pending generation 1", st)
	}
	if r := n.ready("gpu-1"); !r.GetReady() {
		t.Fatalf("ready after duplicate registration refused: %s", r.GetReason())
	}
	// L5: a duplicate ready of the ready owner is true, with no second hook.
	if r := n.ready("gpu-1"); !r.GetReady() {
		t.Fatalf("duplicate ready refused: %s", r.GetReason())
	}
	// L6: ready naming another node id is false with a reason.
	if r := n.ready("gpu-2"); r.GetReady() || r.GetReason() == "" {
		t.Fatalf("ready naming gpu-2 = %v, want false with reason", r)
	}
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	h.noHooks()
	h.stop()
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
}

// L4, L8: a second connection for the same node id takes over: the old
// generation is fenced once and its connection closed; its ready is stale.
func TestTakeoverFencesOldGenerationOnce(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	a := h.dial("gpu-1")
	a.connect("gpu-1")
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	h.wantEvent(events.TypeConnected, "gpu-1")

	b := h.dial("gpu-1")
	if r := b.register("gpu-1"); !r.GetAccepted() {
		t.Fatalf("takeover registration refused: %s", r.GetReason())
	}
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
	if e := h.wantEvent(events.TypeDisconnected, "gpu-1"); !strings.Contains(e.Reason, "superseded") {
		t.Fatalf("disconnect reason = %q, want superseded", e.Reason)
	}
	a.expectClosed()
	if st := h.node("gpu-1"); !st.Pending || st.Generation != 2 {
		t.Fatalf("gpu-1 = %+v, want pending generation 2", st)
	}
	if r := b.ready("gpu-1"); !r.GetReady() {
		t.Fatalf("new owner's ready refused: %s", r.GetReason())
	}
	h.wantHooks(hookCall{"ready", "gpu-1", 2})
	h.wantEvent(events.TypeConnected, "gpu-1")
	h.noHooks()
	h.stop()
	h.wantHooks(hookCall{"fence", "gpu-1", 2})
	h.noHooks()
}

// A3: a ready node's NodeDrainingNotice reaches OnDraining once with
// its generation and publishes node.draining; the session stays up (its
// streams go on) until the node closes it. A notice before ready, or a
// second one, changes nothing.
func TestDrainingNotice(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	notice := &iop.Envelope{Kind: &iop.Envelope_DrainingNotice{DrainingNotice: &iop.NodeDrainingNotice{DrainTimeoutMs: 30000}}}
	a := h.dial("gpu-1")
	a.register("gpu-1")
	a.send(notice) // pending: ignored
	if r := a.ready("gpu-1"); !r.GetReady() {
		t.Fatalf("ready refused: %s", r.GetReason())
	}
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	h.wantEvent(events.TypeConnected, "gpu-1")
	a.send(notice)
	a.send(notice)
	a.roundTrip(7) // both notices were read
	h.wantHooks(hookCall{"draining", "gpu-1", 1})
	h.wantEvent(events.TypeDraining, "gpu-1")
	h.noHooks()
	h.noEvents()
	if st := h.node("gpu-1"); !st.Connected {
		t.Fatalf("gpu-1 = %+v after draining, want still connected", st)
	}
	// A request dispatched before the Edge read the notice reaches a node
	// that closes: its stream ends with ErrNodeDrained (an ErrSessionLost
	// too), so the surface answers 503 node_shutdown, not 502.
	st, err := h.srv.StartRun(dispatch.Target{Node: "gpu-1", Generation: 1}, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a.recv() // the RunRequest
	a.conn.Close()
	recvErr(t, st, dispatch.ErrNodeDrained)
	recvErr(t, st, dispatch.ErrSessionLost)
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
}

// L9: the new generation becomes ready before the old connection's read
// loop reports its close; that late close leaves the new one ready, calls
// no hook and emits no event.
func TestLateCloseOfOldGenerationAfterNewReady(t *testing.T) {
	leakcheck.Check(t)
	release, reached, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	h := newHarness(t, harnessOpts{setup: func(s *Server) {
		s.beforeConnClosed = func(id registry.ConnID) {
			if id == connID(1) {
				close(reached)
				<-release
			}
		}
		s.afterConnClosed = func(id registry.ConnID) {
			if id == connID(1) {
				close(done)
			}
		}
	}})
	a := h.dial("gpu-1")
	a.connect("gpu-1")
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	h.wantEvent(events.TypeConnected, "gpu-1")

	b := h.dial("gpu-1")
	b.connect("gpu-1")
	h.wantHooks(hookCall{"fence", "gpu-1", 1}, hookCall{"ready", "gpu-1", 2})
	h.wantEvent(events.TypeDisconnected, "gpu-1")
	h.wantEvent(events.TypeConnected, "gpu-1")
	select {
	case <-reached: // the old read loop failed and waits to report it
	case <-time.After(wait):
		t.Fatal("old session never reached its close")
	}
	close(release)
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("old session's close was not processed")
	}
	if st := h.node("gpu-1"); !st.Connected || st.Generation != 2 {
		t.Fatalf("gpu-1 = %+v after the late close, want connected generation 2", st)
	}
	h.noHooks()
	h.noEvents()
	b.roundTrip(1) // the new session is unaffected
}

// W5, W1: a malformed frame, a zero length and an oversized pre-ready frame
// close the connection; an unknown envelope kind is ignored.
func TestFrameErrors(t *testing.T) {
	unknownKind := protowire.AppendTag(nil, 99, protowire.BytesType)
	unknownKind = protowire.AppendBytes(unknownKind, []byte("from the future"))
	frame := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	tests := []struct {
		name   string
		send   []byte
		closes bool
	}{
		{"W5 malformed protobuf closes", frame([]byte{0xff, 0xff, 0xff}), true},
		{"W1 zero length closes", []byte{0, 0, 0, 0}, true},
		// Only the header is sent: the edge must close without waiting for
		// (or allocating) the 70000-byte body.
		{"W1 oversized pre-ready frame closes before allocating", binary.BigEndian.AppendUint32(nil, 70000), true},
		{"W5 unknown envelope kind is ignored", frame(unknownKind), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			h := newHarness(t, harnessOpts{})
			n := h.dial("gpu-1")
			n.sendRaw(tc.send)
			if tc.closes {
				n.expectClosed()
				return
			}
			n.roundTrip(7)
			n.connect("gpu-1")
		})
	}
}

// W1: after ready the cap is 16 MiB, so a 70000-byte frame is accepted (a
// run event for an unknown run id, dropped).
func TestFrameCapRaisedAfterReady(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n := h.dial("gpu-1")
	n.connect("gpu-1")
	n.send(&iop.Envelope{RunId: "nope", Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{
		Seq: 1, Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: strings.Repeat("x", 70000)}}})
	n.roundTrip(3)
}

// L7: the edge answers pings with the same nonce and sends its own pings
// every interval.
func TestHeartbeats(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{cfg: testConfig(t, 50, 1000, 2000, 4)})
	n := h.dial("gpu-1")
	n.connect("gpu-1")
	n.ping(42)
	pings := 0
	gotPong := false
	for pings < 2 || !gotPong {
		n.conn.SetReadDeadline(time.Now().Add(wait))
		env := new(iop.Envelope)
		if err := n.r.ReadEnvelope(env); err != nil {
			t.Fatalf("read: %v (pings %d, pong %v)", err, pings, gotPong)
		}
		switch {
		case env.GetPing() != nil:
			pings++
		case env.GetPong() != nil:
			if env.GetPong().GetNonce() != 42 {
				t.Fatalf("pong nonce = %d, want 42", env.GetPong().GetNonce())
			}
			gotPong = true
		}
	}
}

// L7 over real TLS: a ready node that goes silent but keeps its socket
// open is fenced after heartbeat.timeout_ms (here 300 ms), not before, and
// its connection closed.
func TestHalfOpenNodeFencedRealTLS(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{cfg: testConfig(t, 100, 200, 300, 4)})
	n := h.dial("gpu-1")
	n.register("gpu-1")
	silentSince := time.Now() // the ready request is the last frame sent
	if r := n.ready("gpu-1"); !r.GetReady() {
		t.Fatalf("ready refused: %s", r.GetReason())
	}
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
	if el := time.Since(silentSince); el < 300*time.Millisecond {
		t.Fatalf("fenced after %v, before the 300ms timeout", el)
	}
	if e := h.wantEvent(events.TypeConnected, "gpu-1"); e.Node != "gpu-1" {
		t.Fatal(e)
	}
	if e := h.wantEvent(events.TypeDisconnected, "gpu-1"); e.Reason != registry.ErrHeartbeatTimeout.Error() {
		t.Fatalf("disconnect reason = %q, want heartbeat timeout", e.Reason)
	}
	n.expectClosed()
}

// B1: anyone who reaches the node port can make a handshake fail, so
// the refusals are logged at a bounded rate: a flood writes
// ratelog.DefaultBurst lines per second, and the next line counts the
// suppressed ones.
func TestRefusedHandshakesLogBounded(t *testing.T) {
	leakcheck.Check(t)
	var mu sync.Mutex
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newHarness(t, harnessOpts{modify: func(o *Options) {
		o.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	}})
	refuse := func() {
		c, err := h.dialer()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(wait))
		io.WriteString(c, "GET / HTTP/1.0\r\n\r\n") // not a TLS ClientHello
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("the edge did not close a refused connection: %v", err)
		}
	}
	const flood = 50
	for range flood {
		refuse()
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	refuse()
	h.stop()
	logs := h.logs.String()
	if n := strings.Count(logs, "node TLS handshake refused"); n != ratelog.DefaultBurst+1 {
		t.Errorf("got %d refusal lines for %d refusals, want %d", n, flood+1, ratelog.DefaultBurst+1)
	}
	if want := fmt.Sprintf("suppressed=%d", flood-ratelog.DefaultBurst); !strings.Contains(logs, want) {
		t.Errorf("no line with %s:\n%s", want, logs)
	}
}
