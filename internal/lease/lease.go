// Package lease is the credential lease of the managed credential plane
// (SPEC C1–C6): the Edge seals one request's worth of an upstream secret to
// the selected Node and signs it (Issuer), and the Node verifies and opens
// it right before its provider call (Opener).
//
// Wire format (proto CredentialLease, CredentialLeaseBinding):
//   - Seal: HPKE base mode (RFC 9180) with DHKEM(X25519, HKDF-SHA256),
//     HKDF-SHA256 and AES-256-GCM to the Node's X25519 recipient key,
//     info "iop credential lease v1", and as associated data the canonical
//     binding bytes (CanonicalBinding) followed by the lease header (lease
//     id, issue and expiry times, issuer and recipient key ids). A
//     ciphertext moved to another binding or lease does not open.
//   - Sign: Ed25519 (RFC 8032) by the Edge's issuer key over the domain
//     string "iop credential lease signature v1", the canonical binding,
//     the lease header, the HPKE encapsulated key and the ciphertext.
//   - Key ids: the first 8 bytes of SHA-256 of the raw public key, in hex.
//
// Verification (Opener.Open) is a pure function of its inputs and the
// replay cache: time comes in as an argument. It checks, in this order,
// presence, shape, issuer key and signature, recipient, that the binding
// matches this request and this Node's applied projection (node, provider,
// target, profile, auth header, credential revision, projection
// generation), lifetime and expiry with DefaultSkew, and replay; only then
// does it open the seal. Every rejection is an *Error wrapping one of the
// sentinels below.
//
// The package never logs, never keeps a plaintext after returning it, and
// never puts a secret, a ciphertext or a private key into an error message.
// Goroutines: Opener.Open runs its HPKE decapsulation on a goroutine that
// has ended when Open returns; Recipient.Precompute's refill goroutine
// exits once its store of prepared encapsulations is full.
package lease

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	iop "iop/proto/gen/iop"
)

// Defaults (docs/operating.md, "The credential plane").
const (
	// DefaultTTL is a lease's lifetime from issue to expiry.
	DefaultTTL = 60 * time.Second
	// MaxTTL is the longest lifetime an Issuer grants or an Opener accepts.
	MaxTTL = 5 * time.Minute
	// DefaultSkew is the clock skew tolerated between Edge and Node, on
	// both the issue and the expiry side.
	DefaultSkew = 5 * time.Second
	// DefaultReplayCapacity bounds the replay cache: 1,000 leases/s for a
	// 60 s TTL plus skew fit twice over.
	DefaultReplayCapacity = 1 << 17
	// MaxSecretBytes bounds one sealed secret.
	MaxSecretBytes = 16 << 10
)

// Errors, wrapped in *Error; test with errors.Is.
var (
	// ErrMissing: the credential plane is on and the request carries
	// neither lease nor binding (SPEC C4).
	ErrMissing = errors.New("credential lease required")
	// ErrHalfPresent: a lease without a binding or a binding without a
	// lease (SPEC C4: an inseparable pair).
	ErrHalfPresent = errors.New("credential lease and binding must travel together")
	// ErrPlaneOff: the credential plane is off but the request carries a
	// lease (a configuration mismatch between Edge and Node; SPEC C4).
	ErrPlaneOff = errors.New("the credential plane is off but the request carries a credential lease")
	// ErrMalformed: a field is missing or out of shape.
	ErrMalformed = errors.New("malformed credential lease")
	// ErrIssuer: the lease names an issuer key this Node does not trust.
	ErrIssuer = errors.New("credential lease from an unknown issuer key")
	// ErrSignature: the Ed25519 signature does not verify.
	ErrSignature = errors.New("credential lease signature invalid")
	// ErrRecipient: the lease is sealed to another recipient key.
	ErrRecipient = errors.New("credential lease sealed to another recipient")
	// ErrBoot: the lease is bound to another boot of this Node: it was
	// issued before the Node restarted (Opener.BootID).
	ErrBoot = errors.New("credential lease issued before this node restarted")
	// ErrScope: the binding names another node, provider, target, profile
	// or auth header than this request, or an older credential revision or
	// projection generation than this Node applied (SPEC C6).
	ErrScope = errors.New("credential lease binding does not match the request")
	// ErrLifetime: expiry not after issue, or a lifetime above MaxTTL.
	ErrLifetime = errors.New("credential lease lifetime invalid")
	// ErrNotYetValid: issued more than the skew in this Node's future.
	ErrNotYetValid = errors.New("credential lease not yet valid")
	// ErrExpired: expired more than the skew ago.
	ErrExpired = errors.New("credential lease expired")
	// ErrReplayed: the lease id was already used (SPEC C3).
	ErrReplayed = errors.New("credential lease already used")
	// ErrReplayFull: the replay cache holds its capacity of unexpired
	// leases; the lease is refused rather than let in unchecked.
	ErrReplayFull = errors.New("credential lease replay cache full")
	// ErrOpen: the seal does not open (tampered ciphertext or associated
	// data, or a wrong key).
	ErrOpen = errors.New("credential lease does not open")
)

// Error is a rejected lease: the check that failed (Err, one of the
// sentinels) and a detail naming the field, never secret material.
type Error struct {
	Err    error
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Err.Error()
	}
	return e.Err.Error() + ": " + e.Detail
}

func (e *Error) Unwrap() error { return e.Err }

func reject(err error, format string, args ...any) *Error {
	return &Error{Err: err, Detail: fmt.Sprintf(format, args...)}
}

