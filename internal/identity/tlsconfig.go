package identity

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"time"
)

// ServerOptions configure the edge's node listener (SPEC I1, I2).
type ServerOptions struct {
	CertFile string // PEM certificate of this edge (role edge)
	KeyFile  string // PEM private key for CertFile
	CAFile   string // PEM bundle of the CA(s) that sign node certificates
	// TrustDomain every peer (and this edge's own certificate) must belong
	// to; empty means DefaultTrustDomain.
	TrustDomain string
	// EdgeName, if set, must be the name in this edge's own certificate;
	// a mismatch fails ServerConfig.
	EdgeName string
	// AllowNode reports whether a node name may connect, typically "is a
	// configured node" (SPEC I2). It is called during every handshake and
	// must be safe for concurrent use. Required.
	AllowNode func(name string) bool
	// VerifyNode, if set, is called after every other check of a node's
	// certificate has passed; a non-nil error refuses the handshake (the
	// enrollment store's revocations and superseded serials, SPEC J6).
	// It must be safe for concurrent use.
	VerifyNode func(id ID, leaf *x509.Certificate) error
	// Now is the clock for certificate validity; nil means time.Now.
	Now func() time.Time
}

// ClientOptions configure the node's dialer to the edge (SPEC I1, I2).
type ClientOptions struct {
	CertFile string // PEM certificate of this node (role node)
	KeyFile  string // PEM private key for CertFile
	CAFile   string // PEM bundle of the CA(s) that sign the edge certificate
	// TrustDomain the edge (and this node's own certificate) must belong
	// to; empty means DefaultTrustDomain.
	TrustDomain string
	// ExpectedEdgeName is the name the edge's SPIFFE ID must carry. Required.
	ExpectedEdgeName string
	// NodeName, if set, must be the name in this node's own certificate
	// (the node id it registers as, SPEC I3); a mismatch fails ClientConfig.
	NodeName string
	// Now is the clock for certificate validity; nil means time.Now.
	Now func() time.Time
}

// ServerConfig returns the TLS config for the edge's node listener: TLS 1.3
// only, no session tickets, a client certificate required and verified
// against CAFile (Go checks the chain, validity and the clientAuth key
// usage), then in VerifyConnection — which, unlike VerifyPeerCertificate,
// also runs on resumed sessions — the peer's SPIFFE ID must be in
// TrustDomain with role node and a name AllowNode accepts, and the leaf
// must list clientAuth explicitly (Go lets a leaf without the extension
// through) (SPEC I2). A rejected handshake returns an error wrapping
// ErrNoPeerCertificate, ErrLeafIsCA, ErrNotOneURISAN, ErrBadSPIFFEID,
// ErrWrongTrustDomain, ErrWrongRole, ErrWrongName or ErrMissingKeyUsage,
// or Go's *tls.CertificateVerificationError. This edge's own certificate
// must list serverAuth.
//
// The edge's own certificate is served through GetCertificate and re-read
// when the files change (see keyPairFile). An unreadable or invalid
// CertFile, KeyFile or CAFile, a KeyFile accessible by group or others
// (ErrKeyExposed), or an own certificate that is not this edge's, fails at
// once with a *FileError naming the file; missing options fail with
// ErrInvalidOptions.
func ServerConfig(o ServerOptions) (*tls.Config, error) {
	td, err := optionTrustDomain(o.TrustDomain)
	if err != nil {
		return nil, err
	}
	if o.AllowNode == nil {
		return nil, fmt.Errorf("%w: AllowNode is nil", ErrInvalidOptions)
	}
	if err := requireFiles(o.CertFile, o.KeyFile, o.CAFile); err != nil {
		return nil, err
	}
	if o.EdgeName != "" {
		if err := ValidateName(o.EdgeName); err != nil {
			return nil, fmt.Errorf("%w: EdgeName: %w", ErrInvalidOptions, err)
		}
	}
	pool, err := loadCAPool(o.CAFile)
	if err != nil {
		return nil, err
	}
	own := func(c *x509.Certificate) error {
		return checkID(c, td, RoleEdge, nameIs(o.EdgeName, true), "own")
	}
	kp, err := newKeyPairFile(o.CertFile, o.KeyFile, own)
	if err != nil {
		return nil, err
	}
	allow, verify := o.AllowNode, o.VerifyNode
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              pool,
		Time:                   o.Now,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.current(), nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("node: %w", ErrNoPeerCertificate)
			}
			leaf := cs.PeerCertificates[0]
			if err := checkID(leaf, td, RoleNode, allow, "node"); err != nil || verify == nil {
				return err
			}
			id, _ := FromCertificate(leaf) // checkID parsed it
			return verify(id, leaf)
		},
	}, nil
}

