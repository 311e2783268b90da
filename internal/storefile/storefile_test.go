package storefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// K1, C1: writers holding Lock from read to rename lose nothing: 32
// concurrent read-increment-write cycles leave the counter at 32, and the
// file is never seen half-written by a reader without the lock.
func TestLockedRewritesLoseNothing(t *testing.T) {
	leakcheck.Check(t)
	path := filepath.Join(t.TempDir(), "counter")
	if err := WriteAtomic(path, ".c-*.tmp", []byte("0")); err != nil {
		t.Fatal(err)
	}
	const writers = 32
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() { // a reader without the lock, as the edge reads the key store
		defer readers.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := os.ReadFile(path)
			if err != nil {
				errs <- err
				return
			}
			if _, err := strconv.Atoi(string(b)); err != nil {
				errs <- err
				return
			}
		}
	}()
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := Lock(path)
			if err != nil {
				errs <- err
				return
			}
			defer unlock()
			b, err := os.ReadFile(path)
			if err != nil {
				errs <- err
				return
			}
			n, _ := strconv.Atoi(string(b))
			if err := WriteAtomic(path, ".c-*.tmp", []byte(strconv.Itoa(n+1))); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != strconv.Itoa(writers) {
		t.Fatalf("counter %s after %d locked increments, want %d", b, writers, writers)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".c-*.tmp"))
	if len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}

// K1: a failed write leaves the file as it was.
func TestWriteAtomicFailureKeepsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteAtomic(path, ".f-*.tmp", []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := WriteAtomic(filepath.Join(dir, "missing", "f"), ".f-*.tmp", []byte("new")); err == nil {
		t.Fatal("write into a missing directory: got nil error")
	}
	if err := os.Mkdir(filepath.Join(dir, "f.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Renaming a file over a directory fails: the old one stays.
	if err := WriteAtomic(filepath.Join(dir, "f.d"), ".f-*.tmp", []byte("new")); err == nil {
		t.Fatal("rename over a directory: got nil error")
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("file holds %q, want old", b)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".f-*.tmp"))
	if len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}

// SPEC K1, J1, C1: Read, which every store file goes through (the key
// store, its usage file, the enrollment store, the secret store and its
// key), returns a regular file's content, follows a symlink to one, and
// refuses at once — never waiting on it, never reading it whole — a
// FIFO without a writer, a device, a directory and a file over the
// bound, naming the path; a missing file wraps fs.ErrNotExist.
func TestReadRefusesWhatIsNotAStoreFile(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "store.json")
	if err := os.WriteFile(reg, []byte(`{"version":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	fifo := filepath.Join(dir, "fifo")
	big := filepath.Join(dir, "big")
	if err := os.Symlink(reg, link); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 101); err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		path string
		want error
	}{
		{reg, nil}, {link, nil}, {fifo, ErrNotRegular}, {"/dev/null", ErrNotRegular}, {"/dev/zero", ErrNotRegular},
		{dir, ErrNotRegular}, {big, ErrTooLarge}, {filepath.Join(dir, "missing"), fs.ErrNotExist},
	} {
		done := make(chan error, 1)
		var got []byte
		go func() {
			b, _, err := Read(row.path, 100)
			got = b
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			if w, werr := os.OpenFile(fifo, os.O_WRONLY, 0); werr == nil {
				w.Close()
			}
			<-done
			t.Fatalf("%s: Read did not return (it waited on the file)", row.path)
		}
		switch {
		case row.want == nil && (err != nil || string(got) != `{"version":1}`):
			t.Errorf("%s: %q, %v; want the file's content", row.path, got, err)
		case row.want != nil && (!errors.Is(err, row.want) || !strings.Contains(err.Error(), row.path)):
			t.Errorf("%s: %v, want %v naming the path", row.path, err, row.want)
		}
	}
}