// Required reports whether err means the lease was absent altogether
// (ErrMissing), as opposed to present and invalid; the Node reports the two
// with different failure codes.
func Required(err error) bool { return errors.Is(err, ErrMissing) }

// CheckPresence applies SPEC C4's presence rules before anything is
// verified: lease and binding travel together; with the plane on they are
// required, with it off they are refused. It returns nil when the pair is
// present and the plane is on (verify next) or both are absent and the
// plane is off (serve without a lease).
func CheckPresence(planeOn bool, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) error {
	switch {
	case (l == nil) != (b == nil):
		if l == nil {
			return reject(ErrHalfPresent, "binding without lease")
		}
		return reject(ErrHalfPresent, "lease without binding")
	case planeOn && l == nil:
		return &Error{Err: ErrMissing, Detail: "the credential plane is on and the request carries no lease"}
	case !planeOn && l != nil:
		return &Error{Err: ErrPlaneOff}
	}
	return nil
}

// ErrNotHeaderValue: a secret that cannot travel as an HTTP header value
// unchanged (CheckHeaderValue).
var ErrNotHeaderValue = errors.New("not usable as an HTTP header value")

// CheckHeaderValue reports whether secret can be an upstream credential:
// the Node sends it as (the end of) one HTTP header field value, so it
// must hold no control character (below 0x20, or 0x7F: CR and LF would
// split the header, NUL, TAB and the others are refused or kept by servers
// differently) and must not begin or end with a space, which HTTP parsers
// strip from a field value (RFC 9110 §5.5), so the upstream would see
// another key. Bytes from 0x80 up (obs-text) pass. The error wraps
// ErrNotHeaderValue and names the offset, never the secret's bytes.
func CheckHeaderValue(secret []byte) error {
	for i, c := range secret {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: a control character at byte offset %d", ErrNotHeaderValue, i)
		}
	}
	if n := len(secret); n > 0 && (secret[0] == ' ' || secret[n-1] == ' ') {
		return fmt.Errorf("%w: it begins or ends with a space, which HTTP strips from a header value", ErrNotHeaderValue)
	}
	return nil
}

// KeyID is the key id of a raw public key (32 bytes for X25519 and
// Ed25519): the first 8 bytes of its SHA-256, as 16 lowercase hex digits.
func KeyID(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:8])
}

// Domain strings of the seal and the signature.
const (
	hpkeInfo      = "iop credential lease v1"
	bindingDomain = "iop credential lease binding v1"
	sigDomain     = "iop credential lease signature v1"
)

// CanonicalBinding returns the canonical bytes of b that the seal and the
// signature cover: the domain string "iop credential lease binding v1",
// then every field in field-number order, strings as a 4-byte big-endian
// length and their bytes, integers as 8 bytes big-endian. Two bindings
// have the same canonical bytes exactly when all their fields are equal;
// unlike a protobuf encoding it depends on no library or field order.
func CanonicalBinding(b *iop.CredentialLeaseBinding) []byte {
	out := make([]byte, 0, 256)
	out = appendString(out, bindingDomain)
	for _, s := range []string{b.GetPrincipal(), b.GetSlot(), b.GetRoute(), b.GetProfile(), b.GetUpstreamTarget(),
		b.GetNodeId(), b.GetRecipient()} {
		out = appendString(out, s)
	}
	out = binary.BigEndian.AppendUint64(out, b.GetCredentialRevision())
	out = binary.BigEndian.AppendUint64(out, b.GetRouteRevision())
	out = binary.BigEndian.AppendUint64(out, b.GetProjectionGeneration())
	out = appendString(out, b.GetAuthHeader())
	out = appendString(out, b.GetAuthScheme())
	out = appendString(out, b.GetProvider())
	if id := b.GetNodeBootId(); id != "" {
		// Appended only when set, so a binding without it encodes as it
		// always did and a Node that predates the field still verifies it.
		out = appendString(out, id)
	}
	return out
}

// header appends the lease's own fields that the seal binds: id, times and
// key ids.
func header(out []byte, l *iop.CredentialLease) []byte {
	out = appendString(out, l.GetLeaseId())
	out = binary.BigEndian.AppendUint64(out, uint64(l.GetIssuedAtUnixMs()))
	out = binary.BigEndian.AppendUint64(out, uint64(l.GetExpiresAtUnixMs()))
	out = appendString(out, l.GetIssuerKeyId())
	out = appendString(out, l.GetRecipientKeyId())
	return out
}

// sealAAD is the HPKE associated data: canonical binding, lease header.
func sealAAD(canon []byte, l *iop.CredentialLease) []byte {
	return header(append(make([]byte, 0, len(canon)+96), canon...), l)
}

// signedBytes is what the issuer signs.
func signedBytes(canon []byte, l *iop.CredentialLease) []byte {
	out := make([]byte, 0, len(sigDomain)+len(canon)+128+len(l.GetHpkeEnc())+len(l.GetCiphertext()))
	out = appendString(out, sigDomain)
	out = append(out, canon...)
	out = header(out, l)
	out = appendBytes(out, l.GetHpkeEnc())
	out = appendBytes(out, l.GetCiphertext())
	return out
}

func appendString(out []byte, s string) []byte {
	out = binary.BigEndian.AppendUint32(out, uint32(len(s)))
	return append(out, s...)
}

func appendBytes(out, b []byte) []byte {
	out = binary.BigEndian.AppendUint32(out, uint32(len(b)))
	return append(out, b...)
}
