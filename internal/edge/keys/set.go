package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keystore"
	"iop/internal/edge/limit"
)

// Sources of a principal.
const (
	SourceConfig = "config" // api_keys[] of the Edge config
	SourceStore  = "store"  // the key store (`edge keys`)
)

// ErrConflict: the config's api_keys and the key store name the same
// principal or hold the same key (docs/keys.md K1).
var ErrConflict = errors.New("api_keys and the key store conflict")

// Principal is one client: an api_keys[] entry or a key of the store. It
// is immutable once built; a reload builds new ones.
type Principal struct {
	Name   string
	Source string // SourceConfig or SourceStore
	// Models is the scope (K4): names and patterns; empty = every model.
	Models []string
	exact  map[string]bool
	globs  []string
	// Configured are the bounds as configured; Limits what this Edge
	// enforces, Configured divided by keys.edge_count (K8).
	Configured keystore.Limits
	Limits     keystore.Limits
	ExpiresAt  time.Time // zero = never (K3)
	RevokedAt  time.Time // zero = not revoked (K2)
	Hint       string    // the key's hint (store keys), for people
	CreatedAt  time.Time
	// Sched is the key's place in the queue, defaults filled in: weight,
	// default class and highest class (SPEC G1, G4).
	Sched keystore.Sched
	// LocalOnly: the key's requests never reach a remote adapter (SPEC
	// V3; api_keys[].local_only, a store key's local_only).
	LocalOnly bool

	c *counters // set by Registry.Swap before the set is current
	// text holds Limits' requests per minute, tokens per minute and per
	// day as header values, formatted once.
	text [3]string
}

// Allows reports whether the principal may call model (K4): every model
// without a scope, else a listed name or a matching pattern.
func (p *Principal) Allows(model string) bool {
	if len(p.Models) == 0 || p.exact[model] {
		return true
	}
	for _, g := range p.globs {
		if keystore.Match(g, model) {
			return true
		}
	}
	return false
}

// Scoped reports whether the principal has a model scope.
func (p *Principal) Scoped() bool { return len(p.Models) > 0 }

// FilterModels returns the names p may call, in their order (the
// /v1/models list, K4); names itself when p has no scope.
func (p *Principal) FilterModels(names []string) []string {
	if !p.Scoped() {
		return names
	}
	var out []string
	for _, n := range names {
		if p.Allows(n) {
			out = append(out, n)
		}
	}
	return out
}

func (p *Principal) keyLimit() limit.KeyLimit {
	return limit.KeyLimit{MaxConcurrent: clampInt(p.Limits.MaxConcurrent), RequestsPerMinute: clampInt(p.Limits.RequestsPerMinute)}
}

func (p *Principal) tokenLimit() limit.TokenLimit {
	return limit.TokenLimit{PerMinute: p.Limits.TokensPerMinute, PerDay: p.Limits.TokensPerDay}
}

func clampInt(v int64) int { return int(min(v, math.MaxInt32)) }

// credential is one accepted key: its principal, and for a rotation's
// previous key the end of its grace.
type credential struct {
	p          *Principal
	graceUntil time.Time // zero: the principal's current key
}

// Set is one generation of keys: the config's api_keys and the key
// store, indexed by the SHA-256 of the key. Immutable; Build makes one.
type Set struct {
	byHash map[[sha256.Size]byte]credential
	byName map[string]*Principal
	names  []string // sorted
	// store is whether a key store is configured: then the Edge is never
	// open, even with no key yet.
	store    bool
	revision uint64 // the store's revision
}

// Len is the number of principals (revoked store keys included).
func (s *Set) Len() int { return len(s.names) }

// Revision is the key store's revision (0 without one).
func (s *Set) Revision() uint64 { return s.revision }

// Principal returns the principal named name, or nil.
func (s *Set) Principal(name string) *Principal { return s.byName[name] }

// Names lists the principals by name.
func (s *Set) Names() []string { return s.names }

// Open reports whether no key is configured and no key store either:
// every request is then admitted without a principal.
func (s *Set) Open() bool { return len(s.byHash) == 0 && !s.store }

