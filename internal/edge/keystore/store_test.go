package keystore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC)

// K1: a store saved and loaded again holds the same keys, hashes only.
func TestStoreRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	s := New()
	secret, err := s.Create(Spec{Name: "team-a", Models: []string{"tiny", "qwen3*"},
		Limits:    Limits{RequestsPerMinute: 60, TokensPerMinute: 1000, TokensPerDay: 50000, MaxConcurrent: 2},
		ExpiresAt: t0.Add(time.Hour)}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, KeyPrefix) || len(secret) != len(KeyPrefix)+26 {
		t.Fatalf("secret %q: want %s + 26 characters", secret, KeyPrefix)
	}
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if bytes.Contains(raw, []byte(secret)) || bytes.Contains(raw, []byte(secret[len(KeyPrefix):len(KeyPrefix)+8])) {
		t.Fatal("K1: the store file holds the key or a part of it beyond the hint")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	k, ok := got.Key("team-a")
	if !ok || k.KeySHA256 != Hash(secret) || k.Hint != "iop-…"+secret[len(secret)-4:] || len(k.Models) != 2 ||
		k.Limits() != (Limits{60, 1000, 50000, 2}) || !k.ExpiresAt.Equal(t0.Add(time.Hour)) || got.Revision != 1 {
		t.Fatalf("loaded %+v revision %d", k, got.Revision)
	}
	if err := got.Save(path); err != nil {
		t.Fatal(err)
	}
	if again, _ := Load(path); again.Revision != 2 {
		t.Fatalf("revision after a second save %d, want 2", again.Revision)
	}
}

// K1, K9: a malformed or corrupted store is refused, naming what is wrong.
func TestParseRefuses(t *testing.T) {
	s := New()
	if _, err := s.Create(Spec{Name: "a"}, t0); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "k.json")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	hashOf := func() string { k, _ := s.Key("a"); return k.KeySHA256 }
	rows := []struct {
		name, file, want string
	}{
		{"not JSON", `{"version":1,`, "invalid JSON"},
		{"cut short", string(good[:len(good)/2]), "invalid JSON"},
		{"a flipped byte that still parses", strings.Replace(string(good), hashOf()[:8], "00000000", 1), "checksum: does not match"},
		{"edited by hand", strings.Replace(string(good), `"name": "a"`, `"name": "b"`, 1), "checksum"},
		{"unknown member", `{"version":1,"keys":[{"name":"a","kee_sha256":"x"}]}`, "keys[0].kee_sha256: unknown field"},
		{"version", `{"version":2,"keys":[],"checksum":"sha256:x"}`, "version: want 1"},
		{"bad name", `{"version":1,"keys":[{"name":"a b","key_sha256":"` + hashOf() + `","created_at":"2026-01-01T00:00:00Z"}]}`, `keys[0].name: invalid key name "a b"`},
		{"bad hash", `{"version":1,"keys":[{"name":"a","key_sha256":"ABC","created_at":"2026-01-01T00:00:00Z"}]}`, "keys[0].key_sha256: want 64 lowercase hex"},
		{"same key twice", `{"version":1,"keys":[{"name":"a","key_sha256":"` + hashOf() + `","created_at":"2026-01-01T00:00:00Z"},{"name":"b","key_sha256":"` + hashOf() + `","created_at":"2026-01-01T00:00:00Z"}]}`, `keys[1].key_sha256: the same key is also a`},
		{"bad pattern", `{"version":1,"keys":[{"name":"a","key_sha256":"` + hashOf() + `","models":["qw[en"],"created_at":"2026-01-01T00:00:00Z"}]}`, `keys[0].models[0]: bad model pattern "qw[en"`},
		{"negative limit", `{"version":1,"keys":[{"name":"a","key_sha256":"` + hashOf() + `","tokens_per_day":-1,"created_at":"2026-01-01T00:00:00Z"}]}`, "keys[0].tokens_per_day: must be ≥ 0"},
		{"a bad time", `{"version":1,"keys":[{"name":"a","key_sha256":"` + hashOf() + `","created_at":"yesterday"}]}`, "yesterday"},
		{"a type mismatch", `{"version":1,"keys":[{"name":"a","max_concurrent":"4"}]}`, "keys[0].max_concurrent: want an integer"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, err := Parse([]byte(row.file))
			if !errors.Is(err, ErrBadStore) || !strings.Contains(err.Error(), row.want) {
				t.Fatalf("got %v, want ErrBadStore naming %q", err, row.want)
			}
			if strings.Contains(err.Error(), "config") {
				t.Fatalf("a key store's error calls it a config: %v", err)
			}
		})
	}
	if _, err := Parse(good); err != nil {
		t.Fatalf("the file Save wrote: %v", err)
	}
}

