// Package keystore is the Edge's key store (docs/keys.md K1): the client
// API keys a team manages with `edge keys`, one JSON file holding, per
// key, its name, the SHA-256 of the key (never the key), its model scope,
// its limits and its dates; and the usage file the Edge writes beside it
// (usage.go).
//
// File format (mode 0600, written atomically by storefile.WriteAtomic;
// writers hold storefile.Lock from Load to Save):
//
//	{"version": 1, "revision": 7, "keys": [
//	  {"name": "team-a", "key_sha256": "<64 hex>", "hint": "iop-…WXYZ",
//	   "models": ["tiny", "qwen3*"], "requests_per_minute": 60,
//	   "tokens_per_minute": 20000, "tokens_per_day": 1000000,
//	   "max_concurrent": 4, "local_only": true, "created_at": "<RFC 3339>",
//	   "expires_at": "<RFC 3339>", "revoked_at": "<RFC 3339>",
//	   "previous_key_sha256": "<64 hex>", "previous_expires_at": "<RFC 3339>"}],
//	 "checksum": "sha256:<64 hex>"}
//
// Limits of 0 (omitted) are no bound; omitted dates are none. The
// checksum is the SHA-256 of the keys array as compact JSON: a file cut
// short, a flipped byte that still parses, or a hand edit is refused, and
// the Edge keeps the store it had (K1). A revoked key stays as an entry
// (so its name is never reused by mistake and `list` shows it).
//
// Keys are "iop-" and 26 characters of crypto/rand base32 (130 bits):
// with that much entropy a plain SHA-256 is enough to store (no slow hash
// is needed against guessing), and it is what api_keys[].key_sha256
// already holds. The package never logs; no key appears in an error.
package keystore

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"time"

	"iop/internal/jsonconfig"
	"iop/internal/storefile"
)

// Errors; test with errors.Is.
var (
	ErrBadStore = errors.New("invalid key store")
	ErrBadName  = errors.New("invalid key name")
	ErrExists   = errors.New("a key of that name exists")
	ErrNoKey    = errors.New("no such key")
	ErrRevoked  = errors.New("key is revoked")
	ErrBadLimit = errors.New("invalid limit")
)

// KeyPrefix starts every key `edge keys` makes.
const KeyPrefix = "iop-"

