package lease

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/hpke"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/textproto"
	"runtime"
	"slices"
	"strings"
	"time"

	iop "iop/proto/gen/iop"
)

// Scope is what a binding must match on the Node (SPEC C3, C6): this
// request's adapter, target and protocol profile, and the credential
// projection the Node applied last.
type Scope struct {
	// Node is this Node's id.
	Node string
	// Provider is the adapter instance the request runs on.
	Provider string
	// Target is the request's backend model name.
	Target string
	// Profile is the adapter's protocol profile name ("openai", "vllm",
	// "llamacpp", "ollama").
	Profile string
	// AuthHeader and AuthScheme are where the adapter puts the credential;
	// the header name compares case-insensitively.
	AuthHeader, AuthScheme string
	// Generation is the projection generation of the Node's applied config:
	// a binding naming an older one is rejected.
	Generation uint64
	// Revisions are the current revision of each slot the Node knows: a
	// binding naming an older revision of its slot is rejected. A slot
	// the Node does not know yet (added after its last refresh) is checked
	// by the signature alone.
	Revisions map[string]uint64
}

// Opener verifies and opens leases on a Node (SPEC C3). It holds the
// Node's recipient private key, the trusted issuer public keys and the
// replay cache; safe for concurrent use.
//
// Restarts (the replay cache is in memory): each Opener draws a random
// boot id, which the Node reports at registration (RegisterRequest.boot_id)
// and the Edge binds into every lease for it (node_boot_id, signed). A
// lease bound to another boot id was issued for an earlier run of the
// Node and is rejected (ErrBoot), so a restart invalidates every lease
// issued before it although the new process's replay cache is empty —
// exactly, without a clock or state on disk. A binding without a boot id
// comes from an Edge that does not bind boots and is checked without it.
type Opener struct {
	bootID    string
	priv      hpke.PrivateKey
	keyID     string
	issuers   map[string]ed25519.PublicKey // by KeyID
	issuerIDs []string                     // sorted
	skew      time.Duration
	replay    *ReplayCache
}

// NewOpener returns an Opener for the Node's X25519 recipient private key
// and the Edge's Ed25519 issuer public keys — one, or several while the
// Edge's issuer key is rotated (a lease signed by any of them verifies) —
// with replay (nil = a new cache of DefaultReplayCapacity) and skew (0 =
// DefaultSkew).
func NewOpener(priv *ecdh.PrivateKey, issuers []ed25519.PublicKey, replay *ReplayCache, skew time.Duration) (*Opener, error) {
	if priv == nil || priv.Curve() != ecdh.X25519() {
		return nil, errors.New("lease opener: want an X25519 recipient private key")
	}
	if len(issuers) == 0 {
		return nil, errors.New("lease opener: want at least one Ed25519 issuer public key")
	}
	trusted := make(map[string]ed25519.PublicKey, len(issuers))
	var ids []string
	for _, k := range issuers {
		if len(k) != ed25519.PublicKeySize {
			return nil, errors.New("lease opener: want Ed25519 issuer public keys")
		}
		id := KeyID(k)
		if _, dup := trusted[id]; !dup {
			ids = append(ids, id)
		}
		trusted[id] = k
	}
	slices.Sort(ids)
	hp, err := hpke.NewDHKEMPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("lease opener: %w", err)
	}
	if replay == nil {
		replay = NewReplayCache(0)
	}
	if skew <= 0 {
		skew = DefaultSkew
	}
	boot := make([]byte, 16)
	if _, err := rand.Read(boot); err != nil {
		return nil, fmt.Errorf("lease opener: boot id: %w", err)
	}
	return &Opener{bootID: hex.EncodeToString(boot), priv: hp, keyID: KeyID(priv.PublicKey().Bytes()), issuers: trusted, issuerIDs: ids,
		skew: skew, replay: replay}, nil
}

// BootID is this Opener's boot id: 32 hex digits, random per process
// (one Opener per Node process), for RegisterRequest.boot_id.
func (o *Opener) BootID() string { return o.bootID }

// RecipientKeyID is the id of the Node's recipient key.
func (o *Opener) RecipientKeyID() string { return o.keyID }

// IssuerKeyIDs are the ids of the issuer keys the Node trusts, sorted.
func (o *Opener) IssuerKeyIDs() []string { return slices.Clone(o.issuerIDs) }

// TrustsIssuer reports whether id is one of the trusted issuer keys.
func (o *Opener) TrustsIssuer(id string) bool {
	_, ok := o.issuers[id]
	return ok
}

