package keyscmd

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/keystore"
	"iop/internal/leakcheck"
)

var clock = func() time.Time { return time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC) }

// edgeConfig writes a minimal valid edge config with a key store into
// dir and returns its path. storeBlock replaces the keys block.
func edgeConfig(t testing.TB, dir, keysBlock string) string {
	t.Helper()
	cfg := `{
  "tls": {"cert_file": "edge.crt", "key_file": "edge.key", "ca_file": "ca.crt"},
  "api_keys": [{"principal": "ops", "key_sha256": "` + keystore.Hash("ops-key") + `"}],
  ` + keysBlock + `
  "nodes": [{"id": "gpu-1", "adapters": [{"type": "ollama", "base_url": "http://127.0.0.1:11434"}]}],
  "models": [{"name": "tiny", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"}]},
             {"name": "qwen3:8b", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "qwen3:8b"}]}]
}`
	path := filepath.Join(dir, "edge.json")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = Main(args, &out, &errb, clock)
	return code, out.String(), errb.String()
}

// K1, K3, K4, K9: every subcommand against one store, in order: what it
// prints, what it refuses (naming the flag or value), and that the store
// keeps only hashes.
func TestKeysCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := edgeConfig(t, dir, `"keys": {"store_file": "keys.json"},`)
	store := filepath.Join(dir, "keys.json")
	var first string
	steps := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{"K9 no subcommand", nil, ExitUsage, "", "missing subcommand"},
		{"K9 unknown subcommand", []string{"delete"}, ExitUsage, "", `unknown subcommand "delete"`},
		{"K9 unknown flag", []string{"create", "-config", cfg, "-name", "a", "-tmp", "5"}, ExitUsage, "", "-tmp"},
		{"K9 missing -config", []string{"list"}, ExitUsage, "", "missing -config"},
		{"K9 missing -name", []string{"create", "-config", cfg}, ExitUsage, "", "missing -name"},
		{"K9 negative limit", []string{"create", "-config", cfg, "-name", "a", "-tpm", "-5"}, ExitUsage, "", "-tpm: invalid limit: must be ≥ 0 (0 = no bound), got -5"},
		{"K9 negative concurrency", []string{"create", "-config", cfg, "-name", "a", "-max-concurrent", "-1"}, ExitUsage, "", "-max-concurrent: invalid limit"},
		{"K9 not a number", []string{"create", "-config", cfg, "-name", "a", "-rpm", "lots"}, ExitUsage, "", `invalid value "lots" for flag -rpm`},
		{"K9 bad pattern", []string{"create", "-config", cfg, "-name", "a", "-models", "tiny,qw[en]"}, ExitUsage, "", `-models: bad model pattern "qw[en]"`},
		{"K9 bad expiry", []string{"create", "-config", cfg, "-name", "a", "-expires", "-3d"}, ExitUsage, "", `-expires "-3d"`},
		{"K9 bad name", []string{"create", "-config", cfg, "-name", "a b"}, ExitUsage, "", `-name "a b"`},
		{"K9 an api_keys principal's name", []string{"create", "-config", cfg, "-name", "ops"}, ExitError, "", `-name "ops" is an api_keys principal`},
		{"K9 stray argument", []string{"list", "-config", cfg, "extra"}, ExitUsage, "", `unexpected argument "extra"`},
		{"K1 list before any key", []string{"list", "-config", cfg}, ExitOK, "no keys in", ""},
		{"K1 create", []string{"create", "-config", cfg, "-name", "team-a", "-models", "tiny, qwen3*", "-tpm", "1000", "-tokens-per-day", "50000", "-expires", "30d"},
			ExitOK, keystore.KeyPrefix, `key "team-a" created (models tiny,qwen3*, 1000 tokens/min, 50000 tokens/day, expires 2026-03-02T12:00:00Z, weight 1, class interactive, max class interactive, local and remote adapters)`},
		{"K1 create again", []string{"create", "-config", cfg, "-name", "team-a"}, ExitError, "", "a key of that name exists"},
		{"K4 a pattern matching no group is noted", []string{"create", "-config", cfg, "-name", "team-b", "-models", "llama*"}, ExitOK, keystore.KeyPrefix, `note: -models entry "llama*" matches no model group`},
		{"K1 list", []string{"list", "-config", cfg}, ExitOK, "team-a  active", ""},
		{"K1 show", []string{"show", "-config", cfg, "-name", "team-a"}, ExitOK, "tokens per day:       50000", ""},
		{"K1 show unknown", []string{"show", "-config", cfg, "-name", "nobody"}, ExitError, "", `no such key "nobody"`},
		{"K3 rotate with grace", []string{"rotate", "-config", cfg, "-name", "team-a", "-grace", "10m"}, ExitOK, keystore.KeyPrefix, "stays valid for 10m0s"},
		{"K3 bad grace", []string{"rotate", "-config", cfg, "-name", "team-a", "-grace", "-1s"}, ExitUsage, "", "-grace -1s"},
		{"G4 create with a weight and classes", []string{"create", "-config", cfg, "-name", "bulk-1", "-weight", "3", "-class", "batch", "-max-class", "interactive"},
			ExitOK, keystore.KeyPrefix, "weight 3, class batch, max class interactive"},
		{"G4 show the key's place in the queue", []string{"show", "-config", cfg, "-name", "bulk-1"}, ExitOK, "queue:                weight 3, class batch, max class interactive", ""},
		{"G4 rotate changes only the queue flags given", []string{"rotate", "-config", cfg, "-name", "bulk-1", "-max-class", "critical"}, ExitOK, keystore.KeyPrefix,
			"weight 3, class batch, max class critical"},
		{"G4 unknown class", []string{"create", "-config", cfg, "-name", "x", "-class", "urgent"}, ExitUsage, "", `-class: must be critical, interactive or batch, got "urgent"`},
		{"G4 class above max class", []string{"create", "-config", cfg, "-name", "x", "-class", "critical", "-max-class", "batch"}, ExitUsage, "",
			`-class: "critical" is above the key's max class "batch"`},
		{"G1 weight out of range", []string{"create", "-config", cfg, "-name", "x", "-weight", "5000"}, ExitUsage, "", "-weight: must be between 1 and 1000, got 5000"},
		{"G4 rotate to a class above the max class", []string{"rotate", "-config", cfg, "-name", "bulk-1", "-class", "critical", "-max-class", "batch"}, ExitError, "",
			`-class: "critical" is above the key's max class "batch"`},
		{"V3 create a local-only key", []string{"create", "-config", cfg, "-name", "site", "-local-only"}, ExitOK, keystore.KeyPrefix, "local adapters only)"},
		{"V3 show a local-only key", []string{"show", "-config", cfg, "-name", "site"}, ExitOK, "data:                 local adapters only", ""},
		{"V3 show a key that may reach remote adapters", []string{"show", "-config", cfg, "-name", "team-a"}, ExitOK, "local and remote adapters\n", ""},
		{"K2 revoke", []string{"revoke", "-config", cfg, "-name", "team-b"}, ExitOK, `key "team-b" revoked`, ""},
		{"K2 revoke twice", []string{"revoke", "-config", cfg, "-name", "team-b"}, ExitError, "", "key is revoked"},
		{"K2 rotate a revoked key", []string{"rotate", "-config", cfg, "-name", "team-b"}, ExitError, "", "key is revoked"},
		{"K2 list shows the revoked key", []string{"list", "-config", cfg}, ExitOK, "team-b  revoked", ""},
		{"K7 usage before the edge wrote any", []string{"usage", "-config", cfg}, ExitOK, "no usage recorded yet", ""},
	}
	for _, st := range steps {
		code, out, errs := run(st.args...)
		if code != st.wantCode || !strings.Contains(out, st.wantOut) || !strings.Contains(errs, st.wantErr) {
			t.Fatalf("%s: exit %d (want %d)\nstdout: %s\nstderr: %s", st.name, code, st.wantCode, out, errs)
		}
		if st.name == "K1 create" {
			first = strings.TrimSpace(out)
		}
	}
	raw, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	if first == "" || bytes.Contains(raw, []byte(first)) || !bytes.Contains(raw, []byte(keystore.Hash(first))) {
		t.Fatal("K1: the store holds the key, or not its hash")
	}
	if !strings.Contains(string(raw), `"previous_key_sha256": "`+keystore.Hash(first)) {
		t.Fatal("K3: the rotation kept no previous key")
	}
	// The edge's usage file, as `edge keys usage` reads it.
	u := &keystore.Usage{SavedAt: clock(), Keys: []keystore.KeyUsage{{Name: "team-a", Requests: 3, PromptTokens: 30, CompletionTokens: 70, Day: "2026-01-31", DayTokens: 100}}}
	if err := keystore.SaveUsage(store+".usage", u); err != nil {
		t.Fatal(err)
	}
	code, out, _ := run("usage", "-config", cfg)
	if code != ExitOK || !strings.Contains(out, "team-a  3         0        30      70          0          100    50000") {
		t.Fatalf("K7 usage:\n%s", out)
	}
	if code, out, _ := run("show", "-config", cfg, "-name", "team-a"); code != ExitOK || !strings.Contains(out, "tokens today:") {
		t.Fatalf("K7 show with usage:\n%s", out)
	}
}

