package edge

import (
	"context"
	"sync"
)

// applier serializes recomputations of the effective config (SPEC N2,
// J2): request asks for one (from any goroutine, never blocking: requests
// coalesce), the main loop runs apply when kick fires, and wait blocks
// until every change requested before it has been applied.
type applier struct {
	kick chan struct{} // cap 1

	mu        sync.Mutex
	want, did uint64
	done      chan struct{} // closed and replaced when did advances
}

func newApplier() *applier {
	return &applier{kick: make(chan struct{}, 1), done: make(chan struct{})}
}

func (a *applier) request() {
	a.mu.Lock()
	a.want++
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// apply runs fn, which applies every change requested so far.
func (a *applier) apply(fn func()) {
	a.mu.Lock()
	target := a.want
	a.mu.Unlock()
	fn()
	a.mu.Lock()
	if target > a.did {
		a.did = target
		close(a.done)
		a.done = make(chan struct{})
	}
	a.mu.Unlock()
}

// wait returns once every change requested before the call was applied,
// or ctx ended.
func (a *applier) wait(ctx context.Context) {
	a.mu.Lock()
	target := a.want
	for a.did < target {
		done := a.done
		a.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
		a.mu.Lock()
	}
	a.mu.Unlock()
}
