package keys

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keystore"
	"iop/internal/proctest"
)

// edit changes the store at path as `edge keys` does.
func edit(t testing.TB, path string, change func(*keystore.Store) error) {
	t.Helper()
	if err := keystore.Update(path, change); err != nil {
		t.Fatal(err)
	}
}

func keysConfig(path string, api ...config.APIKey) *config.Config {
	return &config.Config{APIKeys: api, Keys: config.Keys{StoreFile: path, EdgeCount: 1}}
}

// K2: a store changed under a running Edge: a created key is accepted and
// a revoked one refused within a second of the write (the poll), with no
// SIGHUP.
func TestStoreChangedUnderRunningEdge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "keys.json")
		var secret string
		edit(t, path, func(st *keystore.Store) (err error) {
			secret, err = st.Create(keystore.Spec{Name: "a"}, noon)
			return err
		})
		l, reg, err := NewLoader(keysConfig(path), nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		swaps := make(chan struct{}, 8)
		go l.Run(ctx, 0, func() { swaps <- struct{}{} })
		if _, err := reg.Authenticate(secret, noon); err != nil {
			t.Fatal(err)
		}
		var second string
		edit(t, path, func(st *keystore.Store) (err error) {
			second, err = st.Create(keystore.Spec{Name: "b"}, noon)
			return err
		})
		time.Sleep(time.Second) // the bubble's clock: one second of polls
		synctest.Wait()
		if p, err := reg.Authenticate(second, noon); err != nil || p.Name != "b" {
			t.Fatalf("K2: a key created a second ago: %v", err)
		}
		edit(t, path, func(st *keystore.Store) error { return st.Revoke("a", noon) })
		time.Sleep(time.Second)
		synctest.Wait()
		if _, err := reg.Authenticate(secret, noon); !errors.Is(err, ErrRevoked) {
			t.Fatalf("K2: a key revoked a second ago: %v", err)
		}
		if n := len(swaps); n != 2 {
			t.Fatalf("%d swaps, want 2 (one per write)", n)
		}
		// Nothing changed: no swap, however long.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := len(swaps); n != 2 {
			t.Fatalf("%d swaps without a write, want 2", n)
		}
	})
}

