package keys

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/edge/keystore"
	"iop/internal/proctest"
	"iop/internal/storefile"
)

// SPEC K1, attacked: the key store file changed under a running edge in
// the ways TestBadStoreKeepsPrevious does not try — replaced by a symlink
// to a FIFO (no writer: an open(2) of it would wait forever, with the
// loader's lock held and so every request of an unknown key behind it),
// by a symlink to a device (/dev/null), by a directory, by a sparse file
// one byte over storefile.MaxRead, half-written in place (no rename), and
// with a key added in bad JSON. Each poll returns at once, keeps the keys
// in effect and logs why, naming the file; a symlink to a good newer
// store is followed and applied.
func TestK1StoreFileReplacedUnderRunningEdge(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	var secret string
	edit(t, path, func(st *keystore.Store) (err error) {
		secret, err = st.Create(keystore.Spec{Name: "a"}, noon)
		return err
	})
	good, _ := os.ReadFile(path)
	var logs proctest.Log
	l, reg, err := NewLoader(keysConfig(path), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	replace := func(make func(tmp string) error) {
		t.Helper()
		tmp := filepath.Join(dir, "next")
		os.RemoveAll(tmp)
		if err := make(tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rows := []struct {
		name, why string
		change    func()
	}{
		{"a symlink to a FIFO", "not a regular file", func() { replace(func(tmp string) error { return os.Symlink(fifo, tmp) }) }},
		{"a symlink to /dev/null", "not a regular file", func() { replace(func(tmp string) error { return os.Symlink("/dev/null", tmp) }) }},
		{"a directory", "not a regular file", func() { replace(func(tmp string) error { return os.Mkdir(tmp, 0o700) }) }},
		{"a sparse file over the bound", "file too large", func() {
			replace(func(tmp string) error {
				if err := os.WriteFile(tmp, good, 0o600); err != nil {
					return err
				}
				return os.Truncate(tmp, storefile.MaxRead+1)
			})
		}},
		{"half-written in place", "invalid JSON", func() {
			os.RemoveAll(path)
			if err := os.WriteFile(path, good[:len(good)/2], 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a key added in bad JSON", "invalid JSON", func() {
			i := strings.Index(string(good), `"keys": [`)
			bad := string(good[:i]) + `"keys": [{"name": "x", "sha256": ,},` + string(good[i+len(`"keys": [`):])
			replace(func(tmp string) error { return os.WriteFile(tmp, []byte(bad), 0o600) })
		}},
	}
	for _, row := range rows {
		row.change()
		before := strings.Count(logs.String(), "key store refused")
		done := make(chan bool, 1)
		go func() { done <- l.Poll() }()
		select {
		case swapped := <-done:
			if swapped {
				t.Fatalf("%s: swapped in", row.name)
			}
		case <-time.After(10 * time.Second):
			// Release a reader held by the FIFO so that the test ends.
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			<-done
			t.Fatalf("%s: the poll did not return (it waited on the file)", row.name)
		}
		if _, err := reg.Authenticate(secret, noon); err != nil {
			t.Fatalf("%s: the key in effect is gone: %v", row.name, err)
		}
		all := strings.TrimSuffix(logs.String(), "\n")
		tail := all[strings.LastIndex(all, "\n")+1:]
		if strings.Count(logs.String(), "key store refused") != before+1 || !strings.Contains(tail, row.why) || !strings.Contains(tail, "keys.json") {
			t.Errorf("%s: the log does not say why (%q, naming the file): %s", row.name, row.why, tail)
		}
	}
	// A symlink to a good, newer store (a key added) is followed.
	other := filepath.Join(dir, "other.json")
	if err := os.WriteFile(other, good, 0o600); err != nil {
		t.Fatal(err)
	}
	edit(t, other, func(st *keystore.Store) error { _, err := st.Create(keystore.Spec{Name: "b"}, noon); return err })
	replace(func(tmp string) error { return os.Symlink(other, tmp) })
	if !l.Poll() {
		t.Fatalf("a symlink to a good newer store was not applied:\n%s", logs.String())
	}
	if _, err := reg.Authenticate(secret, noon); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatal("P4: a key in the log")
	}
}
