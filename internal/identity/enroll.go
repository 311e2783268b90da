package identity

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net/url"
	"os"
	"time"
)

// Enrollment (node join and renewal): the edge signs a node's own key,
// which it sends in a certificate signing request (PKCS #10, RFC 2986),
// with the CA key it holds online; the node's private keys never leave the
// node. The certificate is a node workload certificate as IssueNode makes
// one (SPIFFE URI SAN, clientAuth).

// CA is a certificate authority able to sign: the CA certificate and its
// private key. Make one with LoadCA.
type CA struct {
	Cert *x509.Certificate
	// TrustDomain is the one in the CA's spiffe://<td> URI SAN; "" when it
	// records none.
	TrustDomain string
	key         crypto.Signer
}

// LoadCA reads a CA from certFile (a PEM bundle: the certificate whose
// public key matches the key is the signing one) and keyFile (PKCS #8 PEM).
// Errors are *FileError: unreadable files, ErrBadPEM, ErrKeyMismatch when no
// CA certificate of the bundle belongs to the key. The key never appears in
// an error.
func LoadCA(certFile, keyFile string) (*CA, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return nil, &FileError{What: "CA certificate", Path: certFile, Err: err}
	}
	certs, err := parseCertificatesPEM(data)
	if err != nil {
		return nil, &FileError{What: "CA certificate", Path: certFile, Err: err}
	}
	der, err := readPEMBlock(keyFile, "PRIVATE KEY", "CA private key")
	if err != nil {
		return nil, err
	}
	defer clear(der)
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, &FileError{What: "CA private key", Path: keyFile, Err: fmt.Errorf("%w: not PKCS #8", ErrBadPEM)}
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, &FileError{What: "CA private key", Path: keyFile, Err: fmt.Errorf("%w: %T cannot sign", ErrKeyMismatch, k)}
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	pub, ok := signer.Public().(equaler)
	for _, c := range certs {
		if ok && c.BasicConstraintsValid && c.IsCA && pub.Equal(c.PublicKey) {
			return &CA{Cert: c, TrustDomain: caTrustDomain(c), key: signer}, nil
		}
	}
	return nil, &FileError{What: "CA private key", Path: keyFile,
		Err: fmt.Errorf("%w: matches no CA certificate in %s", ErrKeyMismatch, certFile)}
}

// caTrustDomain is the trust domain of a CA's spiffe://<td> URI SAN, or "".
func caTrustDomain(ca *x509.Certificate) string {
	for _, u := range ca.URIs {
		if u.Scheme == "spiffe" && (u.Path == "" || u.Path == "/") && ValidateTrustDomain(u.Host) == nil {
			return u.Host
		}
	}
	return ""
}

// MinEnrolledValidity is the shortest certificate lifetime SignNode issues.
const MinEnrolledValidity = time.Minute

// SignNode checks csrDER (CheckNodeCSR: a node CSR for exactly id) and
// returns the DER of a certificate for its public key: URI SAN id, key
// usage digitalSignature, extended key usage clientAuth, NotBefore = now
// minus min(5 min, validity/4) (slow clocks), NotAfter = now + validity
// capped at the CA's NotAfter. Errors: ErrBadCSR, ErrInvalidOptions (a
// validity under MinEnrolledValidity, an id that is not a node's).
func (ca *CA) SignNode(csrDER []byte, id ID, now time.Time, validity time.Duration) ([]byte, error) {
	if validity < MinEnrolledValidity {
		return nil, fmt.Errorf("%w: validity %v is under %v", ErrInvalidOptions, validity, MinEnrolledValidity)
	}
	csr, err := CheckNodeCSR(csrDER, id)
	if err != nil {
		return nil, err
	}
	tmpl, err := leafTemplate(ca.Cert, id, now, validity, min(notBeforeSkew, validity/4))
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", id, err)
	}
	return der, nil
}

