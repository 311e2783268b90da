package pool

import "fmt"

// Narrowed classes (SPEC H11). A re-dispatched request must not
// get a provider it already tried (Request.Exclude), so it cannot wait in
// its class's FIFO: the head of a class must be servable by every free
// candidate of the class, or the scheduling rule of doc.go breaks. It
// waits instead in a narrowed class — same group, operation and long-ness,
// the class's candidates minus the excluded ones — which the pump serves by
// arrival number like any other class. Requests that excluded the same
// providers share one narrowed class. A narrowed class is in its group's
// class list only while it has waiters; re-dispatches are rare, so their
// classes cost nothing in steady state.

// A re-dispatch also stays within the credential slot of the route it
// was bound to (SPEC C6: no fallback to another credential slot of the
// same model after a bound route fails): its narrowed class keeps only the
// candidates of that slot.

// narrow returns the class of c's requests that exclude the providers in
// ex, when sameSlot every route whose credential slot is not slot, and
// when localOnly every remote route (SPEC V3): c
// itself when that leaves all of c's candidates, nil when it leaves none,
// else the group's narrowed class with exactly the remaining candidates
// (found among the registered ones, or new and unregistered).
func (c *class) narrow(ex []Key, sameSlot bool, slot string, localOnly bool) *class {
	keep := make([]cand, 0, len(c.cands))
	for _, cd := range c.cands {
		if !excluded(ex, cd.res.cfg.Key) && (!sameSlot || cd.slot == slot) && !(localOnly && cd.remote) {
			keep = append(keep, cd)
		}
	}
	switch len(keep) {
	case 0:
		return nil
	case len(c.cands):
		return c
	}
	for _, o := range c.g.classes {
		if o.narrowed && o.op == c.op && o.long == c.long && sameCands(o.cands, keep) {
			return o
		}
	}
	return &class{g: c.g, op: c.op, long: c.long, cands: keep, narrowed: true}
}

func excluded(ex []Key, k Key) bool {
	for _, e := range ex {
		if e == k {
			return true
		}
	}
	return false
}

func sameCands(a, b []cand) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].res != b[i].res {
			return false
		}
	}
	return true
}

// register puts a narrowed class into its group's class list before its
// first waiter is queued; no-op for other classes.
func (c *class) register() {
	if c.narrowed && !c.registered {
		c.g.classes = append(c.g.classes, c)
		c.registered = true
	}
}

// unregisterIfEmpty takes a narrowed class without waiters out of its
// group's class list.
func (c *class) unregisterIfEmpty() {
	if !c.narrowed || !c.registered || c.n > 0 {
		return
	}
	cs := c.g.classes
	for i, o := range cs {
		if o == c {
			copy(cs[i:], cs[i+1:])
			cs[len(cs)-1] = nil
			c.g.classes = cs[:len(cs)-1]
			break
		}
	}
	c.registered = false
}

// allTried is the ErrAllTried of a request of model that excluded every
// candidate (within credential slot slot, when sameSlot).
func allTried(model string, sameSlot bool, slot string) error {
	if sameSlot && slot != "" {
		return fmt.Errorf("model %q: %w within credential slot %q", model, ErrAllTried, slot)
	}
	return fmt.Errorf("model %q: %w", model, ErrAllTried)
}
