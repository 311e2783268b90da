// Package limit holds the Edge's admission bounds against a hostile or
// runaway client (B2): per API key, the requests in flight
// (api_keys[].max_concurrent) and the request rate
// (api_keys[].requests_per_minute) and the token budgets per minute and
// per day (Tokens, docs/keys.md K5); across all clients, the request-body
// bytes held at once (http.max_inflight_body_bytes) and the client
// connections open at once (http.max_connections).
//
// It owns the decisions and the counters only: it never reads a clock
// (every call takes the time), touches no network, writes no response and
// logs nothing; the HTTP surface turns a refusal into a 429 or 503 with
// Retry-After in the surface's shape and logs the principal, never the key.
// Every type is safe for concurrent use; none starts a goroutine.
package limit

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of Keys.Acquire; test with errors.Is. Both come wrapped in a
// *RefusedError that carries the wait.
var (
	// ErrConcurrency: the key already has max_concurrent requests in flight.
	ErrConcurrency = errors.New("limit: too many requests in flight for this API key")
	// ErrRate: the key used up its requests_per_minute.
	ErrRate = errors.New("limit: request rate of this API key exceeded")
)

// RefusedError is a refused request of one principal: Err is ErrConcurrency
// or ErrRate, RetryAfter when the next request can be admitted (ErrRate:
// exactly, the next token of the bucket; ErrConcurrency: a second, as no
// one can know when a request in flight ends).
type RefusedError struct {
	Principal  string
	Err        error
	Limit      int // the bound that refused: max_concurrent or requests_per_minute
	RetryAfter time.Duration
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("principal %q: %v (limit %d)", e.Principal, e.Err, e.Limit)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// KeyLimit is one API key's bounds; 0 means no bound.
type KeyLimit struct {
	MaxConcurrent     int
	RequestsPerMinute int
}

// Keys tracks every principal's requests in flight and its rate bucket.
// Its memory is one small entry per principal that ever had a bound; Retain
// drops the principals a reload removed.
type Keys struct {
	mu sync.Mutex
	m  map[string]*keyState
}

type keyState struct {
	inflight int    // guarded by Keys.mu
	rate     bucket // guarded by Keys.mu
}

// Slot is one admitted request; Release ends it, once (later calls do
// nothing). A nil *Slot is valid and releases nothing.
type Slot struct {
	k         *Keys
	ks        *keyState
	perMinute int // the rate it took a token of (Cancel gives it back)
	done      atomic.Bool
	// Rate is the principal's request rate right after this admission
	// (zero without requests_per_minute).
	Rate RateState
}

// RateState is a principal's request rate at one instant, as the
// rate-limit headers report it (docs/keys.md K6): the requests the bucket
// still admits at once, and how long until it is full again.
type RateState struct {
	Remaining int
	Reset     time.Duration
}

// Acquire admits one request of principal under lim at time now, or
// refuses it with a *RefusedError. The in-flight bound is checked first, so
// a refused request never spends a rate token. With no bound set it admits
// without keeping any state and returns a nil Slot.
func (k *Keys) Acquire(principal string, lim KeyLimit, now time.Time) (*Slot, error) {
	if lim.MaxConcurrent <= 0 && lim.RequestsPerMinute <= 0 {
		return nil, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[string]*keyState)
	}
	ks := k.m[principal]
	if ks == nil {
		ks = &keyState{}
		k.m[principal] = ks
	}
	if lim.MaxConcurrent > 0 && ks.inflight >= lim.MaxConcurrent {
		return nil, &RefusedError{Principal: principal, Err: ErrConcurrency, Limit: lim.MaxConcurrent, RetryAfter: time.Second}
	}
	if lim.RequestsPerMinute > 0 {
		if wait, ok := ks.rate.take(now, lim.RequestsPerMinute); !ok {
			return nil, &RefusedError{Principal: principal, Err: ErrRate, Limit: lim.RequestsPerMinute, RetryAfter: wait}
		}
	}
	ks.inflight++
	sl := &Slot{k: k, ks: ks, perMinute: lim.RequestsPerMinute}
	if lim.RequestsPerMinute > 0 {
		sl.Rate = ks.rate.state(now, lim.RequestsPerMinute)
	}
	return sl, nil
}

