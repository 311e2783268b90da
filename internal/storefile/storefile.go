// Package storefile is how iop's files are rewritten while something else
// may read or rewrite them: the edge's secret store (SPEC C1, `edge
// secrets`), key store (docs/keys.md K1, `edge keys`) and enrollment store
// (SPEC J1, `edge tokens`, joins), the files `edge pki -force` replaces,
// and a node's renewed certificate and key (SPEC J5), which its TLS config
// re-reads at every handshake.
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
	"io"
	"io/fs"
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
	return WriteAtomicMode(path, pattern, data, 0o600)
}

// WriteAtomicMode is WriteAtomic with the file's mode (set independent of
// the umask): 0644 for a certificate or public key.
func WriteAtomicMode(path, pattern string, data []byte, mode fs.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := finish(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	_ = SyncDir(dir) // best effort: some file systems refuse fsync on a directory
	return nil
}

// Create writes a new file (O_EXCL: an existing one is fs.ErrExist) with
// mode perm, set independent of the umask, and fsyncs it: for files that
// appear once, in a directory renamed into place after (`node join`) or
// never overwritten (`edge pki init`).
func Create(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	return finish(f, data, perm)
}

// finish sets f's mode, writes data, syncs and closes f.
func finish(f *os.File, data []byte, perm fs.FileMode) error {
	err := f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// SyncDir fsyncs a directory, so that a rename or a new file in it
// survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Stamp identifies one version of a file without reading it: a rename
// (every WriteAtomic) gives a new inode, an edit in place a new size or
// modification time. Readers that poll a store compare stamps (the key
// store, the enrollment store). The zero Stamp is "no file".
type Stamp struct {
	ok         bool
	dev, ino   uint64
	size, nsec int64
}

// Exists reports whether s is a file's (not the zero Stamp).
func (s Stamp) Exists() bool { return s.ok }

// StampOf is the Stamp of a file's FileInfo.
func StampOf(fi fs.FileInfo) Stamp {
	s := Stamp{ok: true, size: fi.Size(), nsec: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), st.Ino
	}
	return s
}

// StatStamp is the Stamp of the file at path, or the zero Stamp when it
// cannot be stat'ed (missing).
func StatStamp(path string) Stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return Stamp{}
	}
	return StampOf(fi)
}

// MaxRead bounds a store file Read, in bytes (256 MiB: hundreds of
// thousands of keys or nodes).
const MaxRead = 256 << 20

// Errors of Read; test with errors.Is.
var (
	// ErrNotRegular: the path (a symlink followed) is a FIFO, a device, a
	// socket or a directory.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge: the file holds more than the bound.
	ErrTooLarge = errors.New("file too large")
)

// Read returns the content of the regular file at path (a symlink
// followed), at most max bytes, and its FileInfo, so that a store file
// replaced under a running process by something else cannot hold its
// reader or its memory: the file is opened without blocking (a FIFO with
// no writer would hold the open, and a FIFO's or a device's read never
// ends) and refused with ErrNotRegular unless it is a regular file, and
// one of more than max bytes is ErrTooLarge naming the bound. Errors name
// path, never content; the open's error wraps fs.ErrNotExist for a
// missing file.
func Read(path string, max int64) ([]byte, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: %w (mode %v)", path, ErrNotRegular, fi.Mode().Type())
	}
	if fi.Size() > max {
		return nil, nil, fmt.Errorf("%s: %w: %d bytes, at most %d", path, ErrTooLarge, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1)) // a file that grows while it is read
	if err != nil {
		return nil, nil, err
	}
	if int64(len(b)) > max {
		return nil, nil, fmt.Errorf("%s: %w: more than %d bytes", path, ErrTooLarge, max)
	}
	return b, fi, nil
}