// ClientConfig returns the TLS config for the node's dialer: TLS 1.3 only,
// no session tickets or session cache, this node's certificate offered
// through GetClientCertificate (re-read when the files change), and the
// edge's certificate checked in VerifyConnection: a chain to CAFile valid
// at Now with the serverAuth key usage, then a SPIFFE ID in TrustDomain with
// role edge and name ExpectedEdgeName, and serverAuth listed explicitly in
// the leaf (SPEC I2). This node's own certificate must list clientAuth.
//
// Why InsecureSkipVerify is set: the node dials an address, and the edge is
// identified by its SPIFFE URI SAN, not by a DNS name (SPIFFE X.509-SVID
// §5). Go's built-in client verification always matches ServerName against
// DNS/IP SANs and cannot be told to skip only that step, so it is switched
// off and VerifyConnection performs the complete chain verification itself
// (x509.Verify against the CA pool, intermediates from the peer, current
// time, ExtKeyUsageServerAuth) before any identity check. VerifyConnection
// runs on every handshake, including resumed ones; the TLS signature check
// that proves possession of the key is unaffected by InsecureSkipVerify.
// A handshake with any other config is never verified: only use the
// returned config as built.
//
// A rejected handshake returns an error wrapping ErrUntrustedCertificate
// (with the x509 cause in a *tls.CertificateVerificationError),
// ErrNoPeerCertificate, ErrLeafIsCA, ErrNotOneURISAN, ErrBadSPIFFEID,
// ErrWrongTrustDomain, ErrWrongRole, ErrWrongName or ErrMissingKeyUsage.
// An unreadable or invalid file, or a private key file accessible by group
// or others (ErrKeyExposed), fails at once with a *FileError naming it
// (SPEC S3).
func ClientConfig(o ClientOptions) (*tls.Config, error) {
	td, err := optionTrustDomain(o.TrustDomain)
	if err != nil {
		return nil, err
	}
	if o.ExpectedEdgeName == "" {
		return nil, fmt.Errorf("%w: ExpectedEdgeName is empty", ErrInvalidOptions)
	}
	if err := ValidateName(o.ExpectedEdgeName); err != nil {
		return nil, fmt.Errorf("%w: ExpectedEdgeName: %w", ErrInvalidOptions, err)
	}
	if o.NodeName != "" {
		if err := ValidateName(o.NodeName); err != nil {
			return nil, fmt.Errorf("%w: NodeName: %w", ErrInvalidOptions, err)
		}
	}
	if err := requireFiles(o.CertFile, o.KeyFile, o.CAFile); err != nil {
		return nil, err
	}
	pool, err := loadCAPool(o.CAFile)
	if err != nil {
		return nil, err
	}
	own := func(c *x509.Certificate) error {
		return checkID(c, td, RoleNode, nameIs(o.NodeName, true), "own")
	}
	kp, err := newKeyPairFile(o.CertFile, o.KeyFile, own)
	if err != nil {
		return nil, err
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	edgeName := nameIs(o.ExpectedEdgeName, false)
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		ClientSessionCache:     nil,
		InsecureSkipVerify:     true, // replaced by verifyChain below; see the doc comment
		Time:                   o.Now,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.current(), nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := verifyChain(cs.PeerCertificates, pool, now()); err != nil {
				return err
			}
			return checkID(cs.PeerCertificates[0], td, RoleEdge, edgeName, "edge")
		},
	}, nil
}

