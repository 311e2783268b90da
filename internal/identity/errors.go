package identity

import (
	"errors"
	"fmt"
)

// Errors returned by this package; test with errors.Is. A TLS handshake that
// fails one of the peer checks returns the wrapped sentinel unchanged from
// tls.Conn.Handshake (Go passes VerifyConnection's error through), so
// errors.Is works on the handshake error itself. The remote side only sees
// a "bad certificate" alert.
var (
	// ErrBadSPIFFEID: a URI is not spiffe://<trust_domain>/<role>/<name>
	// with a known role (SPEC I1).
	ErrBadSPIFFEID = errors.New("identity: malformed SPIFFE ID")
	// ErrNotOneURISAN: a leaf certificate carries zero or several URI SANs;
	// an identity needs exactly one (SPEC I1).
	ErrNotOneURISAN = errors.New("identity: certificate does not carry exactly one URI SAN")
	// ErrLeafIsCA: the peer's leaf certificate has the CA basic constraint.
	ErrLeafIsCA = errors.New("identity: leaf certificate is a CA")
	// ErrNoPeerCertificate: the peer presented no certificate (SPEC I2).
	ErrNoPeerCertificate = errors.New("identity: peer presented no certificate")
	// ErrUntrustedCertificate: the edge's certificate chain failed
	// verification against the CA (unknown CA, expired, not yet valid, wrong
	// key usage). The x509 cause is wrapped in a
	// *tls.CertificateVerificationError, as Go does on the server side.
	ErrUntrustedCertificate = errors.New("identity: peer certificate failed chain verification")
	// ErrWrongTrustDomain: the peer's SPIFFE ID names another trust domain.
	ErrWrongTrustDomain = errors.New("identity: wrong trust domain")
	// ErrWrongRole: the peer's SPIFFE ID has the wrong role (a node where an
	// edge is expected or the reverse) (SPEC I2).
	ErrWrongRole = errors.New("identity: wrong role")
	// ErrWrongName: the peer's name is not an allowed node, or not the
	// expected edge (SPEC I2, I3).
	ErrWrongName = errors.New("identity: wrong name")
	// ErrBadPEM: a file holds no PEM block of the expected type, or the
	// block does not parse.
	ErrBadPEM = errors.New("identity: bad PEM data")
	// ErrKeyMismatch: a private key does not belong to its certificate, or
	// a key file holds the wrong kind of key.
	ErrKeyMismatch = errors.New("identity: wrong or mismatched key")
	// ErrInvalidOptions: ServerOptions, ClientOptions, PKIOptions or
	// IssueOptions are incomplete or inconsistent.
	ErrInvalidOptions = errors.New("identity: invalid options")
	// ErrMissingKeyUsage: a leaf certificate does not list the extended key
	// usage its role needs — clientAuth on a node certificate, serverAuth
	// on the edge's (SPEC I2). Go's chain verification treats a leaf with
	// no ExtendedKeyUsage extension as valid for any usage (RFC 5280
	// §4.2.1.12), so the usage is checked explicitly; anyExtendedKeyUsage
	// alone does not count either.
	ErrMissingKeyUsage = errors.New("identity: certificate lacks the required extended key usage")
	// ErrKeyExposed: a private key file is readable or writable by group or
	// others (mode & 0o077 != 0); it is refused as the secret store key is.
	ErrKeyExposed = errors.New("identity: private key file is accessible by group or others")
	// ErrFileExists: dev PKI generation refused to overwrite a file (set
	// Force); the FileError around it names the file.
	ErrFileExists = errors.New("identity: file exists, not overwritten without force")
	// ErrBadCSR: a certificate signing request is malformed, not signed by
	// its key, or asks for another identity than the one allowed (a join
	// or renewal, SPEC J2).
	ErrBadCSR = errors.New("identity: bad certificate signing request")
	// ErrBadJoinToken: a join token does not parse (SPEC J1).
	ErrBadJoinToken = errors.New("identity: malformed join token")
	// ErrPinMismatch: the edge's CA is not the one the join token pins
	// (SPEC J1): another deployment, or someone in between.
	ErrPinMismatch = errors.New("identity: edge CA does not match the join token's pin")
)

// FileError reports a local credential file that could not be read, parsed
// or written. The node treats it as fatal at once (SPEC S3). Err wraps an
// fs error or one of the sentinels above.
type FileError struct {
	What string // "certificate", "private key", "CA bundle", "public key", …
	Path string
	Err  error
}

func (e *FileError) Error() string {
	return fmt.Sprintf("%s file %s: %v", e.What, e.Path, e.Err)
}

// Unwrap returns the cause.
func (e *FileError) Unwrap() error { return e.Err }