// Rate reports principal's request rate under perMinute (> 0) at now,
// without taking a request (a refusal's headers).
func (k *Keys) Rate(principal string, perMinute int, now time.Time) RateState {
	k.mu.Lock()
	defer k.mu.Unlock()
	var b bucket
	if ks := k.m[principal]; ks != nil {
		b = ks.rate
	}
	return b.state(now, perMinute)
}

// Release ends the request s admitted; idempotent, nil-safe.
func (s *Slot) Release() {
	if s == nil || !s.done.CompareAndSwap(false, true) {
		return
	}
	s.k.mu.Lock()
	s.ks.inflight--
	s.k.mu.Unlock()
}

// Cancel ends the request s admitted as if it had never been: it leaves
// the in-flight count and gives its request token back to the bucket (a
// request refused by a later bound, docs/keys.md K5). Idempotent with
// Release (whichever comes first counts), nil-safe.
func (s *Slot) Cancel() {
	if s == nil || !s.done.CompareAndSwap(false, true) {
		return
	}
	s.k.mu.Lock()
	s.ks.inflight--
	if s.perMinute > 0 {
		s.ks.rate.tat = s.ks.rate.tat.Add(-max(time.Minute/time.Duration(s.perMinute), 1))
	}
	s.k.mu.Unlock()
}

// InFlight reports principal's requests in flight.
func (k *Keys) InFlight(principal string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ks := k.m[principal]; ks != nil {
		return ks.inflight
	}
	return 0
}

// Retain forgets every principal keep reports false for (a reload removed
// its key). Requests in flight of a forgotten principal still release
// safely; its next request starts a fresh entry.
func (k *Keys) Retain(keep func(principal string) bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for p := range k.m {
		if !keep(p) {
			delete(k.m, p)
		}
	}
}

// bucket is a token bucket of n requests per minute, burst n, kept as GCRA
// (the generic cell rate algorithm, ITU-T I.371): one time, the
// theoretical arrival time of the next request, instead of a token count
// and a refill timer. A request at now fits when tat − now ≤ τ, with the
// emission interval T = 1 min / n and the burst tolerance τ = 1 min − T;
// it moves tat to max(tat, now) + T. A fresh bucket admits exactly n
// requests at one instant, then one per T.
type bucket struct{ tat time.Time }

// take admits one request at now under perMinute (> 0); when it does not
// fit, wait is how long until it would.
func (b *bucket) take(now time.Time, perMinute int) (wait time.Duration, ok bool) {
	t := max(time.Minute/time.Duration(perMinute), 1)
	tau := time.Minute - t
	tat := b.tat
	if tat.Before(now) {
		tat = now
	}
	if ahead := tat.Sub(now); ahead > tau {
		return ahead - tau, false
	}
	b.tat = tat.Add(t)
	return 0, true
}

// state is the bucket at now: the requests it admits at once
// (perMinute − ceil((tat − now) / T)) and the time until it is full
// (tat − now).
func (b *bucket) state(now time.Time, perMinute int) RateState {
	ahead := b.tat.Sub(now)
	if ahead <= 0 {
		return RateState{Remaining: perMinute}
	}
	t := max(time.Minute/time.Duration(perMinute), 1)
	used := int((ahead + t - 1) / t)
	return RateState{Remaining: max(perMinute-used, 0), Reset: ahead}
}

// Budget counts bytes held against a bound that may change (a reload).
// Reserve and Release are lock-free.
type Budget struct {
	max  atomic.Int64
	used atomic.Int64
}

// SetMax sets the bound in bytes; ≤ 0 means no bound. Bytes already held
// stay held: a lower bound refuses new reservations until enough are
// released.
func (b *Budget) SetMax(n int64) { b.max.Store(n) }

// Reserve takes n bytes and reports true, or takes nothing and reports
// false when that would pass the bound.
func (b *Budget) Reserve(n int64) bool {
	m := b.max.Load()
	if m <= 0 {
		b.used.Add(n)
		return true
	}
	for {
		u := b.used.Load()
		if u+n > m {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Release gives back n bytes taken by Reserve.
func (b *Budget) Release(n int64) { b.used.Add(-n) }

// Used reports the bytes held.
func (b *Budget) Used() int64 { return b.used.Load() }
