package pool

import "time"

// Passive health (outlier ejection) as the pool sees it: the
// decision of when to eject and when to re-admit is internal/edge/outlier's;
// the pool only keeps the projection — an ejected resource is no candidate
// (live) and shows status=unavailable, health=cooling and its window in
// snapshots. It is independent of the runtime-unavailable overlay (SPEC
// H8–H10) and of node generations: an ejection is about the backend, so it
// survives a node reconnect and a config reload.

// HealthCooling is ProviderSnapshot.health of an ejected provider.
const HealthCooling = "cooling"

// Eject excludes provider k from candidates until Readmit (passive health);
// until and reason (a bounded label such as "status") are shown in
// snapshots. A second Eject updates them. It reports false for an unknown
// provider.
func (p *Pool) Eject(k Key, until time.Time, reason string) bool {
	p.lock()
	defer p.mu.Unlock()
	ok := p.s.eject(k, until, reason)
	p.apply()
	return ok
}

// Readmit makes an ejected provider k a candidate again and pumps waiters
// (SPEC Q5). It reports whether k was ejected.
func (p *Pool) Readmit(k Key) bool {
	p.lock()
	defer p.mu.Unlock()
	ok := p.s.readmit(k)
	p.apply()
	return ok
}

// eject marks k ejected (no candidate) with its window for snapshots.
// Nothing becomes servable, so no pump; a waiter that leaves a group
// with no live provider (leave.go) may leave.
func (s *state) eject(k Key, until time.Time, reason string) bool {
	r := s.resources[k]
	if r == nil {
		return false
	}
	r.ejected, r.ejectedUntil, r.ejectReason = true, until, reason
	s.leaveUnavailable()
	return true
}

// readmit lifts k's ejection and pumps (SPEC Q5).
func (s *state) readmit(k Key) bool {
	r := s.resources[k]
	if r == nil || !r.ejected {
		return false
	}
	r.ejected, r.ejectedUntil, r.ejectReason = false, time.Time{}, ""
	s.pump()
	return true
}
