package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"iop/internal/storefile"
)

// Dev PKI file names inside the PKI directory.
const (
	CACertFile    = "ca.crt"     // CA certificate, PEM
	CAKeyFile     = "ca.key"     // CA private key, PKCS #8 PEM, mode 0600
	IssuerKeyFile = "issuer.key" // lease issuer Ed25519 private key, PKCS #8 PEM, mode 0600
	IssuerPubFile = "issuer.pub" // lease issuer Ed25519 public key, PKIX PEM
)

// CertFileName is the certificate file of the edge or node name: "<name>.crt".
func CertFileName(name string) string { return name + ".crt" }

// KeyFileName is the private key file of the edge or node name: "<name>.key".
func KeyFileName(name string) string { return name + ".key" }

// RecipientKeyFileName is node's lease recipient private key file:
// "<node>.recipient.key" (X25519, PKCS #8 PEM, mode 0600).
func RecipientKeyFileName(node string) string { return node + ".recipient.key" }

// RecipientPubFileName is node's lease recipient public key file:
// "<node>.recipient.pub" (X25519, PKIX PEM).
func RecipientPubFileName(node string) string { return node + ".recipient.pub" }

// Default validity periods of generated certificates.
const (
	DefaultLeafValidity = 365 * 24 * time.Hour
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	// notBeforeSkew backdates NotBefore so hosts with slightly slow clocks
	// accept a fresh certificate.
	notBeforeSkew = 5 * time.Minute
)

const (
	modePrivate = 0o600
	modePublic  = 0o644
	modeDir     = 0o700
)

// PKIOptions configure InitPKI.
type PKIOptions struct {
	TrustDomain string   // empty means DefaultTrustDomain
	Edge        string   // edge name; required
	Edges       []string // more edge names, each with a certificate of its own (several edges, one CA)
	Nodes       []string // node ids; none for an edge whose nodes join (SPEC J1)
	Force       bool     // overwrite existing files
	Now         func() time.Time
	// Validity of the edge and node certificates; 0 means
	// DefaultLeafValidity. The CA gets DefaultCAValidity or Validity,
	// whichever is longer.
	Validity time.Duration
}

// IssueOptions configure IssueNode.
type IssueOptions struct {
	Node string // node id; required
	// TrustDomain; empty means the one recorded in ca.crt's URI SAN. If both
	// are present they must agree.
	TrustDomain string
	Force       bool // overwrite the node's existing files
	Now         func() time.Time
	Validity    time.Duration // 0 means DefaultLeafValidity; capped at the CA's NotAfter
}

// outFile is one file InitPKI or IssueNode writes.
type outFile struct {
	name string // base name in the PKI directory
	what string // for errors
	data []byte // PEM; cleared after writing when private
	mode fs.FileMode
}

// InitPKI writes a development PKI into dir (created with mode 0700 if
// missing), without openssl (`edge pki init`):
//   - ca.crt, ca.key: an ECDSA P-256 CA with URI SAN spiffe://<td> and a
//     name constraint limiting URI SANs to the trust domain;
//   - <edge>.crt/.key: URI SAN spiffe://<td>/edge/<edge>, DNS SAN localhost,
//     IP SAN 127.0.0.1, extended key usage serverAuth;
//   - <node>.crt/.key for each node: URI SAN spiffe://<td>/node/<node>,
//     extended key usage clientAuth;
//   - issuer.key/issuer.pub: the Ed25519 lease issuer pair;
//   - <node>.recipient.key/.pub: each node's X25519 lease recipient pair.
//
// Private keys get mode 0600, the rest 0644. Unless o.Force is set, it
// writes nothing if any target exists and returns a *FileError naming it
// that wraps ErrFileExists. Bad names fail with ErrInvalidOptions.
func InitPKI(dir string, o PKIOptions) error {
	td, err := optionTrustDomain(o.TrustDomain)
	if err != nil {
		return err
	}
	if o.Edge == "" {
		return fmt.Errorf("%w: edge name is empty", ErrInvalidOptions)
	}
	edges := append([]string{o.Edge}, o.Edges...)
	seen := map[string]bool{}
	for _, n := range append(append([]string(nil), edges...), o.Nodes...) {
		if err := ValidateName(n); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		if seen[n] {
			return fmt.Errorf("%w: %q named twice (edges and nodes each need a name of their own)", ErrInvalidOptions, n)
		}
		seen[n] = true
	}
	now := clock(o.Now)()
	leafValidity := o.Validity
	if leafValidity <= 0 {
		leafValidity = DefaultLeafValidity
	}
	ca, caKey, caFiles, err := newCA(td, now, max(DefaultCAValidity, leafValidity))
	if err != nil {
		return err
	}
	files := caFiles
	for _, e := range edges {
		edge, err := newLeaf(ca, caKey, ID{TrustDomain: td, Role: RoleEdge, Name: e}, now, leafValidity)
		if err != nil {
			return err
		}
		files = append(files, edge...)
	}
	for _, n := range o.Nodes {
		nf, err := newNodeFiles(ca, caKey, ID{TrustDomain: td, Role: RoleNode, Name: n}, now, leafValidity)
		if err != nil {
			return err
		}
		files = append(files, nf...)
	}
	issuer, err := newIssuerFiles()
	if err != nil {
		return err
	}
	files = append(files, issuer...)
	return writeFiles(dir, files, o.Force)
}