// K3, K9: create, revoke and rotate refuse what they must and keep what
// they must.
func TestCreateRevokeRotate(t *testing.T) {
	s := New()
	first, err := s.Create(Spec{Name: "a", Models: []string{"tiny"}, Limits: Limits{TokensPerDay: 10}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		name string
		spec Spec
		want error
	}{
		{"exists", Spec{Name: "a"}, ErrExists},
		{"bad name", Spec{Name: "-a"}, ErrBadName},
		{"bad pattern", Spec{Name: "b", Models: []string{"a b"}}, ErrBadPattern},
		{"negative limit", Spec{Name: "b", Limits: Limits{TokensPerMinute: -1}}, ErrBadLimit},
	} {
		if _, err := s.Create(row.spec, t0); !errors.Is(err, row.want) {
			t.Errorf("create %s: got %v, want %v", row.name, err, row.want)
		}
	}
	if _, err := s.Create(Spec{Name: "b", ExpiresAt: t0}, t0); err == nil {
		t.Error("create with an expiry of now: got nil error")
	}
	second, err := s.Rotate("a", time.Hour, t0)
	if err != nil || second == first {
		t.Fatalf("rotate: %v", err)
	}
	k, _ := s.Key("a")
	if k.KeySHA256 != Hash(second) || k.PreviousKeySHA256 != Hash(first) || !k.PreviousExpiresAt.Equal(t0.Add(time.Hour)) ||
		k.Models[0] != "tiny" || k.TokensPerDay != 10 {
		t.Fatalf("after rotate: %+v", k)
	}
	third, _ := s.Rotate("a", 0, t0)
	if k, _ = s.Key("a"); k.KeySHA256 != Hash(third) || k.PreviousKeySHA256 != "" {
		t.Fatalf("rotate without grace keeps a previous key: %+v", k)
	}
	if _, err := s.Rotate("a", MaxGrace+time.Second, t0); err == nil {
		t.Error("rotate with a grace over MaxGrace: got nil error")
	}
	if err := s.Revoke("a", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke("a", t0); !errors.Is(err, ErrRevoked) {
		t.Errorf("revoke twice: got %v", err)
	}
	if _, err := s.Rotate("a", 0, t0); !errors.Is(err, ErrRevoked) {
		t.Errorf("rotate a revoked key: got %v", err)
	}
	if _, err := s.Create(Spec{Name: "a"}, t0); !errors.Is(err, ErrExists) {
		t.Errorf("create over a revoked name: got %v", err)
	}
	if err := s.Revoke("zz", t0); !errors.Is(err, ErrNoKey) {
		t.Errorf("revoke an unknown key: got %v", err)
	}
	if k, _ = s.Key("a"); k.Status(t0) != "revoked" {
		t.Errorf("status %q, want revoked", k.Status(t0))
	}
}

// K3: expiry values.
func TestParseExpiry(t *testing.T) {
	rows := []struct {
		in   string
		want time.Time
		bad  bool
	}{
		{"30d", t0.Add(30 * 24 * time.Hour), false},
		{"12h", t0.Add(12 * time.Hour), false},
		{"90m", t0.Add(90 * time.Minute), false},
		{"2026-03-01", time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), false},
		{"2026-03-01T10:00:00+02:00", time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC), false},
		{"0d", time.Time{}, true},
		{"-1h", time.Time{}, true},
		{"2020-01-01", time.Time{}, true},
		{"9999d", time.Time{}, true},
		{"soon", time.Time{}, true},
	}
	for _, row := range rows {
		got, err := ParseExpiry(row.in, t0)
		if (err != nil) != row.bad || !got.Equal(row.want) {
			t.Errorf("ParseExpiry(%q) = %v, %v; want %v bad=%v", row.in, got, err, row.want, row.bad)
		}
		if err != nil && !strings.Contains(err.Error(), row.in) {
			t.Errorf("K9: error %q does not name %q", err, row.in)
		}
	}
}

// K4: names and patterns.
func TestMatch(t *testing.T) {
	rows := []struct {
		p, model string
		want     bool
	}{
		{"tiny", "tiny", true},
		{"tiny", "tiny-oa", false},
		{"tiny*", "tiny-oa", true},
		{"tiny*", "tiny", true},
		{"*", "org/model:8b", true},
		{"qwen3*", "qwen2.5", false},
		{"*-oa", "tiny-tool-oa", true},
		{"*-oa", "tiny-tool", false},
		{"t?ny", "tiny", true},
		{"t?ny", "tny", false},
		{"t?ny", "tüny", true},
		{"a*b*c", "aXbYbZc", true},
		{"a*b*c", "aXbYbZ", false},
		{"**", "", true},
		{"?", "", false},
	}
	for _, row := range rows {
		if got := Match(row.p, row.model); got != row.want {
			t.Errorf("Match(%q, %q) = %v, want %v", row.p, row.model, got, row.want)
		}
	}
}

