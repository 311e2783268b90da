// Package proctest is test support for the tests that run the built edge and
// node binaries: building one, reading its exit code, and waiting on its log
// output without polling. Its Log is also the log sink of in-process tests
// whose servers and timers write from several goroutines. The binaries
// never import it (./run.sh test checks).
package proctest

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Build compiles the command in the test's package directory into a temp
// dir and returns the binary's path.
func Build(t testing.TB, name string) string {
	t.Helper()
	return BuildPackage(t, ".", name)
}

// BuildPackage compiles the command pkg (an import path, e.g. "iop/edge")
// into a temp dir as name and returns the binary's path: a test of one
// binary that needs the other.
func BuildPackage(t testing.TB, pkg, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// ExitCode is a finished command's exit code: 0 for nil, -1 when it did not
// exit on its own (start failure, signal).
func ExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// Log collects a process's output (an exec.Cmd's Stderr) or a logger's
// lines, safe for concurrent writers, and lets a test wait for a line
// without polling: every Write wakes the waiters. The zero Log is ready.
type Log struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{} // closed and replaced at each Write
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.wrote != nil {
		close(l.wrote)
		l.wrote = nil
	}
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// WaitFor reports whether the output contains s within d.
func (l *Log) WaitFor(s string, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		l.mu.Lock()
		if strings.Contains(l.b.String(), s) {
			l.mu.Unlock()
			return true
		}
		if l.wrote == nil {
			l.wrote = make(chan struct{})
		}
		wrote := l.wrote
		l.mu.Unlock()
		select {
		case <-wrote:
		case <-t.C:
			return strings.Contains(l.String(), s)
		}
	}
}
