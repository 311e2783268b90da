package identity

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// J1: a token round-trips through its wire form; anything else is refused
// without quoting the secret.
func TestJoinToken(t *testing.T) {
	p := newPKI(t, td, "edge-1")
	pin := CAPin(p.ca)
	tok, err := NewJoinToken(pin)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseJoinToken("  " + tok.String() + "\n")
	if err != nil || got != tok {
		t.Fatalf("round trip: got %+v, %v; want %+v", got, err, tok)
	}
	if !SecretMatches(tok.Secret, tok.SecretSHA256()) || SecretMatches(tok.Secret+"x", tok.SecretSHA256()) {
		t.Error("SecretMatches disagrees with SecretSHA256")
	}
	named := tok
	named.Node = "gpu-9.rack_2"
	if got, err := ParseJoinToken(named.String()); err != nil || got != named || !strings.HasSuffix(named.String(), "."+tok.Secret+".gpu-9.rack_2") {
		t.Fatalf("J1 a token for one node: %q parses to %+v, %v; want %+v", named.String(), got, err, named)
	}
	other, _ := NewJoinToken(pin)
	if other.ID == tok.ID || other.Secret == tok.Secret {
		t.Error("two tokens share an id or a secret")
	}
	for _, tt := range []struct{ name, s string }{
		{"J1 empty", ""},
		{"J1 three parts", "iop1." + pin + "." + tok.ID},
		{"J1 other version", "iop2." + pin + "." + tok.ID + "." + tok.Secret},
		{"J1 short pin", "iop1.abc." + tok.ID + "." + tok.Secret},
		{"J1 upper-case id", "iop1." + pin + "." + strings.ToUpper("abcdef0123456789") + "." + tok.Secret},
		{"J1 short secret", "iop1." + pin + "." + tok.ID + ".c2VjcmV0"},
		{"J1 an empty node name", "iop1." + pin + "." + tok.ID + "." + tok.Secret + "."},
		{"J1 a path-like node name", "iop1." + pin + "." + tok.ID + "." + tok.Secret + ".../etc"},
		{"J1 a node name with a slash", "iop1." + pin + "." + tok.ID + "." + tok.Secret + ".gpu/1"},
		{"J1 a node name of 64", "iop1." + pin + "." + tok.ID + "." + tok.Secret + "." + strings.Repeat("a", 64)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseJoinToken(tt.s)
			if !errors.Is(err, ErrBadJoinToken) {
				t.Fatalf("got %v, want ErrBadJoinToken", err)
			}
			if strings.Contains(err.Error(), tok.Secret) {
				t.Errorf("error quotes the secret: %v", err)
			}
		})
	}
}

func csrFor(t *testing.T, tmpl *x509.CertificateRequest, key any) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// J2: the edge signs a CSR only for exactly the node identity it allows.
func TestCheckNodeCSR(t *testing.T) {
	want := ID{TrustDomain: td, Role: RoleNode, Name: "gpu-3"}
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	uri := func(s string) []*url.URL { u, _ := url.Parse(s); return []*url.URL{u} }
	good := nodeCSR(t, want)
	tampered := append([]byte(nil), good...)
	tampered[len(tampered)-5] ^= 0xff
	for _, tt := range []struct {
		name string
		der  []byte
		ok   bool
	}{
		{"J2 NewNodeKey's CSR", good, true},
		{"J2 Ed25519 key", csrFor(t, &x509.CertificateRequest{URIs: sans(want)}, edKey), true},
		{"J2 a CSR for another name", csrFor(t, &x509.CertificateRequest{URIs: uri("spiffe://iop.local/node/gpu-4")}, p256), false},
		{"J2 another trust domain", csrFor(t, &x509.CertificateRequest{URIs: uri("spiffe://other.local/node/gpu-3")}, p256), false},
		{"J2 the edge role", csrFor(t, &x509.CertificateRequest{URIs: uri("spiffe://iop.local/edge/gpu-3")}, p256), false},
		{"J2 no URI SAN", csrFor(t, &x509.CertificateRequest{}, p256), false},
		{"J2 two URI SANs", csrFor(t, &x509.CertificateRequest{URIs: append(sans(want), sans(want)...)}, p256), false},
		{"J2 a DNS SAN as well", csrFor(t, &x509.CertificateRequest{URIs: sans(want), DNSNames: []string{"edge.example"}}, p256), false},
		{"J2 P-384 key", csrFor(t, &x509.CertificateRequest{URIs: sans(want)}, p384), false},
		{"J2 RSA key", csrFor(t, &x509.CertificateRequest{URIs: sans(want)}, rsaKey), false},
		{"J2 broken signature", tampered, false},
		{"J2 not DER", []byte("not a csr"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CheckNodeCSR(tt.der, want)
			if tt.ok && err != nil {
				t.Fatalf("got %v, want accepted", err)
			}
			if !tt.ok && !errors.Is(err, ErrBadCSR) {
				t.Fatalf("got %v, want ErrBadCSR", err)
			}
		})
	}
}

func sans(id ID) []*url.URL { return []*url.URL{id.URL()} }