// Build indexes the config's api_keys and, when st is not nil, the key
// store's keys (hasStore: a key store is configured, even if st holds no
// key yet), every bound divided by edgeCount (≥ 1; K8). Errors: a store
// key named like an api_keys principal, or the same key in both
// (ErrConflict, naming both). A config that went through config.Parse has
// valid api_keys; an entry with an invalid hash is skipped.
func Build(apiKeys []config.APIKey, st *keystore.Store, hasStore bool, edgeCount int) (*Set, error) {
	edgeCount = max(edgeCount, 1)
	s := &Set{byHash: map[[sha256.Size]byte]credential{}, byName: map[string]*Principal{}, store: hasStore || st != nil}
	add := func(hexSum string, c credential) bool {
		var sum [sha256.Size]byte
		if n, err := hex.Decode(sum[:], []byte(hexSum)); err != nil || n != sha256.Size {
			return true
		}
		if _, dup := s.byHash[sum]; dup {
			return false
		}
		s.byHash[sum] = c
		return true
	}
	for i, k := range apiKeys {
		l := keystore.Limits{MaxConcurrent: int64(k.MaxConcurrent), RequestsPerMinute: int64(k.RequestsPerMinute)}
		p := &Principal{Name: k.Principal, Source: SourceConfig, Configured: l, Limits: divide(l, edgeCount), Sched: k.Sched(), LocalOnly: k.LocalOnly}
		s.byName[p.Name] = p
		if !add(k.KeySHA256, credential{p: p}) {
			return nil, fmt.Errorf("%w: api_keys[%d] holds a key configured twice", ErrConflict, i)
		}
	}
	if st != nil {
		s.revision = st.Revision
		for _, k := range st.Keys() {
			if other := s.byName[k.Name]; other != nil {
				return nil, fmt.Errorf("%w: key store key %q is also an api_keys principal (rename one)", ErrConflict, k.Name)
			}
			p := &Principal{Name: k.Name, Source: SourceStore, Models: k.Models, Configured: k.Limits(),
				Limits: divide(k.Limits(), edgeCount), ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt, Hint: k.Hint, CreatedAt: k.CreatedAt,
				Sched: k.Sched().Effective(), LocalOnly: k.LocalOnly}
			for _, m := range k.Models {
				if keystore.IsPattern(m) {
					p.globs = append(p.globs, m)
				} else {
					if p.exact == nil {
						p.exact = map[string]bool{}
					}
					p.exact[m] = true
				}
			}
			s.byName[p.Name] = p
			if !add(k.KeySHA256, credential{p: p}) {
				return nil, fmt.Errorf("%w: key store key %q is also configured in api_keys", ErrConflict, k.Name)
			}
			if k.PreviousKeySHA256 != "" && !add(k.PreviousKeySHA256, credential{p: p, graceUntil: k.PreviousExpiresAt}) {
				return nil, fmt.Errorf("%w: key store key %q's previous key is also configured in api_keys", ErrConflict, k.Name)
			}
		}
	}
	for n, p := range s.byName {
		s.names = append(s.names, n)
		for i, v := range [3]int64{p.Limits.RequestsPerMinute, p.Limits.TokensPerMinute, p.Limits.TokensPerDay} {
			p.text[i] = strconv.FormatInt(v, 10)
		}
	}
	sort.Strings(s.names)
	return s, nil
}

// divide is what one of n Edges enforces of l (K8): each bound divided by
// n, rounded up, so that a bound never becomes 0 (no bound).
func divide(l keystore.Limits, n int) keystore.Limits {
	if n <= 1 {
		return l
	}
	d := func(v int64) int64 {
		if v <= 0 {
			return v
		}
		return (v + int64(n) - 1) / int64(n)
	}
	return keystore.Limits{RequestsPerMinute: d(l.RequestsPerMinute), TokensPerMinute: d(l.TokensPerMinute),
		TokensPerDay: d(l.TokensPerDay), MaxConcurrent: d(l.MaxConcurrent)}
}
