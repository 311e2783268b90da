package limit

import (
	"errors"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// B2: the GCRA bucket admits exactly n at one instant, then one per
// minute/n, and names the wait exactly.
func TestBucket(t *testing.T) {
	type step struct {
		at       time.Duration // since t0
		wantOK   bool
		wantWait time.Duration
	}
	rows := []struct {
		name  string
		perM  int
		steps []step
	}{
		{"one per minute", 1, []step{{0, true, 0}, {0, false, time.Minute}, {59 * time.Second, false, time.Second}, {time.Minute, true, 0}}},
		{"burst of 3 then one per 20 s", 3, []step{{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, false, 20 * time.Second},
			{19 * time.Second, false, time.Second}, {20 * time.Second, true, 0}, {20 * time.Second, false, 20 * time.Second}}},
		{"an idle minute refills the whole burst", 2, []step{{0, true, 0}, {0, true, 0}, {0, false, 30 * time.Second},
			{3 * time.Minute, true, 0}, {3 * time.Minute, true, 0}, {3 * time.Minute, false, 30 * time.Second}}},
		{"a clock going backwards admits nothing extra", 1, []step{{time.Minute, true, 0}, {0, false, 2 * time.Minute}}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var b bucket
			for i, s := range row.steps {
				wait, ok := b.take(t0.Add(s.at), row.perM)
				if ok != s.wantOK || wait != s.wantWait {
					t.Fatalf("step %d at +%v: got ok=%v wait=%v, want ok=%v wait=%v", i, s.at, ok, wait, s.wantOK, s.wantWait)
				}
			}
		})
	}
}

// B2: max_concurrent and requests_per_minute are exact under
// concurrency: of 1,000 simultaneous requests exactly the bound is
// admitted, and a refused request spends no rate token.
func TestKeysExactUnderConcurrency(t *testing.T) {
	rows := []struct {
		name      string
		lim       KeyLimit
		wantOK    int
		wantErr   error
		wantAfter time.Duration
	}{
		{"max_concurrent 37", KeyLimit{MaxConcurrent: 37}, 37, ErrConcurrency, time.Second},
		{"requests_per_minute 120", KeyLimit{RequestsPerMinute: 120}, 120, ErrRate, 500 * time.Millisecond},
		{"both: in flight refuses first", KeyLimit{MaxConcurrent: 5, RequestsPerMinute: 100}, 5, ErrConcurrency, time.Second},
		{"no bound", KeyLimit{}, 1000, nil, 0},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var k Keys
			var mu sync.Mutex
			var slots []*Slot
			var refused []*RefusedError
			var wg sync.WaitGroup
			for range 1000 {
				wg.Go(func() {
					s, err := k.Acquire("team-a", row.lim, t0)
					mu.Lock()
					defer mu.Unlock()
					var re *RefusedError
					switch {
					case err == nil:
						slots = append(slots, s)
					case errors.As(err, &re):
						refused = append(refused, re)
					default:
						t.Errorf("unexpected error %v", err)
					}
				})
			}
			wg.Wait()
			if len(slots) != row.wantOK || len(refused) != 1000-row.wantOK {
				t.Fatalf("got %d admitted, %d refused; want %d admitted", len(slots), len(refused), row.wantOK)
			}
			for _, re := range refused {
				if !errors.Is(re, row.wantErr) || re.RetryAfter != row.wantAfter || re.Principal != "team-a" {
					t.Fatalf("got %v retry %v, want %v retry %v", re, re.RetryAfter, row.wantErr, row.wantAfter)
				}
			}
			if row.lim.MaxConcurrent > 0 {
				if got := k.InFlight("team-a"); got != row.wantOK {
					t.Errorf("in flight: got %d, want %d", got, row.wantOK)
				}
			}
			for _, s := range slots {
				s.Release()
				s.Release() // idempotent
			}
			if got := k.InFlight("team-a"); got != 0 {
				t.Errorf("in flight after release: got %d, want 0", got)
			}
			if row.lim.MaxConcurrent > 0 && row.lim.RequestsPerMinute > 0 {
				// The refused requests spent no token: 95 more fit this minute.
				lim := KeyLimit{RequestsPerMinute: row.lim.RequestsPerMinute}
				for i := range row.lim.RequestsPerMinute - row.wantOK {
					if _, err := k.Acquire("team-a", lim, t0); err != nil {
						t.Fatalf("request %d after the refusals: %v", i, err)
					}
				}
				if _, err := k.Acquire("team-a", lim, t0); !errors.Is(err, ErrRate) {
					t.Fatalf("one over the rate: got %v, want ErrRate", err)
				}
			}
		})
	}
}

// B2: principals are counted apart, and a reload that removes one
// forgets it without breaking its requests in flight.
func TestKeysPerPrincipalAndRetain(t *testing.T) {
	var k Keys
	lim := KeyLimit{MaxConcurrent: 1}
	a, err := k.Acquire("a", lim, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Acquire("b", lim, t0); err != nil {
		t.Fatalf("b is refused because of a: %v", err)
	}
	if _, err := k.Acquire("a", lim, t0); !errors.Is(err, ErrConcurrency) {
		t.Fatalf("a's second request: got %v, want ErrConcurrency", err)
	}
	k.Retain(func(p string) bool { return p == "b" })
	a.Release() // on the forgotten entry
	if got := k.InFlight("a"); got != 0 {
		t.Errorf("a in flight after Retain: got %d, want 0", got)
	}
	if got := k.InFlight("b"); got != 1 {
		t.Errorf("b in flight after Retain: got %d, want 1", got)
	}
	var nilSlot *Slot
	nilSlot.Release()
}

// B2: the body budget is exact under concurrency and follows a
// lowered bound without losing count.
func TestBudget(t *testing.T) {
	var b Budget
	b.SetMax(1000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 1000 {
		wg.Go(func() {
			if b.Reserve(7) {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ok != 142 || b.Used() != 994 {
		t.Fatalf("got %d reservations, %d bytes used; want 142 and 994", ok, b.Used())
	}
	b.SetMax(500)
	if b.Reserve(1) {
		t.Error("a reservation over a lowered bound succeeded")
	}
	b.Release(994)
	if !b.Reserve(500) || b.Reserve(1) {
		t.Error("the lowered bound is not exact")
	}
	b.SetMax(0)
	if !b.Reserve(1 << 40) {
		t.Error("no bound refused")
	}
}