// Open verifies l and b for a request in scope s at time now and returns
// the plaintext credential (SPEC C3). The caller owns the returned slice
// and must clear() it once the credential is in the outgoing request. A
// lease that passes every check before the seal is recorded in the replay
// cache even if the seal then fails to open: it is consumed. Errors are
// *Error wrapping ErrMalformed, ErrIssuer, ErrSignature, ErrRecipient, ErrBoot,
// ErrScope, ErrLifetime, ErrNotYetValid, ErrExpired, ErrReplayed,
// ErrReplayFull or ErrOpen. Presence rules are CheckPresence's; Open
// treats a nil l or b as ErrMalformed.
//
// The HPKE decapsulation (an X25519 exchange, independent of every check)
// runs on a second goroutine while the signature, scope, lifetime and
// replay are checked on the caller's (when GOMAXPROCS > 1), so the two
// waits overlap on a multi-core Node; its result is used only once every
// check passed, and the goroutine has ended when Open returns.
func (o *Opener) Open(now time.Time, s Scope, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) ([]byte, error) {
	if err := checkShape(l, b); err != nil {
		return nil, err
	}
	type decap struct {
		r   *hpke.Recipient
		err error
	}
	done := make(chan decap, 1)
	run := func() {
		kdf, aead := suite()
		r, err := hpke.NewRecipient(l.GetHpkeEnc(), o.priv, kdf, aead, []byte(hpkeInfo))
		done <- decap{r, err}
	}
	var d decap
	if runtime.GOMAXPROCS(0) > 1 {
		go run()
		err := o.verify(now, s, l, b)
		d = <-done // the goroutine has ended
		if err != nil {
			return nil, err
		}
	} else { // on one P a second goroutine only adds a switch
		if err := o.verify(now, s, l, b); err != nil {
			return nil, err
		}
		run()
		d = <-done
	}
	if d.err != nil {
		return nil, reject(ErrOpen, "encapsulated key")
	}
	pt, err := d.r.Open(sealAAD(CanonicalBinding(b), l), l.GetCiphertext())
	if err != nil {
		return nil, reject(ErrOpen, "ciphertext or binding")
	}
	return pt, nil
}

// checkShape rejects a lease whose fields are absent or out of shape.
func checkShape(l *iop.CredentialLease, b *iop.CredentialLeaseBinding) error {
	if l == nil || b == nil {
		return reject(ErrMalformed, "lease or binding absent")
	}
	switch {
	case l.GetLeaseId() == "" || len(l.GetLeaseId()) > 128:
		return reject(ErrMalformed, "lease_id")
	case len(l.GetHpkeEnc()) == 0:
		return reject(ErrMalformed, "hpke_enc")
	case len(l.GetCiphertext()) == 0 || len(l.GetCiphertext()) > MaxSecretBytes+64:
		return reject(ErrMalformed, "ciphertext")
	case len(l.GetSignature()) != ed25519.SignatureSize:
		return reject(ErrMalformed, "signature")
	}
	return nil
}

// verify runs every check after the shape but the seal, in the documented
// order, and records the lease id in the replay cache last.
func (o *Opener) verify(now time.Time, s Scope, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) error {
	issuer, ok := o.issuers[l.GetIssuerKeyId()]
	if !ok {
		return reject(ErrIssuer, "issuer_key_id %.32q, this node trusts %s", l.GetIssuerKeyId(), strings.Join(o.issuerIDs, ", "))
	}
	if !ed25519.Verify(issuer, signedBytes(CanonicalBinding(b), l), l.GetSignature()) {
		return reject(ErrSignature, "")
	}
	// Signed from here on: the fields are the Edge's own.
	if l.GetRecipientKeyId() != o.keyID || b.GetRecipient() != o.keyID {
		return reject(ErrRecipient, "recipient %s, this node is %s", l.GetRecipientKeyId(), o.keyID)
	}
	if id := b.GetNodeBootId(); id != "" && id != o.bootID {
		return reject(ErrBoot, "node_boot_id %.40q, this node's is %s", id, o.bootID)
	}
	if err := checkScope(s, b); err != nil {
		return err
	}
	issued, expires := l.GetIssuedAtUnixMs(), l.GetExpiresAtUnixMs()
	nowMs, skew := now.UnixMilli(), o.skew.Milliseconds()
	switch {
	case expires <= issued || expires-issued > MaxTTL.Milliseconds():
		return reject(ErrLifetime, "issued %d, expires %d (Unix ms)", issued, expires)
	case nowMs < issued-skew:
		return reject(ErrNotYetValid, "issued %d ms in this node's future (skew allowance %d ms)", issued-nowMs, skew)
	case nowMs > expires+skew:
		return reject(ErrExpired, "expired %d ms ago (skew allowance %d ms)", nowMs-expires, skew)
	}
	if err := o.replay.admit(l.GetLeaseId(), expires+skew, nowMs); err != nil {
		return &Error{Err: err}
	}
	return nil
}

// checkScope compares the binding with the request and the Node's applied
// projection (SPEC C6: no lease for another node, target, revision or
// generation).
func checkScope(s Scope, b *iop.CredentialLeaseBinding) error {
	for _, f := range []struct{ name, got, want string }{
		{"node_id", b.GetNodeId(), s.Node},
		{"provider", b.GetProvider(), s.Provider},
		{"upstream_target", b.GetUpstreamTarget(), s.Target},
		{"profile", b.GetProfile(), s.Profile},
		{"auth_scheme", b.GetAuthScheme(), s.AuthScheme},
	} {
		if f.got != f.want {
			return reject(ErrScope, "%s is %.64q, the request's is %.64q", f.name, f.got, f.want)
		}
	}
	if textproto.CanonicalMIMEHeaderKey(b.GetAuthHeader()) != textproto.CanonicalMIMEHeaderKey(s.AuthHeader) || s.AuthHeader == "" {
		return reject(ErrScope, "auth_header is %.64q, the adapter's is %.64q", b.GetAuthHeader(), s.AuthHeader)
	}
	if b.GetSlot() == "" {
		return reject(ErrScope, "slot is empty")
	}
	if g := b.GetProjectionGeneration(); g < s.Generation {
		return reject(ErrScope, "projection_generation %d is older than this node's %d", g, s.Generation)
	}
	if cur, ok := s.Revisions[b.GetSlot()]; ok && b.GetCredentialRevision() < cur {
		return reject(ErrScope, "credential_revision %d of slot %q is older than the current %d", b.GetCredentialRevision(), b.GetSlot(), cur)
	}
	return nil
}
