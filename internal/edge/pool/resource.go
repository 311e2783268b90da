package pool

import (
	"iop/internal/protocol"
)

// A resource's predicates the machine chooses candidates by (SPEC Q3, P3,
// N2, E4): live, free, the capacities its node's generation runs it with
// and this edge's share of them, the operations it supports.

func (r *resource) isOverlaid() bool {
	return r.overlaid && r.overlayGen == r.node.gen
}

// live reports whether r may be a candidate (SPEC Q3, P3, N2): configured,
// its node ready at the current generation, not draining and running r as
// configured, no overlay, not ejected by passive health (cooling.go), some
// capacity.
func (r *resource) live() bool {
	if !r.configured || !r.node.ready || r.node.draining || !r.run() || r.isOverlaid() || r.ejected {
		return false
	}
	c, _ := r.caps()
	return c > 0
}

// run reports whether r's node's current generation runs r as the config
// defines it (SPEC N2: a payload the node answered RESTART_REQUIRED or
// FAILED to is not what it runs, so a provider that payload adds or
// changes is not served by it). True when NodeRuns never said otherwise.
func (r *resource) run() bool {
	n := r.node
	if n.runs == nil {
		return true
	}
	ru, ok := n.runs[r.cfg.Provider]
	return n.runsGen == n.gen && ok && ru.Revision == r.cfg.Revision
}

// caps are r's capacity and long capacity before any share: the ones its
// node's generation runs it with (NodeRuns), else the configured ones.
func (r *resource) caps() (capacity, long int) {
	if n := r.node; n.runs != nil && n.runsGen == n.gen {
		if ru, ok := n.runs[r.cfg.Provider]; ok {
			return ru.Capacity, ru.LongCapacity
		}
	}
	return r.cfg.Capacity, r.cfg.LongCapacity
}

func (r *resource) free(long bool) bool {
	return r.inFlight < r.capacity() && (!r.limited || r.inFlight < r.limit) && (!long || r.longInFlight < r.longCapacity())
}

// capacity and longCapacity are what r admits from this edge: the
// numbers its node's generation runs it with (caps), or that
// generation's share of them (the node's edges[].capacity_share,
// protocol.ShareOf; SPEC E4).
func (r *resource) capacity() int {
	c, _ := r.caps()
	return int(protocol.ShareOf(int64(c), r.node.share))
}

func (r *resource) longCapacity() int {
	_, l := r.caps()
	return int(protocol.ShareOf(int64(l), r.node.share))
}

func (r *resource) supports(op string) bool {
	for _, o := range r.cfg.Operations {
		if o == op {
			return true
		}
	}
	return false
}
