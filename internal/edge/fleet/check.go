package fleet

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"iop/internal/identity"
)

// Refusals of a join, a renewal or a handshake; test with errors.Is. Their
// text reaches the node (NodeJoinResponse.error) and the edge's log; none
// names a token secret.
var (
	// ErrBadToken: no token has that id, or the secret does not match
	// (one error for both: the id is not a secret, but the answer should
	// not help guessing either).
	ErrBadToken = errors.New("invalid join token")
	// ErrTokenExpired: the token's ttl passed.
	ErrTokenExpired = errors.New("join token expired")
	// ErrTokenUsedUp: the token has no uses left (a used token replayed).
	ErrTokenUsedUp = errors.New("join token used up")
	// ErrTokenRevoked: edge tokens revoke revoked it.
	ErrTokenRevoked = errors.New("join token revoked")
	// ErrNameNotAllowed: the token's scope does not allow that node name.
	ErrNameNotAllowed = errors.New("node name not allowed by this join token")
	// ErrNameTaken: a prefix token cannot take over a name that is enrolled
	// and not revoked (a token made for that name with -node can).
	ErrNameTaken = errors.New("node name already enrolled")
	// ErrNodeRevoked: edge nodes revoke revoked the node (SPEC J6).
	ErrNodeRevoked = errors.New("node revoked")
	// ErrNotEnrolled: a renewal from a node that has no enrollment record.
	ErrNotEnrolled = errors.New("node not enrolled")
	// ErrSuperseded: the certificate is not one the store issued to the
	// node last (it renewed twice since, or re-joined).
	ErrSuperseded = errors.New("certificate superseded")
	// ErrRenewTooSoon: a renewal within MinRenewGap of the last one.
	ErrRenewTooSoon = errors.New("certificate renewed too recently")
)

// noToken is the hash a join naming no token is compared to, so that an
// unknown id and a wrong secret cost the same work (SPEC J1: the time of
// the refusal says nothing of which token ids exist).
var noToken = identity.SecretSHA256("no token has this id")

// secretMatches is identity.SecretMatches (a test counts its calls).
var secretMatches = identity.SecretMatches

// CheckJoin decides whether token id with secret may enroll name at now
// (SPEC J1): the token exists and the secret matches, it is not revoked,
// not expired and has uses left, and its scope allows name (the -node name
// exactly, or a name starting with the -prefix; a prefix token never takes
// over a name that is enrolled and not revoked). It changes nothing.
func (s *Store) CheckJoin(id, secret, name string, now time.Time) (*Token, error) {
	t := s.Token(id)
	want := noToken
	if t != nil {
		want = t.SecretSHA256
	}
	if !secretMatches(secret, want) || t == nil { // an unknown id costs the hash a wrong secret costs
		return nil, ErrBadToken
	}
	switch {
	case t.RevokedAt != nil:
		return nil, fmt.Errorf("%w (token %s, at %s)", ErrTokenRevoked, t.ID, t.RevokedAt.UTC().Format(time.RFC3339))
	case !now.Before(t.ExpiresAt):
		return nil, fmt.Errorf("%w (token %s, at %s)", ErrTokenExpired, t.ID, t.ExpiresAt.UTC().Format(time.RFC3339))
	case t.Used >= t.Uses:
		return nil, fmt.Errorf("%w (token %s: %d of %d uses)", ErrTokenUsedUp, t.ID, t.Used, t.Uses)
	case t.Node != "" && name != t.Node:
		return nil, fmt.Errorf("%w: %q (the token is for %q)", ErrNameNotAllowed, name, t.Node)
	case t.Node == "" && !strings.HasPrefix(name, t.Prefix):
		return nil, fmt.Errorf("%w: %q (the token is for names starting with %q)", ErrNameNotAllowed, name, t.Prefix)
	}
	if r := s.Node(name); t.Node == "" && r != nil && r.RevokedAt == nil && len(r.Serials) > 0 {
		return nil, fmt.Errorf("%w: %q (revoke it first, or make a token for it with -node)", ErrNameTaken, name)
	}
	return t, nil
}

