package identity

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"sync"
)

// keyPairFile serves a certificate/key pair from two files and picks up a
// replaced pair on the next handshake, without restart (J5).
//
// Each handshake re-reads both files (a few hundred bytes each) and compares
// their contents with the pair in use; only a change is parsed. Contents are
// compared rather than mtime and size because Linux file timestamps are
// jiffy-coarse (several ms): a rotation written within one tick with an
// equal size would otherwise be missed. If the new pair fails to read,
// parse, match or pass check, or the key file has become accessible by
// group or others, the last good pair keeps being served and the next
// handshake tries again; nothing is logged.
type keyPairFile struct {
	certPath, keyPath string
	check             func(*x509.Certificate) error // own-identity check; may be nil

	mu      sync.Mutex // guards the fields below; held only for file reads and parsing
	certPEM []byte
	keyPEM  []byte
	pair    *tls.Certificate
}

// newKeyPairFile loads the pair once; an unreadable or invalid file fails
// with a *FileError naming it (SPEC S3: fatal local credential error).
func newKeyPairFile(certPath, keyPath string, check func(*x509.Certificate) error) (*keyPairFile, error) {
	k := &keyPairFile{certPath: certPath, keyPath: keyPath, check: check}
	certPEM, keyPEM, err := k.read()
	if err != nil {
		return nil, err
	}
	pair, err := k.parse(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	k.certPEM, k.keyPEM, k.pair = certPEM, keyPEM, pair
	return k, nil
}

func (k *keyPairFile) read() (certPEM, keyPEM []byte, err error) {
	certPEM, err = os.ReadFile(k.certPath)
	if err != nil {
		return nil, nil, &FileError{What: "certificate", Path: k.certPath, Err: err}
	}
	if err := checkPrivateMode(k.keyPath, "private key"); err != nil {
		return nil, nil, err
	}
	keyPEM, err = os.ReadFile(k.keyPath)
	if err != nil {
		return nil, nil, &FileError{What: "private key", Path: k.keyPath, Err: err}
	}
	return certPEM, keyPEM, nil
}

func (k *keyPairFile) parse(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	if _, err := parseCertificatesPEM(certPEM); err != nil {
		return nil, &FileError{What: "certificate", Path: k.certPath, Err: err}
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// The certificate parsed above, so the key is what is wrong. The
		// tls error text never contains key bytes.
		return nil, &FileError{What: "private key", Path: k.keyPath,
			Err: fmt.Errorf("%w: %v (certificate %s)", ErrKeyMismatch, err, k.certPath)}
	}
	if k.check != nil {
		if err := k.check(pair.Leaf); err != nil {
			return nil, &FileError{What: "certificate", Path: k.certPath, Err: err}
		}
	}
	return &pair, nil
}

// current returns the pair to present in this handshake: the files' pair
// if it changed and is good, otherwise the last good one.
func (k *keyPairFile) current() *tls.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	certPEM, keyPEM, err := k.read()
	if err != nil {
		return k.pair
	}
	if bytes.Equal(certPEM, k.certPEM) && bytes.Equal(keyPEM, k.keyPEM) {
		return k.pair
	}
	pair, err := k.parse(certPEM, keyPEM)
	if err != nil {
		return k.pair
	}
	k.certPEM, k.keyPEM, k.pair = certPEM, keyPEM, pair
	return pair
}

// parseCertificatesPEM parses every CERTIFICATE block in data; there must
// be at least one and nothing else that is not a certificate.
func parseCertificatesPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%w: PEM block %q, want CERTIFICATE", ErrBadPEM, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadPEM, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%w: no CERTIFICATE block", ErrBadPEM)
	}
	return certs, nil
}

// loadCAPool reads a PEM bundle of one or more CA certificates.
func loadCAPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &FileError{What: "CA bundle", Path: path, Err: err}
	}
	certs, err := parseCertificatesPEM(data)
	if err != nil {
		return nil, &FileError{What: "CA bundle", Path: path, Err: err}
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, &FileError{What: "CA bundle", Path: path,
				Err: fmt.Errorf("%w: certificate %q is not a CA", ErrBadPEM, c.Subject.CommonName)}
		}
		pool.AddCert(c)
	}
	return pool, nil
}
