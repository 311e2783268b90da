package fleet

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/proctest"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// edgeEnv is an edge's PKI and config with enrollment on and a node
// template for gpu-*, plus a join listener served by a Fleet.
type edgeEnv struct {
	dir, store string
	pki        string
	cfg        *config.Config
	f          *Fleet
	addr       string
	log        *proctest.Log
	changed    chan struct{}
}

func writeConfig(t testing.TB, dir string, edit func(map[string]any)) *config.Config {
	t.Helper()
	raw := map[string]any{
		"http_listen": "127.0.0.1:0", "node_listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
		"tls":        map[string]any{"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt"},
		"enrollment": map[string]any{"ca_key_file": "pki/ca.key", "store_file": "enrollment.json", "certificate_ttl_ms": 120000},
		"nodes":      []any{map[string]any{"id": "static-1", "adapters": []any{map[string]any{"type": "ollama", "base_url": "http://127.0.0.1:11434"}}}},
		"node_templates": []any{map[string]any{"match": "gpu-*", "adapters": []any{
			map[string]any{"type": "ollama", "base_url": "http://127.0.0.1:11434"}}}},
		"models": []any{map[string]any{"name": "tiny", "providers": []any{map[string]any{"node": "gpu-*", "provider": "ollama", "target": "tiny"}}}},
	}
	if edit != nil {
		edit(raw)
	}
	b, _ := json.Marshal(raw)
	p := filepath.Join(dir, "edge.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newEdgeEnv(t testing.TB, edit func(map[string]any)) *edgeEnv {
	t.Helper()
	return newEdgeEnvAt(t, edit, nil)
}

// newEdgeEnvAt is newEdgeEnv with the Fleet's clock (Options.Now; nil =
// time.Now).
func newEdgeEnvAt(t testing.TB, edit func(map[string]any), now func() time.Time) *edgeEnv {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(filepath.Join(dir, "pki"), identity.PKIOptions{Edge: "edge-1", Nodes: []string{"static-1"}}); err != nil {
		t.Fatal(err)
	}
	e := &edgeEnv{dir: dir, store: filepath.Join(dir, "enrollment.json"), pki: filepath.Join(dir, "pki"), log: &proctest.Log{},
		changed: make(chan struct{}, 16)}
	e.cfg = writeConfig(t, dir, edit)
	f, err := New(e.cfg, Options{Logger: slog.New(slog.NewTextHandler(e.log, nil)), Now: now,
		Changed: func() { e.changed <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	e.f = f
	srv, err := identity.ServerConfig(identity.ServerOptions{CertFile: e.cfg.TLS.CertFile, KeyFile: e.cfg.TLS.KeyFile, CAFile: e.cfg.TLS.CAFile,
		AllowNode: func(string) bool { return true }, VerifyNode: f.Admit})
	if err != nil {
		t.Fatal(err)
	}
	srv = identity.JoinServerConfig(srv, f.ChainCA())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { // as the transport does: handshake, then the join
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				tc := tls.Server(c, srv)
				if tc.Handshake() == nil && tc.ConnectionState().NegotiatedProtocol == identity.JoinALPN {
					f.ServeJoin(tc)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return e
}

// token adds a token to the store as edge tokens create does.
func (e *edgeEnv) token(t *testing.T, edit func(*Token)) identity.JoinToken {
	t.Helper()
	ca, err := identity.LoadCA(filepath.Join(e.pki, "ca.crt"), filepath.Join(e.pki, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := identity.NewJoinToken(identity.CAPin(ca.Cert))
	if err != nil {
		t.Fatal(err)
	}
	rec := &Token{ID: tok.ID, SecretSHA256: tok.SecretSHA256(), Node: "gpu-3", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), Uses: 1}
	if edit != nil {
		edit(rec)
	}
	if err := Update(e.store, func(st *Store) error { st.Tokens = append(st.Tokens, rec); return nil }); err != nil {
		t.Fatal(err)
	}
	return tok
}

// joinReq is what a node sends for name, with a CSR for csrName.
func joinReq(t *testing.T, tok identity.JoinToken, name, csrName string) *iop.NodeJoinRequest {
	t.Helper()
	k, err := identity.NewNodeKey(identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: csrName})
	if err != nil {
		t.Fatal(err)
	}
	rk, _ := identity.NewRecipientKey()
	return &iop.NodeJoinRequest{TokenId: tok.ID, TokenSecret: tok.Secret, NodeName: name, Csr: k.CSR,
		LeaseRecipientPublicKey: rk.Public.Bytes()}
}

// join dials the edge as node join does (ALPN, the pin checked before
// anything is sent) and returns the answer.
func join(t *testing.T, addr, pin string, req *iop.NodeJoinRequest) (*iop.NodeJoinResponse, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, identity.JoinClientConfig(pin, nil))
	if err := tc.Handshake(); err != nil {
		return nil, err
	}
	// A write error is not the end: the edge may have answered and closed
	// before the whole of an oversized request was sent.
	werr := wire.NewWriter(tc, 1<<20).WriteEnvelope(&iop.Envelope{Kind: &iop.Envelope_JoinRequest{JoinRequest: req}})
	var env iop.Envelope
	if err := wire.NewReader(tc, 1<<20).ReadEnvelope(&env); err != nil {
		return nil, errors.Join(werr, err)
	}
	return env.GetJoinResponse(), nil
}

func (e *edgeEnv) storeBytes(t *testing.T) []byte {
	b, err := os.ReadFile(e.store)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// J1 J2 J3: a granted join signs a clientAuth SPIFFE certificate for the
// node's own key and records it; every refused one — expired, used up,
// revoked, another CA's token, a CSR for another name, a name the token or
// the config does not allow, an edge without enrollment — is a clear
// error on both sides and leaves the enrollment store byte for byte as it
// was.
func TestJoin(t *testing.T) {
	leakcheck.Check(t)
	e := newEdgeEnv(t, nil)
	good := e.token(t, nil)
	req := joinReq(t, good, "gpu-3", "gpu-3")
	resp, err := join(t, e.addr, good.Pin, req)
	if err != nil || !resp.GetOk() {
		t.Fatalf("J2 a good join: %v, %v", resp, err)
	}
	cert, err := identity.ParseCertificatePEM(resp.GetCertificatePem())
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := identity.FromCertificate(cert); id.String() != "spiffe://iop.local/node/gpu-3" ||
		len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("J2 certificate %v, EKU %v", id, cert.ExtKeyUsage)
	}
	csr, _ := x509.ParseCertificateRequest(req.Csr)
	if !csr.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
		t.Error("J2 the certificate is not for the node's own key")
	}
	if d := time.Until(cert.NotAfter); d > 2*time.Minute || d < time.Minute {
		t.Errorf("J5 certificate_ttl_ms 120000: NotAfter in %v", d)
	}
	if resp.GetEdgeName() != "edge-1" || resp.GetTrustDomain() != "iop.local" || len(resp.GetCaPem()) == 0 {
		t.Errorf("J2 answer: edge %q, trust domain %q", resp.GetEdgeName(), resp.GetTrustDomain())
	}
	st, _ := LoadStore(e.store)
	if r := st.Node("gpu-3"); r == nil || r.Serials[0] != serialHex(cert) || st.Token(good.ID).Used != 1 {
		t.Fatalf("J1 the store after the join: %+v", r)
	}
	if bytes.Contains(e.storeBytes(t), []byte(good.Secret)) {
		t.Fatal("J1 the store holds the token's secret")
	}
	select {
	case <-e.changed:
	default:
		t.Error("J7 a join did not announce a change")
	}
	if err := e.f.Admit(identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: "gpu-3"}, cert); err != nil {
		t.Errorf("J6 the new certificate is refused: %v", err)
	}

	past := time.Now().Add(-time.Minute)
	other := newEdgeEnv(t, nil)
	otherTok := other.token(t, nil)
	off := newEdgeEnv(t, func(m map[string]any) { delete(m, "enrollment") })
	offTok := off.token(t, nil)
	second := newEdgeEnv(t, nil) // refusals log at a bounded rate per edge
	for _, tt := range []struct {
		name    string
		env     *edgeEnv
		tok     func(*Token)
		pin     string // "" = the token's
		reqName string
		csrName string
		mutate  func(*iop.NodeJoinRequest)
		want    string // in the node's error
		handErr error  // the handshake fails instead
	}{
		{name: "J1 expired token", tok: func(t *Token) { t.ExpiresAt = past }, want: "join token expired"},
		{name: "J1 used-up token replayed", tok: func(t *Token) { t.Used = 1 }, want: "join token used up"},
		{name: "J1 revoked token", tok: func(t *Token) { t.RevokedAt = &past }, want: "join token revoked"},
		{name: "J1 token for another node name", tok: func(t *Token) { t.Node = "gpu-9" }, want: "not allowed by this join token"},
		{name: "J1 wrong secret", mutate: func(r *iop.NodeJoinRequest) { r.TokenSecret = strings.Repeat("A", 43) }, want: "invalid join token"},
		{name: "J2 a CSR for another name", csrName: "gpu-4", want: "asks for spiffe://iop.local/node/gpu-4"},
		{name: "J7 a name no template matches", reqName: "cpu-1", csrName: "cpu-1", tok: func(t *Token) { t.Node = "cpu-1" },
			want: "no node_templates entry"},
		{name: "J7 a name the config lists", reqName: "static-1", csrName: "static-1", tok: func(t *Token) { t.Node = "static-1" },
			want: "listed in the edge config's nodes[]"},
		{name: "J1 a name no template matches, for a token of another node, names both", env: second, reqName: "vm", csrName: "vm", tok: func(t *Token) { t.Node = "gpu-9" },
			want: `"vm" (the token is for "gpu-9")`},
		{name: "J4 a wrong secret learns nothing of the config", env: second, reqName: "static-1", csrName: "static-1",
			mutate: func(r *iop.NodeJoinRequest) { r.TokenSecret = strings.Repeat("A", 43) }, want: "invalid join token"},
		{name: "J2 a recipient key of 31 bytes", mutate: func(r *iop.NodeJoinRequest) { r.LeaseRecipientPublicKey = r.LeaseRecipientPublicKey[:31] },
			want: "lease recipient public key"},
		{name: "J1 a token pinned to another CA", pin: otherTok.Pin, handErr: identity.ErrPinMismatch},
		{name: "J1 an edge without enrollment", env: off, pin: offTok.Pin, want: "enrollment is off"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := tt.env
			if env == nil {
				env = e
			}
			tok := env.token(t, tt.tok)
			name, csrName := "gpu-3", "gpu-3"
			if tt.reqName != "" {
				name = tt.reqName
			}
			if tt.csrName != "" {
				csrName = tt.csrName
			}
			req := joinReq(t, tok, name, csrName)
			if tt.mutate != nil {
				tt.mutate(req)
			}
			pin := tok.Pin
			if tt.pin != "" {
				pin = tt.pin
			}
			before := env.storeBytes(t)
			logBefore := len(env.log.String())
			resp, err := join(t, env.addr, pin, req)
			if tt.handErr != nil {
				if !errors.Is(err, tt.handErr) {
					t.Fatalf("handshake: got %v, want %v", err, tt.handErr)
				}
			} else {
				if err != nil || resp.GetOk() || !strings.Contains(resp.GetError(), tt.want) {
					t.Fatalf("node side: got %v, %v; want an error with %q", resp, err, tt.want)
				}
				if !strings.Contains(env.log.String()[logBefore:], "node join refused") {
					t.Errorf("edge side: no refusal logged:\n%s", env.log.String()[logBefore:])
				}
				if strings.Contains(resp.GetError(), tok.Secret) || strings.Contains(env.log.String(), tok.Secret) {
					t.Error("the secret appears in an error or the log")
				}
			}
			if after := env.storeBytes(t); !bytes.Equal(before, after) {
				t.Errorf("J3 a refused join changed the store:\n%s\n→\n%s", before, after)
			}
		})
	}
}

// J4: a join connection is bounded like any unauthenticated peer: a
// request over MaxJoinRequest is refused before it is buffered, and beyond
// enrollment.joins_per_minute the edge answers "busy" without reading.
func TestJoinBounds(t *testing.T) {
	leakcheck.Check(t)
	e := newEdgeEnv(t, func(m map[string]any) {
		m["enrollment"].(map[string]any)["joins_per_minute"] = 3
	})
	tok := e.token(t, nil)
	big := joinReq(t, tok, "gpu-3", "gpu-3")
	big.Version = strings.Repeat("v", MaxJoinRequest)
	before := e.storeBytes(t)
	resp, err := join(t, e.addr, tok.Pin, big)
	// The edge answers and closes after the frame's header; the unread rest
	// may make the kernel reset the connection before the answer is read.
	if err == nil && (resp.GetOk() || !strings.Contains(resp.GetError(), "frame")) {
		t.Fatalf("J4 an oversized request: %v", resp)
	}
	if !bytes.Equal(before, e.storeBytes(t)) {
		t.Error("J4 an oversized request changed the store")
	}
	for i := 0; i < 2; i++ {
		join(t, e.addr, tok.Pin, &iop.NodeJoinRequest{TokenId: "x"})
	}
	resp, err = join(t, e.addr, tok.Pin, joinReq(t, tok, "gpu-3", "gpu-3"))
	if err != nil || resp.GetOk() || !strings.Contains(resp.GetError(), "busy") {
		t.Fatalf("J4 the fourth join in a minute of 3: %v, %v; want busy", resp, err)
	}
	if st, _ := LoadStore(e.store); st.Token(tok.ID).Used != 0 {
		t.Error("J4 a refused join spent a use")
	}
}

// longCSR is a CSR for spiffe://iop.local/node/<n bytes of x>: a request
// whose name no SPIFFE ID can have.
func longCSR(t *testing.T, n int) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u := &url.URL{Scheme: "spiffe", Host: "iop.local", Path: "/node/" + strings.Repeat("x", n)}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

// J4 J5: what a refusal quotes of the peer's input is bounded, in the
// answer and in the log line: anyone who reaches node_listen may send a
// 16 KiB name or a CSR for a name of kilobytes (a line each, ten a
// second), and a ready node a renewal of megabytes, as often as it likes
// (its refusals are rate limited too).
func TestRefusalsQuoteBoundedInput(t *testing.T) {
	leakcheck.Check(t)
	// The Fleet's clock stands still, so the 50 renewals below fall in
	// one window of the refusal log's rate limit however slowly a loaded
	// machine runs them (at load 23 a real clock spread them over windows
	// enough to log 29 lines).
	frozen := time.Now()
	e := newEdgeEnvAt(t, nil, func() time.Time { return frozen })
	tok := e.token(t, nil)
	const maxLine = 2048 + 512 // what a refusal may quote plus the line's own fields
	longest := func(log string) int {
		n := 0
		for _, l := range strings.Split(log, "\n") {
			n = max(n, len(l))
		}
		return n
	}
	longName := joinReq(t, tok, strings.Repeat("x", 15000), "gpu-3")
	longURI := joinReq(t, tok, "gpu-3", "gpu-3")
	longURI.Csr = longCSR(t, 7000)
	for name, req := range map[string]*iop.NodeJoinRequest{"a 15,000-byte name": longName, "a CSR for a 7,000-byte name": longURI} {
		resp, err := join(t, e.addr, tok.Pin, req)
		if err != nil || resp.GetOk() {
			t.Fatalf("J4 %s: %v %v", name, resp, err)
		}
		if n := len(resp.GetError()); n > 2048 {
			t.Errorf("J4 %s: the answer quotes %d bytes", name, n)
		}
	}
	if n := longest(e.log.String()); n > maxLine {
		t.Errorf("J4 a refused join logged a line of %d bytes", n)
	}
	// One request sent 50 times, made before the first, on the frozen
	// clock: the refusals come within the log's one window.
	huge := &iop.CertificateRenewRequest{Csr: longCSR(t, 1<<16)}
	before := strings.Count(e.log.String(), "renewal refused")
	for range 50 {
		if r := e.f.Renew("gpu-3", nil, huge); r.GetOk() || len(r.GetError()) > 2048 {
			t.Fatalf("J5 a renewal for a 64 KiB name: ok %v, an answer of %d bytes", r.GetOk(), len(r.GetError()))
		}
	}
	if n := strings.Count(e.log.String(), "renewal refused") - before; n == 0 || n > 20 {
		t.Errorf("J5 50 refused renewals in a moment logged %d lines, want a few (rate limited)", n)
	}
	if n := longest(e.log.String()); n > maxLine {
		t.Errorf("J5 a refused renewal logged a line of %d bytes", n)
	}
}
