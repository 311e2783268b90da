package pool

import (
	"errors"
	"fmt"
)

// Requests that leave a group with no live provider (SPEC V1). A request
// whose group has a fallback on `unavailable` (Request.LeaveUnavailable)
// never waits for a provider to come back: while none of the providers it
// may use (its class, narrowed by Exclude, the credential slot and the
// local-only mark) is live, Acquire fails with an *UnavailableError, at
// admission or, for a queued request, in the transition that took the
// last one away — a fence, a drain, an overlay, an ejection, what a node
// runs, a reload. The caller then decides the fallback; the error's
// Arrival lets it queue again in its place when no fallback can take it.
// Other requests wait as before (a provider may come back).

// ErrUnavailable: Request.LeaveUnavailable was set and no provider the
// request may use is live.
var ErrUnavailable = errors.New("pool: no live provider for the request")

// UnavailableError wraps ErrUnavailable. Reason says why each provider is
// not live (as WaitTimeoutError's); Arrival is the request's arrival
// number (Request.Arrival, SPEC G5) to queue again with.
type UnavailableError struct {
	Model   string
	Reason  string
	Arrival uint64
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("model %q: %s", e.Model, e.Reason)
}

func (e *UnavailableError) Unwrap() error { return ErrUnavailable }

// hasLive reports whether some candidate of c is live (capacity aside).
func (c *class) hasLive() bool {
	for i := range c.cands {
		if c.cands[i].res.live() {
			return true
		}
	}
	return false
}

// leaveUnavailable fails every queued waiter that asked to leave
// (Request.LeaveUnavailable) whose class has no live candidate any more.
// Called at the end of each transition that can take liveness away; a
// no-op while no such waiter is queued.
func (s *state) leaveUnavailable() {
	if s.leavers == 0 {
		return
	}
	for w := s.all.head; w != nil; {
		next := w.anext
		if w.leave && !w.cls.hasLive() {
			reason := w.cls.why()
			s.dequeue(w)
			s.fx.failed = append(s.fx.failed, failure{w, &UnavailableError{Model: w.model, Reason: reason, Arrival: w.seq}})
		}
		w = next
	}
}
