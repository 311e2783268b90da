package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// repoRoot is the repository root (this package is internal/release).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root: %v", err)
	}
	return root
}

// fakeTree writes a minimal source tree: what Build packs, with the given
// mtimes and modes, plus files it must leave out (dot files, Go files,
// what is not in paths).
func fakeTree(t *testing.T, mtime time.Time, mode fs.FileMode) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"README.md":                       "# iop\n",
		"docs/install.md":                 "# Installing\n",
		"docs/.install.md.swp":            "editor junk",
		"docs/.hidden/x":                  "junk",
		"docs/layout_test.go":             "package docs",
		"deploy/systemd/iop-edge.service": "[Unit]\n",
		"deploy/sysusers.d/iop.conf":      "u iop-edge -\n",
		"BENCHMARKS.md":                   "# Benchmarks\n",
		"scripts/bench.sh":                "not packed",
		"internal/x.go":                   "package x",
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// fakeBuild stands in for `go build`: deterministic bytes per program and
// arch.
func fakeBuild(_ context.Context, program, arch, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte("ELF "+program+" "+arch), 0o700)
}

// Reproducible release: two trees with the same content but other paths,
// mtimes and file modes (a checkout under another umask) give the same
// archives and SHA256SUMS; each archive holds both binaries, README.md,
// BENCHMARKS.md, docs/ and deploy/ and nothing else (no dot files, no source); the sums
// are sha256sum's format over the archive bytes.
func TestBuildReproducible(t *testing.T) {
	o := Options{Version: "1.2.3", Commit: "abc", Epoch: epoch, BuildBinary: fakeBuild}
	o1, o2 := o, o
	o1.Src, o1.Out = fakeTree(t, time.Unix(1000, 0), 0o644), t.TempDir()
	o2.Src, o2.Out = fakeTree(t, time.Now(), 0o664), filepath.Join(t.TempDir(), "nested", "dist")
	a1, err := Build(context.Background(), o1)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := Build(context.Background(), o2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a1, a2) {
		t.Fatalf("artifacts differ:\n%+v\n%+v", a1, a2)
	}
	names := []string{"iop_1.2.3_linux_amd64.tar.gz", "iop_1.2.3_linux_arm64.tar.gz"}
	for i, n := range names {
		if a1[i].Name != n {
			t.Errorf("artifact %d: %s, want %s", i, a1[i].Name, n)
		}
		b1, _ := os.ReadFile(filepath.Join(o1.Out, n))
		b2, _ := os.ReadFile(filepath.Join(o2.Out, n))
		if len(b1) == 0 || !bytes.Equal(b1, b2) {
			t.Errorf("%s: %d and %d bytes, not identical", n, len(b1), len(b2))
		}
		sum := sha256.Sum256(b1)
		if a1[i].SHA256 != hex.EncodeToString(sum[:]) || a1[i].Size != int64(len(b1)) {
			t.Errorf("%s: artifact %+v does not describe the file", n, a1[i])
		}
		_, members := readArchive(t, b1)
		var got []string
		for _, m := range members {
			got = append(got, m.name)
		}
		top := strings.TrimSuffix(n, ".tar.gz") + "/"
		arch := strings.TrimSuffix(strings.TrimPrefix(n, "iop_1.2.3_linux_"), ".tar.gz")
		want := []string{top, top + "BENCHMARKS.md", top + "README.md", top + "bin/", top + "bin/edge", top + "bin/node", top + "deploy/",
			top + "deploy/systemd/", top + "deploy/systemd/iop-edge.service", top + "deploy/sysusers.d/",
			top + "deploy/sysusers.d/iop.conf", top + "docs/", top + "docs/install.md"}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s members:\n got %q\nwant %q", n, got, want)
		}
		for _, m := range members {
			if strings.HasSuffix(m.name, "/bin/edge") && (m.data != "ELF edge "+arch || m.mode != 0o755) {
				t.Errorf("%s: %q mode %o, want the %s build, 0755", m.name, m.data, m.mode, arch)
			}
			if strings.HasSuffix(m.name, ".md") && m.mode != 0o644 {
				t.Errorf("%s: mode %o, want 0644 whatever the checkout's", m.name, m.mode)
			}
		}
	}
	sums, _ := os.ReadFile(filepath.Join(o1.Out, SumsName))
	want := fmt.Sprintf("%s  %s\n%s  %s\n", a1[0].SHA256, names[0], a1[1].SHA256, names[1])
	if string(sums) != want {
		t.Errorf("SHA256SUMS:\n%s\nwant\n%s", sums, want)
	}
	if sha, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command(sha, "-c", SumsName)
		cmd.Dir = o1.Out
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum -c: %v\n%s", err, out)
		}
	}
	left, _ := filepath.Glob(filepath.Join(o1.Out, ".build-*"))
	if len(left) != 0 {
		t.Errorf("temporary build directories left in the output: %v", left)
	}
}

