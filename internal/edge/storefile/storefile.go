// Package storefile is how the Edge's store files are rewritten while
// something else may read or rewrite them: the secret store (SPEC C1,
// `edge secrets`) and the key store (docs/keys.md K1, `edge keys`).
//
//   - Lock serializes writers across processes: a writer holds it from
//     reading the file to renaming the new one into place, so two
//     concurrent commands never both read the old file and lose one
//     change to the other's rename.
//   - WriteAtomic replaces a file so that a reader without the lock sees
//     the old file or the new one, never a part of either: a temporary
//     file in the same directory, fsync, rename, fsync of the directory.
//
// It knows nothing of the files' formats, never logs, and puts no file
// content into an error.
package storefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Lock takes an exclusive advisory lock (flock(2)) on path's lock file,
// path + ".lock" (created mode 0600, left in place), waiting while another
// process or goroutine holds it, and returns its release. Readers need
// none (WriteAtomic renames). The lock is released when the process ends,
// so a writer that crashes never leaves it held.
func Lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil // closing the descriptor releases the lock
}

// WriteAtomic replaces path's content with data, mode 0600: a temporary
// file named after pattern (os.CreateTemp, e.g. ".keys-*.tmp") in path's
// directory, written and fsynced, renamed over path, and the directory
// fsynced so that the rename survives a crash. On an error path is
// unchanged and the temporary file is gone.
func WriteAtomic(path, pattern string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // best effort: some file systems refuse fsync on a directory
		d.Close()
	}
	return nil
}
