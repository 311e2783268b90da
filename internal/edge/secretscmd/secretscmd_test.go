package secretscmd

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/secretstore"
)

var clock = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

// C1: "edge secrets" manages the store: the secret comes from standard
// input only, list prints names and revisions, nothing prints a secret,
// and usage errors exit 2.
func TestSecretsCommand(t *testing.T) {
	dir := t.TempDir()
	key, store := filepath.Join(dir, "store.key"), filepath.Join(dir, "secrets.json")
	const secret = "sk-proj-SECRETSECRETSECRET"
	steps := []struct {
		name     string
		args     []string
		stdin    string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{"C1 no subcommand", nil, "", ExitUsage, "", "missing subcommand"},
		{"C1 unknown subcommand", []string{"get"}, "", ExitUsage, "", `unknown subcommand "get"`},
		{"C1 init", []string{"init", "-key", key}, "", ExitOK, "wrote " + key, ""},
		{"C1 init refuses to overwrite", []string{"init", "-key", key}, "", ExitError, "", "file exists"},
		{"C1 set without -slot", []string{"set", "-store", store, "-key", key}, secret, ExitUsage, "", "missing -slot"},
		{"C1 secret as an argument is refused", []string{"set", "-store", store, "-key", key, "-slot", "openai", secret}, "", ExitUsage, "", "never from arguments"},
		{"C1 set from stdin", []string{"set", "-store", store, "-key", key, "-slot", "openai"}, secret + "\n", ExitOK, "slot openai: revision 1", ""},
		{"C1 set again bumps the revision", []string{"set", "-store", store, "-key", key, "-slot", "openai"}, secret + "2\r\n", ExitOK, "slot openai: revision 2", ""},
		{"C1 empty stdin", []string{"set", "-store", store, "-key", key, "-slot", "x"}, "\n", ExitError, "", "standard input is empty"},
		{"C1 list", []string{"list", "-store", store}, "", ExitOK, "openai", ""},
		{"C1 rm", []string{"rm", "-store", store, "-slot", "openai"}, "", ExitOK, "slot openai removed", ""},
		{"C1 rm unknown", []string{"rm", "-store", store, "-slot", "openai"}, "", ExitError, "", "no such slot"},
		{"C1 list empty", []string{"list", "-store", store}, "", ExitOK, "no slots", ""},
		{"C1 set again after rm continues the revisions", []string{"set", "-store", store, "-key", key, "-slot", "openai"}, secret, ExitOK, "revision 3", ""},
	}
	for _, st := range steps {
		var out, errb bytes.Buffer
		code := Main(st.args, strings.NewReader(st.stdin), &out, &errb, clock)
		if code != st.wantCode || !strings.Contains(out.String(), st.wantOut) || !strings.Contains(errb.String(), st.wantErr) {
			t.Fatalf("%s: exit %d (want %d)\nstdout: %s\nstderr: %s", st.name, code, st.wantCode, out.String(), errb.String())
		}
		if strings.Contains(out.String()+errb.String(), "SECRETSECRET") {
			t.Fatalf("%s: printed the secret", st.name)
		}
	}
	// The stored secret is the stdin without its trailing newline.
	k, err := secretstore.LoadKey(key)
	if err != nil {
		t.Fatal(err)
	}
	s, err := secretstore.Load(store)
	if err != nil {
		t.Fatal(err)
	}
	pt, rev, err := s.Open(k, "openai")
	if err != nil || rev != 3 || string(pt) != secret {
		t.Fatalf("stored %q rev %d, %v", pt, rev, err)
	}
	raw, _ := os.ReadFile(store)
	if bytes.Contains(raw, []byte(secret)) {
		t.Fatal("C1: store file holds the plaintext")
	}
	// A key that does not open the existing slots is refused before writing.
	other := filepath.Join(dir, "other.key")
	Main([]string{"init", "-key", other}, nil, &bytes.Buffer{}, &bytes.Buffer{}, clock)
	var errb bytes.Buffer
	if code := Main([]string{"set", "-store", store, "-key", other, "-slot", "b"}, strings.NewReader("x"), &bytes.Buffer{}, &errb, clock); code != ExitError ||
		!strings.Contains(errb.String(), "is -key the store's key?") {
		t.Fatalf("set with another key: exit %d: %s", code, errb.String())
	}
}

// chunkReader hands out its data a chunk at a time and remembers every
// buffer it wrote into.
type chunkReader struct {
	data    []byte
	chunk   int
	written [][]byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.chunk)], r.data)
	r.data = r.data[n:]
	r.written = append(r.written, p[:n])
	return n, nil
}

// C1: set leaves no copy of the secret in memory it read into (a grown
// and abandoned read buffer held its first part), and an oversized input
// is named as such.
func TestSetLeavesNoCopy(t *testing.T) {
	dir := t.TempDir()
	key, store := filepath.Join(dir, "store.key"), filepath.Join(dir, "secrets.json")
	Main([]string{"init", "-key", key}, nil, &bytes.Buffer{}, &bytes.Buffer{}, clock)
	secret := "sk-" + strings.Repeat("Q", 3000)
	in := &chunkReader{data: []byte(secret), chunk: 100}
	var errb bytes.Buffer
	if code := Main([]string{"set", "-store", store, "-key", key, "-slot", "big"}, in, &bytes.Buffer{}, &errb, clock); code != ExitOK {
		t.Fatalf("set: exit %d: %s", code, errb.String())
	}
	for i, w := range in.written {
		if bytes.Contains(w, []byte("QQQQ")) {
			t.Fatalf("C1: read buffer %d still holds the secret after set returned", i)
		}
	}
	errb.Reset()
	huge := strings.NewReader(strings.Repeat("Q", 10*secretstore.MaxSecretBytes))
	if code := Main([]string{"set", "-store", store, "-key", key, "-slot", "huge"}, huge, &bytes.Buffer{}, &errb, clock); code != ExitError ||
		!strings.Contains(errb.String(), "more than 16384 bytes") {
		t.Fatalf("oversized stdin: exit %d: %s", code, errb.String())
	}
}

// C1: concurrent writers lose nothing: each set reads the store, adds its
// slot and renames a new file; without a lock two of them read the same
// old file and the later rename drops the other's slot.
func TestConcurrentSetsLoseNothing(t *testing.T) {
	dir := t.TempDir()
	key, store := filepath.Join(dir, "store.key"), filepath.Join(dir, "secrets.json")
	Main([]string{"init", "-key", key}, nil, &bytes.Buffer{}, &bytes.Buffer{}, clock)
	const writers = 16
	codes := make(chan string, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var errb bytes.Buffer
			slot := fmt.Sprintf("slot-%02d", i)
			if code := Main([]string{"set", "-store", store, "-key", key, "-slot", slot}, strings.NewReader("sk-"+slot), &bytes.Buffer{}, &errb, clock); code != ExitOK {
				codes <- fmt.Sprintf("%s: exit %d: %s", slot, code, errb.String())
			}
		}()
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		t.Error(c)
	}
	s, err := secretstore.Load(store)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(s.Slots()); got != writers {
		t.Fatalf("C1: %d of %d slots in the store after %d concurrent sets that all reported success", got, writers, writers)
	}
}