// PeerID returns the SPIFFE ID of the peer of a connection whose handshake
// succeeded with a config from ServerConfig or ClientConfig (those verified
// the chain and the identity; PeerID only reads the leaf). The edge binds
// the node id of a registration to PeerID(...).Name (SPEC I3).
func PeerID(cs tls.ConnectionState) (ID, error) {
	if !cs.HandshakeComplete {
		return ID{}, fmt.Errorf("%w: handshake not complete", ErrNoPeerCertificate)
	}
	if len(cs.PeerCertificates) == 0 {
		return ID{}, ErrNoPeerCertificate
	}
	return FromCertificate(cs.PeerCertificates[0])
}

// verifyChain verifies the peer chain the way Go's client would, minus the
// host name: against roots, at now, for server authentication.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, now time.Time) error {
	if len(certs) == 0 {
		return fmt.Errorf("edge: %w", ErrNoPeerCertificate)
	}
	opts := x509.VerifyOptions{
		Roots:         roots,
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("edge: %w: %w", ErrUntrustedCertificate,
			&tls.CertificateVerificationError{UnverifiedCertificates: certs, Err: err})
	}
	return nil
}

// nameIs returns a name check accepting exactly want; an empty want accepts
// any name when emptyMeansAny is set.
func nameIs(want string, emptyMeansAny bool) func(string) bool {
	return func(name string) bool {
		return name == want || (want == "" && emptyMeansAny)
	}
}

// checkID extracts c's SPIFFE ID and checks trust domain, role and name, in
// that order. who names the certificate in the error ("own", "node", "edge").
func checkID(c *x509.Certificate, td, role string, allowName func(string) bool, who string) error {
	id, err := FromCertificate(c)
	if err != nil {
		return fmt.Errorf("%s certificate: %w", who, err)
	}
	switch {
	case id.TrustDomain != td:
		return fmt.Errorf("%s certificate %s: trust domain %q, want %q: %w", who, id, id.TrustDomain, td, ErrWrongTrustDomain)
	case id.Role != role:
		return fmt.Errorf("%s certificate %s: role %q, want %q: %w", who, id, id.Role, role, ErrWrongRole)
	case !allowName(id.Name):
		return fmt.Errorf("%s certificate %s: name %q not allowed: %w", who, id, id.Name, ErrWrongName)
	}
	want := roleUsage(role)
	if !slices.Contains(c.ExtKeyUsage, want) {
		return fmt.Errorf("%s certificate %s: extended key usage %s missing: %w", who, id, usageName(want), ErrMissingKeyUsage)
	}
	return nil
}

// roleUsage is the extended key usage a role's certificate must list
// (SPEC I2): a node authenticates as a TLS client, the edge as a server.
func roleUsage(role string) x509.ExtKeyUsage {
	if role == RoleEdge {
		return x509.ExtKeyUsageServerAuth
	}
	return x509.ExtKeyUsageClientAuth
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageServerAuth {
		return "serverAuth"
	}
	return "clientAuth"
}

func optionTrustDomain(td string) (string, error) {
	if td == "" {
		return DefaultTrustDomain, nil
	}
	if err := ValidateTrustDomain(td); err != nil {
		return "", fmt.Errorf("%w: TrustDomain: %w", ErrInvalidOptions, err)
	}
	return td, nil
}

func requireFiles(cert, key, ca string) error {
	for _, f := range []struct{ name, v string }{{"CertFile", cert}, {"KeyFile", key}, {"CAFile", ca}} {
		if f.v == "" {
			return fmt.Errorf("%w: %s is empty", ErrInvalidOptions, f.name)
		}
	}
	return nil
}
