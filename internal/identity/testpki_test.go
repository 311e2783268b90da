package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Test-only helpers: a loopback TLS handshake runner, error matchers and a
// maker of deliberately bad certificates (the goroutine leak check is
// iop/internal/leakcheck). Good certificates always come from the package's
// own InitPKI/IssueNode.

const testTimeout = 5 * time.Second

// handshakeResult is what each side saw. clientErr is the client's
// Handshake error, or — when its Handshake returned nil — the error of its
// first read: in TLS 1.3 the client finishes before the server has checked
// the client certificate, so a server-side rejection reaches the client as
// an alert on that read.
type handshakeResult struct {
	serverErr, clientErr   error
	serverPeer, clientPeer ID // PeerID on each side after a good handshake
	serverSerial           *big.Int
}

// runHandshake does one TLS handshake over real loopback TCP and, if both
// sides accept, one byte of application data from server to client.
func runHandshake(t *testing.T, serverCfg, clientCfg *tls.Config) handshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	type serverSide struct {
		err  error
		peer ID
	}
	done := make(chan serverSide, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- serverSide{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testTimeout))
		tc := tls.Server(c, serverCfg)
		if err := tc.Handshake(); err != nil {
			done <- serverSide{err: err}
			return
		}
		peer, err := PeerID(tc.ConnectionState())
		if err == nil {
			_, err = tc.Write([]byte{1})
		}
		io.Copy(io.Discard, tc) // until the client closes
		done <- serverSide{err: err, peer: peer}
	}()

	var r handshakeResult
	c, err := net.DialTimeout("tcp", ln.Addr().String(), testTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.SetDeadline(time.Now().Add(testTimeout))
	tc := tls.Client(c, clientCfg)
	if r.clientErr = tc.Handshake(); r.clientErr == nil {
		cs := tc.ConnectionState()
		r.serverSerial = cs.PeerCertificates[0].SerialNumber
		if r.clientPeer, r.clientErr = PeerID(cs); r.clientErr == nil {
			var b [1]byte
			_, r.clientErr = io.ReadFull(tc, b[:])
		}
	}
	tc.Close()
	select {
	case s := <-done:
		r.serverErr, r.serverPeer = s.err, s.peer
	case <-time.After(testTimeout):
		t.Fatal("server side did not finish")
	}
	return r
}

// match describes an expected error; it returns "" when err fits.
type match func(err error) string

func ok() match {
	return func(err error) string {
		if err != nil {
			return "want success, got " + err.Error()
		}
		return ""
	}
}

func is(target error) match {
	return func(err error) string {
		if !errors.Is(err, target) {
			return "want errors.Is " + target.Error() + ", got " + errString(err)
		}
		return ""
	}
}

// x509Invalid matches a chain verification failure with the given reason,
// as Go reports it (inside *tls.CertificateVerificationError).
func x509Invalid(reason x509.InvalidReason) match {
	return func(err error) string {
		var cve *tls.CertificateVerificationError
		var inv x509.CertificateInvalidError
		if !errors.As(err, &cve) || !errors.As(err, &inv) || inv.Reason != reason {
			return "want x509 CertificateInvalidError in CertificateVerificationError, got " + errString(err)
		}
		return ""
	}
}

func unknownAuthority() match {
	return func(err error) string {
		var cve *tls.CertificateVerificationError
		var ua x509.UnknownAuthorityError
		if !errors.As(err, &cve) || !errors.As(err, &ua) {
			return "want x509 UnknownAuthorityError in CertificateVerificationError, got " + errString(err)
		}
		return ""
	}
}

// remoteAlert matches the side that did not reject: it got the peer's alert.
func remoteAlert() match {
	return func(err error) string {
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "remote error" {
			return "want a remote TLS alert, got " + errString(err)
		}
		return ""
	}
}

// errText is only for errors Go returns as plain text with no type.
func errText(sub string) match {
	return func(err error) string {
		if err == nil || !strings.Contains(err.Error(), sub) {
			return "want error containing " + sub + ", got " + errString(err)
		}
		return ""
	}
}

func all(ms ...match) match {
	return func(err error) string {
		for _, m := range ms {
			if s := m(err); s != "" {
				return s
			}
		}
		return ""
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// pkiDir is an InitPKI directory with its edge and node names.
type pkiDir struct {
	dir  string
	ca   *x509.Certificate
	key  crypto.Signer
	edge string
}

func (p pkiDir) path(name string) string { return filepath.Join(p.dir, name) }

func newPKI(t *testing.T, td, edge string, nodes ...string) pkiDir {
	t.Helper()
	dir := t.TempDir()
	if err := InitPKI(dir, PKIOptions{TrustDomain: td, Edge: edge, Nodes: nodes}); err != nil {
		t.Fatalf("InitPKI: %v", err)
	}
	ca, key, err := loadCA(dir)
	if err != nil {
		t.Fatalf("loadCA: %v", err)
	}
	return pkiDir{dir: dir, ca: ca, key: key, edge: edge}
}

// badLeaf describes a deliberately wrong leaf certificate.
type badLeaf struct {
	uris      []string
	eku       x509.ExtKeyUsage
	noEKU     bool // no ExtendedKeyUsage extension at all (eku ignored)
	isCA      bool
	notBefore time.Time // zero: an hour ago
	notAfter  time.Time // zero: in a day
}

// writeBadLeaf signs b with ca/caKey (no checks on the identity) and writes
// it to a fresh temp dir; it returns the certificate and key paths.
func writeBadLeaf(t *testing.T, ca *x509.Certificate, caKey crypto.Signer, b badLeaf) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := newSerial()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "bad leaf"},
		NotBefore:             b.notBefore,
		NotAfter:              b.notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{b.eku},
		BasicConstraintsValid: true,
		IsCA:                  b.isCA,
	}
	if b.noEKU {
		tmpl.ExtKeyUsage = nil
	}
	if b.isCA {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	for _, u := range b.uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatalf("create bad leaf: %v", err)
	}
	keyPEM, err := privateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certPath, keyPath = filepath.Join(dir, "bad.crt"), filepath.Join(dir, "bad.key")
	if err := os.WriteFile(certPath, certPEM(der), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

// unconstrainedCA is a CA without name constraints, as an operator's own CA
// might be, so that it can sign an identity in another trust domain.
func unconstrainedCA(t *testing.T) (*x509.Certificate, crypto.Signer, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(7),
		Subject:               pkix.Name{CommonName: "unconstrained test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(p, certPEM(der), 0o644); err != nil {
		t.Fatal(err)
	}
	return ca, key, p
}

// rawServer is a misbehaving edge: it presents certPath/keyPath, asks for
// any client certificate and verifies nothing.
func rawServer(t *testing.T, certPath, keyPath string) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAnyClientCert}
}

// rawClient is a misbehaving node: it presents certPath/keyPath (none if
// empty) and verifies nothing.
func rawClient(t *testing.T, certPath, keyPath string) *tls.Config {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if certPath != "" {
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}
