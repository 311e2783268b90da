package pool

import (
	"fmt"
	"strings"
	"time"

	"iop/internal/edge/routing"
)

// reconfigure installs cfg (SPEC Q5 config change). Leases, node
// generations, readiness and overlays survive: a lease keeps its resource
// even when the resource left the config, and capacity below in_flight just
// admits nothing until enough leases return. Queued waiters move, in arrival
// order, to their group's new class; a waiter whose group is gone fails with
// ErrUnknownModel and one whose operation no provider supports any more with
// ErrNoCandidate. Then the queue is pumped.
func (s *state) reconfigure(cfg Config) {
	s.maxWaiters = cfg.MaxWaiters
	s.waitTimeout = cfg.WaitTimeout
	s.affEntries = cfg.AffinityEntries
	s.starveGrants = cfg.StarvationGrants
	if s.starveGrants <= 0 {
		s.starveGrants = DefaultStarvationGrants
	}

	for _, r := range s.resources {
		r.configured = false
	}
	for _, n := range s.nodes {
		n.configured = false
		n.resources = n.resources[:0]
	}
	s.nodeOrder = s.nodeOrder[:0]
	addNode := func(id string) *nodeState {
		n := s.node(id)
		if !n.configured {
			n.configured = true
			s.nodeOrder = append(s.nodeOrder, n)
		}
		return n
	}
	for _, id := range cfg.Nodes {
		addNode(id)
	}
	for _, rc := range cfg.Resources {
		n := addNode(rc.Node)
		r := s.resources[rc.Key]
		if r == nil {
			r = &resource{node: n, id: routing.ProviderID(rc.Key.String())}
			s.resources[rc.Key] = r
			n.all = append(n.all, r)
		}
		rc.Operations = append([]string(nil), rc.Operations...)
		r.cfg = rc
		if !r.configured {
			r.configured = true
			n.resources = append(n.resources, r)
		}
	}

	s.groups = make(map[string]*group, len(cfg.Groups))
	s.groupList = s.groupList[:0]
	for _, gc := range cfg.Groups {
		g := s.buildGroup(gc)
		s.groups[g.name] = g
		s.groupList = append(s.groupList, g)
	}

	s.markCosted()
	s.unpinAll()
	s.resetFair()
	for w := s.all.head; w != nil; {
		next := w.anext
		s.rehome(w)
		w = next
	}
	s.pump()
	s.leaveUnavailable()
}

// buildGroup makes a group's classes: one per (operation, long) that some
// candidate supports, each with its candidates deduplicated by Key (the
// first entry in config order wins) and limited to resources that can ever
// serve it.
func (s *state) buildGroup(gc Group) *group {
	g := &group{name: gc.Name, longTokens: gc.LongContextTokens, mode: gc.Routing, epsilon: max(gc.Epsilon, 0)}
	if gc.Routing == routing.PrefixAffinity {
		g.affinityWait = gc.AffinityWait
		g.balance = max(gc.Balance, 0)
		g.fit = s.fits[gc.Name]
		if g.fit == nil {
			g.fit = routing.NewFit(s.seedTokenTime(gc))
			s.fits[gc.Name] = g.fit
		}
	}
	if gc.Timed {
		if g.svc = s.service[gc.Name]; g.svc == nil {
			g.svc = &serviceTime{}
			s.service[gc.Name] = g.svc
		}
	}
	g.fair = s.fair[gc.Name]
	if g.fair == nil {
		g.fair = &fairGroup{}
		s.fair[gc.Name] = g.fair
	}
	g.stats = s.routeStats[gc.Name]
	if g.stats == nil {
		g.stats = &routeCounts{}
		s.routeStats[gc.Name] = g.stats
	}
	var ops []string
	for _, cc := range gc.Candidates {
		r := s.resources[cc.Key]
		if r == nil || !r.configured {
			continue
		}
		for _, op := range r.cfg.Operations {
			if !contains(ops, op) {
				ops = append(ops, op)
			}
		}
	}
	for _, op := range ops {
		for _, long := range []bool{false, true} {
			c := &class{g: g, op: op, long: long}
			for _, cc := range gc.Candidates {
				r := s.resources[cc.Key]
				if r == nil || !r.configured || !r.supports(op) || r.cfg.Capacity <= 0 ||
					(long && r.cfg.LongCapacity <= 0) || c.has(r) {
					continue
				}
				c.cands = append(c.cands, cand{res: r, target: cc.Target, stall: cc.StallTimeoutMs, slot: cc.Slot, remote: cc.Remote})
			}
			if len(c.cands) > 0 {
				g.classes = append(g.classes, c)
			}
		}
	}
	return g
}

