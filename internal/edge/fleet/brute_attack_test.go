package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/storefile"
)

// SPEC J1, J4, attacked: guessing join tokens. A wrong token id and a
// wrong secret get the same refusal for the same work — one hash of the
// secret and one constant-time compare (before, an unknown id returned
// without hashing, so the refusal's time told which ids exist) — and a
// burst of 20 wrong tokens from one peer meets enrollment.joins_per_minute
// (5): 5 are checked and refused "invalid join token", 15 answered busy
// unread; nothing is written to the store. The bound is the edge's, not
// the peer's: the burst spends the minute's joins of everyone (J4). With
// 256-bit secrets, that rate leaves guessing at nothing.
func TestJ1TokenGuessesCostTheSameAndAreBounded(t *testing.T) {
	leakcheck.Check(t)
	tok := tokenFor("4abcc7fa34f62fd8", "s3cret")
	tok.Node = "gpu-3"
	st := &Store{Tokens: []*Token{tok}}
	calls := 0
	secretMatches = func(secret, want string) bool { calls++; return identity.SecretMatches(secret, want) }
	defer func() { secretMatches = identity.SecretMatches }()
	for _, row := range []struct{ name, id, secret string }{
		{"an unknown id", "0000000000000000", "s3cret"},
		{"an empty id", "", ""},
		{"an unknown id, the secret of the no-token hash", "0000000000000000", "no token has this id"},
		{"a wrong secret", "4abcc7fa34f62fd8", "guess"},
	} {
		calls = 0
		_, err := st.CheckJoin(row.id, row.secret, "gpu-3", t0)
		if err != ErrBadToken || calls != 1 {
			t.Errorf("%s: %v after %d secret compares, want %v after 1", row.name, err, calls, ErrBadToken)
		}
	}

	e := newEdgeEnv(t, func(m map[string]any) {
		m["enrollment"].(map[string]any)["joins_per_minute"] = 5
	})
	good := e.token(t, nil)
	before := e.storeBytes(t)
	answers := map[string]int{}
	for i := range 20 {
		guess := good
		if i%2 == 0 {
			guess.ID = fmt.Sprintf("%016x", i)
		} else {
			guess.Secret = strings.Repeat("A", len(good.Secret))
		}
		resp, err := join(t, e.addr, good.Pin, joinReq(t, guess, "gpu-3", "gpu-3"))
		if err != nil {
			t.Fatalf("guess %d: %v", i, err)
		}
		if resp.GetOk() {
			t.Fatalf("guess %d joined", i)
		}
		msg := resp.GetError()
		if strings.HasPrefix(msg, "edge busy") {
			msg = "edge busy"
		}
		answers[msg]++
	}
	if len(answers) != 2 || answers[ErrBadToken.Error()] != 5 || answers["edge busy"] != 15 {
		t.Errorf("answers %v, want 5 %q (an unknown id and a wrong secret alike) and 15 busy", answers, ErrBadToken)
	}
	if string(e.storeBytes(t)) != string(before) {
		t.Error("a refused guess changed the enrollment store")
	}
}

// SPEC J1, attacked: the enrollment store replaced under a running edge by
// a symlink to a FIFO (an open of it would wait for a writer forever), to
// a device, by a directory or by a sparse file over storefile.MaxRead is
// refused at once, naming the file and why (the watcher then keeps the
// store in effect, TestWatchBadStore).
func TestJ1EnrollmentStoreNotRegularOrHuge(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		name, why string
		make      func(path string) error
	}{
		{"a symlink to a FIFO", "not a regular file", func(p string) error { return os.Symlink(fifo, p) }},
		{"a symlink to /dev/null", "not a regular file", func(p string) error { return os.Symlink("/dev/null", p) }},
		{"a directory", "not a regular file", func(p string) error { return os.Mkdir(p, 0o700) }},
		{"a sparse file over the bound", "file too large", func(p string) error {
			if err := os.WriteFile(p, []byte(`{"version":1}`), 0o600); err != nil {
				return err
			}
			return os.Truncate(p, storefile.MaxRead+1)
		}},
	} {
		path := filepath.Join(dir, strings.NewReplacer(" ", "-", "/", "").Replace(row.name)+".json")
		if err := row.make(path); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := LoadStore(path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), row.why) || !strings.Contains(err.Error(), path) {
				t.Errorf("%s: %v, want an error naming %s and %q", row.name, err, path, row.why)
			}
		case <-time.After(10 * time.Second):
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			<-done
			t.Errorf("%s: LoadStore did not return (it waited on the file)", row.name)
		}
	}
}