// Build refuses what would make a misnamed or unverifiable release.
func TestBuildRefuses(t *testing.T) {
	src := fakeTree(t, epoch, 0o644)
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"no version", Options{Commit: "c", Epoch: epoch}, "version must be"},
		{"version with a slash", Options{Version: "1/2", Commit: "c", Epoch: epoch}, "version must be"},
		{"version with a dash first", Options{Version: "-x", Commit: "c", Epoch: epoch}, "version must be"},
		{"no commit", Options{Version: "1", Epoch: epoch}, "no commit"},
		{"no epoch", Options{Version: "1", Commit: "c"}, "SOURCE_DATE_EPOCH"},
		{"a missing path", Options{Version: "1", Commit: "c", Epoch: epoch, Src: t.TempDir()}, "README.md"},
		{"a failing build", Options{Version: "1", Commit: "c", Epoch: epoch, Src: src,
			BuildBinary: func(context.Context, string, string, string) error { return errors.New("compile error") }}, "build edge linux/amd64: compile error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Out = t.TempDir()
			if tc.o.Src == "" {
				tc.o.Src = src
			}
			if tc.o.BuildBinary == nil {
				tc.o.BuildBinary = fakeBuild
			}
			_, err := Build(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("a symlink in a packed directory", func(t *testing.T) {
		src := fakeTree(t, epoch, 0o644)
		if err := os.Symlink("/etc/passwd", filepath.Join(src, "docs", "passwd")); err != nil {
			t.Fatal(err)
		}
		_, err := Build(context.Background(), Options{Version: "1", Commit: "c", Epoch: epoch, Src: src, Out: t.TempDir(), BuildBinary: fakeBuild})
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("got %v, want the symlink refused", err)
		}
	})
}

// The go build environment: every variable that changes the output is the
// release's, whatever the builder's shell had.
func TestBuildEnv(t *testing.T) {
	env := BuildEnv([]string{"HOME=/root", "GOFLAGS=-race -buildvcs=true", "GOAMD64=v3", "CGO_ENABLED=1", "GOARCH=386",
		"GOTOOLCHAIN=auto", "GOPATH=/go", "GOEXPERIMENT=foo"}, "arm64")
	get := func(k string) (string, int) {
		v, n := "", 0
		for _, kv := range env {
			if key, val, _ := strings.Cut(kv, "="); key == k {
				v, n = val, n+1
			}
		}
		return v, n
	}
	want := map[string]string{"HOME": "/root", "GOPATH": "/go", "GOFLAGS": "", "GOAMD64": "v1", "GOARM64": "v8.0",
		"CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": "arm64", "GOTOOLCHAIN": "local", "GOEXPERIMENT": ""}
	for k, w := range want {
		if v, n := get(k); v != w || n != 1 {
			t.Errorf("%s=%q (%d times), want %q once", k, v, n, w)
		}
	}
}