// nodeCSR is NewNodeKey's CSR for id.
func nodeCSR(t *testing.T, id ID) []byte {
	t.Helper()
	k, err := NewNodeKey(id)
	if err != nil {
		t.Fatal(err)
	}
	return k.CSR
}

// J2 J5: an enrolled certificate is a node workload certificate valid for
// the requested lifetime, backdated by a quarter of it at most, and the
// node's ClientConfig presents it to an edge that accepts it.
func TestSignNode(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, td, "edge-1")
	ca, err := LoadCA(p.path(CACertFile), p.path(CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if ca.TrustDomain != td {
		t.Errorf("CA trust domain %q, want %q", ca.TrustDomain, td)
	}
	id := ID{TrustDomain: td, Role: RoleNode, Name: "gpu-3"}
	key, err := NewNodeKey(id)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	der, err := ca.SignNode(key.CSR, id, now, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := FromCertificate(c); got != id {
		t.Errorf("identity %v, want %v", got, id)
	}
	if len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("extended key usage %v, want clientAuth only", c.ExtKeyUsage)
	}
	if d := c.NotAfter.Sub(now); d > 2*time.Minute || d < 2*time.Minute-time.Second {
		t.Errorf("NotAfter is %v after signing, want 2m", d)
	}
	if d := now.Sub(c.NotBefore); d > 30*time.Second+time.Second || d < 29*time.Second {
		t.Errorf("NotBefore is %v before signing, want 30s (a quarter of 2m)", d)
	}
	if _, err := ca.SignNode(key.CSR, id, now, 30*time.Second); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("a 30 s lifetime: got %v, want ErrInvalidOptions", err)
	}
	if _, err := ca.SignNode(key.CSR, ID{TrustDomain: td, Role: RoleNode, Name: "gpu-4"}, now, time.Hour); !errors.Is(err, ErrBadCSR) {
		t.Errorf("a CSR for another name: got %v, want ErrBadCSR", err)
	}

	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "n.crt"), filepath.Join(dir, "n.key")
	os.WriteFile(certPath, CertificatePEM(der), 0o644)
	os.WriteFile(keyPath, key.KeyPEM, 0o600)
	co := clientOpts(p, "gpu-3")
	co.CertFile, co.KeyFile = certPath, keyPath
	r := runHandshake(t, mustServer(t, serverOpts(p, "gpu-3")), mustClient(t, co))
	if r.serverErr != nil || r.clientErr != nil || r.serverPeer != id {
		t.Fatalf("handshake with the enrolled certificate: server %v, client %v, peer %v", r.serverErr, r.clientErr, r.serverPeer)
	}
}

// J1 J6: the join listener serves joins (no client certificate, the CA in
// the chain, checked against the pin) and sessions (mutual TLS) on one
// port; VerifyNode refuses a certificate the enrollment store superseded.
func TestJoinHandshake(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, td, "edge-1", "gpu-1")
	other := newPKI(t, td, "edge-1")
	var refused *x509.Certificate
	so := serverOpts(p, "gpu-1")
	so.VerifyNode = func(id ID, leaf *x509.Certificate) error {
		if refused != nil && leaf.SerialNumber.Cmp(refused.SerialNumber) == 0 {
			return errors.New("revoked")
		}
		return nil
	}
	srv := JoinServerConfig(mustServer(t, so), p.ca)
	joinRun := func(pin string) (ID, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		done := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(testTimeout))
			tc := tls.Server(c, srv)
			err = tc.Handshake()
			if err == nil && tc.ConnectionState().NegotiatedProtocol != JoinALPN {
				err = errors.New("join ALPN not negotiated")
			}
			done <- err
		}()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), testTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testTimeout))
		tc := tls.Client(c, JoinClientConfig(pin, nil))
		herr := tc.Handshake()
		var id ID
		if herr == nil {
			id, _, herr = CheckJoinPeer(tc.ConnectionState(), pin, time.Now())
		}
		tc.Close()
		<-done
		return id, herr
	}
	id, err := joinRun(CAPin(p.ca))
	if err != nil || id != (ID{TrustDomain: td, Role: RoleEdge, Name: "edge-1"}) {
		t.Fatalf("J1 join with the right pin: %v, %v", id, err)
	}
	if _, err := joinRun(CAPin(other.ca)); !errors.Is(err, ErrPinMismatch) {
		t.Fatalf("J1 a token pinned to another CA: got %v, want ErrPinMismatch", err)
	}
	// A session on the same config still needs its client certificate.
	if r := runHandshake(t, srv, mustClient(t, clientOpts(p, "gpu-1"))); r.serverErr != nil || r.clientErr != nil {
		t.Fatalf("I2 session handshake on the join listener: %v / %v", r.serverErr, r.clientErr)
	}
	raw := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	if r := runHandshake(t, srv, raw); r.serverErr == nil {
		t.Error("I2 a client without certificate or join ALPN was accepted")
	}
	refused = loadCert(t, p.path(CertFileName("gpu-1")))
	if r := runHandshake(t, srv, mustClient(t, clientOpts(p, "gpu-1"))); r.serverErr == nil {
		t.Error("J6 VerifyNode's refusal did not refuse the handshake")
	}
}
