package adapter

import "sync/atomic"

// gate is the capacity gate of one adapter instance (SPEC E4): a counter of
// admitted runs and tunnels, shared by both, that never waits. It is
// defense-in-depth behind the Edge's provider leases, not a second queue.
// limit ≤ 0 means no local limit.
type gate struct {
	limit int64
	inUse atomic.Int64
}

// tryAcquire admits one request if a slot is free; it never blocks.
func (g *gate) tryAcquire() bool {
	if g.limit <= 0 {
		return true
	}
	for {
		n := g.inUse.Load()
		if n >= g.limit {
			return false
		}
		if g.inUse.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release returns a slot taken by tryAcquire.
func (g *gate) release() {
	if g.limit > 0 {
		g.inUse.Add(-1)
	}
}
