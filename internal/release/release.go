// Command release makes iop's release archives (`./run.sh release
// VERSION`, which runs `go run ./internal/release`; flags in main.go): for each target platform one dist/iop_VERSION_linux_ARCH.tar.gz
// holding both binaries, the example configs, the systemd units and
// sysusers file (deploy/), README.md, BENCHMARKS.md and docs/ (the files
// git tracks), and dist/SHA256SUMS over the archives (sha256sum's format, so `sha256sum -c SHA256SUMS` checks
// them on a host without network).
//
// Builds are reproducible: the same source, version, commit, epoch and Go
// toolchain give byte-identical archives. The binaries are built with
// CGO_ENABLED=0, -trimpath, -buildvcs=false (the commit comes in through
// -ldflags -X instead, so a stray file in the tree changes nothing), a
// fixed GOAMD64/GOARM64 baseline, GOTOOLCHAIN=local and GOFLAGS cleared, so
// nothing of the builder's environment or paths is embedded; the archives
// are written by WriteArchive (fixed order, mtimes, owners; gzip without a
// timestamp). It never writes outside Options.Out and never reads files
// outside Options.Src.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// arches are the target architectures (GOOS is linux).
var arches = []string{"amd64", "arm64"}

// programs are the binaries each archive carries, built from ./NAME.
var programs = []string{"edge", "node"}

// paths are what the archive carries from the source tree besides the
// binaries: files, or directories taken whole but for names starting with
// "." and Go files (docs/ holds its own checks). A missing one is an error.
// BENCHMARKS.md is there because README.md and docs/ cite its figures
// (memory per model group, per key) and link it.
var paths = []string{"README.md", "BENCHMARKS.md", "docs", "deploy"}

// Options for Build.
type Options struct {
	// Src is the repository root (go.mod, edge/, node/, README.md, …).
	Src string
	// Out is the directory the archives and SHA256SUMS are written to
	// (created; files of the same names are replaced).
	Out string
	// Version names the release ("0.4.0"): letters, digits, ".", "_",
	// "+" and "-", starting with a letter or digit.
	Version string
	// Commit is the git commit the source is ("…-dirty" for a modified
	// tree); printed by `edge version`.
	Commit string
	// Epoch is SOURCE_DATE_EPOCH: the mtime of every archive entry (the
	// commit's time).
	Epoch time.Time
	// Arches overrides the target architectures (amd64, arm64; tests).
	Arches []string
	// Go is the go command; "" = "go".
	Go string
	// BuildBinary, when set, replaces `go build` (tests): it writes the
	// program ("edge" or "node") for linux/arch to out.
	BuildBinary func(ctx context.Context, program, arch, out string) error
	// Tracked, when non-nil, is the set of files (slash-separated, relative
	// to Src) the archive may carry from paths (README.md, docs/, …): the
	// files git tracks (GitFiles). Any other file there, an untracked
	// draft or a key dropped into deploy/, is left out and logged, so the
	// archive holds what the commit holds. nil packs every file (a source
	// tree that is not a git checkout).
	Tracked map[string]bool
	// Log, when set, gets one line per step.
	Log io.Writer
}

// Artifact is one written archive.
type Artifact struct {
	Name   string // file name in Out
	Size   int64  // bytes
	SHA256 string // hex
}

