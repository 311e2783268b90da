package fleet

import (
	"errors"
	"testing"
	"time"

	"iop/internal/identity"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func tokenFor(id, secret string) *Token {
	return &Token{ID: id, SecretSHA256: identity.SecretSHA256(secret), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), Uses: 1}
}

// J1: the join token decision, one row per rule: the secret, revocation,
// expiry, uses (a used token replayed), the -node and -prefix scopes and
// a prefix token's attempt to take over an enrolled name.
func TestCheckJoin(t *testing.T) {
	revokedAt := t0.Add(-time.Minute)
	for _, tt := range []struct {
		name   string
		tok    func(*Token)
		nodes  []*NodeRecord
		secret string
		node   string
		at     time.Time
		want   error
	}{
		{name: "J1 a fresh token for its node", node: "gpu-3"},
		{name: "J1 unknown id", node: "gpu-3", tok: func(t *Token) { t.ID = "other" }, want: ErrBadToken},
		{name: "J1 wrong secret", node: "gpu-3", secret: "guess", want: ErrBadToken},
		{name: "J1 revoked", node: "gpu-3", tok: func(t *Token) { t.RevokedAt = &revokedAt }, want: ErrTokenRevoked},
		{name: "J1 expired at its expiry", node: "gpu-3", at: t0.Add(time.Hour), want: ErrTokenExpired},
		{name: "J1 a used token replayed", node: "gpu-3", tok: func(t *Token) { t.Used = 1 }, want: ErrTokenUsedUp},
		{name: "J1 second of three uses", node: "gpu-3", tok: func(t *Token) { t.Uses, t.Used = 3, 1 }},
		{name: "J1 -node token, another name", node: "gpu-4", want: ErrNameNotAllowed},
		{name: "J1 -prefix token, a matching name", node: "gpu-7", tok: func(t *Token) { t.Node, t.Prefix = "", "gpu-" }},
		{name: "J1 -prefix token, another name", node: "cpu-7", tok: func(t *Token) { t.Node, t.Prefix = "", "gpu-" }, want: ErrNameNotAllowed},
		{name: "J1 -prefix token cannot take over an enrolled node", node: "gpu-7", tok: func(t *Token) { t.Node, t.Prefix = "", "gpu-" },
			nodes: []*NodeRecord{{Name: "gpu-7", Serials: []string{"1"}}}, want: ErrNameTaken},
		{name: "J1 -prefix token may take a revoked name", node: "gpu-7", tok: func(t *Token) { t.Node, t.Prefix = "", "gpu-" },
			nodes: []*NodeRecord{{Name: "gpu-7", RevokedAt: &revokedAt}}},
		{name: "J1 -node token re-enrolls its node", node: "gpu-3", nodes: []*NodeRecord{{Name: "gpu-3", Serials: []string{"1"}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tok := tokenFor("4abcc7fa34f62fd8", "s3cret")
			tok.Node = "gpu-3"
			if tt.tok != nil {
				tt.tok(tok)
			}
			st := &Store{Version: 1, Tokens: []*Token{tok}, Nodes: tt.nodes}
			secret := tt.secret
			if secret == "" {
				secret = "s3cret"
			}
			at := tt.at
			if at.IsZero() {
				at = t0
			}
			got, err := st.CheckJoin("4abcc7fa34f62fd8", secret, tt.node, at)
			if !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if err == nil && got != tok {
				t.Fatal("the granted token is not the stored one")
			}
			if err != nil && (tok.Used > 1 || len(tok.Joined) > 0) {
				t.Error("a refused join changed the token")
			}
		})
	}
}

// J1 J5: a recorded join spends one use and replaces the node's record;
// a renewal keeps the new serial and the one before; a revocation clears
// them until the next join.
func TestRecordJoinRenewRevoke(t *testing.T) {
	tok := tokenFor("a", "s")
	tok.Uses = 2
	st := &Store{Version: 1, Tokens: []*Token{tok}}
	st.RecordJoin(tok, "gpu-3", "key", "s1", t0.Add(time.Hour), t0)
	if tok.Used != 1 || len(st.Nodes) != 1 || st.Nodes[0].Serials[0] != "s1" {
		t.Fatalf("after the join: token %+v, nodes %+v", tok, st.Nodes)
	}
	ttl := 2 * time.Minute
	if err := st.CheckRenew("gpu-3", "s1", ttl, t0.Add(time.Minute)); err != nil {
		t.Fatalf("J5 renewal with the current certificate: %v", err)
	}
	st.RecordRenew("gpu-3", "s2", t0.Add(3*time.Minute), t0.Add(time.Minute))
	st.RecordRenew("gpu-3", "s3", t0.Add(4*time.Minute), t0.Add(2*time.Minute))
	if got := st.Node("gpu-3").Serials; len(got) != 2 || got[0] != "s3" || got[1] != "s2" {
		t.Fatalf("J5 serials after two renewals: %v, want [s3 s2]", got)
	}
	for _, tt := range []struct {
		name, node, serial string
		at                 time.Time
		want               error
	}{
		{"J5 renewed just now", "gpu-3", "s3", t0.Add(2*time.Minute + time.Second), ErrRenewTooSoon},
		{"J5 the previous certificate may renew", "gpu-3", "s2", t0.Add(5 * time.Minute), nil},
		{"J6 a superseded certificate", "gpu-3", "s1", t0.Add(5 * time.Minute), ErrSuperseded},
		{"J5 a node that never joined", "gpu-9", "s1", t0.Add(5 * time.Minute), ErrNotEnrolled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := st.CheckRenew(tt.node, tt.serial, ttl, tt.at); !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
	if !st.RevokeNode("gpu-3", t0.Add(6*time.Minute)) || st.RevokeNode("gpu-3", t0.Add(7*time.Minute)) {
		t.Fatal("J6 RevokeNode: want true once, then false")
	}
	if err := st.CheckRenew("gpu-3", "s3", ttl, t0.Add(8*time.Minute)); !errors.Is(err, ErrNodeRevoked) {
		t.Fatalf("J6 renewal after revocation: got %v", err)
	}
	if !st.RevokeNode("gpu-1", t0) || st.Node("gpu-1").RevokedAt == nil {
		t.Fatal("J6 a node without a record (the config file's) gets a revoked record")
	}
	st.RecordJoin(tok, "gpu-3", "key2", "s4", t0.Add(time.Hour), t0.Add(9*time.Minute))
	if r := st.Node("gpu-3"); r.RevokedAt != nil || r.Serials[0] != "s4" || tok.Used != 2 {
		t.Fatalf("J6 a new join after revocation: %+v", r)
	}
}

// J1: unusable tokens stay listed for a day, then go.
func TestPrune(t *testing.T) {
	live, old, revoked := tokenFor("a", "s"), tokenFor("b", "s"), tokenFor("c", "s")
	old.ExpiresAt = t0.Add(-25 * time.Hour)
	r := t0.Add(-26 * time.Hour)
	revoked.RevokedAt = &r
	st := &Store{Tokens: []*Token{live, old, revoked}}
	st.Prune(t0)
	if len(st.Tokens) != 1 || st.Tokens[0] != live {
		t.Fatalf("after Prune: %d tokens, want only the live one", len(st.Tokens))
	}
	if got := live.State(t0); got != "active" {
		t.Errorf("state %q", got)
	}
}
