package secretstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newKey(t *testing.T, dir string) *Key {
	t.Helper()
	path := filepath.Join(dir, "store.key")
	if err := WriteNewKey(path); err != nil {
		t.Fatal(err)
	}
	k, err := LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// C1: a secret is encrypted at rest — the file holds neither the secret nor
// the key — with a fresh nonce per write, the slot name bound as associated
// data, and a revision that rises with every write, across removal.
func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	k := newKey(t, dir)
	keyBytes, _ := os.ReadFile(filepath.Join(dir, "store.key"))
	path := filepath.Join(dir, "secrets.json")
	secret := []byte("sk-live-AAAABBBBCCCCDDDD")

	s := New()
	steps := []struct {
		name    string
		do      func() (uint64, error)
		wantRev uint64
	}{
		{"C1 first set is revision 1", func() (uint64, error) { return s.Set(k, "openai", secret, now) }, 1},
		{"C1 set again bumps the revision", func() (uint64, error) { return s.Set(k, "openai", secret, now) }, 2},
		{"C1 another slot starts at 1", func() (uint64, error) { return s.Set(k, "vllm", []byte("v-key"), now) }, 1},
	}
	var nonces [][]byte
	for _, st := range steps {
		rev, err := st.do()
		if err != nil || rev != st.wantRev {
			t.Fatalf("%s: got revision %d, %v; want %d", st.name, rev, err, st.wantRev)
		}
		nonces = append(nonces, bytes.Clone(s.slots["openai"].Nonce))
	}
	if bytes.Equal(nonces[0], nonces[1]) {
		t.Fatal("C1: two writes of the same slot share a nonce")
	}
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("store mode %v, want 0600", fi.Mode().Perm())
	}
	raw, _ := os.ReadFile(path)
	if bytes.Contains(raw, secret) || bytes.Contains(raw, keyBytes) {
		t.Fatal("C1: the store file holds the secret or the key")
	}
	s2, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	pt, rev, err := s2.Open(k, "openai")
	if err != nil || rev != 2 || !bytes.Equal(pt, secret) {
		t.Fatalf("open: revision %d, %v", rev, err)
	}
	if got := s2.Slots(); len(got) != 2 || got[0].Name != "openai" || got[0].Revision != 2 || !got[0].UpdatedAt.Equal(now) {
		t.Fatalf("slots %+v", got)
	}
	// Removal keeps the revision: setting the slot again continues it.
	if !s2.Remove("openai", now) || s2.Remove("openai", now) {
		t.Fatal("remove: want true once, then false")
	}
	if _, _, err := s2.Open(k, "openai"); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("open removed: %v", err)
	}
	if err := s2.Save(path); err != nil {
		t.Fatal(err)
	}
	s3, _ := Load(path)
	if len(s3.Slots()) != 1 {
		t.Fatalf("slots after rm: %+v", s3.Slots())
	}
	if rev, _ := s3.Set(k, "openai", secret, now); rev != 3 {
		t.Fatalf("C6: set after rm: revision %d, want 3", rev)
	}
}

// C1: what must not open does not: another key, a ciphertext moved to
// another slot, an edited revision.
func TestStoreRejects(t *testing.T) {
	dir := t.TempDir()
	k := newKey(t, dir)
	s := New()
	s.Set(k, "a", []byte("secret-a"), now)
	s.Set(k, "b", []byte("secret-b"), now)
	other := &Key{}
	other.b[0] = 1
	rows := []struct {
		name   string
		mutate func(s *Store) *Key
		slot   string
		want   error
	}{
		{"C1 wrong key", func(*Store) *Key { return other }, "a", ErrDecrypt},
		{"C1 ciphertext moved to another slot", func(s *Store) *Key {
			s.slots["b"].Nonce, s.slots["b"].Ciphertext = s.slots["a"].Nonce, s.slots["a"].Ciphertext
			return k
		}, "b", ErrDecrypt},
		{"C1 revision edited", func(s *Store) *Key { s.slots["a"].Revision = 9; return k }, "a", ErrDecrypt},
		{"C1 unknown slot", func(*Store) *Key { return k }, "c", ErrNoSlot},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			c := New()
			for n, e := range s.slots {
				cp := *e
				c.slots[n] = &cp
			}
			key := row.mutate(c)
			if pt, _, err := c.Open(key, row.slot); !errors.Is(err, row.want) || pt != nil {
				t.Fatalf("got %v, want %v", err, row.want)
			}
		})
	}
	for _, bad := range [][]byte{nil, []byte("a\nb"), []byte("a\x00"), make([]byte, MaxSecretBytes+1),
		[]byte("a\x01b"), []byte("a\tb"), []byte("a\x7f"), []byte(" sk-a"), []byte("sk-a ")} {
		if _, err := s.Set(k, "x", bad, now); !errors.Is(err, ErrBadSecret) {
			t.Errorf("secret %q: got %v, want ErrBadSecret", bad[:min(len(bad), 8)], err)
		}
	}
	if _, err := s.Set(k, "../x", []byte("s"), now); !errors.Is(err, ErrBadSlotName) {
		t.Errorf("bad slot name: %v", err)
	}
}