// versionRE is what Options.Version may be (a file name part, no "/").
var versionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+-]*$`)

// ErrBadVersion: Options.Version is empty or not a plain name.
var ErrBadVersion = errors.New("release: version must be letters, digits, '.', '_', '+', '-', starting with a letter or digit")

// ArchiveName is the archive's file name for version and arch.
func ArchiveName(version, arch string) string {
	return "iop_" + version + "_linux_" + arch + ".tar.gz"
}

// SumsName is the checksum file's name in Out.
const SumsName = "SHA256SUMS"

// Build writes one archive per arch and SHA256SUMS into o.Out and returns
// the archives in arch order. Errors: ErrBadVersion, a missing commit or
// epoch, a failed build, an unreadable source path.
func Build(ctx context.Context, o Options) ([]Artifact, error) {
	if !versionRE.MatchString(o.Version) {
		return nil, fmt.Errorf("%w: %q", ErrBadVersion, o.Version)
	}
	if o.Commit == "" {
		return nil, errors.New("release: no commit given")
	}
	if o.Epoch.Unix() <= 0 {
		return nil, errors.New("release: no SOURCE_DATE_EPOCH given")
	}
	archList := o.Arches
	if archList == nil {
		archList = arches
	}
	build := o.BuildBinary
	if build == nil {
		build = func(ctx context.Context, program, arch, out string) error {
			return goBuild(ctx, o, program, arch, out)
		}
	}
	common, err := collect(o.Src, paths, o.Tracked, o.Log)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(o.Out, ".build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var arts []Artifact
	for _, arch := range archList {
		files := slices.Clone(common)
		for _, prog := range programs {
			bin := filepath.Join(tmp, arch, prog)
			logf(o.Log, "build %s linux/%s", prog, arch)
			if err := build(ctx, prog, arch, bin); err != nil {
				return nil, fmt.Errorf("release: build %s linux/%s: %w", prog, arch, err)
			}
			data, err := os.ReadFile(bin)
			if err != nil {
				return nil, err
			}
			files = append(files, File{Name: "bin/" + prog, Mode: 0o755, Data: data})
		}
		name := ArchiveName(o.Version, arch)
		var buf bytes.Buffer
		top := strings.TrimSuffix(name, ".tar.gz")
		if err := WriteArchive(&buf, top, files, o.Epoch); err != nil {
			return nil, err
		}
		if err := writeFileAtomic(filepath.Join(o.Out, name), buf.Bytes()); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(buf.Bytes())
		arts = append(arts, Artifact{Name: name, Size: int64(buf.Len()), SHA256: hex.EncodeToString(sum[:])})
		logf(o.Log, "wrote %s (%d bytes)", filepath.Join(o.Out, name), buf.Len())
	}
	if err := writeFileAtomic(filepath.Join(o.Out, SumsName), Sums(arts)); err != nil {
		return nil, err
	}
	logf(o.Log, "wrote %s", filepath.Join(o.Out, SumsName))
	return arts, nil
}

// Sums is the SHA256SUMS content: "HEX  NAME\n" per artifact, sorted by
// name (GNU sha256sum's text format, read by `sha256sum -c`).
func Sums(arts []Artifact) []byte {
	sorted := slices.Clone(arts)
	slices.SortFunc(sorted, func(a, b Artifact) int { return strings.Compare(a.Name, b.Name) })
	var b bytes.Buffer
	for _, a := range sorted {
		fmt.Fprintf(&b, "%s  %s\n", a.SHA256, a.Name)
	}
	return b.Bytes()
}

// goBuild runs `go build` for one program with an environment that
// embeds nothing of the builder (see the package comment).
func goBuild(ctx context.Context, o Options, program, arch, out string) error {
	gocmd := o.Go
	if gocmd == "" {
		gocmd = "go"
	}
	ldflags := "-s -w -X main.version=" + o.Version + " -X main.commit=" + o.Commit
	cmd := exec.CommandContext(ctx, gocmd, "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "./"+program)
	cmd.Dir = o.Src
	cmd.Env = BuildEnv(os.Environ(), arch)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w\n%s", err, stderr.Bytes())
	}
	return nil
}

// BuildEnv is env with every variable that changes what `go build` emits
// for linux/arch replaced by the release's fixed value.
func BuildEnv(env []string, arch string) []string {
	fixed := map[string]string{
		"CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": arch,
		"GOAMD64": "v1", "GOARM64": "v8.0", "GO386": "", "GOARM": "",
		"GOFLAGS": "", "GOEXPERIMENT": "", "GOTOOLCHAIN": "local",
		"GOWORK": "off", "CGO_CFLAGS": "", "CGO_LDFLAGS": "",
	}
	out := make([]string, 0, len(env)+len(fixed))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := fixed[k]; !ok {
			out = append(out, kv)
		}
	}
	keys := make([]string, 0, len(fixed))
	for k := range fixed {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+fixed[k])
	}
	return out
}

// collect reads paths (relative to src, slash-separated) into Files:
// a file as is, a directory's regular files recursively. Names starting
// with "." and Go files are skipped inside directories, and so is a file
// not in tracked when tracked is non-nil (logged to log); symlinks and
// other special files are an error (an archive carries regular files only).
func collect(src string, paths []string, tracked map[string]bool, log io.Writer) ([]File, error) {
	var files []File
	add := func(name string, fi fs.FileInfo) error {
		if tracked != nil && !tracked[name] {
			logf(log, "left out %s: git does not track it", name)
			return nil
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("release: %s is not a regular file", name)
		}
		data, err := os.ReadFile(filepath.Join(src, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		mode := int64(0o644)
		if fi.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		files = append(files, File{Name: name, Mode: mode, Data: data})
		return nil
	}
	for _, p := range paths {
		fi, err := os.Lstat(filepath.Join(src, filepath.FromSlash(p)))
		if err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
		if !fi.IsDir() {
			if err := add(p, fi); err != nil {
				return nil, err
			}
			continue
		}
		root := filepath.Join(src, filepath.FromSlash(p))
		err = filepath.WalkDir(root, func(fp string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(d.Name(), ".go") {
				return nil // docs/'s own checks (go test ./docs), not documentation
			}
			if fp != root && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() {
				return nil
			}
			rel, err := filepath.Rel(src, fp)
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			return add(path.Clean(filepath.ToSlash(rel)), fi)
		})
		if err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
	}
	return files, nil
}

// GitFiles is the set of files git tracks under src's paths (README.md,
// BENCHMARKS.md, docs/, deploy/): `git ls-files`, the index, so a file
// added but not yet committed counts (and makes the tree dirty). For
// Options.Tracked. It returns nil
// and no error when src is not inside a git work tree; an error when git
// cannot be run there or fails.
func GitFiles(ctx context.Context, src string) (map[string]bool, error) {
	inside := exec.CommandContext(ctx, "git", "-C", src, "rev-parse", "--is-inside-work-tree")
	if out, err := inside.Output(); err != nil || strings.TrimSpace(string(out)) != "true" {
		var exit *exec.ExitError
		if err == nil || errors.As(err, &exit) {
			return nil, nil // not a checkout (git says so)
		}
		return nil, fmt.Errorf("release: git: %w", err)
	}
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", src, "ls-files", "-z", "--"}, paths...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("release: git ls-files: %w\n%s", err, stderr.Bytes())
	}
	set := map[string]bool{}
	for _, name := range strings.Split(string(out), "\x00") {
		if name != "" {
			set[name] = true
		}
	}
	return set, nil
}

func writeFileAtomic(name string, data []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "[release] "+format+"\n", args...)
	}
}