// IssueNode adds one node to an existing PKI directory: <node>.crt/.key
// signed by dir's ca.crt/ca.key and a new <node>.recipient.key/.pub. With
// Force it replaces an existing node's files (certificate rotation). Errors:
// *FileError for unreadable or invalid CA files or a refused overwrite
// (ErrFileExists); ErrInvalidOptions for a bad name or a trust domain that
// disagrees with the CA's.
func IssueNode(dir string, o IssueOptions) error {
	if err := ValidateName(o.Node); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	ca, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	if err := notOtherIdentity(dir, o.Node); err != nil {
		return err
	}
	td, err := issueTrustDomain(ca, o.TrustDomain)
	if err != nil {
		return err
	}
	now := clock(o.Now)()
	validity := o.Validity
	if validity <= 0 {
		validity = DefaultLeafValidity
	}
	files, err := newNodeFiles(ca, caKey, ID{TrustDomain: td, Role: RoleNode, Name: o.Node}, now, validity)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, o.Force)
}

// IssueEdge adds one edge's certificate to an existing PKI directory:
// <edge>.crt/.key signed by dir's ca.crt/ca.key, for another edge the
// same nodes serve (node config edges[].name). With force it replaces the
// edge's existing files. Errors as IssueNode; a name that holds a node's
// certificate, the CA's or the issuer's files is ErrInvalidOptions.
func IssueEdge(dir, edge string, force bool, now func() time.Time) error {
	if err := ValidateName(edge); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	ca, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	if l := strings.ToLower(edge); l == "ca" || l == "issuer" || strings.HasSuffix(l, ".recipient") {
		return fmt.Errorf("%w: edge name %q would overwrite the CA's, the issuer's or a node's keys", ErrInvalidOptions, edge)
	}
	if id, ok := certIdentity(dir, edge); ok && id.Role != RoleEdge {
		return fmt.Errorf("%w: %s holds the %s certificate %s; an edge may not take its name", ErrInvalidOptions,
			CertFileName(edge), id.Role, id)
	}
	td, err := issueTrustDomain(ca, "")
	if err != nil {
		return err
	}
	files, err := newLeaf(ca, caKey, ID{TrustDomain: td, Role: RoleEdge, Name: edge}, clock(now)(), DefaultLeafValidity)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, force)
}

// certIdentity reads the identity of dir's certificate of name, if there
// is one that parses.
func certIdentity(dir, name string) (ID, bool) {
	pemBytes, err := os.ReadFile(filepath.Join(dir, CertFileName(name)))
	if err != nil {
		return ID{}, false
	}
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return ID{}, false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return ID{}, false
	}
	id, err := FromCertificate(cert)
	return id, err == nil
}

