package limit

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// noon is 12:00 UTC: the day's end is 12 h away.
var noon = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// K5: the token budgets, step by step: reserve an estimate, settle what
// the backend reported, refuse while spent with the exact wait.
func TestTokens(t *testing.T) {
	type step struct {
		at      time.Duration // since noon
		reserve int64         // the estimate; -1 = settle the open reservation
		settle  int64
		wantErr error
		wantRA  time.Duration // RetryAfter of a refusal
		wantMin int64         // MinuteRemaining after an admitted reservation, or after a settlement
		wantDay int64         // DayRemaining likewise
	}
	const settle = -1
	rows := []struct {
		name  string
		lim   TokenLimit
		steps []step
	}{
		{"per minute: admitted while something is left, the next refused until it drains", TokenLimit{PerMinute: 600}, []step{
			{0, 100, 0, nil, 0, 500, 0},
			{0, settle, 590, nil, 0, 10, 0}, // the backend used more than the estimate
			{0, 50, 0, nil, 0, 0, 0},        // 10 left: admitted (a request is never cut to fit)
			{0, settle, 50, nil, 0, 0, 0},   // 640 used of 600
			{0, 1, 0, ErrTokensMinute, 4100 * time.Millisecond, 0, 0},
			{4100 * time.Millisecond, 1, 0, nil, 0, 0, 0}, // 4.1 s drained 41: exactly one token of room
		}},
		{"per minute: reservations alone fill it", TokenLimit{PerMinute: 100}, []step{
			{0, 100, 0, nil, 0, 0, 0},
			{0, 1, 0, ErrTokensMinute, time.Second, 0, 0},
		}},
		{"per minute: an idle minute empties it", TokenLimit{PerMinute: 60}, []step{
			{0, 60, 0, nil, 0, 0, 0},
			{0, settle, 60, nil, 0, 0, 0},
			{30 * time.Second, 1, 0, nil, 0, 29, 0},
			{30 * time.Second, settle, 0, nil, 0, 30, 0}, // settled 0: the reservation is given back
			{2 * time.Minute, 1, 0, nil, 0, 59, 0},
		}},
		{"per day: spent until 00:00 UTC", TokenLimit{PerDay: 1000}, []step{
			{0, 10, 0, nil, 0, 0, 990},
			{0, settle, 1200, nil, 0, 0, 0},
			{time.Hour, 1, 0, ErrTokensDay, 11 * time.Hour, 0, 0}, // noon is 12:00 UTC
			{12 * time.Hour, 1, 0, nil, 0, 0, 999},
		}},
		{"both: the day refuses first", TokenLimit{PerMinute: 10, PerDay: 10}, []step{
			{0, 5, 0, nil, 0, 5, 5},
			{0, settle, 10, nil, 0, 0, 0},
			{0, 1, 0, ErrTokensDay, 12 * time.Hour, 0, 0},
		}},
		{"no bound: admitted, day counted", TokenLimit{}, []step{
			{0, 1 << 50, 0, nil, 0, 0, 0},
			{0, settle, 5, nil, 0, 0, 0},
		}},
		{"a midnight between reserve and settle counts in the new day", TokenLimit{PerDay: 100}, []step{
			{11*time.Hour + 59*time.Minute, 10, 0, nil, 0, 0, 90},
			{12 * time.Hour, settle, 30, nil, 0, 0, 70},
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var tk Tokens
			var open *Reservation
			for i, s := range row.steps {
				now := noon.Add(s.at)
				if s.reserve == settle {
					open.Settle(s.settle, now)
					open = nil
					st := tk.State("a", row.lim, now)
					if st.MinuteRemaining != s.wantMin || st.DayRemaining != s.wantDay {
						t.Fatalf("step %d: after settle %+v, want minute %d day %d remaining", i, st, s.wantMin, s.wantDay)
					}
					continue
				}
				r, err := tk.Reserve("a", row.lim, s.reserve, now)
				var re *RefusedError
				if s.wantErr != nil {
					if !errors.Is(err, s.wantErr) || !errors.As(err, &re) || re.RetryAfter != s.wantRA {
						t.Fatalf("step %d: got %v (%+v), want %v with Retry-After %v", i, err, re, s.wantErr, s.wantRA)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if r.State.MinuteRemaining != s.wantMin || r.State.DayRemaining != s.wantDay {
					t.Fatalf("step %d: state %+v, want minute %d day %d remaining", i, r.State, s.wantMin, s.wantDay)
				}
				open = r
			}
		})
	}
}

// K5: of 1,000 concurrent requests of estimate 10 against 1,000 tokens a
// minute exactly 100 are admitted: the reservations stop the rest.
func TestTokensExactUnderConcurrency(t *testing.T) {
	var tk Tokens
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := tk.Reserve("a", TokenLimit{PerMinute: 1000}, 10, noon); err == nil {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != 100 {
		t.Fatalf("admitted %d, want 100", admitted)
	}
}

// K6: the minute window's reset is when it is back to its limit with the
// in-flight reservations counted as spent, as its remaining counts them: a
// reset of 0 with less than the limit remaining would tell a client it may
// send the limit again at once.
func TestTokenStateMinuteReset(t *testing.T) {
	lim := TokenLimit{PerMinute: 600} // 10 tokens a second
	rows := []struct {
		name      string
		settled   int64 // settled at noon before the reservation
		reserve   int64 // in flight at noon
		at        time.Duration
		wantLeft  int64
		wantReset time.Duration
	}{
		{"empty, nothing in flight", 0, 0, 0, 600, 0},
		{"empty, one reservation in flight", 0, 100, 0, 500, 10 * time.Second},
		{"settled and in flight add up", 300, 100, 0, 200, 40 * time.Second},
		{"settled and drained a while, in flight", 300, 100, 10 * time.Second, 300, 30 * time.Second},
		{"the window overfilled by a reservation", 0, 1000, 0, 0, 100 * time.Second},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var tk Tokens
			if row.settled > 0 {
				r, err := tk.Reserve("a", lim, 1, noon)
				if err != nil {
					t.Fatal(err)
				}
				r.Settle(row.settled, noon)
			}
			now := noon.Add(row.at)
			if row.reserve > 0 {
				r, err := tk.Reserve("a", lim, row.reserve, now)
				if err != nil {
					t.Fatal(err)
				}
				if r.State.MinuteRemaining != row.wantLeft || r.State.MinuteReset != row.wantReset {
					t.Errorf("after the reservation: %+v, want %d remaining, reset %v", r.State, row.wantLeft, row.wantReset)
				}
			}
			if st := tk.State("a", lim, now); st.MinuteRemaining != row.wantLeft || st.MinuteReset != row.wantReset {
				t.Errorf("state: %+v, want %d remaining, reset %v", st, row.wantLeft, row.wantReset)
			}
		})
	}
}

// K5: Settle is idempotent and nil-safe.
func TestSettleOnce(t *testing.T) {
	var tk Tokens
	r, _ := tk.Reserve("a", TokenLimit{PerDay: 100}, 10, noon)
	r.Settle(20, noon)
	r.Settle(20, noon)
	(*Reservation)(nil).Settle(5, noon)
	if st := tk.State("a", TokenLimit{PerDay: 100}, noon); st.DayRemaining != 80 || st.DayUsed != 20 {
		t.Fatalf("state %+v, want 80 remaining, 20 used", st)
	}
}

// K7: settled budgets survive a restart (Snapshot, Restore); the day
// rolls over and the minute drains meanwhile.
func TestTokensSnapshotRestore(t *testing.T) {
	lim := TokenLimit{PerMinute: 60, PerDay: 1000}
	var a Tokens
	r, _ := a.Reserve("k", lim, 5, noon)
	r.Settle(60, noon)
	open, _ := a.Reserve("k", lim, 1000, noon.Add(time.Second)) // in flight at the crash: not carried over
	_ = open
	snaps := a.Snapshot(noon.Add(time.Second))
	rows := []struct {
		name             string
		at               time.Duration
		wantMin, wantDay int64
	}{
		{"restarted at once", time.Second, 1, 940},
		{"restarted 30 s later", 30 * time.Second, 30, 940},
		{"restarted the next day", 13 * time.Hour, 60, 1000},
	}
	for _, row := range rows {
		var b Tokens
		b.Restore(snaps, noon.Add(row.at))
		st := b.State("k", lim, noon.Add(row.at))
		if st.MinuteRemaining != row.wantMin || st.DayRemaining != row.wantDay {
			t.Errorf("%s: %+v, want minute %d day %d remaining", row.name, st, row.wantMin, row.wantDay)
		}
	}
}

// K6: the request bucket's state after each admission: remaining counts
// down from the limit, reset is when the bucket is full again.
func TestRateState(t *testing.T) {
	var k Keys
	lim := KeyLimit{RequestsPerMinute: 3}
	want := []RateState{{2, 20 * time.Second}, {1, 40 * time.Second}, {0, time.Minute}}
	for i, w := range want {
		s, err := k.Acquire("a", lim, noon)
		if err != nil || s.Rate != w {
			t.Fatalf("admission %d: %+v, %v; want %+v", i, s.Rate, err, w)
		}
	}
	if got := k.Rate("a", 3, noon.Add(30*time.Second)); got != (RateState{1, 30 * time.Second}) {
		t.Fatalf("after 30 s: %+v", got)
	}
	if got := k.Rate("b", 3, noon); got != (RateState{3, 0}) {
		t.Fatalf("unknown principal: %+v", got)
	}
}

// K5: Cancel gives the request token back and leaves the in-flight
// count; after Release it does nothing more.
func TestSlotCancel(t *testing.T) {
	var k Keys
	lim := KeyLimit{RequestsPerMinute: 2, MaxConcurrent: 5}
	s, _ := k.Acquire("a", lim, noon)
	s2, _ := k.Acquire("a", lim, noon)
	s2.Cancel()
	s2.Cancel()
	s2.Release()
	if got := k.Rate("a", 2, noon); got.Remaining != 1 || k.InFlight("a") != 1 {
		t.Fatalf("after Cancel: %+v, %d in flight; want 1 remaining, 1 in flight", got, k.InFlight("a"))
	}
	s.Release()
	s.Cancel()
	if got := k.Rate("a", 2, noon); got.Remaining != 1 || k.InFlight("a") != 0 {
		t.Fatalf("Cancel after Release: %+v, %d in flight", got, k.InFlight("a"))
	}
	(*Slot)(nil).Cancel()
}
