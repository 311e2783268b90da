package main

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
)

// File is one regular file of an archive.
type File struct {
	// Name is the slash-separated path inside the archive's top directory
	// ("bin/edge", "docs/install.md"); no "..", no leading slash.
	Name string
	// Mode is 0o755 for programs, 0o644 otherwise; only the permission
	// bits are used.
	Mode int64
	// Data is the file's content.
	Data []byte
}

// WriteArchive writes files as a gzip-compressed tar (POSIX pax format)
// under the top directory top (e.g. "iop_0.4.0_linux_amd64"), so that the
// same files give the same bytes whatever the order they are given in and
// whatever the machine (https://reproducible-builds.org/docs/archives/):
//
//   - entries are sorted by name, each directory listed once before its
//     first file;
//   - every entry has mtime mtime (SOURCE_DATE_EPOCH, whole seconds), uid
//     and gid 0 and no user or group name, mode 0755 for directories;
//   - the gzip header has no name, no mtime and OS "unknown" (255), and
//     the compression level is fixed (gzip.BestCompression).
//
// The bytes then depend on compress/flate of the Go toolchain that runs it,
// which the release pins (the go.mod toolchain). Errors: a bad or duplicate
// name, or the writer's.
func WriteArchive(w io.Writer, top string, files []File, mtime time.Time) error {
	if err := checkName(top); err != nil || strings.Contains(top, "/") {
		return fmt.Errorf("archive top directory %q: not a single path element", top)
	}
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	for i, f := range sorted {
		if err := checkName(f.Name); err != nil {
			return err
		}
		if i > 0 && sorted[i-1].Name == f.Name {
			return fmt.Errorf("archive: %s listed twice", f.Name)
		}
	}
	mtime = time.Unix(mtime.Unix(), 0).UTC()
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	zw.Header = gzip.Header{OS: 255}
	tw := tar.NewWriter(zw)
	dirs := map[string]bool{}
	var mkdir func(dir string) error
	mkdir = func(dir string) error {
		if dirs[dir] {
			return nil
		}
		if parent := path.Dir(dir); parent != "." {
			if err := mkdir(parent); err != nil {
				return err
			}
		}
		dirs[dir] = true
		return tw.WriteHeader(header(dir+"/", tar.TypeDir, 0o755, 0, mtime))
	}
	if err := mkdir(top); err != nil {
		return err
	}
	for _, f := range sorted {
		name := top + "/" + f.Name
		if err := mkdir(path.Dir(name)); err != nil {
			return err
		}
		if err := tw.WriteHeader(header(name, tar.TypeReg, f.Mode&0o777, int64(len(f.Data)), mtime)); err != nil {
			return err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func header(name string, typ byte, mode, size int64, mtime time.Time) *tar.Header {
	return &tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: size, ModTime: mtime, Format: tar.FormatPAX}
}

// checkName refuses what could land outside the archive's top directory
// or be read differently by another tar.
func checkName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == "." ||
		slices.Contains(strings.Split(name, "/"), "..") || strings.ContainsAny(name, "\\\x00") {
		return fmt.Errorf("archive: bad file name %q", name)
	}
	return nil
}
