package limit

import (
	"errors"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of Tokens.Reserve, wrapped in a *RefusedError; test with
// errors.Is.
var (
	// ErrTokensMinute: the key spent its tokens_per_minute.
	ErrTokensMinute = errors.New("limit: tokens per minute of this API key spent")
	// ErrTokensDay: the key spent its tokens_per_day (the UTC day).
	ErrTokensDay = errors.New("limit: tokens per day of this API key spent")
)

// TokenLimit is one key's token budgets (docs/keys.md K5); 0 means no
// bound.
type TokenLimit struct {
	// PerMinute is a bucket of that many tokens refilled evenly over a
	// minute (GCRA, as the request rate).
	PerMinute int64
	// PerDay is the tokens of one UTC day (00:00 to 24:00 UTC).
	PerDay int64
}

// Tokens tracks every principal's token budgets: the tokens the backends
// reported (settled) and the estimates of the requests in flight
// (reserved). A request is admitted while a budget has something left
// after the reservations of the others: used + reserved < limit. Its
// estimate is then reserved until Settle replaces it with what the
// backend reported, so a burst of concurrent requests cannot all pass on
// the same remainder; one request may still use more than was left (it
// is never cut), and the next is refused until the window frees enough.
//
// Its memory is one small entry per principal that ever reserved; Retain
// drops the principals a reload removed. Safe for concurrent use; it reads
// no clock (every call takes the time).
type Tokens struct {
	mu sync.Mutex
	m  map[string]*tokenState
}

type tokenState struct { // guarded by Tokens.mu
	// tat is the per-minute window's GCRA state: the time it would be
	// empty. Its level at now is ceil((tat − now) · PerMinute / 1 min).
	tat      time.Time
	day      int64 // UTC day number (Unix days) of dayUsed
	dayUsed  int64
	reserved int64 // estimates of the requests in flight
}

// TokenState is a principal's budgets at one instant, as the rate-limit
// headers report them (docs/keys.md K6). Remaining counts the
// reservations of the requests in flight as spent, and so does Reset:
// when the window is back to its initial state (the minute: empty once
// the settled tokens and then the reservations have drained; the day: the
// next 00:00 UTC).
type TokenState struct {
	MinuteRemaining, DayRemaining int64
	MinuteReset, DayReset         time.Duration
	// DayUsed is the tokens settled in the current UTC day, limit or not.
	DayUsed int64
}

// Reservation is one admitted request's estimate; Settle ends it, once
// (later calls do nothing). A nil *Reservation is valid and settles
// nothing.
type Reservation struct {
	t    *Tokens
	st   *tokenState
	est  int64
	lim  TokenLimit
	done atomic.Bool
	// State is the principal's budgets right after this reservation.
	State TokenState
}

// maxAhead bounds how far past now one settlement moves the minute
// window's GCRA time (a year): beyond it nothing changes for any client,
// and time.Time arithmetic stays far from overflowing.
const maxAhead = 366 * 24 * time.Hour

// MaxEstimate bounds one reservation and one settlement, in tokens.
const MaxEstimate = 1 << 40

// Reserve admits one request of principal with an estimate of est tokens
// (the prompt's estimate and the completion it may take; clamped to
// 0..MaxEstimate) under lim at now, or refuses it with a *RefusedError
// wrapping ErrTokensMinute or ErrTokensDay whose RetryAfter says when
// the budget will have room again (the day: the next 00:00 UTC; the
// minute: exactly, or 1 s while only in-flight reservations fill it).
// The day is checked first: it is the longer wait.
func (t *Tokens) Reserve(principal string, lim TokenLimit, est int64, now time.Time) (*Reservation, error) {
	est = min(max(est, 0), MaxEstimate)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]*tokenState)
	}
	st := t.m[principal]
	if st == nil {
		st = &tokenState{}
		t.m[principal] = st
	}
	st.rollDay(now)
	if lim.PerDay > 0 && st.dayUsed+st.reserved >= lim.PerDay {
		return nil, &RefusedError{Principal: principal, Err: ErrTokensDay, Limit: int(lim.PerDay), RetryAfter: untilNextDay(now)}
	}
	if lim.PerMinute > 0 {
		level := minuteLevel(st.tat, now, lim.PerMinute)
		if level+st.reserved >= lim.PerMinute {
			wait := time.Second // only reservations fill it: nobody knows when they settle
			if room := lim.PerMinute - st.reserved - 1; room >= 0 {
				wait = st.tat.Sub(now) - tokensDuration(room, lim.PerMinute)
			}
			return nil, &RefusedError{Principal: principal, Err: ErrTokensMinute, Limit: int(lim.PerMinute), RetryAfter: max(wait, time.Millisecond)}
		}
	}
	st.reserved += est
	r := &Reservation{t: t, st: st, est: est, lim: lim}
	r.State = st.state(lim, now)
	return r, nil
}

// Settle replaces the reservation by used, the tokens the backend
// reported (prompt + completion; clamped to 0..MaxEstimate), counted at
// now: in the minute window and in now's UTC day. Idempotent, nil-safe.
func (r *Reservation) Settle(used int64, now time.Time) {
	if r == nil || !r.done.CompareAndSwap(false, true) {
		return
	}
	used = min(max(used, 0), MaxEstimate)
	r.t.mu.Lock()
	defer r.t.mu.Unlock()
	r.st.reserved -= r.est
	r.st.rollDay(now)
	r.st.dayUsed += used
	if r.lim.PerMinute > 0 && used > 0 {
		tat := r.st.tat
		if tat.Before(now) {
			tat = now
		}
		r.st.tat = tat.Add(min(tokensDuration(used, r.lim.PerMinute), maxAhead))
	}
}