// copyTree copies the files of src that a build reads (everything but
// .git, bin, dist, .run) to a new directory.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "elsewhere", "iop")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() && (rel == ".git" || rel == "bin" || rel == "dist" || rel == ".run" || rel == "tmp") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// Reproducible release, the real thing (./run.sh e2e sets
// IOP_RELEASE_BUILD=1: it builds four binaries twice, a minute or more on
// a cold cache): the repository and a copy of it at another path give
// byte-identical archives for both architectures, and the amd64 edge and
// node of the archive print the release's version and commit.
func TestReleaseReproducible(t *testing.T) {
	if os.Getenv("IOP_RELEASE_BUILD") != "1" {
		t.Skip("set IOP_RELEASE_BUILD=1 to build the release twice and compare (./run.sh e2e does)")
	}
	root := repoRoot(t)
	o := Options{Version: "0.0.0-repro", Commit: "0123456789abcdef0123456789abcdef01234567", Epoch: epoch}
	o1, o2 := o, o
	o1.Src, o1.Out = root, t.TempDir()
	o2.Src, o2.Out = copyTree(t, root), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	a1, err := Build(ctx, o1)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := Build(ctx, o2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a1 {
		t.Logf("%s: %d bytes, sha256 %s", a1[i].Name, a1[i].Size, a1[i].SHA256)
		if a1[i] != a2[i] {
			t.Errorf("not reproducible: %+v from %s, %+v from %s", a1[i], o1.Src, a2[i], o2.Src)
		}
	}
	s1, _ := os.ReadFile(filepath.Join(o1.Out, SumsName))
	s2, _ := os.ReadFile(filepath.Join(o2.Out, SumsName))
	if !bytes.Equal(s1, s2) {
		t.Errorf("SHA256SUMS differ:\n%s\n%s", s1, s2)
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		return
	}
	// The archive's binaries say what they are.
	b, err := os.ReadFile(filepath.Join(o1.Out, ArchiveName(o.Version, "amd64")))
	if err != nil {
		t.Fatal(err)
	}
	_, members := readArchive(t, b)
	dir := t.TempDir()
	for _, m := range members {
		prog := filepath.Base(m.name)
		if !strings.Contains(m.name, "/bin/") || m.typ != '0' {
			continue
		}
		exe := filepath.Join(dir, prog)
		if err := os.WriteFile(exe, []byte(m.data), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(exe, "version").CombinedOutput()
		want := prog + " 0.0.0-repro commit " + o.Commit + " " + runtime.Version() + " linux/amd64\n"
		if err != nil || string(out) != want {
			t.Errorf("%s version: %v %q, want %q", prog, err, out, want)
		}
		if strings.Contains(m.data, root) {
			t.Errorf("%s embeds the build path %s (-trimpath)", prog, root)
		}
	}
}

// An archive holds what the commit holds: with Options.Tracked (the files
// git tracks) a file git does not know under a packed directory — a draft
// left in docs/, a key dropped into deploy/ — is left out and logged, so
// neither a secret nor a stray file reaches a host, and a second builder
// from the commit gets the same bytes (P4: no secret anywhere observable).
func TestBuildTrackedOnly(t *testing.T) {
	src := fakeTree(t, epoch, 0o644)
	for name, data := range map[string]string{"deploy/examples/ca.key": "PRIVATE KEY", "docs/draft.md": "# draft"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, filepath.FromSlash(name)), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tracked := map[string]bool{"README.md": true, "BENCHMARKS.md": true, "docs/install.md": true, "deploy/systemd/iop-edge.service": true,
		"deploy/sysusers.d/iop.conf": true}
	var log bytes.Buffer
	o := Options{Version: "1.2.3", Commit: "abc", Epoch: epoch, BuildBinary: fakeBuild, Arches: []string{"amd64"},
		Src: src, Out: t.TempDir(), Tracked: tracked, Log: &log}
	if _, err := Build(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(o.Out, ArchiveName("1.2.3", "amd64")))
	if err != nil {
		t.Fatal(err)
	}
	_, members := readArchive(t, b)
	var got []string
	for _, m := range members {
		if m.typ == '0' {
			got = append(got, strings.TrimPrefix(m.name, "iop_1.2.3_linux_amd64/"))
		}
	}
	want := []string{"BENCHMARKS.md", "README.md", "bin/edge", "bin/node", "deploy/systemd/iop-edge.service", "deploy/sysusers.d/iop.conf", "docs/install.md"}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("files %q, want %q (the tracked ones and the binaries)", got, want)
	}
	for _, name := range []string{"deploy/examples/ca.key", "docs/draft.md"} {
		if !strings.Contains(log.String(), "left out "+name+": git does not track it") {
			t.Errorf("log does not name %s:\n%s", name, log.String())
		}
	}
}

// GitFiles is what git tracks under the packed paths: not an untracked or
// an ignored file, not a file outside them; a directory that is not a
// git checkout gives nil (every file packed).
func TestGitFiles(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed")
	}
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command(gitBin, append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	for name, data := range map[string]string{"README.md": "#", "docs/install.md": "#", "deploy/systemd/iop-edge.service": "[Unit]",
		".gitignore": "*.key\n", "main.go": "package main"} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("add", ".")
	git("commit", "-q", "-m", "x")
	for _, name := range []string{"docs/draft.md", "deploy/examples/ca.key"} { // untracked; ignored
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := GitFiles(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"README.md": true, "docs/install.md": true, "deploy/systemd/iop-edge.service": true}
	if !maps.Equal(got, want) {
		t.Errorf("GitFiles = %v, want %v", got, want)
	}
	if got, err := GitFiles(context.Background(), t.TempDir()); got != nil || err != nil {
		t.Errorf("outside a checkout: %v, %v; want nil, nil", got, err)
	}
}

// The documentation in the archive is whole: every relative link of its
// Markdown files (README.md's to BENCHMARKS.md and docs/, the docs' to
// each other) names a file the archive carries, so a host without network
// follows them all.
func TestArchiveLinks(t *testing.T) {
	files, err := collect(repoRoot(t), paths, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		have[f.Name] = true
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range files {
		if !strings.HasSuffix(f.Name, ".md") {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(string(f.Data), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			name := path.Clean(path.Join(path.Dir(f.Name), target))
			if !have[name] && !have[name+"/"] && !hasPrefixIn(have, name+"/") {
				t.Errorf("%s links %s: not in the archive", f.Name, m[1])
			}
		}
	}
}

// hasPrefixIn reports whether some name in set starts with prefix (a
// link to a directory the archive carries).
func hasPrefixIn(set map[string]bool, prefix string) bool {
	for name := range set {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}
