package pool

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the pool's source of time. AfterFunc must run f later on some
// goroutine, never synchronously inside AfterFunc; stop reports whether it
// prevented f from running (like time.Timer.Stop).
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock returns the Clock backed by package time.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// Pool is the concurrency-safe provider pool. All methods may be called from
// any goroutine; none blocks except Acquire while it waits.
type Pool struct {
	clk    Clock
	mu     sync.Mutex
	s      *state      // guarded by mu
	costed atomic.Bool // s.costed as of the last config (cost.go)
}

// New returns a pool for cfg. No node is ready yet: nothing is admitted
// until NodeReady (SPEC P3).
func New(cfg Config, clk Clock) *Pool {
	if clk == nil {
		clk = SystemClock()
	}
	p := &Pool{clk: clk, s: newState(cfg)}
	p.costed.Store(p.s.costed)
	return p
}

// apply carries out the effects of the transition just run and resets
// them. Called with mu held; every step is non-blocking: each waiter's
// channel has one buffer slot and receives exactly one result.
func (p *Pool) apply() {
	fx := &p.s.fx
	for _, g := range fx.grants {
		g.w.ch <- result{l: g.l}
	}
	for _, f := range fx.failed {
		f.w.ch <- result{err: f.err}
	}
	for _, cancel := range fx.closes {
		cancel()
	}
	for _, lf := range fx.lifts {
		lf := lf
		p.clk.AfterFunc(lf.d, func() {
			now := p.clk.Now()
			p.lock()
			p.s.liftLimit(lf.r, lf.seq, now)
			p.apply()
			p.mu.Unlock()
		})
	}
	for _, w := range fx.pins {
		w.stopPin = p.clk.AfterFunc(w.cls.g.affinityWait, func() {
			p.lock()
			p.s.affinityExpired(w)
			p.apply()
			p.mu.Unlock()
		})
	}
	fx.reset()
}

// Reconfigure installs a new config (SPEC Q5): leases, generations and
// overlays are kept, waiters are moved to the new groups (or failed with
// ErrUnknownModel / ErrNoCandidate when their group or operation is gone),
// and the queue is pumped. MaxWaiters and WaitTimeout apply to requests that
// arrive afterwards.
func (p *Pool) Reconfigure(cfg Config) {
	p.lock()
	p.s.reconfigure(cfg)
	p.apply()
	p.unlockConfig()
}

// Acquire admits r and returns its lease (SPEC Q2–Q4, Q6, Q7). With no free
// live candidate it waits as a FIFO waiter of r.Model's group until a lease
// is granted, ctx ends (the waiter is removed and nothing leaks: a lease
// granted in the same instant is returned), or the wait timeout expires.
//
// Errors: ErrUnknownModel; *NoCandidateError (ErrNoCandidate) when no
// configured provider of the group supports r.Operation (with long capacity
// if r is long); *QueueFullError (ErrQueueFull) when MaxWaiters requests
// already wait; *WaitTimeoutError (ErrWaitTimeout) naming the model and
// why; *UnavailableError (ErrUnavailable) for a request with
// LeaveUnavailable when no provider it may use is live, or none is any
// more while it waits (leave.go); ctx.Err().
func (p *Pool) Acquire(ctx context.Context, r Request) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.lock()
	l, c, err := p.s.admit(r)
	if c == nil {
		p.mu.Unlock()
		return l, err
	}
	w := newWaiter(r)
	w.ch = make(chan result, 1)
	timeout := p.s.waitTimeout
	if p.s.enqueue(c, w, timeout) {
		// Pinned to the provider holding the conversation (R1):
		// after the group's affinity wait it competes for any candidate.
		stopPin := p.clk.AfterFunc(c.g.affinityWait, func() {
			p.lock()
			p.s.affinityExpired(w)
			p.apply()
			p.mu.Unlock()
		})
		defer stopPin()
	}
	p.mu.Unlock()
	defer func() {
		// Armed by apply under mu while w was queued; w is not queued now
		// (its result came through the channel, or cancel took it under
		// mu), so that write happened before this read.
		if w.stopPin != nil {
			w.stopPin()
		}
	}()

	if timeout > 0 {
		stop := p.clk.AfterFunc(timeout, func() {
			p.lock()
			p.s.timeout(w)
			p.apply()
			p.mu.Unlock()
		})
		defer stop()
	}
	select {
	case res := <-w.ch:
		return res.l, res.err
	case <-ctx.Done():
		p.lock()
		queued := p.s.cancel(w)
		p.mu.Unlock()
		if !queued {
			// A result was handed over under mu before we got it: take it
			// and give back a lease we will not use.
			if res := <-w.ch; res.l != nil {
				p.Release(res.l)
			}
		}
		return nil, ctx.Err()
	}
}

