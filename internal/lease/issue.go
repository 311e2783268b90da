package lease

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/hpke"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	iop "iop/proto/gen/iop"
)

// suite returns the HPKE ciphersuite's KDF and AEAD; the KEM is the
// recipient key's (DHKEM(X25519, HKDF-SHA256)).
func suite() (hpke.KDF, hpke.AEAD) { return hpke.HKDFSHA256(), hpke.AES256GCM() }

// Recipient is a Node's lease recipient public key, ready to seal to.
// Safe for concurrent use.
type Recipient struct {
	pub   hpke.PublicKey
	keyID string
	// ready holds HPKE encapsulations to pub prepared ahead of need (nil:
	// none; see Precompute). Each is used for exactly one lease.
	ready   chan prepared
	filling atomic.Bool // a refill goroutine is running
}

// prepared is one HPKE encapsulation: the encapsulated key and its
// single-use sending context.
type prepared struct {
	enc    []byte
	sender *hpke.Sender
}

// NewRecipient wraps a Node's X25519 recipient public key (from `edge pki`,
// the edge config's nodes[].lease_recipient_public_key). Other curves are
// an error.
func NewRecipient(pub *ecdh.PublicKey) (*Recipient, error) {
	if pub == nil || pub.Curve() != ecdh.X25519() {
		return nil, errors.New("lease recipient: want an X25519 public key")
	}
	hp, err := hpke.NewDHKEMPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("lease recipient: %w", err)
	}
	return &Recipient{pub: hp, keyID: KeyID(pub.Bytes())}, nil
}

// Precompute keeps up to n HPKE encapsulations to r prepared, so that
// Issue's seal costs one AES-GCM pass instead of an X25519 key generation
// and exchange (two scalar multiplications) on the request's path. Each
// prepared encapsulation is fresh (a new ephemeral key) and used once, as
// RFC 9180's single-shot Seal would; preparing them early changes when the
// work happens, not what is sent. Call it once, before r is shared.
//
// Goroutines: a refill goroutine is started when the store runs low; it
// prepares encapsulations until the store is full, then exits (a few
// milliseconds). It is owned by r and never outlives a full store.
func (r *Recipient) Precompute(n int) {
	if n <= 0 {
		return
	}
	r.ready = make(chan prepared, n)
	r.refill()
}

// refill starts the refill goroutine unless one is running.
func (r *Recipient) refill() {
	if r.ready == nil || !r.filling.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.filling.Store(false)
		kdf, aead := suite()
		for len(r.ready) < cap(r.ready) {
			enc, s, err := hpke.NewSender(r.pub, kdf, aead, []byte(hpkeInfo))
			if err != nil {
				return
			}
			select {
			case r.ready <- prepared{enc: enc, sender: s}:
			default:
				return
			}
		}
	}()
}

// encapsulate returns a fresh encapsulation to r: a prepared one when there
// is one (and a refill is started), else one made now.
func (r *Recipient) encapsulate() ([]byte, *hpke.Sender, error) {
	if r.ready != nil {
		select {
		case p := <-r.ready:
			r.refill()
			return p.enc, p.sender, nil
		default:
			r.refill()
		}
	}
	kdf, aead := suite()
	return hpke.NewSender(r.pub, kdf, aead, []byte(hpkeInfo))
}

// KeyID is the recipient key's id (KeyID of its raw bytes).
func (r *Recipient) KeyID() string { return r.keyID }

// Issuer seals and signs leases on the Edge (SPEC C2). It is immutable and
// safe for concurrent use.
type Issuer struct {
	priv  ed25519.PrivateKey
	keyID string
	ttl   time.Duration
}

// NewIssuer returns an Issuer signing with priv (the Ed25519 issuer key
// from `edge pki`) and granting leases of ttl (0 = DefaultTTL; at most
// MaxTTL; at least one second).
func NewIssuer(priv ed25519.PrivateKey, ttl time.Duration) (*Issuer, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, errors.New("lease issuer: want an Ed25519 private key")
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < time.Second || ttl > MaxTTL {
		return nil, fmt.Errorf("lease issuer: ttl %v is outside 1s..%v", ttl, MaxTTL)
	}
	return &Issuer{priv: priv, keyID: KeyID(priv.Public().(ed25519.PublicKey)), ttl: ttl}, nil
}

// KeyID is the issuer key's id.
func (is *Issuer) KeyID() string { return is.keyID }

// TTL is the lifetime of the leases it issues.
func (is *Issuer) TTL() time.Duration { return is.ttl }

// Issue returns a fresh lease for secret, sealed to r and bound to b, valid
// from now for the Issuer's TTL (SPEC C2). It sets b.Recipient to r's key
// id; every other binding field is the caller's. The lease id is 128 random
// bits (crypto/rand.Text). secret is not retained: the caller may clear it
// as soon as Issue returns. Errors: an empty secret or one over
// MaxSecretBytes, or an HPKE failure.
func (is *Issuer) Issue(now time.Time, r *Recipient, b *iop.CredentialLeaseBinding, secret []byte) (*iop.CredentialLease, error) {
	if len(secret) == 0 || len(secret) > MaxSecretBytes {
		return nil, fmt.Errorf("lease: secret of %d bytes (want 1..%d)", len(secret), MaxSecretBytes)
	}
	b.Recipient = r.keyID
	l := &iop.CredentialLease{
		LeaseId:         rand.Text(),
		IssuedAtUnixMs:  now.UnixMilli(),
		ExpiresAtUnixMs: now.Add(is.ttl).UnixMilli(),
		IssuerKeyId:     is.keyID,
		RecipientKeyId:  r.keyID,
	}
	canon := CanonicalBinding(b)
	enc, sender, err := r.encapsulate()
	if err != nil {
		return nil, fmt.Errorf("lease: hpke sender: %w", err)
	}
	ct, err := sender.Seal(sealAAD(canon, l), secret)
	if err != nil {
		return nil, fmt.Errorf("lease: hpke seal: %w", err)
	}
	l.HpkeEnc, l.Ciphertext = enc, ct
	l.Signature = ed25519.Sign(is.priv, signedBytes(canon, l))
	return l, nil
}
