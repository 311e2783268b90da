package identity

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
)

// Lease key files written by InitPKI and IssueNode. The issuer pair
// (Ed25519) signs credential leases on the edge; each node's recipient pair
// (X25519) is what leases are sealed to (SPEC C2, C3). Private keys are PEM
// "PRIVATE KEY" (PKCS #8, RFC 5208/8410), public keys PEM "PUBLIC KEY"
// (PKIX SubjectPublicKeyInfo, RFC 5280/8410).

// LoadRecipientPublicKey reads a node's X25519 lease recipient public key
// from a PEM "PUBLIC KEY" file. Errors are *FileError wrapping fs errors,
// ErrBadPEM, or ErrKeyMismatch for another key type.
func LoadRecipientPublicKey(path string) (*ecdh.PublicKey, error) {
	der, err := readPEMBlock(path, "PUBLIC KEY", "recipient public key")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, &FileError{What: "recipient public key", Path: path, Err: fmt.Errorf("%w: %w", ErrBadPEM, err)}
	}
	pub, ok := k.(*ecdh.PublicKey)
	if !ok || pub.Curve() != ecdh.X25519() {
		return nil, &FileError{What: "recipient public key", Path: path, Err: fmt.Errorf("%w: %T, want X25519", ErrKeyMismatch, k)}
	}
	return pub, nil
}

// LoadRecipientPrivateKey reads a node's X25519 lease recipient private key
// from a PEM "PRIVATE KEY" file. Errors as LoadRecipientPublicKey; they
// never contain key bytes.
func LoadRecipientPrivateKey(path string) (*ecdh.PrivateKey, error) {
	der, err := readPEMBlock(path, "PRIVATE KEY", "recipient private key")
	if err != nil {
		return nil, err
	}
	defer clear(der)
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, &FileError{What: "recipient private key", Path: path, Err: fmt.Errorf("%w: not PKCS #8", ErrBadPEM)}
	}
	priv, ok := k.(*ecdh.PrivateKey)
	if !ok || priv.Curve() != ecdh.X25519() {
		return nil, &FileError{What: "recipient private key", Path: path, Err: fmt.Errorf("%w: %T, want X25519", ErrKeyMismatch, k)}
	}
	return priv, nil
}

// LoadIssuerPublicKey reads the edge's Ed25519 lease issuer public key from
// a PEM "PUBLIC KEY" file. Errors as LoadRecipientPublicKey.
func LoadIssuerPublicKey(path string) (ed25519.PublicKey, error) {
	der, err := readPEMBlock(path, "PUBLIC KEY", "issuer public key")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, &FileError{What: "issuer public key", Path: path, Err: fmt.Errorf("%w: %w", ErrBadPEM, err)}
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, &FileError{What: "issuer public key", Path: path, Err: fmt.Errorf("%w: %T, want Ed25519", ErrKeyMismatch, k)}
	}
	return pub, nil
}

// LoadIssuerPrivateKey reads the edge's Ed25519 lease issuer private key
// from a PEM "PRIVATE KEY" file. Errors as LoadRecipientPrivateKey.
func LoadIssuerPrivateKey(path string) (ed25519.PrivateKey, error) {
	der, err := readPEMBlock(path, "PRIVATE KEY", "issuer private key")
	if err != nil {
		return nil, err
	}
	defer clear(der)
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, &FileError{What: "issuer private key", Path: path, Err: fmt.Errorf("%w: not PKCS #8", ErrBadPEM)}
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, &FileError{What: "issuer private key", Path: path, Err: fmt.Errorf("%w: %T, want Ed25519", ErrKeyMismatch, k)}
	}
	return priv, nil
}

// RecipientPublicKeyBase64 returns the standard base64 (RFC 4648 §4, with
// padding) of the 32 raw bytes of an X25519 public key: the form of the
// edge config's nodes[].lease_recipient_public_key.
func RecipientPublicKeyBase64(pub *ecdh.PublicKey) string {
	return base64.StdEncoding.EncodeToString(pub.Bytes())
}

// ParseRecipientPublicKeyBase64 is the inverse of RecipientPublicKeyBase64.
// It fails with ErrKeyMismatch unless s decodes to 32 bytes of X25519.
func ParseRecipientPublicKeyBase64(s string) (*ecdh.PublicKey, error) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: recipient public key is not standard base64: %w", ErrKeyMismatch, err)
	}
	pub, err := ecdh.X25519().NewPublicKey(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: recipient public key: %d bytes, want 32 of X25519", ErrKeyMismatch, len(raw))
	}
	return pub, nil
}

// IssuerPublicKeyBase64 returns the standard base64 of the 32 raw bytes of
// an Ed25519 public key (for a node config's credentials.issuer_public_key).
func IssuerPublicKeyBase64(pub ed25519.PublicKey) string {
	return base64.StdEncoding.EncodeToString(pub)
}

// ParseIssuerPublicKeyBase64 is the inverse of IssuerPublicKeyBase64. It
// fails with ErrKeyMismatch unless s decodes to 32 bytes.
func ParseIssuerPublicKeyBase64(s string) (ed25519.PublicKey, error) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: issuer public key is not standard base64: %w", ErrKeyMismatch, err)
	}
	if len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: issuer public key: %d bytes, want %d", ErrKeyMismatch, len(raw), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw), nil
}

// readPEMBlock returns the DER of the first PEM block of file path, which
// must have type want. The file contents are cleared before returning. A
// "PRIVATE KEY" file must not be accessible by group or others
// (ErrKeyExposed).
func readPEMBlock(path, want, what string) ([]byte, error) {
	if want == "PRIVATE KEY" {
		if err := checkPrivateMode(path, what); err != nil {
			return nil, err
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &FileError{What: what, Path: path, Err: err}
	}
	defer clear(data)
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, &FileError{What: what, Path: path, Err: fmt.Errorf("%w: no PEM block", ErrBadPEM)}
	}
	if block.Type != want {
		return nil, &FileError{What: what, Path: path, Err: fmt.Errorf("%w: PEM block %q, want %q", ErrBadPEM, block.Type, want)}
	}
	return block.Bytes, nil
}

// checkPrivateMode refuses a private key file whose mode grants group or
// others any access (mode & 0o077), as ssh does for identity files and the
// secret store does for its key; the *FileError says how to fix it.
func checkPrivateMode(path, what string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return &FileError{What: what, Path: path, Err: err}
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return &FileError{What: what, Path: path, Err: fmt.Errorf("%w (mode %v; chmod 600 it)", ErrKeyExposed, m)}
	}
	return nil
}
