package pool

import "time"

// Over-capacity refusals (SPEC E4, Q2). A node's capacity is its own:
// when several edges lease the same provider, each edge's pool counts only
// its own leases, so a node's capacity gate may refuse a request this pool
// admitted (failure code over_capacity: the other edges hold the rest).
// Nothing ran; the request is queued again, not failed, and the provider
// does not cool (passive health never hears it). The pool learns from the
// refusal: the provider admits no more leases than this edge holds on it
// at that moment — each of those, when it ends, frees a node slot this
// edge may take again — until a probe window passes, after which it admits
// up to its capacity again, finding out whether the other edges still hold
// theirs. A refusal that comes within twice the window after the previous
// one was lifted doubles the window (RefusedBackoff to RefusedBackoffMax);
// one after a quiet spell starts it over. The node says in the refusal
// what this edge's fair share is: the provider admits no more than that
// during the window (an edge above it steps back to it, freeing node
// slots), and an edge below it tries again after RefusedRetry: the node
// holds the last free slot for that retry (for twice RefusedRetry).

// Probe windows of a refused provider. A refusal that says this edge is
// below its fair share (the node's gate holds the last free slot for its
// retry, see the node's capacity gate) is retried after RefusedRetry
// instead.
const (
	RefusedBackoff    = 100 * time.Millisecond
	RefusedBackoffMax = time.Second
	RefusedRetry      = 50 * time.Millisecond
)

// lift is a refused provider's window: when it ends, lift it if seq is
// still the resource's (a newer refusal or generation replaced it).
type lift struct {
	r   *resource
	seq uint64
	d   time.Duration
}

// ReleaseRefused returns l, whose node refused its request over capacity
// before any upstream call, exactly once (as Release) and lowers what l's
// provider admits to the leases this pool still holds on it (and at most
// fairShare, the node's word for this edge's share; 0 = none said) until
// its probe window passes (see above). It reports what Release would.
func (p *Pool) ReleaseRefused(l *Lease, fairShare int) bool {
	now := p.clk.Now()
	p.lock()
	ok := p.s.refused(l, now, fairShare)
	p.apply()
	p.mu.Unlock()
	return ok
}

// refused returns l and limits its resource (ReleaseRefused). A held
// lease only; a second call or one after a fence changes nothing.
func (s *state) refused(l *Lease, now time.Time, fair int) bool {
	if l == nil || l.res == nil || l.returned {
		return false
	}
	r := l.res
	s.unhold(l)
	if l.Generation != r.node.gen {
		s.pump()
		return true
	}
	limit := r.inFlight
	if fair > 0 {
		limit = min(limit, fair)
	}
	below := fair > 0 && r.inFlight < fair // the node holds the last free slot for this edge: retry soon
	if r.limited && (!below || r.window <= RefusedRetry) {
		r.limit = min(r.limit, limit) // another refusal of the same burst: the window stands
		s.pump()
		return true
	}
	var d time.Duration
	switch {
	case below:
		d = RefusedRetry
	case r.backoff == 0 || r.liftedAt.IsZero() || now.Sub(r.liftedAt) >= 2*r.backoff:
		r.backoff = RefusedBackoff
		d = r.backoff
	default:
		r.backoff = min(2*r.backoff, RefusedBackoffMax)
		d = r.backoff
	}
	r.limited, r.limit, r.window = true, limit, d
	r.limitSeq++
	s.fx.lifts = append(s.fx.lifts, lift{r: r, seq: r.limitSeq, d: d})
	s.pump() // other providers may serve what waits
	return true
}

// liftLimit ends a refused provider's window (its timer fired) and pumps.
func (s *state) liftLimit(r *resource, seq uint64, now time.Time) {
	if !r.limited || r.limitSeq != seq {
		return
	}
	r.limited, r.liftedAt = false, now
	s.pump()
}

// unlimit forgets a resource's refusals (a new generation of its node).
func (r *resource) unlimit() {
	r.limited, r.limit, r.backoff, r.window, r.liftedAt = false, 0, 0, 0, time.Time{}
	r.limitSeq++
}
