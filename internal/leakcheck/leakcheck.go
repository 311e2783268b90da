// Package leakcheck fails a test that leaves goroutines running after it
// ends (M2: every goroutine has a named owner and an exit; tests check for
// leaks).
//
// It owns one check: the process's goroutine count before a test against
// the count after every other cleanup of that test has run. It is for
// _test.go files only (it imports testing); product code must never import
// it. It starts no goroutines, keeps no package-level state and reads no
// environment.
//
// The count is process-wide, so the check is only meaningful when no other
// test of the same package runs at the same time (no t.Parallel siblings).
// Call it outside testing/synctest bubbles: synctest.Test already fails when
// a bubble's goroutine outlives the bubble, and inside a bubble the deadline
// below would run on the bubble's fake clock.
package leakcheck

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Timeout is how long Check's cleanup waits for the goroutine count to come
// back down before it fails the test (10 s).
const Timeout = 10 * time.Second

// pollInterval is how often the cleanup re-reads the count (5 ms). A
// goroutine's exit has no signal to wait on, so polling the counter on a
// ticker is the only way.
const pollInterval = 5 * time.Millisecond

// maxStacks caps the stack dump in a failure message (256 KiB).
const maxStacks = 256 << 10

// Check records runtime.NumGoroutine now and registers a t.Cleanup that
// waits, polling every 5 ms for up to Timeout (10 s), until the count is at
// most that start value; if it never is, the cleanup fails t with t.Errorf,
// both counts and the stacks of every goroutine (truncated to 256 KiB).
//
// Call it first in a test, before anything that registers a cleanup or
// starts a goroutine: cleanups run last-in first-out, so its cleanup then
// runs last, after the test's own cleanups have closed servers and
// connections. In a table test, call it first in each t.Run body.
func Check(t testing.TB) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		n, waited := waitDown(base)
		if n <= base {
			return
		}
		t.Errorf("goroutine leak: %d goroutines at the start of the test, %d still running %v after it ended (M2); stacks:\n%s",
			base, n, waited, stacks())
	})
}

// waitDown polls runtime.NumGoroutine until it is at most base or Timeout
// has passed, and returns the last count and how long it waited.
func waitDown(base int) (int, time.Duration) {
	start := time.Now()
	deadline := start.Add(Timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		n := runtime.NumGoroutine()
		if n <= base || !time.Now().Before(deadline) {
			return n, time.Since(start).Round(time.Millisecond)
		}
		<-tick.C
	}
}

// stacks returns the stacks of all goroutines, at most maxStacks bytes of
// them, marked when cut.
func stacks() string {
	buf := make([]byte, maxStacks)
	n := runtime.Stack(buf, true)
	if n == len(buf) {
		return string(buf) + fmt.Sprintf("\n… (stacks truncated at %d KiB)", maxStacks>>10)
	}
	return string(buf[:n])
}
