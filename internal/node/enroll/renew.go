package enroll

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"iop/internal/identity"
	"iop/internal/storefile"
)

// Renewer renews a node's certificate (SPEC J5): it tells the session when
// the certificate in its files is due, makes a new key and CSR, and
// installs the certificate the edge signs. The TLS config reads the files
// at every handshake, so the session that renewed goes on and the next
// connection uses the new pair: no restart, no dropped request.
//
// Install writes the new key to "<key_file>.next" first, then the
// certificate (atomically), then renames the key into place; Recover, run
// at start, finishes or undoes an install a crash interrupted. A pair
// that does not match is never left in place. Safe for concurrent use.
type Renewer struct {
	id                identity.ID
	certFile, keyFile string

	mu      sync.Mutex
	pending []byte // the key of the last request (PEM), until Install
}

// NewRenewer renews id's certificate in certFile with its key in keyFile.
func NewRenewer(id identity.ID, certFile, keyFile string) *Renewer {
	return &Renewer{id: id, certFile: certFile, keyFile: keyFile}
}

// RenewFraction is how much of its validity (NotBefore to NotAfter) a
// certificate has lived when it is renewed.
const RenewFraction = 2.0 / 3

// RenewAt is when the certificate in the file is due for renewal:
// NotBefore + RenewFraction × (NotAfter − NotBefore) (a day's certificate
// after about 16 hours; a 2-minute one, backdated 30 s, 70 s after issue).
func (r *Renewer) RenewAt() (time.Time, error) {
	c, err := r.current()
	if err != nil {
		return time.Time{}, err
	}
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(time.Duration(float64(life) * RenewFraction)), nil
}

// NotAfter is the certificate's expiry.
func (r *Renewer) NotAfter() (time.Time, error) {
	c, err := r.current()
	if err != nil {
		return time.Time{}, err
	}
	return c.NotAfter, nil
}

func (r *Renewer) current() (*x509.Certificate, error) {
	b, err := os.ReadFile(r.certFile)
	if err != nil {
		return nil, err
	}
	return identity.ParseCertificatePEM(b)
}

// NewRequest makes a new key and returns its CSR for the node's identity;
// the key is kept in memory until Install (a later NewRequest replaces it).
func (r *Renewer) NewRequest() ([]byte, error) {
	k, err := identity.NewNodeKey(r.id)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	clear(r.pending)
	r.pending = k.KeyPEM
	r.mu.Unlock()
	return k.CSR, nil
}

// ErrNoRequest: Install without a NewRequest whose key it can match.
var ErrNoRequest = errors.New("renew: no pending request")

// Install checks that certPEM is a certificate for the pending key and the
// node's identity and writes the pair (see Renewer). On an error the files
// are unchanged.
func (r *Renewer) Install(certPEM []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		return ErrNoRequest
	}
	pair, err := tls.X509KeyPair(certPEM, r.pending)
	if err != nil {
		return fmt.Errorf("renew: the certificate is not for the new key: %w", err)
	}
	if got, err := identity.FromCertificate(pair.Leaf); err != nil || got != r.id {
		return fmt.Errorf("renew: the certificate names %v, want %s", got, r.id)
	}
	next := r.keyFile + ".next"
	if err := storefile.WriteAtomic(next, ".key-*.tmp", r.pending); err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if err := storefile.WriteAtomicMode(r.certFile, ".crt-*.tmp", certPEM, 0o644); err != nil {
		os.Remove(next)
		return fmt.Errorf("renew: %w", err)
	}
	if err := os.Rename(next, r.keyFile); err != nil {
		return fmt.Errorf("renew: %w (the new key is in %s; node start recovers it)", err, next)
	}
	clear(r.pending)
	r.pending = nil
	return nil
}

// Recover finishes an Install a crash cut short: when "<key_file>.next"
// exists and belongs to the certificate it becomes the key; otherwise it
// is removed (the certificate was not replaced yet). Nothing to do is nil.
func Recover(certFile, keyFile string) error {
	next := keyFile + ".next"
	keyPEM, err := os.ReadFile(next)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer clear(keyPEM)
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err == nil {
		if cur, err := os.ReadFile(keyFile); err == nil && bytes.Equal(cur, keyPEM) {
			return os.Remove(next)
		}
		return os.Rename(next, keyFile)
	}
	return os.Remove(next)
}