// notOtherIdentity refuses, even with Force, a node name whose files would
// overwrite the CA, the lease issuer pair or a certificate that is not a
// node's (the edge's): -force re-issues a node, it never replaces those.
func notOtherIdentity(dir, node string) error {
	lower := strings.ToLower(node)
	for _, reserved := range []string{"ca", "issuer"} {
		if lower == reserved {
			return fmt.Errorf("%w: node name %q is reserved for the CA and issuer files in %s", ErrInvalidOptions, node, dir)
		}
	}
	if strings.HasSuffix(lower, ".recipient") {
		return fmt.Errorf("%w: node name %q would overwrite the lease recipient keys of node %q", ErrInvalidOptions, node,
			strings.TrimSuffix(node, node[len(node)-len(".recipient"):]))
	}
	pemBytes, err := os.ReadFile(filepath.Join(dir, CertFileName(node)))
	if err != nil {
		return nil // no certificate of that name yet
	}
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	if id, err := FromCertificate(cert); err == nil && id.Role != RoleNode {
		return fmt.Errorf("%w: %s holds the %s certificate %s; a node may not take its name", ErrInvalidOptions,
			CertFileName(node), id.Role, id)
	}
	return nil
}

func clock(now func() time.Time) func() time.Time {
	if now == nil {
		return time.Now
	}
	return now
}

func newCA(td string, now time.Time, validity time.Duration) (*x509.Certificate, crypto.Signer, []outFile, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{Organization: []string{"iop"}, CommonName: "iop dev CA " + td},
		NotBefore:                   now.Add(-notBeforeSkew),
		NotAfter:                    now.Add(validity),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		URIs:                        []*url.URL{{Scheme: "spiffe", Host: td}},
		PermittedURIDomains:         []string{td},
		PermittedDNSDomainsCritical: true, // marks the name constraints extension critical (RFC 5280 §4.2.1.10)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse new CA certificate: %w", err)
	}
	keyPEM, err := privateKeyPEM(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, []outFile{
		{name: CACertFile, what: "CA certificate", data: certPEM(der), mode: modePublic},
		{name: CAKeyFile, what: "CA private key", data: keyPEM, mode: modePrivate},
	}, nil
}

// newLeaf makes the certificate and key files of an edge or node id.
func newLeaf(ca *x509.Certificate, caKey crypto.Signer, id ID, now time.Time, validity time.Duration) ([]outFile, error) {
	if err := id.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key for %s: %w", id, err)
	}
	tmpl, err := leafTemplate(ca, id, now, validity, notBeforeSkew)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("create certificate for %s: %w", id, err)
	}
	keyPEM, err := privateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	return []outFile{
		{name: CertFileName(id.Name), what: id.Role + " certificate", data: certPEM(der), mode: modePublic},
		{name: KeyFileName(id.Name), what: id.Role + " private key", data: keyPEM, mode: modePrivate},
	}, nil
}

// leafTemplate is the certificate template of an edge or node workload
// identity (SPEC I1): URI SAN id, digitalSignature, serverAuth for an edge
// (with DNS SAN localhost and IP SAN 127.0.0.1) or clientAuth for a node,
// NotBefore backdated by skew, NotAfter = now + validity capped at the
// CA's NotAfter, a fresh random serial.
func leafTemplate(ca *x509.Certificate, id ID, now time.Time, validity, skew time.Duration) (*x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"iop"}, CommonName: id.Name},
		NotBefore:             now.Add(-skew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id.URL()},
	}
	if id.Role == RoleEdge {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return tmpl, nil
}

// newNodeFiles makes a node's certificate, key and lease recipient pair.
func newNodeFiles(ca *x509.Certificate, caKey crypto.Signer, id ID, now time.Time, validity time.Duration) ([]outFile, error) {
	files, err := newLeaf(ca, caKey, id, now, validity)
	if err != nil {
		return nil, err
	}
	rk, err := NewRecipientKey()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id.Name, err)
	}
	privPEM := rk.KeyPEM
	pubPEM, err := publicKeyPEM(rk.Public)
	if err != nil {
		return nil, err
	}
	return append(files,
		outFile{name: RecipientKeyFileName(id.Name), what: "recipient private key", data: privPEM, mode: modePrivate},
		outFile{name: RecipientPubFileName(id.Name), what: "recipient public key", data: pubPEM, mode: modePublic},
	), nil
}