// MaxGrace bounds how long a rotated key's previous secret stays valid.
const MaxGrace = 30 * 24 * time.Hour

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidName reports whether name can name a key: 1–63 of letters,
// digits, '.', '_', '-', starting with a letter or digit (it is a metric
// label value and a command-line argument).
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Key is one entry of the store.
type Key struct {
	Name string `json:"name"`
	// KeySHA256 is the lowercase hex SHA-256 of the key.
	KeySHA256 string `json:"key_sha256"`
	// Hint is the key's prefix and last four characters, for people.
	Hint string `json:"hint"`
	// Models is the scope (K4): model group names and patterns; empty =
	// every model.
	Models            []string `json:"models,omitempty"`
	RequestsPerMinute int64    `json:"requests_per_minute,omitempty"`
	TokensPerMinute   int64    `json:"tokens_per_minute,omitempty"`
	TokensPerDay      int64    `json:"tokens_per_day,omitempty"`
	MaxConcurrent     int64    `json:"max_concurrent,omitempty"`
	// Weight, Class and MaxClass are the key's place in the queue (Sched,
	// SPEC G1, G4); zero values are the defaults.
	Weight   int    `json:"weight,omitempty"`
	Class    string `json:"class,omitempty"`
	MaxClass string `json:"max_class,omitempty"`
	// LocalOnly: the key's requests never reach an adapter whose location
	// is remote, in its own group or through a fallback (SPEC V3; `edge
	// keys create -local-only`). Omitted when false, so a store written
	// before the member existed keeps its checksum.
	LocalOnly bool      `json:"local_only,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt: the key is refused from this instant on (K3); zero = never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// RevokedAt: the key is refused (K2); zero = not revoked.
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	// PreviousKeySHA256 is the key a rotation replaced, valid until
	// PreviousExpiresAt (a rotation's grace, K3).
	PreviousKeySHA256 string    `json:"previous_key_sha256,omitempty"`
	PreviousExpiresAt time.Time `json:"previous_expires_at,omitzero"`
}

// Status is the key's state at now: "active", "expired" or "revoked".
func (k *Key) Status(now time.Time) string {
	switch {
	case !k.RevokedAt.IsZero():
		return "revoked"
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		return "expired"
	}
	return "active"
}

// Limits are a key's bounds; 0 is no bound.
type Limits struct {
	RequestsPerMinute int64
	TokensPerMinute   int64
	TokensPerDay      int64
	MaxConcurrent     int64
}

// Limits returns k's bounds.
func (k *Key) Limits() Limits {
	return Limits{RequestsPerMinute: k.RequestsPerMinute, TokensPerMinute: k.TokensPerMinute,
		TokensPerDay: k.TokensPerDay, MaxConcurrent: k.MaxConcurrent}
}

// Check returns an ErrBadLimit naming the first negative bound by the
// name given for it in names (flag or JSON member names, in the order
// requests per minute, tokens per minute, tokens per day, max concurrent).
func (l Limits) Check(names [4]string) error {
	for i, v := range [4]int64{l.RequestsPerMinute, l.TokensPerMinute, l.TokensPerDay, l.MaxConcurrent} {
		if v < 0 {
			return fmt.Errorf("%s: %w: must be ≥ 0 (0 = no bound), got %d", names[i], ErrBadLimit, v)
		}
	}
	return nil
}

// jsonLimitNames are the file's names of the four bounds.
var jsonLimitNames = [4]string{"requests_per_minute", "tokens_per_minute", "tokens_per_day", "max_concurrent"}

type file struct {
	Version  int    `json:"version"`
	Revision uint64 `json:"revision"`
	Keys     []Key  `json:"keys"`
	Checksum string `json:"checksum"`
}

// Store is a loaded key store. It is not safe for concurrent mutation;
// once no longer changed it may be read concurrently.
type Store struct {
	// Revision rises by one with every Save.
	Revision uint64
	keys     map[string]*Key
}

// New returns an empty store.
func New() *Store { return &Store{keys: map[string]*Key{}} }

// Hash is the lowercase hex SHA-256 of key, as the store keeps it.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// NewSecret returns a fresh key: KeyPrefix and 26 characters of
// crypto/rand base32 (rand.Text, 130 bits).
func NewSecret() string { return KeyPrefix + rand.Text() }

// hint is what Key.Hint holds for key: the prefix and its last four
// characters, e.g. "iop-…WXYZ".
func hint(key string) string {
	if len(key) < len(KeyPrefix)+8 {
		return KeyPrefix + "…"
	}
	return KeyPrefix + "…" + key[len(key)-4:]
}

// Load reads and checks the store file at path. A missing file is an
// fs.ErrNotExist error; any other problem is ErrBadStore naming it.
func Load(path string) (*Store, error) {
	b, _, err := storefile.Read(path, storefile.MaxRead) // a FIFO, a device or a huge file refused (K1)
	if err != nil {
		return nil, fmt.Errorf("key store: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("key store %s: %w", path, err)
	}
	return s, nil
}

// LoadOrNew is Load, or an empty store when path does not exist.
func LoadOrNew(path string) (*Store, error) {
	s, err := Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return New(), nil
	}
	return s, err
}

// Parse decodes and checks a store file's bytes strictly: unknown members
// and every invalid value are reported at once, each naming its path
// (keys[3].tokens_per_day: …), wrapped in ErrBadStore.
func Parse(b []byte) (*Store, error) {
	var f file
	var errs jsonconfig.Errors
	// encoding/json's strict decoder is several times faster than
	// jsonconfig's walk on a large store (BENCHMARKS.md, key store);
	// only a file it refuses is walked again for every problem's path.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil || dec.More() {
		f = file{}
		derrs, usable := jsonconfig.Decode(b, &f)
		if !usable || len(derrs) > 0 {
			return nil, fmt.Errorf("%w:\n%w", ErrBadStore, derrs)
		}
		if err == nil {
			err = errors.New("trailing data after the top-level JSON value")
		}
		return nil, fmt.Errorf("%w: %v", ErrBadStore, err) // what only encoding/json refuses
	}
	add := func(path, format string, args ...any) { errs = append(errs, path+": "+fmt.Sprintf(format, args...)) }
	if f.Version != 1 {
		add("version", "want 1, got %d", f.Version)
	}
	s := New()
	s.Revision = f.Revision
	hashes := map[string]string{}
	for i := range f.Keys {
		k := &f.Keys[i]
		p := fmt.Sprintf("keys[%d]", i)
		if !ValidName(k.Name) {
			add(p+".name", "invalid key name %q (1-63 of letters, digits, '.', '_', '-')", k.Name)
		} else if s.keys[k.Name] != nil {
			add(p+".name", "key %q twice", k.Name)
		}
		for _, h := range []struct{ path, v string }{{".key_sha256", k.KeySHA256}, {".previous_key_sha256", k.PreviousKeySHA256}} {
			if h.v == "" && h.path == ".previous_key_sha256" {
				continue
			}
			if !validHash(h.v) {
				add(p+h.path, "want 64 lowercase hex characters (SHA-256 of the key)")
			} else if other, dup := hashes[h.v]; dup {
				add(p+h.path, "the same key is also %s", other)
			} else {
				hashes[h.v] = k.Name
			}
		}
		if k.PreviousKeySHA256 == "" && !k.PreviousExpiresAt.IsZero() {
			add(p+".previous_expires_at", "set without previous_key_sha256")
		}
		if k.PreviousKeySHA256 != "" && k.PreviousExpiresAt.IsZero() {
			add(p+".previous_expires_at", "required with previous_key_sha256")
		}
		for j, m := range k.Models {
			if err := ValidatePattern(m); err != nil {
				add(fmt.Sprintf("%s.models[%d]", p, j), "%v", err)
			}
		}
		for j, v := range [4]int64{k.RequestsPerMinute, k.TokensPerMinute, k.TokensPerDay, k.MaxConcurrent} {
			if v < 0 {
				add(p+"."+jsonLimitNames[j], "must be ≥ 0 (0 = no bound), got %d", v)
			}
		}
		if err := k.Sched().Check([3]string{p + ".weight", p + ".class", p + ".max_class"}); err != nil {
			errs = append(errs, err.Error())
		}
		if k.CreatedAt.IsZero() {
			add(p+".created_at", "required")
		}
		if ValidName(k.Name) && s.keys[k.Name] == nil {
			s.keys[k.Name] = k
		}
	}
	if len(errs) == 0 {
		if want := checksum(f.Keys); f.Checksum != want {
			add("checksum", "does not match the keys (the file was cut short, corrupted or edited by hand; `edge keys` writes it)")
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w:\n%w", ErrBadStore, errs)
	}
	return s, nil
}

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// checksum is the file's "checksum" member for keys.
func checksum(keys []Key) string {
	if keys == nil {
		keys = []Key{}
	}
	b, _ := json.Marshal(keys)
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Lock takes the store's writer lock (storefile.Lock on path + ".lock")
// and returns its release: `edge keys` holds it from Load to Save so that
// concurrent commands lose nothing (K1). The Edge reads without it.
func Lock(path string) (unlock func(), err error) {
	unlock, err = storefile.Lock(path)
	if err != nil {
		return nil, fmt.Errorf("key store %w", err)
	}
	return unlock, nil
}

// Update is one writer's change of the store at path (K1): under the
// lock, the store is read (an empty one when the file does not exist),
// changed by change and saved; nothing is written when change or the read
// fails. `edge keys` makes every change through it.
func Update(path string, change func(*Store) error) error {
	unlock, err := Lock(path)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := LoadOrNew(path)
	if err != nil {
		return err
	}
	if err := change(st); err != nil {
		return err
	}
	return st.Save(path)
}

// Save writes the store to path atomically (storefile.WriteAtomic, mode
// 0600) with the next revision and a fresh checksum, keys sorted by name.
func (s *Store) Save(path string) error {
	f := file{Version: 1, Revision: s.Revision + 1, Keys: s.Keys()}
	f.Checksum = checksum(f.Keys)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(f); err != nil {
		return fmt.Errorf("key store: %w", err)
	}
	if err := storefile.WriteAtomic(path, ".keys-*.tmp", buf.Bytes()); err != nil {
		return fmt.Errorf("key store: %w", err)
	}
	s.Revision = f.Revision
	return nil
}

// Keys lists every key (revoked ones too) by name; the slice is the
// caller's, its Models shared with the store.
func (s *Store) Keys() []Key {
	names := make([]string, 0, len(s.keys))
	for n := range s.keys {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]Key, 0, len(names))
	for _, n := range names {
		out = append(out, *s.keys[n])
	}
	return out
}

// Len is the number of keys, revoked ones included.
func (s *Store) Len() int { return len(s.keys) }

// Key returns the key named name.
func (s *Store) Key(name string) (Key, bool) {
	k := s.keys[name]
	if k == nil {
		return Key{}, false
	}
	return *k, true
}

// Spec is what `edge keys create` asks for.
type Spec struct {
	Name   string
	Models []string // checked by ValidatePattern, at most MaxScopeEntries; empty = every model
	Limits Limits
	// ExpiresAt: zero = never; else after now.
	ExpiresAt time.Time
	// Sched is the key's place in the queue (SPEC G1, G4).
	Sched Sched
	// LocalOnly keeps the key's requests off remote adapters (SPEC V3).
	LocalOnly bool
}

// Create adds a key for spec and returns it: the only time it exists
// outside the client's hands (the store keeps its hash). Errors:
// ErrBadName, ErrExists (a live or revoked key has the name), ErrBadPattern,
// ErrScopeTooLarge, ErrBadLimit, and an expiry not after now.
func (s *Store) Create(spec Spec, now time.Time) (string, error) {
	if !ValidName(spec.Name) {
		return "", fmt.Errorf("%w %q (1-63 of letters, digits, '.', '_', '-')", ErrBadName, spec.Name)
	}
	if old := s.keys[spec.Name]; old != nil {
		if !old.RevokedAt.IsZero() {
			return "", fmt.Errorf("%w: %q (revoked %s; a name is never reused, pick another)", ErrExists, spec.Name, old.RevokedAt.Format(time.RFC3339))
		}
		return "", fmt.Errorf("%w: %q (`edge keys rotate` issues it a new secret)", ErrExists, spec.Name)
	}
	if err := checkScopeSize(len(spec.Models)); err != nil {
		return "", err
	}
	for _, m := range spec.Models {
		if err := ValidatePattern(m); err != nil {
			return "", err
		}
	}
	if err := spec.Limits.Check(jsonLimitNames); err != nil {
		return "", err
	}
	if err := spec.Sched.Check(jsonSchedNames); err != nil {
		return "", err
	}
	if !spec.ExpiresAt.IsZero() && !spec.ExpiresAt.After(now) {
		return "", fmt.Errorf("expiry %s is not after now", spec.ExpiresAt.Format(time.RFC3339))
	}
	secret := NewSecret()
	k := &Key{Name: spec.Name, KeySHA256: Hash(secret), Hint: hint(secret), Models: append([]string(nil), spec.Models...),
		RequestsPerMinute: spec.Limits.RequestsPerMinute, TokensPerMinute: spec.Limits.TokensPerMinute,
		TokensPerDay: spec.Limits.TokensPerDay, MaxConcurrent: spec.Limits.MaxConcurrent,
		Weight: spec.Sched.Weight, Class: spec.Sched.Class, MaxClass: spec.Sched.MaxClass, LocalOnly: spec.LocalOnly,
		CreatedAt: now.UTC().Truncate(time.Second)}
	if !spec.ExpiresAt.IsZero() {
		k.ExpiresAt = spec.ExpiresAt.UTC()
	}
	s.keys[k.Name] = k
	return secret, nil
}

// Revoke marks key name revoked at now (K2); its entry stays. Errors:
// ErrNoKey, ErrRevoked.
func (s *Store) Revoke(name string, now time.Time) error {
	k := s.keys[name]
	switch {
	case k == nil:
		return fmt.Errorf("%w %q", ErrNoKey, name)
	case !k.RevokedAt.IsZero():
		return fmt.Errorf("%q: %w (since %s)", name, ErrRevoked, k.RevokedAt.Format(time.RFC3339))
	}
	c := *k
	c.RevokedAt = now.UTC()
	c.PreviousKeySHA256, c.PreviousExpiresAt = "", time.Time{}
	s.keys[name] = &c
	return nil
}

// Rotate gives key name a new secret and returns it (K3). The replaced
// secret stays valid for grace (0 = refused at once, at most MaxGrace);
// a secret an earlier rotation kept is dropped. Scope, limits, expiry and
// usage stay with the name. Errors: ErrNoKey, ErrRevoked, a grace out of
// range.
func (s *Store) Rotate(name string, grace time.Duration, now time.Time) (string, error) {
	k := s.keys[name]
	switch {
	case k == nil:
		return "", fmt.Errorf("%w %q", ErrNoKey, name)
	case !k.RevokedAt.IsZero():
		return "", fmt.Errorf("%q: %w (since %s)", name, ErrRevoked, k.RevokedAt.Format(time.RFC3339))
	case grace < 0 || grace > MaxGrace:
		return "", fmt.Errorf("grace %v: must be between 0 and %v", grace, MaxGrace)
	}
	secret := NewSecret()
	c := *k
	c.PreviousKeySHA256, c.PreviousExpiresAt = "", time.Time{}
	if grace > 0 {
		c.PreviousKeySHA256, c.PreviousExpiresAt = k.KeySHA256, now.UTC().Add(grace)
	}
	c.KeySHA256, c.Hint = Hash(secret), hint(secret)
	s.keys[name] = &c
	return secret, nil
}

// ParseExpiry reads an -expires value at now: a duration of whole days
// ("30d"), a Go duration ("12h", "90m"), a date ("2026-01-31", midnight
// UTC) or an RFC 3339 time. It must lie after now.
func ParseExpiry(s string, now time.Time) (time.Time, error) {
	var t time.Time
	switch {
	case strings.HasSuffix(s, "d") && len(s) > 1 && strings.Trim(s[:len(s)-1], "0123456789") == "":
		var n int
		if _, err := fmt.Sscanf(s, "%dd", &n); err != nil || n > 3650 {
			return time.Time{}, fmt.Errorf("-expires %q: want at most 3650d", s)
		}
		t = now.Add(time.Duration(n) * 24 * time.Hour)
	default:
		if d, err := time.ParseDuration(s); err == nil {
			t = now.Add(d)
		} else if d, err := time.Parse(time.DateOnly, s); err == nil {
			t = d
		} else if d, err := time.Parse(time.RFC3339, s); err == nil {
			t = d
		} else {
			return time.Time{}, fmt.Errorf("-expires %q: want a duration (30d, 12h, 90m), a date (2026-01-31) or an RFC 3339 time", s)
		}
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("-expires %q: must lie in the future", s)
	}
	return t.UTC(), nil
}
