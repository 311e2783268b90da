// Package buildinfo says what a binary is: the version and commit it was
// built from and the Go toolchain and platform it was built with, for
// `edge version`, `node version` and their -version flags.
//
// A release build (`./run.sh release`, internal/release) sets the version
// and commit at link time (-ldflags "-X main.version=… -X main.commit=…")
// and builds with -buildvcs=false, so that the binary depends on the source
// alone. A plain `go build` sets neither: the commit then comes from the
// VCS stamp the go command embeds (vcs.revision, vcs.modified) when it
// did, and is "unknown" when it did not (-buildvcs=false, no git). Either
// way what is printed is true. It owns no state; main passes its link-time
// values in.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Info describes one binary.
type Info struct {
	// Program is "edge" or "node".
	Program string
	// Version is the release version ("0.4.0"), or "dev" for a build that
	// was given none.
	Version string
	// Commit is the full git commit id the binary was built from, with
	// "-dirty" when the tree had uncommitted changes; "unknown" when the
	// build recorded none.
	Commit string
	// GoVersion is the toolchain (runtime.Version, e.g. "go1.26.8").
	GoVersion string
	// Platform is GOOS/GOARCH.
	Platform string
}

// Read returns the Info of the running binary. version and commit are the
// link-time values (empty when not set); an empty version is "dev" and an
// empty commit is taken from the build's VCS stamp.
func Read(program, version, commit string) Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuild(program, version, commit, bi)
}

// fromBuild is Read over a given build info (nil when the binary has none).
func fromBuild(program, version, commit string, bi *debug.BuildInfo) Info {
	in := Info{Program: program, Version: version, Commit: commit, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		if in.Commit == "" {
			var rev string
			var dirty bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if rev != "" {
				in.Commit = rev
				if dirty {
					in.Commit += "-dirty"
				}
			}
		}
	}
	if in.Version == "" {
		in.Version = "dev"
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	return in
}

// String is the one line `edge version` prints:
//
//	edge 0.4.0 commit 12ba18a85433edab0df5c3c9ebe7e9fd3da0d45b go1.26.8 linux/amd64
func (in Info) String() string {
	var b strings.Builder
	b.WriteString(in.Program)
	b.WriteByte(' ')
	b.WriteString(in.Version)
	b.WriteString(" commit ")
	b.WriteString(in.Commit)
	b.WriteByte(' ')
	b.WriteString(in.GoVersion)
	b.WriteByte(' ')
	b.WriteString(in.Platform)
	return b.String()
}
