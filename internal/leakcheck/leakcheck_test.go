package leakcheck_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
)

// fakeTB records what Check does with its testing.TB: the cleanups it
// registers and the failures it reports. Any other method reaches the nil
// embedded TB and panics, which fails the real test.
type fakeTB struct {
	testing.TB
	cleanups []func()
	errors   []string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

// parked is the goroutine under test: it runs until release is closed or,
// when exitAfter > 0, until exitAfter has passed. Its name must appear in
// the failure's stacks.
func parked(release <-chan struct{}, exitAfter time.Duration) {
	var timeout <-chan time.Time
	if exitAfter > 0 {
		timeout = time.After(exitAfter)
	}
	select {
	case <-release:
	case <-timeout:
	}
}

// parkedCount is how many parked goroutines a row starts. The count Check
// compares is process-wide, and the goroutine that ran the previous subtest
// may still be exiting while the next row takes its start count; several
// parked goroutines keep such a stray exit from hiding them.
const parkedCount = 4

// slack is how much longer than its bound a cleanup may wait. The poll
// runs on the bubble's fake clock, but the count it reads is
// process-wide: a goroutine outside the bubble that is still ending (the
// previous subtest's, the testing package's) keeps the count up while the
// fake clock runs on, tick after tick, for as long as that takes in real
// time (3.12 s seen for the 3 s row at load 22, against 10 ms). A second
// still tells a wait that ended with the goroutines from one that ran to
// the 10 s timeout.
const slack = time.Second

// M2: Check passes once the goroutines a test started are gone, waits
// up to 10 s for them, and fails with their stacks after that. The checked
// "test" is a fakeTB inside a synctest bubble, so the 10 s deadline runs on
// the bubble's fake clock and this test takes no real time.
func TestCheck(t *testing.T) {
	rows := []struct {
		name      string
		start     bool          // start parkedCount parked goroutines after Check
		exitAfter time.Duration // when it exits on its own; 0 = only when released after the cleanup
		wantFail  bool
		minWait   time.Duration // the cleanup waited at least this long
		maxWait   time.Duration // and at most this long
	}{
		{"M2 no goroutine started passes at once", false, 0, false, 0, 0},
		{"M2 goroutine exiting 3 s after the test is waited for", true, 3 * time.Second, false, 3 * time.Second, 3*time.Second + slack},
		{"M2 goroutine still running fails after 10 s", true, 0, true, leakcheck.Timeout, leakcheck.Timeout + slack},
		{"M2 goroutine exiting at 11 s fails after 10 s", true, 11 * time.Second, true, leakcheck.Timeout, leakcheck.Timeout + slack},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t) // the bubble's goroutines are gone when synctest.Test returns
			synctest.Test(t, func(t *testing.T) {
				fake := &fakeTB{}
				leakcheck.Check(fake)
				if len(fake.cleanups) != 1 || len(fake.errors) != 0 {
					t.Fatalf("after Check: got %d cleanups and errors %q, want 1 cleanup and no errors", len(fake.cleanups), fake.errors)
				}
				release := make(chan struct{})
				if row.start {
					for range parkedCount {
						go parked(release, row.exitAfter)
					}
				}
				start := time.Now()
				fake.cleanups[0]() // the test ends
				waited := time.Since(start)
				close(release)

				if waited < row.minWait || waited > row.maxWait {
					t.Errorf("cleanup waited %v, want between %v and %v", waited, row.minWait, row.maxWait)
				}
				if !row.wantFail {
					if len(fake.errors) != 0 {
						t.Errorf("got errors %q, want none", fake.errors)
					}
					return
				}
				if len(fake.errors) != 1 {
					t.Fatalf("got %d errors %q, want 1", len(fake.errors), fake.errors)
				}
				msg := fake.errors[0]
				for _, want := range []string{"goroutine leak", "still running 10s after it ended", "leakcheck_test.parked"} {
					if !strings.Contains(msg, want) {
						t.Errorf("error %q does not contain %q", msg, want)
					}
				}
			})
		})
	}
}