// RecordJoin records that token t enrolled name with the certificate
// serial valid until notAfter and the lease recipient key (base64): one
// use of t, and a fresh record for name (any earlier one, revoked or not,
// is replaced).
func (s *Store) RecordJoin(t *Token, name, recipientKey, serial string, notAfter, now time.Time) {
	t.Used++
	t.Joined = append(t.Joined, name)
	r := &NodeRecord{Name: name, LeaseRecipientPublicKey: recipientKey, Serials: []string{serial},
		NotAfter: notAfter, EnrolledAt: now, Token: t.ID}
	for i, old := range s.Nodes {
		if old.Name == name {
			s.Nodes[i] = r
			return
		}
	}
	s.Nodes = append(s.Nodes, r)
}

// MinRenewGap is the shortest time between two renewals of one node, as a
// fraction of the certificate lifetime: a node renews at two thirds of it,
// so a faster one is a broken or hostile node.
func MinRenewGap(ttl time.Duration) time.Duration { return max(ttl/10, 5*time.Second) }

// CheckRenew decides whether name, connected with the certificate of that
// serial, may renew at now (SPEC J5): it is enrolled and not revoked, the
// serial is one the store holds for it, and its last renewal is at least
// MinRenewGap(ttl) ago.
func (s *Store) CheckRenew(name, serial string, ttl time.Duration, now time.Time) error {
	r := s.Node(name)
	switch {
	case r == nil || len(r.Serials) == 0 && r.RevokedAt == nil:
		return fmt.Errorf("%w: %q (it joined no enrollment of this edge)", ErrNotEnrolled, name)
	case r.RevokedAt != nil:
		return fmt.Errorf("%w: %q", ErrNodeRevoked, name)
	case !slices.Contains(r.Serials, serial):
		return fmt.Errorf("%w: %q", ErrSuperseded, name)
	case r.RenewedAt != nil && now.Sub(*r.RenewedAt) < MinRenewGap(ttl):
		return fmt.Errorf("%w: %q at %s", ErrRenewTooSoon, name, r.RenewedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// RecordRenew records name's new certificate: its serial first, then the
// one before it.
func (s *Store) RecordRenew(name, serial string, notAfter, now time.Time) {
	r := s.Node(name)
	r.Serials = append([]string{serial}, r.Serials...)[:min(keptSerials, len(r.Serials)+1)]
	r.NotAfter = notAfter
	r.RenewedAt = &now
}

// RevokeNode revokes name at now (SPEC J6): its certificates are refused
// from then on, enrolled or not (a node of the config file too), until it
// joins again. It reports false when name was already revoked.
func (s *Store) RevokeNode(name string, now time.Time) bool {
	r := s.Node(name)
	if r == nil {
		r = &NodeRecord{Name: name}
		s.Nodes = append(s.Nodes, r)
	}
	if r.RevokedAt != nil {
		return false
	}
	r.RevokedAt = &now
	r.Serials = nil
	return true
}

// RevokeToken revokes token id at now; false when there is none or it
// already was.
func (s *Store) RevokeToken(id string, now time.Time) bool {
	t := s.Token(id)
	if t == nil || t.RevokedAt != nil {
		return false
	}
	t.RevokedAt = &now
	return true
}

// tokenKeep is how long a token that can no longer be used (expired, used
// up or revoked) stays listed.
const tokenKeep = 24 * time.Hour

// Prune drops the tokens unusable for longer than a day.
func (s *Store) Prune(now time.Time) {
	s.Tokens = slices.DeleteFunc(s.Tokens, func(t *Token) bool {
		end := t.ExpiresAt
		if t.RevokedAt != nil && t.RevokedAt.Before(end) {
			end = *t.RevokedAt
		}
		return now.Sub(end) > tokenKeep
	})
}

// State is a token's state at now, for edge tokens list: "active",
// "expired", "used" or "revoked".
func (t *Token) State(now time.Time) string {
	switch {
	case t.RevokedAt != nil:
		return "revoked"
	case t.Used >= t.Uses:
		return "used"
	case !now.Before(t.ExpiresAt):
		return "expired"
	}
	return "active"
}

// Scope describes what names the token allows.
func (t *Token) Scope() string {
	if t.Node != "" {
		return "node " + t.Node
	}
	if t.Prefix == "" {
		return "any name"
	}
	return "prefix " + t.Prefix
}