// K1: a malformed or corrupted store is refused and the keys in effect
// kept, logged once per bad version; a fixed store is picked up again.
// A store file that disappears keeps the keys in effect too.
func TestBadStoreKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	var secret string
	edit(t, path, func(st *keystore.Store) (err error) {
		secret, err = st.Create(keystore.Spec{Name: "a"}, noon)
		return err
	})
	var logs proctest.Log
	l, reg, err := NewLoader(keysConfig(path), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	write := func(b []byte) {
		t.Helper()
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	rows := []struct {
		name string
		file []byte
	}{
		{"not JSON", []byte("{")},
		{"cut short", good[:len(good)-20]},
		{"a changed byte", []byte(strings.Replace(string(good), `"name": "a"`, `"name": "z"`, 1))},
		{"an unknown member", []byte(strings.Replace(string(good), `"version"`, `"versoin": 1, "version"`, 1))},
	}
	for _, row := range rows {
		write(row.file)
		if l.Poll() {
			t.Fatalf("%s: swapped in", row.name)
		}
		if l.Poll() {
			t.Fatalf("%s: swapped in on the second poll", row.name)
		}
		if _, err := reg.Authenticate(secret, noon); err != nil {
			t.Fatalf("%s: the previous key is gone: %v", row.name, err)
		}
	}
	if n := strings.Count(logs.String(), "key store refused"); n != len(rows) {
		t.Fatalf("%d refusal lines for %d bad versions, want one each:\n%s", n, len(rows), logs.String())
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatal("P4: a key in the log")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	l.Poll()
	if _, err := reg.Authenticate(secret, noon); err != nil {
		t.Fatalf("store gone: the previous key is gone: %v", err)
	}
	write(good)
	edit(t, path, func(st *keystore.Store) error { return st.Revoke("a", noon) })
	if !l.Poll() {
		t.Fatal("a good store after bad ones: not swapped in")
	}
	if _, err := reg.Authenticate(secret, noon); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after the fix: %v", err)
	}
}

// K1, K2: a running Edge refuses a store older than the one in effect (its
// revision lower: an old backup copied back, or the file deleted and a new
// store begun by `edge keys create`), which would drop every other key with
// its spent budgets and bring revoked keys back; the keys in effect and
// their usage stay, logged once per version. A SIGHUP applies it on purpose.
func TestOlderStoreRefusedWhileRunning(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	secrets := map[string]string{}
	for _, name := range []string{"a", "b"} {
		edit(t, path, func(st *keystore.Store) (err error) {
			secrets[name], err = st.Create(keystore.Spec{Name: name, Limits: keystore.Limits{TokensPerDay: 100}}, noon)
			return err
		})
	}
	backup, _ := os.ReadFile(path) // revision 2: b not revoked yet
	edit(t, path, func(st *keystore.Store) error { return st.Revoke("b", noon) })
	var logs proctest.Log
	l, reg, err := NewLoader(keysConfig(path), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := reg.Authenticate(secrets["a"], noon)
	tk, _ := admit(reg, p, 10, noon)
	tk.Finish(*used(40, 40), noon)
	kept := func(what string) {
		t.Helper()
		if _, err := reg.Authenticate(secrets["a"], noon); err != nil {
			t.Fatalf("%s: the key in effect is gone: %v", what, err)
		}
		if _, err := reg.Authenticate(secrets["b"], noon); !errors.Is(err, ErrRevoked) {
			t.Fatalf("%s: the revoked key is back: %v", what, err)
		}
		if ks, _ := reg.StatusOf("a", noon); ks.TokensToday != 80 || ks.Limits.TokensDayLeft != 20 {
			t.Fatalf("%s: the spent budget is gone: %+v", what, ks)
		}
	}

	tmp := filepath.Join(dir, "tmp")
	os.WriteFile(tmp, backup, 0o600)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if l.Poll() || l.Poll() {
		t.Fatal("an older backup copied back: swapped in")
	}
	kept("an older backup")

	os.Remove(path)
	l.Poll()
	var fresh string
	edit(t, path, func(st *keystore.Store) (err error) {
		fresh, err = st.Create(keystore.Spec{Name: "c"}, noon)
		return err
	})
	if l.Poll() {
		t.Fatal("a new store begun after the file was deleted: swapped in")
	}
	kept("a new store")
	if _, err := reg.Authenticate(fresh, noon); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a key of the refused store: %v", err)
	}
	if n := strings.Count(logs.String(), "older than the revision 3 in effect"); n != 2 {
		t.Fatalf("%d refusal lines naming the revisions for 2 older versions, want one each:\n%s", n, logs.String())
	}

	if err := l.Reload(keysConfig(path)); err != nil { // SIGHUP: on purpose
		t.Fatal(err)
	}
	if p, err := reg.Authenticate(fresh, noon); err != nil || p.Name != "c" {
		t.Fatalf("after SIGHUP: %v", err)
	}
	if !strings.Contains(logs.String(), "key store revision went back") {
		t.Fatalf("the SIGHUP that applied an older store is not logged:\n%s", logs.String())
	}
}

// K1: at startup there is no previous store to keep: a bad one is an
// error, a missing one a store without keys (and no open mode).
func TestNewLoader(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte("{"), 0o600)
	if _, _, err := NewLoader(keysConfig(bad), nil); !errors.Is(err, keystore.ErrBadStore) {
		t.Fatalf("bad store: got %v", err)
	}
	_, reg, err := NewLoader(keysConfig(filepath.Join(dir, "none.json")), nil)
	if err != nil || reg.OpenMode() || reg.Set().Len() != 0 {
		t.Fatalf("missing store: %v, open %v", err, reg.OpenMode())
	}
}