// CheckNodeCSR parses a PKCS #10 request and checks it asks for the node
// identity id and nothing else: a valid self-signature, an ECDSA P-256 or
// Ed25519 public key, exactly one URI SAN equal to id and no DNS, IP or
// e-mail SAN. The subject is ignored (the certificate gets CN = id.Name).
// Errors wrap ErrBadCSR and say what is wrong.
func CheckNodeCSR(csrDER []byte, id ID) (*x509.CertificateRequest, error) {
	if id.Role != RoleNode {
		return nil, fmt.Errorf("%w: %s is not a node identity", ErrInvalidOptions, id)
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("%w: not a PKCS #10 request: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature does not verify: %v", ErrBadCSR, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: ECDSA key on %s, want P-256", ErrBadCSR, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return nil, fmt.Errorf("%w: %T public key, want ECDSA P-256 or Ed25519", ErrBadCSR, csr.PublicKey)
	}
	if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) > 0 {
		return nil, fmt.Errorf("%w: asks for DNS, IP or e-mail names; a node certificate carries only its SPIFFE ID", ErrBadCSR)
	}
	if len(csr.URIs) != 1 {
		return nil, fmt.Errorf("%w: %d URI SANs, want exactly one (%s)", ErrBadCSR, len(csr.URIs), id)
	}
	got, err := Parse(csr.URIs[0].String())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if got != id {
		return nil, fmt.Errorf("%w: asks for %s, want %s", ErrBadCSR, got, id)
	}
	return csr, nil
}

// NodeKey is a node's new workload key: its private key as PKCS #8 PEM
// (write it mode 0600 and clear it) and a CSR for id signed with it.
type NodeKey struct {
	KeyPEM []byte
	CSR    []byte // DER
}

// NewNodeKey makes an ECDSA P-256 key and a CSR for id (URI SAN id, CN
// id.Name), for enrollment and renewal.
func NewNodeKey(id ID) (NodeKey, error) {
	if err := id.validate(); err != nil || id.Role != RoleNode {
		return NodeKey{}, fmt.Errorf("%w: %s is not a node identity", ErrInvalidOptions, id)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return NodeKey{}, fmt.Errorf("generate key for %s: %w", id, err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{Organization: []string{"iop"}, CommonName: id.Name},
		URIs:    []*url.URL{id.URL()},
	}, key)
	if err != nil {
		return NodeKey{}, fmt.Errorf("create CSR for %s: %w", id, err)
	}
	keyPEM, err := privateKeyPEM(key)
	if err != nil {
		return NodeKey{}, err
	}
	return NodeKey{KeyPEM: keyPEM, CSR: csr}, nil
}

// RecipientKey is a node's new X25519 lease recipient pair (SPEC C2): the
// private key as PKCS #8 PEM (write it mode 0600 and clear it) and the
// public key.
type RecipientKey struct {
	KeyPEM []byte
	Public *ecdh.PublicKey
}

// NewRecipientKey makes a lease recipient pair.
func NewRecipientKey() (RecipientKey, error) {
	rk, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return RecipientKey{}, fmt.Errorf("generate recipient key: %w", err)
	}
	pemBytes, err := privateKeyPEM(rk)
	if err != nil {
		return RecipientKey{}, err
	}
	return RecipientKey{KeyPEM: pemBytes, Public: rk.PublicKey()}, nil
}

// CertificatePEM encodes a DER certificate as one PEM "CERTIFICATE" block.
func CertificatePEM(der []byte) []byte { return certPEM(der) }

// IssuerPublicKeyPEM encodes an Ed25519 lease issuer public key as the
// PKIX PEM "PUBLIC KEY" block LoadIssuerPublicKey reads (issuer.pub).
func IssuerPublicKeyPEM(pub ed25519.PublicKey) ([]byte, error) { return publicKeyPEM(pub) }

// ParseCertificatePEM parses the first certificate of a PEM bundle (errors
// wrap ErrBadPEM).
func ParseCertificatePEM(data []byte) (*x509.Certificate, error) {
	certs, err := parseCertificatesPEM(data)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// IssuerIn returns the certificate of the PEM bundle caFile that signed
// leaf, or nil when none did.
func IssuerIn(caFile string, leaf *x509.Certificate) (*x509.Certificate, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, &FileError{What: "CA bundle", Path: caFile, Err: err}
	}
	certs, err := parseCertificatesPEM(data)
	if err != nil {
		return nil, &FileError{What: "CA bundle", Path: caFile, Err: err}
	}
	for _, c := range certs {
		if c.IsCA && leaf.CheckSignatureFrom(c) == nil {
			return c, nil
		}
	}
	return nil, nil
}