// C1: key files: 32 bytes, never overwritten, never group/world readable.
func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k")
	if err := WriteNewKey(path); err != nil {
		t.Fatal(err)
	}
	if err := WriteNewKey(path); !errors.Is(err, ErrExists) {
		t.Fatalf("second init: %v, want ErrExists", err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 || fi.Size() != KeySize {
		t.Fatalf("key file mode %v size %d", fi.Mode().Perm(), fi.Size())
	}
	os.Chmod(path, 0o644)
	if _, err := LoadKey(path); !errors.Is(err, ErrKeyExposed) {
		t.Fatalf("world-readable key: %v", err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc"), 0o600)
	if _, err := LoadKey(short); !errors.Is(err, ErrBadKey) {
		t.Fatalf("short key: %v", err)
	}
	if _, err := LoadKey(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing key: %v", err)
	}
}

// A malformed store file is an error naming the problem.
func TestLoadMalformed(t *testing.T) {
	dir := t.TempDir()
	rows := []struct{ name, body string }{
		{"not json", "{"},
		{"unknown key", `{"version":1,"slots":[],"extra":1}`},
		{"version", `{"version":2,"slots":[]}`},
		{"bad name", `{"version":1,"slots":[{"name":"a/b","revision":1}]}`},
		{"revision 0", `{"version":1,"slots":[{"name":"a","revision":0}]}`},
		{"short nonce", `{"version":1,"slots":[{"name":"a","revision":1,"nonce":"AAAA","ciphertext":"AAAAAAAAAAAAAAAAAAAAAAAAAAAA"}]}`},
		{"duplicate", `{"version":1,"slots":[{"name":"a","revision":1},{"name":"a","revision":2}]}`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			p := filepath.Join(dir, row.name)
			os.WriteFile(p, []byte(row.body), 0o600)
			if _, err := Load(p); !errors.Is(err, ErrBadStore) {
				t.Fatalf("got %v, want ErrBadStore", err)
			}
		})
	}
	// C1, C5: the error never quotes the file: a store key (or any other
	// secret file) given as the store puts no byte of it into a log line.
	for _, row := range []struct{ name, body, secret string }{
		{"the store key given as the store", "\xd7\x9a\x01\xfe-key-bytes", "\xd7\x9a"},
		{"a secret file given as the store", "sk-live-9f8e7d6c5b4a", "sk-live"},
		{"a string where an object belongs", `"sk-live-9f8e7d6c5b4a"`, "sk-live"},
		{"a control byte inside a string", "{\"version\":1,\"slots\":[{\"name\":\"a\x01sk-live\"}]}", "\\x01"},
		{"a number where a string belongs", `{"version":1,"slots":[{"name":4242424242}]}`, "4242424242"},
	} {
		t.Run(row.name, func(t *testing.T) {
			p := filepath.Join(dir, "store.json")
			os.WriteFile(p, []byte(row.body), 0o600)
			_, err := Load(p)
			if !errors.Is(err, ErrBadStore) {
				t.Fatalf("got %v, want ErrBadStore", err)
			}
			if msg := strings.TrimPrefix(err.Error(), "secret store "+p); strings.Contains(msg, row.secret) || strings.Contains(msg, "'") {
				t.Fatalf("C5: the error quotes the file: %q", msg)
			}
		})
	}
	var f file
	if err := json.Unmarshal([]byte(`{"version":1,"slots":[]}`), &f); err != nil || f.Version != 1 {
		t.Fatal("file shape")
	}
}
