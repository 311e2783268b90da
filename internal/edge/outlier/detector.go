// Package outlier owns the Edge's passive health (outlier ejection, issue
// 11): it decides, from what the HTTP surface saw of each request, which
// providers to skip for a while, and when to take them back.
//
// A provider that fails a request before the first byte — no connection
// could be opened, the connection was reset before the response head, the
// upstream answered one of the configured 5xx statuses, or 429 — is
// ejected: the pool skips it while it cools down. The window is the 429's
// Retry-After, or a base time doubled for every consecutive failure, at
// most a cap; a success resets the doubling. When the window ends the
// provider is re-admitted and the pool pumps its waiters (SPEC Q5): a
// request whose every candidate is cooling waits in the queue like one
// whose candidates are busy, and nothing polls.
//
// The decisions live in a pure state machine (machine.go: no I/O, no clock,
// no locks); Detector is its concurrency wrapper, which carries the effects
// out on the pool (Eject, Readmit), arms one re-admission timer per cooling
// provider, logs one line per ejection and re-admission and counts
// iop_edge_provider_ejections_total{reason}.
//
// It is separate from the runtime-unavailable overlay of SPEC H8–H10
// (internal/edge/health): a stall never ejects here, an ejection never
// touches the overlay, and either one alone makes a provider no candidate.
//
// It must never do I/O besides the pool calls and its log, hold a lease,
// build an HTTP response, or put a node or provider name into a metric
// label (P4: those appear in the log lines only).
//
// # Locks and goroutines
//
// Detector.mu guards the machine and the timers; it is held across the
// pool's Eject and Readmit, which is allowed because Pool.mu is a leaf in
// every lock order. The only goroutines are the Clock's timer callbacks
// (one pending per cooling provider); Close stops them.
package outlier

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/pool"
)

// Pool is the provider pool as the Detector drives it; *pool.Pool
// satisfies it. Eject excludes k from candidates until Readmit and shows
// the window in its snapshot; Readmit makes k a candidate again and pumps
// waiters (SPEC Q5).
type Pool interface {
	Eject(k pool.Key, until time.Time, reason string) bool
	Readmit(k pool.Key) bool
}

// Options configure a Detector. Pool is required.
type Options struct {
	Pool   Pool
	Policy Policy
	// Clock: nil means pool.SystemClock().
	Clock pool.Clock
	// Logger gets "provider ejected" and "provider re-admitted"; nil
	// discards.
	Logger *slog.Logger
}

// Detector is the passive-health owner. Safe for concurrent use.
type Detector struct {
	pool Pool
	clk  pool.Clock
	log  *slog.Logger

	mu     sync.Mutex
	m      *Machine           // guarded by mu
	timers map[pool.Key]timer // guarded by mu: the pending re-admission timer
	armed  uint64             // guarded by mu: timers armed so far (ids)
	closed bool               // guarded by mu
	// onRecord mirrors m.Len() > 0 so that Success, called on every
	// answered request, skips the lock when no provider is on record.
	onRecord atomic.Bool

	ejections [nReasons]atomic.Uint64
}