// Release returns l, a lease this pool granted, exactly once (SPEC Q2) and
// pumps waiters (Q5). It reports true for the call that returned it; a later call, a call
// after NodeFenced already returned it, or a nil lease reports false and
// changes nothing.
func (p *Pool) Release(l *Lease) bool {
	p.lock()
	ok := p.s.release(l)
	p.apply()
	p.mu.Unlock()
	return ok
}

// NodeReady makes generation gen of node live (SPEC L5): its configured
// resources become candidates and waiters are pumped at once. A duplicate
// or stale (lower) generation is a no-op (L5, L9); a newer generation first
// fences every lease of older ones (their Fenced channels close). It
// reports whether the call activated gen.
func (p *Pool) NodeReady(node string, gen uint64) bool { return p.NodeReadyShare(node, gen, 0) }

// NodeReadyShare is NodeReady for a node that gives this edge share of
// its capacity (RegisterRequest.capacity_share, SPEC E4): while gen is
// ready each of its providers admits protocol.ShareOf(capacity, share)
// leases (and as much of its long capacity); share ≤ 0 = all of it.
func (p *Pool) NodeReadyShare(node string, gen uint64, share float64) bool {
	now := p.clk.Now()
	p.lock()
	ok := p.s.ready(node, gen, now, share)
	p.apply()
	p.mu.Unlock()
	return ok
}

// NodeRuns tells the pool which providers generation gen of node runs
// (SPEC N2): runs maps each provider name of the config payload that
// generation accepted (at registration, or last answered APPLIED to) to
// how it runs it. From then on a configured resource of the node is a
// candidate only while gen is its ready generation and runs gives it the
// resource's Revision, and it admits the capacities runs gives (what the
// node admits; its share of them, SPEC E4): a provider a later config adds or changes is not
// served by a node that answered RESTART_REQUIRED or FAILED to that
// config (its requests wait for another candidate, as for an offline
// one), and becomes one when a generation running it says so. A provider
// the config no longer has is never a candidate, whatever runs says. Call
// it for a generation before NodeReady (runs is copied); a stale (lower)
// generation is a no-op. For the ready generation the queue is pumped. It
// reports whether it applied.
func (p *Pool) NodeRuns(node string, gen uint64, runs map[string]Run) bool {
	p.lock()
	ok := p.s.setRuns(node, gen, runs)
	p.apply()
	p.mu.Unlock()
	return ok
}

// NodeFenced fences generation gen of node in one step (SPEC L8): every
// lease of that generation still held is returned exactly once, the
// generation's Fenced channel is closed, the node's resources go offline, and waiters stay queued against
// the remaining live candidates. A stale generation, or one already fenced,
// is a no-op (L9). It returns the number of leases returned.
func (p *Pool) NodeFenced(node string, gen uint64) int {
	p.lock()
	n := p.s.fence(node, gen)
	p.apply()
	p.mu.Unlock()
	return n
}

// NodeDraining marks ready generation gen of node as draining (the node
// sent NodeDrainingNotice on SIGTERM): its providers get no new lease from
// now on, while leases already held go on until released or fenced. A
// stale generation, one not ready, or a repeat is a no-op (SPEC L9); a new
// generation of the node starts live. It reports whether it applied.
func (p *Pool) NodeDraining(node string, gen uint64) bool {
	p.lock()
	ok := p.s.drain(node, gen)
	p.apply()
	p.mu.Unlock()
	return ok
}

// SetOverlay marks provider k of node generation gen runtime-unavailable
// (SPEC H8, H9): excluded from candidates and projected as unavailable. It
// applies only to the node's current ready generation and only when seq
// (health_observation_seq, H5) is above every seq accepted for (k, gen); it
// reports whether it applied. A later generation starts without overlay.
func (p *Pool) SetOverlay(k Key, gen, seq uint64) bool {
	p.lock()
	ok := p.s.setOverlay(k, gen, seq)
	p.apply() // waiters pinned to k may move (R1)
	p.mu.Unlock()
	return ok
}

// ClearOverlay lifts k's overlay after an available recovery probe (SPEC
// H10) and pumps waiters (Q5). It applies only when k is overlaid at the
// current ready generation gen and seq is above every seq accepted for
// (k, gen); anything else changes nothing. It reports whether it applied.
func (p *Pool) ClearOverlay(k Key, gen, seq uint64) bool {
	p.lock()
	ok := p.s.clearOverlay(k, gen, seq)
	p.apply()
	p.mu.Unlock()
	return ok
}

// Snapshot returns every configured node in config order with its
// providers as ProviderSnapshots (SPEC N3, Q8, H9). The result is a copy
// the caller owns.
func (p *Pool) Snapshot() []NodeSnapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.snapshot()
}

// Routing returns every configured model group's routing mode and its
// prefix_affinity decision counts, in config order (R1). The result
// is a copy the caller owns.
func (p *Pool) Routing() []GroupRouting {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.routing()
}

// Stats returns the number of leases held and of waiters queued, over all
// resources and groups.
func (p *Pool) Stats() (leases, waiters int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.leases, p.s.waiters
}
