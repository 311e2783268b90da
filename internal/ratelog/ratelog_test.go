package ratelog

import (
	"sync"
	"testing"
	"time"
)

// B1: a flood of refused handshakes writes at most Burst lines per
// window, and the first line of the next window carries the count of the
// lines suppressed.
func TestLimiter(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at             time.Duration
		wantOK         bool
		wantSuppressed int64
	}
	rows := []struct {
		name  string
		l     *Limiter
		steps []step
	}{
		{"burst 2 per second", &Limiter{Burst: 2, Window: time.Second}, []step{
			{0, true, 0}, {1, true, 0}, {2, false, 0}, {3, false, 0},
			{time.Second, true, 2}, {time.Second + 1, true, 0}, {time.Second + 2, false, 0},
			{5 * time.Second, true, 1},
		}},
		{"zero value uses the defaults", &Limiter{}, []step{
			{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0},
			{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0},
			{0, false, 0}, {DefaultWindow, true, 1},
		}},
		{"a clock going backwards opens a window", &Limiter{Burst: 1, Window: time.Minute}, []step{
			{time.Hour, true, 0}, {time.Hour, false, 0}, {0, true, 1},
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			for i, s := range row.steps {
				ok, sup := row.l.Allow(t0.Add(s.at))
				if ok != s.wantOK || sup != s.wantSuppressed {
					t.Fatalf("step %d at +%v: got ok=%v suppressed=%d, want ok=%v suppressed=%d", i, s.at, ok, sup, s.wantOK, s.wantSuppressed)
				}
			}
		})
	}
}

// B1: under concurrent callers no line is lost from the count: the
// lines written plus the suppressed counts they carry add up to the calls.
func TestLimiterCountsEveryCall(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &Limiter{Burst: 3, Window: time.Second}
	var mu sync.Mutex
	var written, reported int64
	var wg sync.WaitGroup
	for range 1100 {
		wg.Go(func() {
			if ok, sup := l.Allow(t0); ok {
				mu.Lock()
				written++
				reported += sup
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	ok, sup := l.Allow(t0.Add(time.Second))
	if !ok || written != 3 || reported+sup != 1097 {
		t.Fatalf("got %d written, %d reported suppressed (+%d at the next window, ok=%v); want 3 and 1097", written, reported, sup, ok)
	}
}
