package pool

import (
	"context"
	"time"
)

// The transitions of a node's generations and of the runtime-unavailable
// overlay (SPEC L8-L10, N2, H8-H10): ready, fence, drain, the providers a
// generation runs (setRuns), a generation's end with its leases fenced,
// and an overlay set and cleared.

func (s *state) node(id string) *nodeState {
	n := s.nodes[id]
	if n == nil {
		n = &nodeState{id: id}
		s.nodes[id] = n
	}
	return n
}

// ready activates generation gen of node (SPEC L5): its resources become
// live and waiters are pumped. A generation below the high-water mark, or
// the current one already ready or fenced, is a no-op (L5 duplicate, L9
// stale). A newer generation first fences every lease of older ones: they
// belong to a superseded connection (L4, L8). It reports whether anything
// changed.
func (s *state) ready(id string, gen uint64, now time.Time, share float64) bool {
	n := s.node(id)
	if gen < n.gen || (gen == n.gen && (n.ready || n.fenced)) {
		return false
	}
	if gen > n.gen {
		s.endGeneration(n)
		s.fenceLeases(n, gen-1)
	}
	n.gen, n.ready, n.fenced, n.draining, n.readySince, n.share = gen, true, false, false, now, share
	n.fence, n.fenceCancel = context.WithCancel(context.Background())
	for _, r := range n.all {
		r.unlimit() // a new connection: what the node refused before says nothing now
	}
	s.pump()
	return true
}

// fence ends generation gen of node in one step (SPEC L8): every lease of
// that generation (or an older one) is returned exactly once and listed in
// fx.fenced, the node's resources go offline, and waiters stay queued
// against the remaining live candidates. A generation below the high-water
// mark, or one already fenced, is a no-op (L9). It returns the number of
// leases returned.
func (s *state) fence(id string, gen uint64) int {
	n := s.node(id)
	if gen < n.gen || (gen == n.gen && n.fenced) {
		return 0
	}
	s.endGeneration(n)
	n.gen, n.ready, n.fenced, n.draining, n.readySince = gen, false, true, false, time.Time{}
	count := s.fenceLeases(n, gen)
	s.repin()
	s.leaveUnavailable()
	return count
}

// drain marks ready generation gen of node as draining (its node is
// shutting down): its resources stop being candidates at once, while the
// leases it holds go on until they are released or the generation is
// fenced. Waiters stay queued against the remaining live candidates. Only
// the current ready generation can drain; anything else is a no-op (L9).
// It reports whether it changed anything.
func (s *state) drain(id string, gen uint64) bool {
	n := s.node(id)
	if gen != n.gen || !n.ready || n.draining {
		return false
	}
	n.draining = true
	s.repin() // waiters pinned to its providers may go elsewhere now
	s.leaveUnavailable()
	return true
}

// setRuns records what generation gen of node runs (SPEC N2; see
// Pool.NodeRuns). A generation below the high-water mark is stale: a
// no-op. For the ready generation, waiters are pumped (a provider may have
// become live) and pinned ones re-pinned (one may have stopped being
// live). It reports whether it applied.
func (s *state) setRuns(id string, gen uint64, runs map[string]Run) bool {
	n := s.node(id)
	if gen < n.gen {
		return false
	}
	n.runs, n.runsGen = make(map[string]Run, len(runs)), gen
	for k, v := range runs {
		n.runs[k] = v
	}
	if gen == n.gen && n.ready {
		s.pump()
		s.leaveUnavailable()
	}
	return true
}

// endGeneration schedules the close of the ready generation's fence
// channel, if a generation was ready.
func (s *state) endGeneration(n *nodeState) {
	if n.fence != nil {
		s.fx.closes = append(s.fx.closes, n.fenceCancel)
		n.fence, n.fenceCancel = nil, nil
	}
}

func (s *state) fenceLeases(n *nodeState, upTo uint64) int {
	count := 0
	for _, r := range n.all {
		for l := r.leases; l != nil; {
			next := l.next
			if l.Generation <= upTo {
				s.unhold(l)
				s.fx.fenced = append(s.fx.fenced, l)
				count++
			}
			l = next
		}
	}
	return count
}

// setOverlay records a fresh runtime-unavailable observation for k (SPEC
// H8): only for the node's current ready generation and only when seq is
// above every seq accepted for (k, gen). seq 0 (absent) is never fresh.
func (s *state) setOverlay(k Key, gen, seq uint64) bool {
	r := s.overlayTarget(k, gen, seq)
	if r == nil {
		return false
	}
	r.seqGen, r.lastSeq = gen, seq
	r.overlaid, r.overlayGen = true, gen
	s.repin()
	s.leaveUnavailable()
	return true
}

// clearOverlay lifts the overlay of k after a recovery probe (SPEC H10):
// only when k is overlaid at gen and seq is fresh. It pumps (Q5).
func (s *state) clearOverlay(k Key, gen, seq uint64) bool {
	r := s.overlayTarget(k, gen, seq)
	if r == nil || !r.isOverlaid() {
		return false
	}
	r.seqGen, r.lastSeq = gen, seq
	r.overlaid = false
	s.pump()
	return true
}

func (s *state) overlayTarget(k Key, gen, seq uint64) *resource {
	r := s.resources[k]
	if r == nil || !r.configured || seq == 0 {
		return nil
	}
	if !r.node.ready || r.node.gen != gen {
		return nil
	}
	if r.seqGen == gen && seq <= r.lastSeq {
		return nil
	}
	return r
}
