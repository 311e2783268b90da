package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// What `edge version` says for each kind of build: the link-time values
// win, the VCS stamp fills a missing commit, and nothing is made up.
func TestFromBuild(t *testing.T) {
	stamp := func(kv ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8"}
		for i := 0; i+1 < len(kv); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return bi
	}
	tests := []struct {
		name             string
		version, commit  string
		bi               *debug.BuildInfo
		wantVer, wantCom string
	}{
		{"release build: link-time values", "0.4.0", "abc123", stamp(), "0.4.0", "abc123"},
		{"release build ignores a VCS stamp", "0.4.0", "abc123", stamp("vcs.revision", "fff", "vcs.modified", "true"), "0.4.0", "abc123"},
		{"go build with a VCS stamp", "", "", stamp("vcs.revision", "def456", "vcs.modified", "false"), "dev", "def456"},
		{"go build of a modified tree", "", "", stamp("vcs.revision", "def456", "vcs.modified", "true"), "dev", "def456-dirty"},
		{"go build -buildvcs=false", "", "", stamp("-buildmode", "exe"), "dev", "unknown"},
		{"no build info", "", "", nil, "dev", "unknown"},
		{"run.sh build: version only", "v1-3-gabc", "", stamp(), "v1-3-gabc", "unknown"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := fromBuild("edge", tc.version, tc.commit, tc.bi)
			if got.Version != tc.wantVer || got.Commit != tc.wantCom {
				t.Errorf("got version %q commit %q, want %q %q", got.Version, got.Commit, tc.wantVer, tc.wantCom)
			}
			if got.GoVersion == "" || got.Platform != runtime.GOOS+"/"+runtime.GOARCH {
				t.Errorf("go %q platform %q", got.GoVersion, got.Platform)
			}
		})
	}
}

func TestString(t *testing.T) {
	in := Info{Program: "node", Version: "0.4.0", Commit: "abc", GoVersion: "go1.26.8", Platform: "linux/arm64"}
	if got, want := in.String(), "node 0.4.0 commit abc go1.26.8 linux/arm64"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// The running test binary: a go build, so "dev" and a Go version.
	if s := Read("edge", "", "").String(); !strings.HasPrefix(s, "edge dev commit ") || !strings.Contains(s, runtime.Version()) {
		t.Errorf("Read: %q", s)
	}
}