func (c *class) has(r *resource) bool {
	for i := range c.cands {
		if c.cands[i].res == r {
			return true
		}
	}
	return false
}

// rehome moves a queued waiter to its class in the new config or fails it.
func (s *state) rehome(w *waiter) {
	g := s.groups[w.model]
	var c *class
	if g != nil {
		c = g.class(w.op, g.isLong(w.promptTokens))
	}
	if c != nil && (len(w.exclude) > 0 || w.sameSlot || w.localOnly) {
		c = c.narrow(w.exclude, w.sameSlot, w.slot, w.localOnly)
	}
	if c == nil {
		s.all.remove(w, true)
		w.queued = false
		s.waiters--
		if w.leave {
			s.leavers--
		}
		s.countKey(w, -1)
		var err error = fmt.Errorf("model %q removed by reconfigure: %w", w.model, ErrUnknownModel)
		switch {
		case g != nil && (len(w.exclude) > 0 || w.sameSlot) && g.class(w.op, g.isLong(w.promptTokens)) != nil:
			err = allTried(w.model, w.sameSlot, w.slot)
		case g != nil:
			err = &NoCandidateError{Model: w.model, Operation: w.op, Long: g.isLong(w.promptTokens)}
		}
		s.fx.failed = append(s.fx.failed, failure{w, err})
		return
	}
	// The old class is garbage now; only w's links need resetting.
	w.prev, w.next, w.flow = nil, nil, nil
	w.cls = c
	c.register()
	s.fairPush(w)
}

// resetFair empties every group's scheduler before the waiters are
// rehomed (their classes are rebuilt): the flows' tags and the classes'
// virtual times stay for the groups still configured, so no key banks or
// loses its place in the share (SPEC G1); idle flows that bank nothing
// and the groups no longer configured are forgotten.
func (s *state) resetFair() {
	for name, fg := range s.fair {
		if s.groups[name] == nil {
			delete(s.fair, name)
			continue
		}
		for t := range fg.tiers {
			ft := &fg.tiers[t]
			clear(ft.active)
			ft.active = ft.active[:0]
			for k, f := range ft.flows {
				f.lists, f.n, f.active = nil, 0, -1
				if f.finish <= ft.vtime {
					delete(ft.flows, k)
				}
			}
		}
	}
	s.tierWaiting = [NumPriorities]int{}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// why explains, for a WaitTimeoutError, why c's waiters are not served.
func (c *class) why() string {
	live := 0
	var down []string
	for i := range c.cands {
		r := c.cands[i].res
		switch {
		case r.live():
			live++
		case !r.node.ready:
			down = append(down, "node "+r.node.id+" not ready")
		case !r.run():
			down = append(down, "provider "+r.cfg.Key.String()+" not in the config node "+r.node.id+
				" runs (it answered a refresh RESTART_REQUIRED or FAILED)")
		case r.isOverlaid():
			down = append(down, "provider "+r.cfg.Key.String()+" unavailable")
		case r.ejected:
			down = append(down, "provider "+r.cfg.Key.String()+" cooling down after "+r.ejectReason+" failures until "+
				r.ejectedUntil.UTC().Format(time.RFC3339))
		default:
			down = append(down, "provider "+r.cfg.Key.String()+" not configured")
		}
	}
	if live == 0 {
		return "no live provider: " + strings.Join(dedupe(down), "; ")
	}
	noun := "providers"
	if live == 1 {
		noun = "provider"
	}
	if c.long {
		return fmt.Sprintf("all %d live %s at capacity or long-context capacity", live, noun)
	}
	return fmt.Sprintf("all %d live %s at capacity", live, noun)
}

func dedupe(list []string) []string {
	out := list[:0]
	for _, s := range list {
		if !contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
