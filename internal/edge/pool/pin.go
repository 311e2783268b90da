package pool

// Affinity wait (models[].affinity_wait_ms, R1). Prefix affinity
// never makes a request wait while another candidate is free, unless its
// group says so: then a request whose conversation is held by a provider
// that is at capacity, while another candidate is free, waits up to the
// group's affinity wait for that provider before it takes any other.
//
// Such a waiter is pinned: it sits in state.pinned (arrival order, class
// links) instead of its key's FIFO in the scheduler (fair.go), so it never
// blocks the waiters behind it, and only its holder can serve it. The pump
// grants the pinned waiter with the lowest arrival number whose holder is
// free when its priority class is above the scheduler's choice's (unless
// the starvation bound chose that class), or the same and it arrived
// earlier; its key is charged like any grant. A pinned waiter leaves the list
// when it is granted, cancelled or timed out (dequeue), when its holder
// stops being live (the pump moves it to its class at once: a cooling,
// overlaid or fenced provider is skipped as under any mode), when the
// affinity wait expires (unpin, armed by the wrapper) and on Reconfigure.
// Moving back keeps arrival order: it is inserted in its key's FIFO
// before every later arrival.
//
// Pinning needs a free waiter slot (queue.max_waiters); without one the
// request takes the free candidate at once.
//
// A request that queued because no candidate was free is pinned the same
// way when it reaches the head of its class and the first candidate to
// free is not its holder (which is still busy): under saturation every
// request queues, and without this the first slot to free anywhere would
// take every conversation. The pump pins it (pinQueued) and the wrapper
// arms its affinity wait from then on (effects.pins). A waiter is pinned
// at most once: after its affinity wait it takes any candidate.

// servablePinned returns the earliest pinned waiter whose holder is free
// now, with the holder's candidate entry in the waiter's class, after
// moving every waiter whose holder is no longer a live candidate of its
// class to that class.
func (s *state) servablePinned() (*waiter, *cand) {
	for w := s.pinned.head; w != nil; {
		next := w.next
		cd := w.cls.candFor(w.pin)
		switch {
		case cd == nil || !w.pin.live():
			s.unpin(w)
		case w.pin.free(w.cls.long):
			return w, cd
		}
		w = next
	}
	return nil, nil
}

// pinQueued moves w, the head of its class, to the pinned list (arrival
// order) waiting for holder, and asks the wrapper to arm its affinity wait.
func (s *state) pinQueued(w *waiter, holder *resource) {
	s.fairRemove(w)
	w.cls.unregisterIfEmpty()
	w.pin, w.pinnedOnce = holder, true
	s.pinned.insertBySeq(w)
	s.fx.pins = append(s.fx.pins, w)
}

// insertAfter links w (class links) after at, or first when at is nil.
func (q *wlist) insertAfter(at, w *waiter) {
	if at == nil {
		w.prev, w.next = nil, q.head
		if q.head != nil {
			q.head.prev = w
		} else {
			q.tail = w
		}
		q.head = w
	} else {
		w.prev, w.next = at, at.next
		if at.next != nil {
			at.next.prev = w
		} else {
			q.tail = w
		}
		at.next = w
	}
	q.n++
}

// unpin moves a pinned waiter back to its class, in arrival order within
// its key (fair.go); a no-op
// for a waiter that is not pinned (granted, gone or already moved). The
// caller pumps.
func (s *state) unpin(w *waiter) {
	if !w.queued || w.pin == nil {
		return
	}
	s.pinned.remove(w, false)
	w.pin = nil
	w.cls.register() // a narrowed class (exclude.go) is listed only while it has waiters
	s.fairPush(w)    // in arrival order within its key
}

// affinityExpired is the affinity-wait timer's transition: w stops waiting
// for its holder and competes for every candidate of its class.
func (s *state) affinityExpired(w *waiter) {
	if !w.queued || w.pin == nil {
		return
	}
	s.unpin(w)
	s.pump()
}

// unpinAll moves every pinned waiter to its class (Reconfigure rebuilds
// the classes; the affinity wait restarts nowhere).
func (s *state) unpinAll() {
	for w := s.pinned.head; w != nil; {
		next := w.next
		w.prev, w.next, w.pin = nil, nil, nil
		w = next
	}
	s.pinned = wlist{}
}

// repin runs after a transition that takes a provider out of the
// candidates without freeing anything (fence, overlay, drain): waiters pinned to
// it move to their classes and may be served by another candidate now.
func (s *state) repin() {
	if s.pinned.n > 0 {
		s.pump()
	}
}

// candFor returns c's candidate entry for r, or nil.
func (c *class) candFor(r *resource) *cand {
	for i := range c.cands {
		if c.cands[i].res == r {
			return &c.cands[i]
		}
	}
	return nil
}
