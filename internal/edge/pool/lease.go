package pool

import (
	"iop/internal/edge/routing"
)

// The transitions that hand a lease to a request and take it back (SPEC
// Q2, L10): grant (a free resource to a waiter or an arriving request),
// grantTo, release and unhold (a lease returned, its slot pumped to the
// next waiter).

// grant gives cd's resource to a request of class c with prefix and
// promptTokens, decided as res (counted and recorded for prefix_affinity
// groups only; its prefill queued on a costed resource, cost.go).
func (s *state) grant(c *class, cd *cand, prefix []uint64, promptTokens int, res routing.Result) *Lease {
	r := cd.res
	var sample routing.Sample
	if r.costed {
		sample = s.queuePrefill(c.g, r, prefix, promptTokens)
	}
	if c.g.mode == routing.PrefixAffinity {
		s.recordAffinity(c.g, r, prefix, promptTokens, res)
	}
	l := &Lease{
		Key:            r.cfg.Key,
		Model:          c.g.name,
		Generation:     r.node.gen,
		Target:         cd.target,
		Type:           r.cfg.Type,
		StallTimeoutMs: cd.stall,
		Long:           c.long,
		Slot:           cd.slot,
		res:            r,
		fenced:         r.node.fence,
		sample:         sample,
		fit:            c.g.fit,
	}
	if c.g.svc != nil {
		l.granted = s.now.UnixNano()
	}
	r.inFlight++
	if c.long {
		r.longInFlight++
	}
	l.next = r.leases
	if r.leases != nil {
		r.leases.prev = l
	}
	r.leases = l
	s.leases++
	return l
}

// unhold takes l off its resource and marks it returned.
func (s *state) unhold(l *Lease) {
	r := l.res
	r.inFlight--
	if l.Long {
		r.longInFlight--
	}
	if l.prev != nil {
		l.prev.next = l.next
	} else {
		r.leases = l.next
	}
	if l.next != nil {
		l.next.prev = l.prev
	}
	l.prev, l.next = nil, nil
	l.returned = true
	s.leases--
	if r.costed {
		r.bl.Released(s.now, l.sample, l.fit, r.inFlight == 0)
	}
}

// release returns l exactly once (SPEC Q2) and pumps (Q5). A second call,
// or a call after a fence returned it, reports false and changes nothing.
func (s *state) release(l *Lease) bool {
	if l == nil || l.res == nil || l.returned {
		return false
	}
	if l.granted != 0 {
		s.observeService(l) // wait.go: a lease held to its end
	}
	s.unhold(l)
	s.pump()
	return true
}

// grantTo is grant for queued waiter w, whose lease keeps its arrival
// number (Lease.Arrival).
func (s *state) grantTo(w *waiter, c *class, cd *cand, res routing.Result) *Lease {
	l := s.grant(c, cd, w.prefix, w.promptTokens, res)
	l.Arrival = w.seq
	return l
}