// K9: a config without keys.store_file, or one that does not load, is an
// error naming what to do.
func TestKeysCommandConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := edgeConfig(t, dir, "")
	if code, _, errs := run("list", "-config", cfg); code != ExitError || !strings.Contains(errs, "has no keys.store_file") {
		t.Fatalf("no store: exit %d: %s", code, errs)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"keys": {"store_fil": "k.json"}}`), 0o600)
	if code, _, errs := run("list", "-config", bad); code != ExitError || !strings.Contains(errs, "keys.store_fil: unknown field") {
		t.Fatalf("bad config: exit %d: %s", code, errs)
	}
	store := filepath.Join(dir, "k.json")
	cfg2 := edgeConfig(t, t.TempDir(), `"keys": {"store_file": "`+store+`"},`)
	os.WriteFile(store, []byte(`{"version": 1, "keys": []}`), 0o600)
	if code, _, errs := run("create", "-config", cfg2, "-name", "x"); code != ExitError || !strings.Contains(errs, "checksum") {
		t.Fatalf("K1 a corrupted store is not written over: exit %d: %s", code, errs)
	}
}

// K4, K9: a scope of more than keystore.MaxScopeEntries entries is
// refused naming the count; `list` shows a long scope cut to its column
// (every row of the table is padded to the widest), `show` shows it whole.
func TestLongScope(t *testing.T) {
	dir := t.TempDir()
	cfg := edgeConfig(t, dir, `"keys": {"store_file": "keys.json"},`)
	many := make([]string, keystore.MaxScopeEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("model-%d", i)
	}
	if code, _, errs := run("create", "-config", cfg, "-name", "huge", "-models", strings.Join(many, ",")); code != ExitUsage ||
		!strings.Contains(errs, fmt.Sprintf("-models: model scope too large: %d entries, at most %d", len(many), keystore.MaxScopeEntries)) {
		t.Fatalf("too many entries: exit %d: %s", code, errs)
	}
	if code, _, errs := run("create", "-config", cfg, "-name", "wide", "-models", strings.Join(many[:100], ",")); code != ExitOK {
		t.Fatal(errs)
	}
	run("create", "-config", cfg, "-name", "narrow", "-models", "tiny")
	code, out, _ := run("list", "-config", cfg)
	if code != ExitOK || !strings.Contains(out, "model-0,model-1,") || !strings.Contains(out, "(+9") {
		t.Fatalf("list:\n%s", out)
	}
	for line := range strings.Lines(out) {
		if len(line) > 160 {
			t.Fatalf("a %d-byte row:\n%s", len(line), out)
		}
	}
	if _, out, _ := run("show", "-config", cfg, "-name", "wide"); !strings.Contains(out, "model-99") {
		t.Fatalf("show cut the scope:\n%s", out)
	}
}

// K1: a create that begins a new store while the edge's usage file names
// store keys (the store file was lost) says so: a running edge refuses the
// new, older store and keeps the keys it has. A first store says nothing.
func TestCreateAfterTheStoreWasLost(t *testing.T) {
	dir := t.TempDir()
	cfg := edgeConfig(t, dir, `"keys": {"store_file": "keys.json"},`)
	store := filepath.Join(dir, "keys.json")
	u := &keystore.Usage{SavedAt: clock(), Keys: []keystore.KeyUsage{{Name: "ops", Requests: 1}}} // api_keys only
	if err := keystore.SaveUsage(store+".usage", u); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("create", "-config", cfg, "-name", "a"); code != ExitOK || strings.Contains(errs, "new key store") {
		t.Fatalf("the first store: exit %d: %s", code, errs)
	}
	u.Keys = append(u.Keys, keystore.KeyUsage{Name: "a", Requests: 2}, keystore.KeyUsage{Name: "b", Requests: 3})
	if err := keystore.SaveUsage(store+".usage", u); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(store); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run("create", "-config", cfg, "-name", "c")
	if code != ExitOK || !strings.HasPrefix(out, keystore.KeyPrefix) ||
		!strings.Contains(errs, "began a new key store") || !strings.Contains(errs, "2 keys") {
		t.Fatalf("a lost store: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
}

// K1: concurrent creates and revokes lose nothing: each holds the lock
// from reading the store to renaming the new one.
func TestConcurrentCreateAndRevoke(t *testing.T) {
	leakcheck.Check(t)
	dir := t.TempDir()
	cfg := edgeConfig(t, dir, `"keys": {"store_file": "keys.json"},`)
	const n = 16
	for i := range n { // half of them revoked concurrently with the new creates
		if code, _, errs := run("create", "-config", cfg, "-name", fmt.Sprintf("old-%d", i)); code != ExitOK {
			t.Fatal(errs)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 2*n)
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if code, _, e := run("create", "-config", cfg, "-name", fmt.Sprintf("new-%d", i)); code != ExitOK {
				errs <- e
			}
		}()
		go func() {
			defer wg.Done()
			if code, _, e := run("revoke", "-config", cfg, "-name", fmt.Sprintf("old-%d", i)); code != ExitOK {
				errs <- e
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	st, err := keystore.Load(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	created, revoked := 0, 0
	for _, k := range st.Keys() {
		switch {
		case strings.HasPrefix(k.Name, "new-") && k.Status(clock()) == "active":
			created++
		case strings.HasPrefix(k.Name, "old-") && k.Status(clock()) == "revoked":
			revoked++
		}
	}
	if created != n || revoked != n || st.Revision != 3*n {
		t.Fatalf("K1: %d created, %d revoked, revision %d after %d of each and %d writes; want %d, %d, %d", created, revoked, st.Revision, n, 3*n, n, n, 3*n)
	}
}