// K9: a bad -models value names the bad entry.
func TestParseModels(t *testing.T) {
	got, err := ParseModels(" tiny , qwen3*,tiny")
	if err != nil || len(got) != 2 || got[0] != "tiny" || got[1] != "qwen3*" {
		t.Fatalf("got %q, %v", got, err)
	}
	if got, err := ParseModels(""); got != nil || err != nil {
		t.Fatalf("empty: got %q, %v", got, err)
	}
	// A scope is bounded (every request of the key matches its patterns):
	// MaxScopeEntries entries, one more is refused naming the count.
	many := make([]string, MaxScopeEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("m%d*", i)
	}
	if got, err := ParseModels(strings.Join(many[:MaxScopeEntries], ",")); err != nil || len(got) != MaxScopeEntries {
		t.Fatalf("%d entries: %d, %v", MaxScopeEntries, len(got), err)
	}
	if _, err := ParseModels(strings.Join(many, ",")); !errors.Is(err, ErrScopeTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(MaxScopeEntries+1)) {
		t.Fatalf("%d entries: got %v, want ErrScopeTooLarge naming the count", MaxScopeEntries+1, err)
	}
	if _, err := New().Create(Spec{Name: "a", Models: many}, t0); !errors.Is(err, ErrScopeTooLarge) {
		t.Fatalf("Create with %d entries: %v", len(many), err)
	}
	// A store written before the bound still loads (`edge keys` can only
	// read it to revoke or rotate such a key; nothing else may edit it).
	old := New()
	if _, err := old.Create(Spec{Name: "a", Models: many[:1]}, t0); err != nil {
		t.Fatal(err)
	}
	old.keys["a"].Models = many
	path := filepath.Join(t.TempDir(), "k.json")
	if err := old.Save(path); err != nil {
		t.Fatal(err)
	}
	if st, err := Load(path); err != nil || len(st.keys["a"].Models) != len(many) {
		t.Fatalf("a store with a scope over the bound: %v", err)
	}
	for _, bad := range []string{"tiny,,x", "qw[en]", "a{b}", `a\b`, "tab\tx", strings.Repeat("m", MaxPatternLen+1)} {
		_, err := ParseModels(bad)
		if !errors.Is(err, ErrBadPattern) {
			t.Errorf("ParseModels(%q): got %v, want ErrBadPattern", bad, err)
		}
	}
}

// K7: the usage file round-trips and refuses what is malformed.
func TestUsageFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.json")
	u := &Usage{SavedAt: t0, Keys: []KeyUsage{{Name: "b", Requests: 2}, {Name: "a", Requests: 1, DayTokens: 5, Day: "2026-01-31", MinuteEmptyAt: t0}}}
	if err := SaveUsage(path, u); err != nil {
		t.Fatal(err)
	}
	got, err := LoadUsage(path)
	if err != nil || len(got.Keys) != 2 || got.Keys[0].Name != "a" || got.Keys[0].DayTokens != 5 || !got.Keys[0].MinuteEmptyAt.Equal(t0) {
		t.Fatalf("got %+v, %v", got, err)
	}
	if e, err := LoadUsageOrEmpty(filepath.Join(t.TempDir(), "none")); err != nil || len(e.Keys) != 0 {
		t.Fatalf("missing file: %+v, %v", e, err)
	}
	for _, bad := range []string{`{"version":1,"keys":[{"name":"a","requests":-1}]}`, `{"version":1,"keys":[{"name":"a","day":"31.1."}]}`,
		`{"version":1,"keys":[{"name":"a"},{"name":"a"}]}`, `{"version":1`} {
		os.WriteFile(path, []byte(bad), 0o600)
		if _, err := LoadUsage(path); !errors.Is(err, ErrBadUsage) {
			t.Errorf("%s: got %v, want ErrBadUsage", bad, err)
		}
	}
}

// SPEC V3: a key made local-only keeps the mark through a save, a load and
// a rotation; a key without it writes no local_only member, so a store
// written before the member existed still matches its checksum.
func TestStoreLocalOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	s := New()
	if _, err := s.Create(Spec{Name: "site", LocalOnly: true}, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(Spec{Name: "anywhere"}, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rotate("site", 0, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if n := bytes.Count(raw, []byte(`"local_only": true`)); n != 1 {
		t.Fatalf("the file holds %d local_only members, want 1 (only the local-only key's):\n%s", n, raw)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"site": true, "anywhere": false} {
		if k, _ := got.Key(name); k.LocalOnly != want {
			t.Errorf("key %q: LocalOnly %v after save and load, want %v", name, k.LocalOnly, want)
		}
	}
	// The same key without the member: what a store of an earlier edge
	// holds; its checksum is still the one Save computes.
	old := []Key{{Name: "x", KeySHA256: Hash("k"), Hint: "iop-…", CreatedAt: t0}}
	b := fmt.Appendf(nil, `{"version":1,"revision":1,"keys":[{"name":"x","key_sha256":%q,"hint":"iop-…","created_at":%q}],"checksum":%q}`,
		Hash("k"), t0.Format(time.RFC3339), checksum(old))
	if _, err := Parse(b); err != nil {
		t.Fatalf("a store without local_only members: %v", err)
	}
}