// K1: a SIGHUP whose api_keys conflict with the store is refused and
// nothing changes; a good one applies api_keys and keys.edge_count.
func TestReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	var secret string
	edit(t, path, func(st *keystore.Store) (err error) {
		secret, err = st.Create(keystore.Spec{Name: "a", Limits: keystore.Limits{TokensPerDay: 100}}, noon)
		return err
	})
	l, reg, err := NewLoader(keysConfig(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Reload(keysConfig(path, config.APIKey{Principal: "a", KeySHA256: keystore.Hash("x")})); !errors.Is(err, ErrConflict) {
		t.Fatalf("conflicting reload: %v", err)
	}
	if reg.Set().Principal("a").Source != SourceStore {
		t.Fatal("the refused reload changed the set")
	}
	c := keysConfig(path, config.APIKey{Principal: "ops", KeySHA256: keystore.Hash("x")})
	c.Keys.EdgeCount = 4
	if err := l.Reload(c); err != nil {
		t.Fatal(err)
	}
	p, err := reg.Authenticate(secret, noon)
	if err != nil || p.Limits.TokensPerDay != 25 || p.Configured.TokensPerDay != 100 {
		t.Fatalf("after reload: %+v, %v", p, err)
	}
	if p, err := reg.Authenticate("x", noon); err != nil || p.Name != "ops" {
		t.Fatalf("api_keys after reload: %v", err)
	}
}

// K7: the Persister writes only while something changed, and once more
// when it stops; a restarted Edge reads the counters back. A malformed
// usage file stops the start.
func TestPersister(t *testing.T) {
	dir := t.TempDir()
	path, usage := filepath.Join(dir, "keys.json"), filepath.Join(dir, "keys.json.usage")
	var secret string
	edit(t, path, func(st *keystore.Store) (err error) {
		secret, err = st.Create(keystore.Spec{Name: "a", Limits: keystore.Limits{TokensPerDay: 100}}, noon)
		return err
	})
	_, reg, _ := NewLoader(keysConfig(path), nil)
	clock := noon
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	ps := NewPersister(reg, usage, time.Hour, now, nil)
	if err := ps.Restore(); err != nil {
		t.Fatal(err)
	}
	ps.Flush()
	if _, err := os.Stat(usage); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("written with nothing counted")
	}
	p, _ := reg.Authenticate(secret, noon)
	tk, _ := admit(reg, p, 10, noon)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ps.Run(ctx); close(done) }()
	tk.Finish(*used(40, 40), noon)
	cancel()
	<-done // the final flush
	_, reg2, _ := NewLoader(keysConfig(path), nil)
	if err := NewPersister(reg2, usage, time.Hour, now, nil).Restore(); err != nil {
		t.Fatal(err)
	}
	ks, _ := reg2.StatusOf("a", noon)
	if ks.TokensToday != 80 || ks.Requests != 1 || ks.Limits.TokensDayLeft != 20 {
		t.Fatalf("restored %+v", ks)
	}
	os.WriteFile(usage, []byte(`{"version":1,"keys":[{"name":"a","requests":-5}]}`), 0o600)
	if err := NewPersister(reg2, usage, time.Hour, now, nil).Restore(); !errors.Is(err, keystore.ErrBadUsage) {
		t.Fatalf("a malformed usage file: %v", err)
	}
}

// K2: a key created a moment ago works on its first request: an unknown
// key makes the Loader look at the store file at once, at most once per
// MissPollInterval.
func TestUnknownKeyLooksAtTheStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	edit(t, path, func(st *keystore.Store) error { _, err := st.Create(keystore.Spec{Name: "a"}, noon); return err })
	l, reg, err := NewLoader(keysConfig(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := noon
	l.now = func() time.Time { return clock }
	var fresh string
	edit(t, path, func(st *keystore.Store) (err error) {
		fresh, err = st.Create(keystore.Spec{Name: "b"}, noon)
		return err
	})
	if p, err := reg.Authenticate(fresh, noon); err != nil || p.Name != "b" {
		t.Fatalf("a key created a moment ago: %v", err)
	}
	var second string
	edit(t, path, func(st *keystore.Store) (err error) {
		second, err = st.Create(keystore.Spec{Name: "c"}, noon)
		return err
	})
	clock = clock.Add(MissPollInterval / 2)
	if _, err := reg.Authenticate(second, noon); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a second miss within MissPollInterval looked at the store: %v", err)
	}
	clock = clock.Add(MissPollInterval)
	if _, err := reg.Authenticate(second, noon); err != nil {
		t.Fatalf("after MissPollInterval: %v", err)
	}
}

// K2: a key created a moment ago works on its first request even when the
// background poll swaps the new store in while the request looks (the
// miss's own poll then finds nothing new): the miss looks at the set in
// effect again, not only when its own poll swapped.
func TestUnknownKeyRacingThePoll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	edit(t, path, func(st *keystore.Store) error { _, err := st.Create(keystore.Spec{Name: "a"}, noon); return err })
	l, reg, err := NewLoader(keysConfig(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	var fresh string
	edit(t, path, func(st *keystore.Store) (err error) {
		fresh, err = st.Create(keystore.Spec{Name: "b"}, noon)
		return err
	})
	reg.onMiss = func() bool {
		l.Poll() // Run's poll, between the request's lookup and its miss
		return l.pollOnMiss()
	}
	if p, err := reg.Authenticate(fresh, noon); err != nil || p.Name != "b" {
		t.Fatalf("a key the background poll swapped in meanwhile: %v", err)
	}
}
