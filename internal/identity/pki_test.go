package identity

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// loadCert parses the first certificate of a PEM file.
func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := parseCertificatesPEM(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return certs[0]
}

// checkLeaf verifies that a leaf chains to the CA for its usage and carries
// exactly the SPIFFE ID want.
func checkLeaf(t *testing.T, dir, name string, want ID) *x509.Certificate {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(loadCert(t, filepath.Join(dir, CACertFile)))
	leaf := loadCert(t, filepath.Join(dir, CertFileName(name)))
	usage := x509.ExtKeyUsageClientAuth
	if want.Role == RoleEdge {
		usage = x509.ExtKeyUsageServerAuth
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("%s does not chain to the CA: %v", name, err)
	}
	if got, err := FromCertificate(leaf); err != nil || got != want {
		t.Errorf("%s: SPIFFE ID %v, %v; want %v", name, got, err, want)
	}
	return leaf
}

func checkMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != want {
		t.Errorf("%s: mode %o, want %o", filepath.Base(path), got, want)
	}
}

// I1: InitPKI writes a CA, edge and node certificates with SPIFFE URI SANs
// that chain to it, and the lease key pairs, private keys mode 0600.
func TestInitPKI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	if err := InitPKI(dir, PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1", "gpu-2"}}); err != nil {
		t.Fatalf("InitPKI: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{"ca.crt", "ca.key", "edge-1.crt", "edge-1.key", "gpu-1.crt", "gpu-1.key",
		"gpu-1.recipient.key", "gpu-1.recipient.pub", "gpu-2.crt", "gpu-2.key",
		"gpu-2.recipient.key", "gpu-2.recipient.pub", "issuer.key", "issuer.pub"}
	if !slices.Equal(names, want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	for _, n := range names {
		mode := fs.FileMode(0o644)
		if filepath.Ext(n) == ".key" {
			mode = 0o600
		}
		checkMode(t, filepath.Join(dir, n), mode)
	}
	checkMode(t, dir, 0o700)

	ca := loadCert(t, filepath.Join(dir, CACertFile))
	if !ca.IsCA || len(ca.URIs) != 1 || ca.URIs[0].String() != "spiffe://"+DefaultTrustDomain {
		t.Errorf("CA: IsCA %v, URIs %v; want a CA for spiffe://%s", ca.IsCA, ca.URIs, DefaultTrustDomain)
	}
	edge := checkLeaf(t, dir, "edge-1", ID{DefaultTrustDomain, RoleEdge, "edge-1"})
	if !slices.Equal(edge.DNSNames, []string{"localhost"}) || len(edge.IPAddresses) != 1 || !edge.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("edge SANs: DNS %v IP %v, want localhost and 127.0.0.1", edge.DNSNames, edge.IPAddresses)
	}
	for _, n := range []string{"gpu-1", "gpu-2"} {
		node := checkLeaf(t, dir, n, ID{DefaultTrustDomain, RoleNode, n})
		if len(node.DNSNames)+len(node.IPAddresses) != 0 {
			t.Errorf("%s: unexpected DNS/IP SANs %v %v", n, node.DNSNames, node.IPAddresses)
		}
		pub, err := LoadRecipientPublicKey(filepath.Join(dir, RecipientPubFileName(n)))
		if err != nil {
			t.Fatal(err)
		}
		priv, err := LoadRecipientPrivateKey(filepath.Join(dir, RecipientKeyFileName(n)))
		if err != nil {
			t.Fatal(err)
		}
		if !priv.PublicKey().Equal(pub) {
			t.Errorf("%s: recipient private and public keys differ", n)
		}
		b64 := RecipientPublicKeyBase64(pub)
		if back, err := ParseRecipientPublicKeyBase64(b64); err != nil || !back.Equal(pub) || len(b64) != 44 {
			t.Errorf("%s: base64 %q round trip: %v", n, b64, err)
		}
	}
	ipub, err := LoadIssuerPublicKey(filepath.Join(dir, IssuerPubFile))
	if err != nil {
		t.Fatal(err)
	}
	ipriv, err := LoadIssuerPrivateKey(filepath.Join(dir, IssuerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if !ipub.Equal(ipriv.Public()) {
		t.Error("issuer private and public keys differ")
	}
	if back, err := ParseIssuerPublicKeyBase64(IssuerPublicKeyBase64(ipub)); err != nil || !back.Equal(ipub) {
		t.Errorf("issuer base64 round trip: %v", err)
	}
	// Wrong key kinds are refused.
	if _, err := LoadRecipientPublicKey(filepath.Join(dir, IssuerPubFile)); !errors.Is(err, ErrKeyMismatch) {
		t.Errorf("issuer.pub as recipient key: %v, want ErrKeyMismatch", err)
	}
	if _, err := LoadIssuerPrivateKey(filepath.Join(dir, "gpu-1.key")); !errors.Is(err, ErrKeyMismatch) {
		t.Errorf("ECDSA key as issuer key: %v, want ErrKeyMismatch", err)
	}
}

// I1: InitPKI never overwrites without Force, and Force replaces everything
// with private keys back at 0600.
func TestInitPKIOverwrite(t *testing.T) {
	dir := t.TempDir()
	o := PKIOptions{TrustDomain: "lab.example", Edge: "edge-1", Nodes: []string{"gpu-1"}}
	if err := InitPKI(dir, o); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, CACertFile))

	err := InitPKI(dir, o)
	var fe *FileError
	if !errors.Is(err, ErrFileExists) || !errors.As(err, &fe) || filepath.Dir(fe.Path) != dir {
		t.Fatalf("second InitPKI: %v, want ErrFileExists naming a file in %s", err, dir)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, CACertFile)); !bytes.Equal(before, after) {
		t.Error("refused InitPKI changed ca.crt")
	}
	// Only one file present is enough to refuse, and nothing new is written.
	dir2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir2, "gpu-1.recipient.pub"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := InitPKI(dir2, o); !errors.As(err, &fe) || fe.Path != filepath.Join(dir2, "gpu-1.recipient.pub") {
		t.Errorf("InitPKI over one file: %v, want *FileError naming it", err)
	}
	if _, err := os.Stat(filepath.Join(dir2, CACertFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("refused InitPKI wrote ca.crt (stat: %v)", err)
	}

	if err := os.Chmod(filepath.Join(dir, "gpu-1.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	o.Force = true
	if err := InitPKI(dir, o); err != nil {
		t.Fatalf("InitPKI with Force: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, CACertFile)); bytes.Equal(before, after) {
		t.Error("Force did not replace ca.crt")
	}
	checkMode(t, filepath.Join(dir, "gpu-1.key"), 0o600)
	checkLeaf(t, dir, "gpu-1", ID{"lab.example", RoleNode, "gpu-1"})
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*tmp*"))
	if len(leftovers) != 0 {
		t.Errorf("temp files left behind: %v", leftovers)
	}
}

// I1: bad names and options are refused before anything is written.
func TestInitPKIOptions(t *testing.T) {
	tests := []struct {
		name string
		o    PKIOptions
	}{
		{"I1 no edge", PKIOptions{Nodes: []string{"gpu-1"}}},
		{"I1 name with slash", PKIOptions{Edge: "edge-1", Nodes: []string{"a/b"}}},
		{"I1 name dot-dot", PKIOptions{Edge: "..", Nodes: []string{"gpu-1"}}},
		{"I1 bad trust domain", PKIOptions{TrustDomain: "Upper.Case", Edge: "edge-1", Nodes: []string{"gpu-1"}}},
		{"I1 duplicate node", PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1", "gpu-1"}}},
		{"I1 node named like the edge", PKIOptions{Edge: "x", Nodes: []string{"x"}}},
		{"I1 node named ca", PKIOptions{Edge: "edge-1", Nodes: []string{"ca"}}},
		{"I1 node name colliding with a recipient file", PKIOptions{Edge: "edge-1", Nodes: []string{"a", "a.recipient"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := InitPKI(dir, tt.o); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("got %v, want ErrInvalidOptions", err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("wrote %d files", len(entries))
			}
		})
	}
}

// I1 I3: IssueNode adds a node signed by the existing CA, with the trust
// domain read from the CA.
func TestIssueNode(t *testing.T) {
	dir := t.TempDir()
	if err := InitPKI(dir, PKIOptions{TrustDomain: "lab.example", Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
		t.Fatal(err)
	}
	fixed := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		dir   string
		o     IssueOptions
		want  error
		check func(t *testing.T)
	}{
		{"I1 new node", dir, IssueOptions{Node: "gpu-3"}, nil, func(t *testing.T) {
			checkLeaf(t, dir, "gpu-3", ID{"lab.example", RoleNode, "gpu-3"})
			checkMode(t, filepath.Join(dir, "gpu-3.key"), 0o600)
			checkMode(t, filepath.Join(dir, "gpu-3.recipient.key"), 0o600)
			if _, err := LoadRecipientPublicKey(filepath.Join(dir, "gpu-3.recipient.pub")); err != nil {
				t.Error(err)
			}
		}},
		{"I1 injected clock and validity", dir, IssueOptions{Node: "gpu-4", Now: func() time.Time { return fixed }, Validity: time.Hour}, nil, func(t *testing.T) {
			c := loadCert(t, filepath.Join(dir, "gpu-4.crt"))
			if !c.NotAfter.Equal(fixed.Add(time.Hour)) || !c.NotBefore.Before(fixed) {
				t.Errorf("validity %v..%v, want up to %v", c.NotBefore, c.NotAfter, fixed.Add(time.Hour))
			}
		}},
		{"I1 existing node without force", dir, IssueOptions{Node: "gpu-1"}, ErrFileExists, nil},
		{"I1 existing node with force", dir, IssueOptions{Node: "gpu-1", Force: true}, nil, func(t *testing.T) {
			checkLeaf(t, dir, "gpu-1", ID{"lab.example", RoleNode, "gpu-1"})
		}},
		{"I1 matching trust domain option", dir, IssueOptions{Node: "gpu-5", TrustDomain: "lab.example"}, nil, nil},
		{"I1 conflicting trust domain", dir, IssueOptions{Node: "gpu-6", TrustDomain: "iop.local"}, ErrInvalidOptions, nil},
		{"I1 bad node name", dir, IssueOptions{Node: "a/b"}, ErrInvalidOptions, nil},
		{"S3 no CA in dir", t.TempDir(), IssueOptions{Node: "gpu-7"}, fs.ErrNotExist, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := IssueNode(tt.dir, tt.o)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("IssueNode: %v, want %v", err, tt.want)
			}
			if tt.check != nil {
				tt.check(t)
			}
		})
	}
}

// I1: a CA key that does not belong to ca.crt is refused.
func TestIssueNodeMismatchedCA(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, d := range []string{a, b} {
		if err := InitPKI(d, PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
			t.Fatal(err)
		}
	}
	key, _ := os.ReadFile(filepath.Join(b, CAKeyFile))
	if err := os.WriteFile(filepath.Join(a, CAKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	var fe *FileError
	if err := IssueNode(a, IssueOptions{Node: "gpu-2"}); !errors.Is(err, ErrKeyMismatch) || !errors.As(err, &fe) || fe.Path != filepath.Join(a, CAKeyFile) {
		t.Errorf("got %v, want ErrKeyMismatch naming ca.key", err)
	}
}

// C2: the base64 form is exactly 32 raw X25519 bytes.
func TestParseRecipientPublicKeyBase64(t *testing.T) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", "not base64!", "AAAA", RecipientPublicKeyBase64(k.PublicKey()) + "AA=="} {
		if _, err := ParseRecipientPublicKeyBase64(s); !errors.Is(err, ErrKeyMismatch) {
			t.Errorf("ParseRecipientPublicKeyBase64(%q) = %v, want ErrKeyMismatch", s, err)
		}
	}
}

// IssueNode -force re-issues a node, never the CA, the issuer pair or the
// edge: those names are refused even with Force, and nothing is written.
func TestIssueNodeRefusesOtherIdentities(t *testing.T) {
	dir := t.TempDir()
	if err := InitPKI(dir, PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
		t.Fatal(err)
	}
	before := map[string][]byte{}
	for _, f := range []string{"ca.crt", "ca.key", "issuer.key", "issuer.pub", "edge-1.crt", "edge-1.key", "gpu-1.recipient.key", "gpu-1.recipient.pub"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		before[f] = b
	}
	for _, name := range []string{"ca", "CA", "issuer", "edge-1", "gpu-1.recipient"} {
		err := IssueNode(dir, IssueOptions{Node: name, Force: true})
		if !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("IssueNode(%q, force): got %v, want ErrInvalidOptions", name, err)
		}
	}
	for f, b := range before {
		got, _ := os.ReadFile(filepath.Join(dir, f))
		if !bytes.Equal(got, b) {
			t.Errorf("%s changed", f)
		}
	}
	if err := IssueNode(dir, IssueOptions{Node: "gpu-1", Force: true}); err != nil {
		t.Errorf("re-issuing a node with force: %v", err)
	}
}
