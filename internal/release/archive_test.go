package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

var epoch = time.Unix(1767225600, 0) // 2026-01-01T00:00:00Z

// entry is one archive member as a test sees it.
type entry struct {
	name       string
	typ        byte
	mode       int64
	uid, gid   int
	uname      string
	mtime      time.Time
	data       string
	paxRecords int
}

// readArchive returns the gzip header and the tar members of b in order.
func readArchive(t *testing.T, b []byte) (gzip.Header, []entry) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out = append(out, entry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Uname + h.Gname, h.ModTime, string(data), len(h.PAXRecords)})
	}
	return zr.Header, out
}

// Reproducible archives: the same files give the same bytes whatever order
// they come in; every member has the epoch as mtime, owner 0/0 without
// names, sorted names with each directory once before its files; the gzip
// header carries no name and no time.
func TestWriteArchiveReproducible(t *testing.T) {
	files := []File{
		{Name: "bin/edge", Mode: 0o755, Data: []byte("ELF edge")},
		{Name: "README.md", Mode: 0o644, Data: []byte("# iop\n")},
		{Name: "deploy/systemd/iop-edge.service", Mode: 0o600, Data: []byte("[Unit]\n")},
		{Name: "bin/node", Mode: 0o4755, Data: []byte("ELF node")},
		{Name: "docs/install.md", Mode: 0o644, Data: nil},
	}
	var a, b bytes.Buffer
	if err := WriteArchive(&a, "iop_1.0_linux_amd64", files, epoch.Add(999*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	rev := slices.Clone(files)
	slices.Reverse(rev)
	if err := WriteArchive(&b, "iop_1.0_linux_amd64", rev, epoch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same files in another order (and a sub-second epoch) gave different bytes")
	}
	zh, got := readArchive(t, a.Bytes())
	if !zh.ModTime.IsZero() || zh.Name != "" || zh.Comment != "" || zh.OS != 255 {
		t.Errorf("gzip header %+v: want no time, name or comment and OS 255", zh)
	}
	want := []struct {
		name string
		typ  byte
		mode int64
		data string
	}{
		{"iop_1.0_linux_amd64/", tar.TypeDir, 0o755, ""},
		{"iop_1.0_linux_amd64/README.md", tar.TypeReg, 0o644, "# iop\n"},
		{"iop_1.0_linux_amd64/bin/", tar.TypeDir, 0o755, ""},
		{"iop_1.0_linux_amd64/bin/edge", tar.TypeReg, 0o755, "ELF edge"},
		{"iop_1.0_linux_amd64/bin/node", tar.TypeReg, 0o755, "ELF node"}, // setuid bit dropped
		{"iop_1.0_linux_amd64/deploy/", tar.TypeDir, 0o755, ""},
		{"iop_1.0_linux_amd64/deploy/systemd/", tar.TypeDir, 0o755, ""},
		{"iop_1.0_linux_amd64/deploy/systemd/iop-edge.service", tar.TypeReg, 0o600, "[Unit]\n"},
		{"iop_1.0_linux_amd64/docs/", tar.TypeDir, 0o755, ""},
		{"iop_1.0_linux_amd64/docs/install.md", tar.TypeReg, 0o644, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("%d members, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.name != w.name || g.typ != w.typ || g.mode != w.mode || g.data != w.data {
			t.Errorf("member %d: got %q type %c mode %o %q, want %q type %c mode %o %q", i, g.name, g.typ, g.mode, g.data, w.name, w.typ, w.mode, w.data)
		}
		if g.uid != 0 || g.gid != 0 || g.uname != "" || !g.mtime.Equal(epoch) || g.paxRecords != 0 {
			t.Errorf("%s: uid %d gid %d names %q mtime %v pax %d, want 0 0 \"\" %v 0", g.name, g.uid, g.gid, g.uname, g.mtime, g.paxRecords, epoch)
		}
	}
}

// Bad member names are refused before anything could be written outside
// the top directory by an unpacking tar.
func TestWriteArchiveRefuses(t *testing.T) {
	tests := []struct {
		name  string
		top   string
		files []File
		want  string
	}{
		{"parent", "top", []File{{Name: "../etc/passwd"}}, "bad file name"},
		{"absolute", "top", []File{{Name: "/etc/passwd"}}, "bad file name"},
		{"not clean", "top", []File{{Name: "a//b"}}, "bad file name"},
		{"inner parent", "top", []File{{Name: "a/../../b"}}, "bad file name"},
		{"empty", "top", []File{{Name: ""}}, "bad file name"},
		{"duplicate", "top", []File{{Name: "a"}, {Name: "a"}}, "listed twice"},
		{"top with a slash", "a/b", nil, "top directory"},
		{"top dot-dot", "..", nil, "top directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteArchive(io.Discard, tc.top, tc.files, epoch)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