// New returns a Detector for o.
func New(o Options) *Detector {
	if o.Clock == nil {
		o.Clock = pool.SystemClock()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Detector{pool: o.Pool, clk: o.Clock, log: o.Logger, m: NewMachine(o.Policy), timers: map[pool.Key]timer{}}
}

// timer is a pending re-admission timer; id tells a timer replaced by a
// newer one (whose callback then does nothing) from the current one.
type timer struct {
	id   uint64
	stop func() bool
}

// SetPolicy installs a new policy (config reload); running windows keep
// their end.
func (d *Detector) SetPolicy(p Policy) {
	d.mu.Lock()
	d.m.SetPolicy(p)
	d.mu.Unlock()
}

// Failure records that provider k failed a request before the first byte
// for reason r; retryAfter is a 429's Retry-After (0 = none). It may eject
// k (see Machine.Failure).
func (d *Detector) Failure(k pool.Key, r Reason, retryAfter time.Duration) {
	now := d.clk.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.apply(d.m.Failure(k, r, retryAfter, now), now)
	d.onRecord.Store(d.m.Len() > 0)
}

// Suspect records that provider k failed a request of principal before
// the first byte in a way the request's own input may have caused (see
// Machine.Suspect); it ejects k only when another principal's failure
// corroborates it.
func (d *Detector) Suspect(k pool.Key, r Reason, principal string) {
	now := d.clk.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.apply(d.m.Suspect(k, r, principal, now), now)
	d.onRecord.Store(d.m.Len() > 0)
}

// Success records that provider k answered a request (any answer that is
// not a failure above, a client error included): its failure streak ends.
func (d *Detector) Success(k pool.Key) {
	if !d.onRecord.Load() {
		return
	}
	d.mu.Lock()
	d.m.Success(k)
	d.onRecord.Store(d.m.Len() > 0)
	d.mu.Unlock()
}

// Close stops every pending re-admission timer; later calls do nothing.
// Providers still cooling stay ejected in the pool (the Edge is stopping).
func (d *Detector) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for k, t := range d.timers {
		t.stop()
		delete(d.timers, k)
	}
}

// expire is the callback of k's re-admission timer id.
func (d *Detector) expire(k pool.Key, id uint64) {
	now := d.clk.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.timers[k].id != id {
		return // stopped, or replaced by a newer timer
	}
	delete(d.timers, k)
	d.apply(d.m.Expire(k, now), now)
	d.onRecord.Store(d.m.Len() > 0)
}

// apply carries out one effect; called with mu held.
func (d *Detector) apply(fx Effect, now time.Time) {
	k := fx.Key
	switch fx.Op {
	case OpEject:
		d.pool.Eject(k, fx.Until, fx.Reason.String())
		d.arm(k, fx.Until.Sub(now))
		d.ejections[fx.Reason].Add(1)
		d.log.Warn("provider ejected", "node", k.Node, "provider", k.Provider, "reason", fx.Reason.String(),
			"cooling_ms", fx.Until.Sub(now).Milliseconds(), "until", fx.Until.UTC().Format(time.RFC3339Nano),
			"consecutive", fx.Level)
	case OpExtend:
		d.pool.Eject(k, fx.Until, fx.Reason.String())
		d.arm(k, fx.Until.Sub(now))
		d.log.Debug("provider ejection extended", "node", k.Node, "provider", k.Provider,
			"until", fx.Until.UTC().Format(time.RFC3339Nano))
	case OpRearm:
		d.arm(k, fx.Until.Sub(now))
	case OpReadmit:
		d.pool.Readmit(k)
		d.log.Info("provider re-admitted", "node", k.Node, "provider", k.Provider, "reason", fx.Reason.String(),
			"consecutive", fx.Level)
	}
}

// arm (re)starts k's re-admission timer; called with mu held.
func (d *Detector) arm(k pool.Key, after time.Duration) {
	if t, ok := d.timers[k]; ok {
		t.stop()
	}
	d.armed++
	id := d.armed
	d.timers[k] = timer{id: id, stop: d.clk.AfterFunc(max(after, 0), func() { d.expire(k, id) })}
}

// MetricEjections is the ejection counter family.
const MetricEjections = "iop_edge_provider_ejections_total"

// Metric is one counter family: Samples maps a rendered, bounded label set
// to its value, every label value present. The shape matches admin.Counter.
type Metric struct {
	Name, Help string
	Samples    func() map[string]float64
}

// Metrics returns iop_edge_provider_ejections_total{reason}.
func (d *Detector) Metrics() []Metric {
	return []Metric{{MetricEjections,
		"Providers ejected by passive health (outlier ejection), by reason: connect, reset, status (configured 5xx), rate_limited (429).",
		func() map[string]float64 {
			out := make(map[string]float64, nReasons)
			for r := range nReasons {
				out[`reason="`+r.String()+`"`] = float64(d.ejections[r].Load())
			}
			return out
		}}}
}
