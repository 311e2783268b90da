package storefile

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

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