// NewIssuer writes a new lease issuer key pair into dir as <name>.key
// (Ed25519 PKCS #8 PEM, mode 0600) and <name>.pub (PKIX PEM, 0644), for
// rotating the edge's issuer key with overlap (nodes trust the old and the
// new public key while the edge switches; SPEC C3). Unless force is set it
// writes nothing if either file exists (a *FileError wrapping
// ErrFileExists). A bad name, or one of the CA's or a node's files, fails
// with ErrInvalidOptions.
func NewIssuer(dir, name string, force bool) error {
	if err := ValidateName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if l := strings.ToLower(name); l == "ca" || strings.HasSuffix(l, ".recipient") {
		return fmt.Errorf("%w: issuer name %q would overwrite the CA's or a node's keys", ErrInvalidOptions, name)
	}
	files, err := newIssuerFiles()
	if err != nil {
		return err
	}
	files[0].name, files[1].name = name+".key", name+".pub"
	return writeFiles(dir, files, force)
}

func newIssuerFiles() ([]outFile, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate issuer key: %w", err)
	}
	privPEM, err := privateKeyPEM(priv)
	clear(priv)
	if err != nil {
		return nil, err
	}
	pubPEM, err := publicKeyPEM(pub)
	if err != nil {
		return nil, err
	}
	return []outFile{
		{name: IssuerKeyFile, what: "issuer private key", data: privPEM, mode: modePrivate},
		{name: IssuerPubFile, what: "issuer public key", data: pubPEM, mode: modePublic},
	}, nil
}

// loadCA reads dir's ca.crt and ca.key and checks that they belong together.
func loadCA(dir string) (*x509.Certificate, crypto.Signer, error) {
	ca, err := LoadCA(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, nil, err
	}
	return ca.Cert, ca.key, nil
}

// issueTrustDomain picks the trust domain for IssueNode: the option, the
// CA's spiffe://<td> URI SAN, or both if they agree.
func issueTrustDomain(ca *x509.Certificate, opt string) (string, error) {
	fromCA := caTrustDomain(ca)
	switch {
	case opt == "" && fromCA == "":
		return "", fmt.Errorf("%w: CA certificate records no trust domain; set TrustDomain", ErrInvalidOptions)
	case opt == "":
		return fromCA, nil
	case ValidateTrustDomain(opt) != nil:
		return "", fmt.Errorf("%w: TrustDomain: %w", ErrInvalidOptions, ValidateTrustDomain(opt))
	case fromCA != "" && opt != fromCA:
		return "", fmt.Errorf("%w: TrustDomain %q, but the CA is for %q", ErrInvalidOptions, opt, fromCA)
	}
	return opt, nil
}

// writeFiles writes files into dir. Without force it first checks that no
// target exists, then creates each with O_EXCL; with force each file is
// replaced atomically (temp file + rename) so a process re-reading it for
// rotation never sees half a file. Private key bytes are cleared after.
func writeFiles(dir string, files []outFile, force bool) error {
	defer func() {
		for _, f := range files {
			if f.mode == modePrivate {
				clear(f.data)
			}
		}
	}()
	seen := make(map[string]bool, len(files))
	for _, f := range files {
		if seen[f.name] {
			return fmt.Errorf("%w: two outputs would both be written to %s; choose distinct names", ErrInvalidOptions, f.name)
		}
		seen[f.name] = true
	}
	if err := os.MkdirAll(dir, modeDir); err != nil {
		return &FileError{What: "PKI directory", Path: dir, Err: err}
	}
	if !force {
		for _, f := range files {
			p := filepath.Join(dir, f.name)
			if _, err := os.Lstat(p); err == nil {
				return &FileError{What: f.what, Path: p, Err: ErrFileExists}
			} else if !errors.Is(err, fs.ErrNotExist) {
				return &FileError{What: f.what, Path: p, Err: err}
			}
		}
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		var err error
		if force {
			err = storefile.WriteAtomicMode(p, "."+f.name+".tmp-*", f.data, f.mode)
		} else {
			err = storefile.Create(p, f.data, f.mode)
		}
		if err != nil {
			if errors.Is(err, fs.ErrExist) {
				err = ErrFileExists
			}
			return &FileError{What: f.what, Path: p, Err: err}
		}
	}
	return nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil // never zero (RFC 5280 §4.1.2.2)
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func privateKeyPEM(key any) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	defer clear(der)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func publicKeyPEM(key any) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}
