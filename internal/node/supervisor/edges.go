package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// Edge is one edge a Node serves, for RunEdges.
type Edge struct {
	// Name says which edge in log lines ("edge-1 at 10.0.0.1:7443").
	Name string
	// Connect runs one attempt at this edge, as a ConnectFunc does; it
	// calls ready (from any goroutine, at most once) when the edge
	// answered ready=true, before the live session runs.
	Connect func(ctx context.Context, ready func()) (reachedReady bool, err error)
	// Log is this edge's logger; nil = discard.
	Log *slog.Logger
}

// RunEdges is the supervision of a Node that serves several edges (SPEC
// S1–S5 per edge): one goroutine per edge does that edge's first dial and
// every reconnect, serially, under p, as Run does for one. The edges are
// independent but for two rules:
//
//   - Attempts count toward p.MaxAttempts only while no edge has a ready
//     session: an edge's count is the consecutive failed attempts at it
//     made wholly since the Node last had a ready session on any edge (an
//     attempt during which some edge was ready, or became or stopped being
//     ready, does not count and starts the count over). So one edge that
//     is down while another serves is retried every p.Interval for as long
//     as it takes, and once the last ready session is lost every edge gets
//     exactly p.MaxAttempts attempts.
//   - An edge that used up its attempts waits: when another edge's session
//     becomes ready its count starts over and it is retried; when every
//     edge has used up its attempts RunEdges returns an error wrapping
//     ErrExhausted (one per edge, each with its last attempt's error), and
//     the process exits 1 (SPEC S4). An edge whose attempt wraps ErrGiveUp
//     (it said retrying cannot help, SPEC N6) has used them up for good:
//     it is not tried again until the process restarts.
//
// A fatal attempt at any edge (a local error, SPEC S3) stops every edge
// and RunEdges returns it. After ctx is done it returns nil once every
// edge's attempt or session has returned (a ready session drains first).
// With one edge it behaves as Run.
func RunEdges(ctx context.Context, p Policy, edges []Edge) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &fleet{live: make([]bool, len(edges)), parked: make([]bool, len(edges)), changed: make(chan struct{})}
	errs := make([]error, len(edges))
	var wg sync.WaitGroup
	for i, e := range edges {
		wg.Go(func() {
			errs[i] = f.supervise(ctx, i, p, e)
			if errors.Is(errs[i], ErrFatal) {
				cancel() // a local error: no edge can be served
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if errors.Is(err, ErrFatal) {
			return err
		}
	}
	return errors.Join(errs...) // nil after shutdown; each wraps ErrExhausted otherwise
}

// fleet is what the edges' supervisors share: which edge has a ready
// session and which used up its attempts. changed is closed and replaced
// at every change.
type fleet struct {
	mu      sync.Mutex
	live    []bool
	parked  []bool
	changed chan struct{}
	// liveSeq changes whenever some edge's session becomes ready or ends.
	liveSeq uint64
	// exhausted: every edge was parked at once; sticky, so that each
	// parked edge gives up even after the first one left.
	exhausted bool
}

func (f *fleet) set(flags []bool, i int, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setLocked(flags, i, v)
}

// setLive records whether edge i has a ready session.
func (f *fleet) setLive(i int, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.setLocked(f.live, i, v) {
		f.liveSeq++
	}
}

// setLocked sets flags[i] to v and reports whether that changed it; f.mu
// is held.
func (f *fleet) setLocked(flags []bool, i int, v bool) bool {
	if flags[i] == v {
		return false
	}
	flags[i] = v
	close(f.changed)
	f.changed = make(chan struct{})
	return true
}

// liveState reports a number that changes whenever some edge's session
// becomes ready or ends, and whether some edge has a ready session now.
func (f *fleet) liveState() (seq uint64, anyLive bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.live {
		anyLive = anyLive || l
	}
	return f.liveSeq, anyLive
}

// park waits, for edge i that used up its attempts, until another edge
// becomes ready (true: start over; never when forGood, an edge that said
// retrying cannot help), every edge used up its attempts (false) or ctx
// is done (false).
func (f *fleet) park(ctx context.Context, i int, forGood bool) bool {
	f.set(f.parked, i, true)
	for {
		f.mu.Lock()
		all, live := true, false
		for j := range f.parked {
			all = all && f.parked[j]
			live = live || f.live[j]
		}
		if all && !f.exhausted {
			f.exhausted = true
			close(f.changed)
			f.changed = make(chan struct{})
		}
		exhausted, ch := f.exhausted, f.changed
		f.mu.Unlock()
		switch {
		case exhausted:
			return false
		case live && !forGood:
			f.set(f.parked, i, false)
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// supervise is edge i's loop (see RunEdges).
func (f *fleet) supervise(ctx context.Context, i int, p Policy, e Edge) error {
	log := e.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	failed := 0
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return nil
		}
		seq0, live0 := f.liveState()
		ready, err := e.Connect(ctx, func() { f.setLive(i, true) })
		f.setLive(i, false)
		if ctx.Err() != nil {
			log.Info("supervisor stopped by local shutdown")
			return nil
		}
		seq1, live1 := f.liveState()
		// S2: a failed attempt counts only when no edge was ready at
		// any time during it; otherwise the Node had a ready session
		// since, and the count starts over.
		counted := !ready && !live0 && !live1 && seq0 == seq1
		if counted {
			failed++
		} else {
			failed = 0
		}
		d := Decide(failed, KindOf(err), p)
		switch d.Action {
		case Fatal:
			log.Error("supervisor: fatal error, not retrying", "err", err)
			return fmt.Errorf("edge %s: attempt %d: %w", e.Name, attempt, err)
		case GiveUp:
			forGood := KindOf(err) == KindGiveUp
			if forGood {
				log.Error("supervisor: this edge says retrying cannot help; not trying it again", "err", err)
			} else {
				log.Error("supervisor: attempts at this edge exhausted; waiting for another edge", "failed_attempts", failed, "err", err)
			}
			if !f.park(ctx, i, forGood) {
				if ctx.Err() != nil {
					return nil
				}
				log.Error("supervisor: giving up: every edge's attempts are exhausted")
				return fmt.Errorf("%w: edge %s: %d consecutive failed attempts, last: %w", ErrExhausted, e.Name, failed, err)
			}
			log.Info("another edge is ready: trying this edge again")
			failed = 0
			d.Wait = p.Interval
		case Retry:
			switch {
			case ready:
				log.Warn("session ended, reconnecting", "err", err, "wait", d.Wait)
			case !counted:
				log.Warn("connect attempt failed while another edge was ready (not counted), retrying", "err", err, "wait", d.Wait)
			default:
				log.Warn("connect attempt failed, retrying", "attempt", failed, "max_attempts", p.MaxAttempts, "err", err, "wait", d.Wait)
			}
		}
		if !wait(ctx, d.Wait) {
			log.Info("supervisor stopped by local shutdown")
			return nil
		}
	}
}