// Estimate is the tokens r reserved.
func (r *Reservation) Estimate() int64 {
	if r == nil {
		return 0
	}
	return r.est
}

// State reports principal's budgets under lim at now (a request refused
// before Reserve, a status page).
func (t *Tokens) State(principal string, lim TokenLimit, now time.Time) TokenState {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.m[principal]
	if st == nil {
		st = &tokenState{}
	}
	c := *st
	c.rollDay(now)
	return c.state(lim, now)
}

func (st *tokenState) state(lim TokenLimit, now time.Time) TokenState {
	s := TokenState{DayUsed: st.dayUsed}
	if lim.PerDay > 0 {
		s.DayRemaining = max(lim.PerDay-st.dayUsed-st.reserved, 0)
		s.DayReset = untilNextDay(now)
	}
	if lim.PerMinute > 0 {
		s.MinuteRemaining = max(lim.PerMinute-minuteLevel(st.tat, now, lim.PerMinute)-st.reserved, 0)
		// Back to its limit once the settled tokens have drained and
		// then the reservations, which Remaining counts as spent too.
		s.MinuteReset = min(max(st.tat.Sub(now), 0), maxAhead) + min(tokensDuration(st.reserved, lim.PerMinute), maxAhead)
	}
	return s
}

// rollDay starts a new day's count when now is in another UTC day.
func (st *tokenState) rollDay(now time.Time) {
	if d := unixDay(now); d != st.day {
		st.day, st.dayUsed = d, 0
	}
}

func unixDay(t time.Time) int64 {
	s := t.Unix()
	if s < 0 {
		return (s+1)/86400 - 1
	}
	return s / 86400
}

func untilNextDay(now time.Time) time.Duration {
	return time.Unix((unixDay(now)+1)*86400, 0).Sub(now)
}

// minuteLevel is the per-minute window's tokens at now: ceil((tat − now)
// · perMinute / 1 min), 0 once tat has passed.
func minuteLevel(tat, now time.Time, perMinute int64) int64 {
	ahead := tat.Sub(now)
	if ahead <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(ahead), uint64(perMinute))
	const m = uint64(time.Minute)
	if hi >= m {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, m)
	if r > 0 {
		q++
	}
	return int64(min(q, math.MaxInt64))
}

// tokensDuration is how long the window takes to drain n tokens at
// perMinute: floor(n · 1 min / perMinute), so that a window filled with n
// tokens from empty reads back exactly n (minuteLevel rounds up).
func tokensDuration(n, perMinute int64) time.Duration {
	hi, lo := bits.Mul64(uint64(n), uint64(time.Minute))
	if hi >= uint64(perMinute) {
		return time.Duration(math.MaxInt64)
	}
	q, _ := bits.Div64(hi, lo, uint64(perMinute))
	return time.Duration(min(q, math.MaxInt64))
}

// Retain forgets every principal keep reports false for (a reload removed
// its key). Reservations of a forgotten principal still settle safely.
func (t *Tokens) Retain(keep func(principal string) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := range t.m {
		if !keep(p) {
			delete(t.m, p)
		}
	}
}

// TokenSnapshot is one principal's settled budgets, for persisting them
// across a restart (docs/keys.md K7): reservations are not part of it (a
// request in flight is not carried over a restart).
type TokenSnapshot struct {
	Principal string
	// MinuteEmptyAt is when the per-minute window would be empty (zero:
	// already empty, or no per-minute bound).
	MinuteEmptyAt time.Time
	// Day is the UTC day of DayUsed; DayUsed its settled tokens.
	Day     time.Time
	DayUsed int64
}

// Snapshot returns every principal's settled budgets at now.
func (t *Tokens) Snapshot(now time.Time) []TokenSnapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]TokenSnapshot, 0, len(t.m))
	for p, st := range t.m {
		s := TokenSnapshot{Principal: p, Day: time.Unix(st.day*86400, 0).UTC(), DayUsed: st.dayUsed}
		if st.tat.After(now) {
			s.MinuteEmptyAt = st.tat
		}
		if unixDay(now) != st.day {
			s.Day, s.DayUsed = time.Unix(unixDay(now)*86400, 0).UTC(), 0
		}
		out = append(out, s)
	}
	return out
}

// Restore sets the settled budgets of the principals in snaps (an Edge
// starting), as of now: a day other than now's counts nothing, a minute
// window drained while the Edge was down is empty.
func (t *Tokens) Restore(snaps []TokenSnapshot, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]*tokenState, len(snaps))
	}
	for _, s := range snaps {
		st := t.m[s.Principal]
		if st == nil {
			st = &tokenState{}
			t.m[s.Principal] = st
		}
		st.day = unixDay(now)
		st.dayUsed = 0
		if unixDay(s.Day) == st.day {
			st.dayUsed = max(s.DayUsed, 0)
		}
		st.tat = time.Time{}
		if s.MinuteEmptyAt.After(now) {
			st.tat = s.MinuteEmptyAt
		}
	}
}
