package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

const td = "iop.local"

func serverOpts(p pkiDir, allowed ...string) ServerOptions {
	return ServerOptions{
		CertFile: p.path(CertFileName(p.edge)), KeyFile: p.path(KeyFileName(p.edge)), CAFile: p.path(CACertFile),
		TrustDomain: td, EdgeName: p.edge,
		AllowNode: func(name string) bool {
			for _, a := range allowed {
				if a == name {
					return true
				}
			}
			return false
		},
	}
}

func clientOpts(p pkiDir, node string) ClientOptions {
	return ClientOptions{
		CertFile: p.path(CertFileName(node)), KeyFile: p.path(KeyFileName(node)), CAFile: p.path(CACertFile),
		TrustDomain: td, ExpectedEdgeName: p.edge, NodeName: node,
	}
}

func mustServer(t *testing.T, o ServerOptions) *tls.Config {
	t.Helper()
	cfg, err := ServerConfig(o)
	if err != nil {
		t.Fatalf("ServerConfig: %v", err)
	}
	return cfg
}

func mustClient(t *testing.T, o ClientOptions) *tls.Config {
	t.Helper()
	cfg, err := ClientConfig(o)
	if err != nil {
		t.Fatalf("ClientConfig: %v", err)
	}
	return cfg
}

// issueCopy issues node into a fresh directory holding a copy of p's CA, so
// p's own node files stay untouched.
func issueCopy(t *testing.T, p pkiDir, o IssueOptions) (certPath, keyPath string) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{CACertFile, CAKeyFile} {
		b, err := os.ReadFile(p.path(f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := IssueNode(dir, o); err != nil {
		t.Fatalf("IssueNode: %v", err)
	}
	return filepath.Join(dir, CertFileName(o.Node)), filepath.Join(dir, KeyFileName(o.Node))
}

// TestHandshake runs every identity check over real loopback TLS. Each row
// fails (or passes) at the handshake, on the side that checks, with an
// error that says which check failed.
func TestHandshake(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, td, "edge-1", "gpu-1", "gpu-2")
	other := newPKI(t, td, "edge-1", "gpu-1") // same names, another CA
	uca, ucaKey, ucaPath := unconstrainedCA(t)
	now := time.Now()

	bad := func(b badLeaf) (string, string) { return writeBadLeaf(t, p.ca, p.key, b) }
	good := func() *tls.Config { return mustServer(t, serverOpts(p, "gpu-1")) }
	goodClient := func() *tls.Config { return mustClient(t, clientOpts(p, "gpu-1")) }
	clientWith := func(cert, key string) *tls.Config { return rawClient(t, cert, key) }
	serverWith := func(cert, key string) *tls.Config { return rawServer(t, cert, key) }

	// An unconstrained PKI in which another trust domain can be signed.
	uEdgeCert, uEdgeKey := writeBadLeaf(t, uca, ucaKey, badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1"}, eku: x509.ExtKeyUsageServerAuth})
	uNodeCert, uNodeKey := writeBadLeaf(t, uca, ucaKey, badLeaf{uris: []string{"spiffe://iop.local/node/gpu-1"}, eku: x509.ExtKeyUsageClientAuth})
	uServer := func() *tls.Config {
		o := serverOpts(p, "gpu-1")
		o.CertFile, o.KeyFile, o.CAFile = uEdgeCert, uEdgeKey, ucaPath
		return mustServer(t, o)
	}
	uClient := func() *tls.Config {
		o := clientOpts(p, "gpu-1")
		o.CertFile, o.KeyFile, o.CAFile = uNodeCert, uNodeKey, ucaPath
		return mustClient(t, o)
	}

	tests := []struct {
		name           string
		server, client func() *tls.Config
		wantServer     match
		wantClient     match
	}{
		{"I1 I2 good pair", good, goodClient, ok(), ok()},
		{"I2 no client certificate", good, func() *tls.Config { return clientWith("", "") },
			errText("client didn't provide a certificate"), remoteAlert()},
		{"I2 node certificate from another CA", good, func() *tls.Config {
			o := clientOpts(other, "gpu-1")
			o.CAFile = p.path(CACertFile) // it would trust the real edge
			return mustClient(t, o)
		}, unknownAuthority(), remoteAlert()},
		{"I2 edge certificate from another CA", func() *tls.Config { return mustServer(t, serverOpts(other, "gpu-1")) }, goodClient,
			remoteAlert(), all(is(ErrUntrustedCertificate), unknownAuthority())},
		{"I2 wrong role: edge certificate used as node client (no clientAuth usage)", good,
			func() *tls.Config { return clientWith(p.path("edge-1.crt"), p.path("edge-1.key")) },
			x509Invalid(x509.IncompatibleUsage), remoteAlert()},
		{"I2 wrong role: edge SPIFFE ID on a client certificate", good, func() *tls.Config {
			return clientWith(bad(badLeaf{uris: []string{"spiffe://iop.local/edge/gpu-1"}, eku: x509.ExtKeyUsageClientAuth}))
		}, is(ErrWrongRole), remoteAlert()},
		{"I2 wrong role: node certificate used as edge server (no serverAuth usage)",
			func() *tls.Config { return serverWith(p.path("gpu-1.crt"), p.path("gpu-1.key")) }, goodClient,
			remoteAlert(), all(is(ErrUntrustedCertificate), x509Invalid(x509.IncompatibleUsage))},
		{"I2 wrong role: node SPIFFE ID on a server certificate", func() *tls.Config {
			return serverWith(bad(badLeaf{uris: []string{"spiffe://iop.local/node/edge-1"}, eku: x509.ExtKeyUsageServerAuth}))
		}, goodClient, remoteAlert(), is(ErrWrongRole)},
		{"I2 I3 wrong name: node not allowed", good, func() *tls.Config { return mustClient(t, clientOpts(p, "gpu-2")) },
			is(ErrWrongName), remoteAlert()},
		{"I2 wrong name: edge is not the expected edge", good, func() *tls.Config {
			o := clientOpts(p, "gpu-1")
			o.ExpectedEdgeName = "edge-2"
			return mustClient(t, o)
		}, remoteAlert(), is(ErrWrongName)},
		{"I1 wrong trust domain: node", uServer, func() *tls.Config {
			return clientWith(writeBadLeaf(t, uca, ucaKey, badLeaf{uris: []string{"spiffe://other.local/node/gpu-1"}, eku: x509.ExtKeyUsageClientAuth}))
		}, is(ErrWrongTrustDomain), remoteAlert()},
		{"I1 wrong trust domain: edge", func() *tls.Config {
			return serverWith(writeBadLeaf(t, uca, ucaKey, badLeaf{uris: []string{"spiffe://other.local/edge/edge-1"}, eku: x509.ExtKeyUsageServerAuth}))
		}, uClient, remoteAlert(), is(ErrWrongTrustDomain)},
		{"I1 unconstrained PKI good pair", uServer, uClient, ok(), ok()},
		{"I1 wrong trust domain under the dev CA's name constraint", good, func() *tls.Config {
			return clientWith(bad(badLeaf{uris: []string{"spiffe://other.local/node/gpu-1"}, eku: x509.ExtKeyUsageClientAuth}))
		}, x509Invalid(x509.CANotAuthorizedForThisName), remoteAlert()},
		{"I2 expired node certificate", good, func() *tls.Config {
			return clientWith(issueCopy(t, p, IssueOptions{Node: "gpu-1", Now: func() time.Time { return now.Add(-48 * time.Hour) }, Validity: 24 * time.Hour}))
		}, x509Invalid(x509.Expired), remoteAlert()},
		{"I2 node certificate not yet valid", good, func() *tls.Config {
			return clientWith(issueCopy(t, p, IssueOptions{Node: "gpu-1", Now: func() time.Time { return now.Add(time.Hour) }}))
		}, x509Invalid(x509.Expired), remoteAlert()},
		{"I2 expired edge certificate", func() *tls.Config {
			return serverWith(bad(badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1"}, eku: x509.ExtKeyUsageServerAuth,
				notBefore: now.Add(-48 * time.Hour), notAfter: now.Add(-24 * time.Hour)}))
		}, goodClient, remoteAlert(), all(is(ErrUntrustedCertificate), x509Invalid(x509.Expired))},
		{"I2 edge certificate not yet valid", func() *tls.Config {
			return serverWith(bad(badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1"}, eku: x509.ExtKeyUsageServerAuth,
				notBefore: now.Add(time.Hour), notAfter: now.Add(48 * time.Hour)}))
		}, goodClient, remoteAlert(), all(is(ErrUntrustedCertificate), x509Invalid(x509.Expired))},
		{"I1 node leaf marked CA", good, func() *tls.Config {
			return clientWith(bad(badLeaf{uris: []string{"spiffe://iop.local/node/gpu-1"}, eku: x509.ExtKeyUsageClientAuth, isCA: true}))
		}, is(ErrLeafIsCA), remoteAlert()},
		{"I1 edge leaf marked CA", func() *tls.Config {
			return serverWith(bad(badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1"}, eku: x509.ExtKeyUsageServerAuth, isCA: true}))
		}, goodClient, remoteAlert(), is(ErrLeafIsCA)},
		{"I1 node certificate with two URI SANs", good, func() *tls.Config {
			return clientWith(bad(badLeaf{uris: []string{"spiffe://iop.local/node/gpu-1", "spiffe://iop.local/node/gpu-2"}, eku: x509.ExtKeyUsageClientAuth}))
		}, is(ErrNotOneURISAN), remoteAlert()},
		{"I1 edge certificate with two URI SANs", func() *tls.Config {
			return serverWith(bad(badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1", "spiffe://iop.local/edge/edge-2"}, eku: x509.ExtKeyUsageServerAuth}))
		}, goodClient, remoteAlert(), is(ErrNotOneURISAN)},
		{"I1 node certificate without URI SAN", good, func() *tls.Config {
			return clientWith(bad(badLeaf{eku: x509.ExtKeyUsageClientAuth}))
		}, is(ErrNotOneURISAN), remoteAlert()},
		// I2: Go's chain check lets a leaf without the ExtendedKeyUsage
		// extension (or with anyExtendedKeyUsage) through for any usage;
		// the role's usage is required explicitly on both sides.
		{"I2 node certificate without extended key usage", good, func() *tls.Config {
			return clientWith(bad(badLeaf{uris: []string{"spiffe://iop.local/node/gpu-1"}, noEKU: true}))
		}, is(ErrMissingKeyUsage), remoteAlert()},
		{"I2 node certificate with anyExtendedKeyUsage only", good, func() *tls.Config {
			return clientWith(bad(badLeaf{uris: []string{"spiffe://iop.local/node/gpu-1"}, eku: x509.ExtKeyUsageAny}))
		}, is(ErrMissingKeyUsage), remoteAlert()},
		{"I2 edge certificate without extended key usage", func() *tls.Config {
			return serverWith(bad(badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1"}, noEKU: true}))
		}, goodClient, remoteAlert(), is(ErrMissingKeyUsage)},
		{"I2 edge certificate with anyExtendedKeyUsage only", func() *tls.Config {
			return serverWith(bad(badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1"}, eku: x509.ExtKeyUsageAny}))
		}, goodClient, remoteAlert(), is(ErrMissingKeyUsage)},
		{"I1 node certificate with a malformed SPIFFE ID", good, func() *tls.Config {
			return clientWith(bad(badLeaf{uris: []string{"spiffe://iop.local/node/gpu-1/extra"}, eku: x509.ExtKeyUsageClientAuth}))
		}, is(ErrBadSPIFFEID), remoteAlert()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runHandshake(t, tt.server(), tt.client())
			if s := tt.wantServer(r.serverErr); s != "" {
				t.Errorf("server: %s", s)
			}
			if s := tt.wantClient(r.clientErr); s != "" {
				t.Errorf("client: %s", s)
			}
		})
	}
}

// I1 I3: after a good handshake each side's PeerID is the other's SPIFFE ID
// from its certificate; the edge binds registration to this name.
func TestPeerIDAfterHandshake(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, td, "edge-1", "gpu-1")
	r := runHandshake(t, mustServer(t, serverOpts(p, "gpu-1")), mustClient(t, clientOpts(p, "gpu-1")))
	if r.serverErr != nil || r.clientErr != nil {
		t.Fatalf("handshake: server %v, client %v", r.serverErr, r.clientErr)
	}
	if want := (ID{TrustDomain: td, Role: RoleNode, Name: "gpu-1"}); r.serverPeer != want {
		t.Errorf("server PeerID = %v, want %v", r.serverPeer, want)
	}
	if want := (ID{TrustDomain: td, Role: RoleEdge, Name: "edge-1"}); r.clientPeer != want {
		t.Errorf("client PeerID = %v, want %v", r.clientPeer, want)
	}
	if _, err := PeerID(tls.ConnectionState{}); !errors.Is(err, ErrNoPeerCertificate) {
		t.Errorf("PeerID(empty state) = %v, want ErrNoPeerCertificate", err)
	}
}

// I1: a certificate file replaced on disk is presented on the next
// handshake, without a new tls.Config; a broken replacement keeps the last
// good pair.
func TestRotation(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, td, "edge-1", "gpu-1")
	srv, cli := mustServer(t, serverOpts(p, "gpu-1")), mustClient(t, clientOpts(p, "gpu-1"))
	serialOf := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		certs, err := parseCertificatesPEM(b)
		if err != nil {
			t.Fatal(err)
		}
		return certs[0].SerialNumber.String()
	}
	handshake := func() handshakeResult {
		t.Helper()
		r := runHandshake(t, srv, cli)
		if r.serverErr != nil || r.clientErr != nil {
			t.Fatalf("handshake: server %v, client %v", r.serverErr, r.clientErr)
		}
		return r
	}
	edgeCert := p.path(CertFileName("edge-1"))
	if got, want := handshake().serverSerial.String(), serialOf(edgeCert); got != want {
		t.Fatalf("initial edge serial %s, want %s", got, want)
	}

	// Rotate the edge certificate with the package's own generator.
	files, err := newLeaf(p.ca, p.key, ID{TrustDomain: td, Role: RoleEdge, Name: "edge-1"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old := serialOf(edgeCert)
	if err := writeFiles(p.dir, files, true); err != nil {
		t.Fatal(err)
	}
	rotated := serialOf(edgeCert)
	if rotated == old {
		t.Fatal("rotation did not change the serial")
	}
	if got := handshake().serverSerial.String(); got != rotated {
		t.Errorf("after edge rotation: client saw serial %s, want the new %s", got, rotated)
	}

	// A broken key file keeps the last good pair.
	if err := os.WriteFile(p.path(KeyFileName("edge-1")), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := handshake().serverSerial.String(); got != rotated {
		t.Errorf("after broken key: client saw serial %s, want last good %s", got, rotated)
	}

	// Rotate the node certificate: the edge sees the new client serial.
	nodeCert := p.path(CertFileName("gpu-1"))
	oldNode := serialOf(nodeCert)
	if err := IssueNode(p.dir, IssueOptions{Node: "gpu-1", Force: true}); err != nil {
		t.Fatal(err)
	}
	newNode := serialOf(nodeCert)
	if newNode == oldNode {
		t.Fatal("IssueNode -force did not change the node serial")
	}
	var seen string
	inner := srv.VerifyConnection
	srv.VerifyConnection = func(cs tls.ConnectionState) error {
		seen = cs.PeerCertificates[0].SerialNumber.String()
		return inner(cs)
	}
	handshake()
	if seen != newNode {
		t.Errorf("after node rotation: edge saw serial %s, want the new %s", seen, newNode)
	}
}

// S3: unreadable or invalid local credential files fail ServerConfig and
// ClientConfig at once with a *FileError naming the file.
func TestConfigFileErrors(t *testing.T) {
	p := newPKI(t, td, "edge-1", "gpu-1")
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("-----BEGIN NOTHING-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.key")
	aDir := t.TempDir()

	tests := []struct {
		name     string
		modify   func(cert, key, ca *string)
		wantPath func() string
		wantErr  error
	}{
		{"S3 missing key file", func(_, k, _ *string) { *k = missing }, func() string { return missing }, os.ErrNotExist},
		{"S3 key path is a directory", func(_, k, _ *string) { *k = aDir }, func() string { return aDir }, nil},
		{"S3 garbage key file", func(_, k, _ *string) { *k = garbage }, func() string { return garbage }, ErrKeyMismatch},
		{"S3 garbage certificate file", func(c, _, _ *string) { *c = garbage }, func() string { return garbage }, ErrBadPEM},
		{"S3 missing CA file", func(_, _, a *string) { *a = missing }, func() string { return missing }, os.ErrNotExist},
		{"S3 CA file holds a leaf", func(_, _, a *string) { *a = p.path("edge-1.crt") }, func() string { return p.path("edge-1.crt") }, ErrBadPEM},
	}
	for _, side := range []string{"server", "client"} {
		for _, tt := range tests {
			t.Run(side+" "+tt.name, func(t *testing.T) {
				var err error
				if side == "server" {
					o := serverOpts(p, "gpu-1")
					tt.modify(&o.CertFile, &o.KeyFile, &o.CAFile)
					_, err = ServerConfig(o)
				} else {
					o := clientOpts(p, "gpu-1")
					tt.modify(&o.CertFile, &o.KeyFile, &o.CAFile)
					_, err = ClientConfig(o)
				}
				var fe *FileError
				if !errors.As(err, &fe) || fe.Path != tt.wantPath() {
					t.Fatalf("got %v, want *FileError for %s", err, tt.wantPath())
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("got %v, want errors.Is %v", err, tt.wantErr)
				}
			})
		}
	}
}

// S3 C5: a private key file that group or others may read or write — the
// TLS key of either side, the lease issuer and recipient keys, the dev CA's
// key — is refused with ErrKeyExposed naming the file, as the secret store
// key is; 0600 and 0400 pass. At rotation such a key is not picked up.
func TestPrivateKeyFileModes(t *testing.T) {
	p := newPKI(t, td, "edge-1", "gpu-1")
	loaders := []struct {
		name string
		file string
		load func() error
	}{
		{"edge TLS key", "edge-1.key", func() error { _, err := ServerConfig(serverOpts(p, "gpu-1")); return err }},
		{"node TLS key", "gpu-1.key", func() error { _, err := ClientConfig(clientOpts(p, "gpu-1")); return err }},
		{"lease issuer private key", IssuerKeyFile, func() error { _, err := LoadIssuerPrivateKey(p.path(IssuerKeyFile)); return err }},
		{"lease recipient private key", RecipientKeyFileName("gpu-1"), func() error {
			_, err := LoadRecipientPrivateKey(p.path(RecipientKeyFileName("gpu-1")))
			return err
		}},
		{"CA private key (pki issue)", CAKeyFile, func() error { _, _, err := loadCA(p.dir); return err }},
	}
	modes := []struct {
		mode    os.FileMode
		refused bool
	}{{0o600, false}, {0o400, false}, {0o644, true}, {0o640, true}, {0o604, true}, {0o620, true}}
	for _, l := range loaders {
		for _, m := range modes {
			t.Run(fmt.Sprintf("%s %04o", l.name, m.mode), func(t *testing.T) {
				path := p.path(l.file)
				if err := os.Chmod(path, m.mode); err != nil {
					t.Fatal(err)
				}
				defer os.Chmod(path, 0o600)
				err := l.load()
				if !m.refused {
					if err != nil {
						t.Fatalf("mode %04o: %v, want accepted", m.mode, err)
					}
					return
				}
				var fe *FileError
				if !errors.Is(err, ErrKeyExposed) || !errors.As(err, &fe) || fe.Path != path {
					t.Fatalf("mode %04o: got %v, want ErrKeyExposed in a *FileError for %s", m.mode, err, path)
				}
			})
		}
	}

	t.Run("rotation to an exposed key keeps the last good pair", func(t *testing.T) {
		kp, err := newKeyPairFile(p.path("gpu-1.crt"), p.path("gpu-1.key"), nil)
		if err != nil {
			t.Fatal(err)
		}
		first := kp.current()
		files, err := newLeaf(p.ca, p.key, ID{TrustDomain: td, Role: RoleNode, Name: "gpu-1"}, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeFiles(p.dir, files, true); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p.path("gpu-1.key"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := kp.current(); got != first {
			t.Error("a rotated pair with an exposed key was picked up")
		}
		if err := os.Chmod(p.path("gpu-1.key"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := kp.current(); got == first {
			t.Error("the rotated pair was not picked up once its key was 0600")
		}
	})
}

// I1 I3 S3: a config whose own certificate is not the configured identity,
// and incomplete options, fail at construction.
func TestConfigOwnIdentityAndOptions(t *testing.T) {
	p := newPKI(t, td, "edge-1", "gpu-1", "gpu-2")
	tests := []struct {
		name string
		err  func() error
		want error
	}{
		{"I1 server with a node certificate", func() error {
			o := serverOpts(p, "gpu-1")
			o.CertFile, o.KeyFile = p.path("gpu-1.crt"), p.path("gpu-1.key")
			_, err := ServerConfig(o)
			return err
		}, ErrWrongRole},
		{"I1 server with another edge name", func() error {
			o := serverOpts(p, "gpu-1")
			o.EdgeName = "edge-2"
			_, err := ServerConfig(o)
			return err
		}, ErrWrongName},
		{"I1 server in another trust domain", func() error {
			o := serverOpts(p, "gpu-1")
			o.TrustDomain = "other.local"
			_, err := ServerConfig(o)
			return err
		}, ErrWrongTrustDomain},
		{"I3 client whose certificate is for another node id", func() error {
			o := clientOpts(p, "gpu-1")
			o.NodeName = "gpu-2"
			_, err := ClientConfig(o)
			return err
		}, ErrWrongName},
		{"I1 client with an edge certificate", func() error {
			o := clientOpts(p, "gpu-1")
			o.CertFile, o.KeyFile = p.path("edge-1.crt"), p.path("edge-1.key")
			_, err := ClientConfig(o)
			return err
		}, ErrWrongRole},
		{"I1 client with mismatched key", func() error {
			o := clientOpts(p, "gpu-1")
			o.KeyFile = p.path("gpu-2.key")
			_, err := ClientConfig(o)
			return err
		}, ErrKeyMismatch},
		{"I2 server whose own certificate lacks serverAuth", func() error {
			o := serverOpts(p, "gpu-1")
			o.CertFile, o.KeyFile = writeBadLeaf(t, p.ca, p.key, badLeaf{uris: []string{"spiffe://iop.local/edge/edge-1"}, noEKU: true})
			_, err := ServerConfig(o)
			return err
		}, ErrMissingKeyUsage},
		{"I2 client whose own certificate lacks clientAuth", func() error {
			o := clientOpts(p, "gpu-1")
			o.CertFile, o.KeyFile = writeBadLeaf(t, p.ca, p.key, badLeaf{uris: []string{"spiffe://iop.local/node/gpu-1"}, eku: x509.ExtKeyUsageServerAuth})
			_, err := ClientConfig(o)
			return err
		}, ErrMissingKeyUsage},
		{"I2 server without AllowNode", func() error {
			o := serverOpts(p)
			o.AllowNode = nil
			_, err := ServerConfig(o)
			return err
		}, ErrInvalidOptions},
		{"I2 client without expected edge name", func() error {
			o := clientOpts(p, "gpu-1")
			o.ExpectedEdgeName = ""
			_, err := ClientConfig(o)
			return err
		}, ErrInvalidOptions},
		{"I1 bad trust domain option", func() error {
			o := clientOpts(p, "gpu-1")
			o.TrustDomain = "Bad.Domain"
			_, err := ClientConfig(o)
			return err
		}, ErrInvalidOptions},
		{"S3 empty key path", func() error {
			o := serverOpts(p, "gpu-1")
			o.KeyFile = ""
			_, err := ServerConfig(o)
			return err
		}, ErrInvalidOptions},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.err(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want errors.Is %v", err, tt.want)
			}
		})
	}
}

// I2: the configs pin TLS 1.3, no session tickets and mutual
// authentication (docs/wire.md, "The connection").
func TestConfigSettings(t *testing.T) {
	p := newPKI(t, td, "edge-1", "gpu-1")
	s, c := mustServer(t, serverOpts(p, "gpu-1")), mustClient(t, clientOpts(p, "gpu-1"))
	for _, cfg := range []*tls.Config{s, c} {
		if cfg.MinVersion != tls.VersionTLS13 || cfg.MaxVersion != tls.VersionTLS13 {
			t.Errorf("versions %x..%x, want TLS 1.3 only", cfg.MinVersion, cfg.MaxVersion)
		}
		if !cfg.SessionTicketsDisabled || cfg.ClientSessionCache != nil {
			t.Error("session tickets enabled, want off")
		}
		if cfg.VerifyConnection == nil {
			t.Error("VerifyConnection is nil")
		}
	}
	if s.ClientAuth != tls.RequireAndVerifyClientCert || s.GetCertificate == nil {
		t.Errorf("server ClientAuth %v, GetCertificate set %v", s.ClientAuth, s.GetCertificate != nil)
	}
	if c.GetClientCertificate == nil {
		t.Error("client GetClientCertificate is nil")
	}
}
