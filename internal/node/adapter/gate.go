package adapter

import (
	"fmt"
	"sync"
	"sync/atomic"

	"iop/internal/protocol"
)

// gate is the capacity gate of one adapter instance (SPEC E4): it admits a
// run or tunnel while fewer than limit requests run on the adapter, counted
// node-wide (use is shared by every Set of the process, through
// Capacity: every edge's, and the one a refresh replaces), and — for an
// edge with a capacity share — while fewer than edgeLimit of that edge's
// do. It never waits. It is defense-in-depth behind the Edge's provider
// leases, not a second queue; over it the request ends with the typed
// over_capacity terminal before any upstream call. A limit ≤ 0 means no
// local limit.
type gate struct {
	limit     int64
	use       *atomic.Int64
	edgeLimit int64
	edgeUse   *atomic.Int64 // nil without a share
}

// tryAcquire admits one request if a slot is free; it never blocks.
func (g *gate) tryAcquire() bool {
	if !acquire(g.use, g.limit) {
		return false
	}
	if g.edgeUse != nil && !acquire(g.edgeUse, g.edgeLimit) {
		release(g.use, g.limit)
		return false
	}
	return true
}

// release returns a slot taken by tryAcquire.
func (g *gate) release() {
	if g.edgeUse != nil {
		release(g.edgeUse, g.edgeLimit)
	}
	release(g.use, g.limit)
}

// full says why the gate refused, for the terminal's error text.
func (g *gate) full() string {
	if g.edgeUse != nil && g.edgeUse.Load() >= g.edgeLimit {
		return fmt.Sprintf("its capacity share of %d concurrent requests from this edge", g.edgeLimit)
	}
	return fmt.Sprintf("its capacity of %d concurrent requests", g.limit)
}

func acquire(n *atomic.Int64, limit int64) bool {
	if limit <= 0 {
		return true
	}
	for {
		v := n.Load()
		if v >= limit {
			return false
		}
		if n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

func release(n *atomic.Int64, limit int64) {
	if limit > 0 {
		n.Add(-1)
	}
}

// Capacity is a Node's capacity (SPEC E4): the count of requests running
// on each adapter name, shared by every Set built with it — one per edge
// session, and the ones refreshes replace — so that an adapter admits at
// most its capacity whichever edges its requests come from. Each Set
// admits by the capacity its own payload gives (so during a rolling
// reload that changes a capacity, each edge's requests meet its own
// edge's number against the one node-wide count).
//
// It also records which backend each edge's payload names under an
// adapter name (its type and base URL): one name is one backend on a node,
// so a Set whose adapter names another backend than a Set of another edge
// under the same name is refused (ErrAdapterConflict). The zero value is
// not usable; make one with NewCapacity. Safe for concurrent use.
type Capacity struct {
	mu     sync.Mutex
	counts map[string]*counts
	claims map[string]map[string]claim // adapter name → edge → what its Set names
}

// counts are one adapter name's requests running: in all and per edge.
type counts struct {
	all    atomic.Int64
	byEdge map[string]*atomic.Int64 // guarded by Capacity.mu
}

// claim is the backend one edge's Set runs under an adapter name.
type claim struct {
	typ, base string
	set       *Set
}

// NewCapacity returns an empty Capacity.
func NewCapacity() *Capacity {
	return &Capacity{counts: map[string]*counts{}, claims: map[string]map[string]claim{}}
}

// gate returns the gate of adapter name for a request of edge: capacity
// node-wide, and ceil(capacity × share) for the edge when share > 0
// (protocol.ShareOf). Called with c.mu held.
func (c *Capacity) gateLocked(name, edge string, capacity int64, share float64) gate {
	n := c.counts[name]
	if n == nil {
		n = &counts{byEdge: map[string]*atomic.Int64{}}
		c.counts[name] = n
	}
	g := gate{limit: capacity, use: &n.all}
	if el := protocol.ShareOf(capacity, share); share > 0 && el > 0 {
		e := n.byEdge[edge]
		if e == nil {
			e = new(atomic.Int64)
			n.byEdge[edge] = e
		}
		g.edgeLimit, g.edgeUse = el, e
	}
	return g
}

// InUse is the number of requests running on adapter name, node-wide.
func (c *Capacity) InUse(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.counts[name]; n != nil {
		return n.all.Load()
	}
	return 0
}

// bind gives s's instances their gates and claims their backends for
// edge, after checking them against every other edge's claims under the
// same names; on a conflict it changes nothing and returns an error
// wrapping ErrAdapterConflict that names both edges and the field.
func (c *Capacity) bind(s *Set, edge string, share float64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range s.names {
		inst := s.instances[name]
		base := inst.ep.Base.String()
		for other, cl := range c.claims[name] {
			if other == edge {
				continue
			}
			field, mine, theirs := "type", inst.typ, cl.typ
			if mine == theirs {
				field, mine, theirs = "base_url", base, cl.base
			}
			if mine != theirs {
				this := "this edge"
				if edge != "" {
					this = "edge " + edge
				}
				return fmt.Errorf("adapter %q: %w: %s sent %s %q, edge %s runs %q under that name (one adapter name is one backend on a node: change it on every edge, or name the other backend differently)",
					name, ErrAdapterConflict, this, field, mine, other, theirs)
			}
		}
	}
	for _, name := range s.names {
		inst := s.instances[name]
		inst.gate = c.gateLocked(name, edge, inst.gate.limit, share)
		if c.claims[name] == nil {
			c.claims[name] = map[string]claim{}
		}
		c.claims[name][edge] = claim{typ: inst.typ, base: inst.ep.Base.String(), set: s}
	}
	return nil
}

// unbind drops the claims s still holds (a later Set of the same edge
// replaced the others).
func (c *Capacity) unbind(s *Set, edge string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range s.names {
		if cl, ok := c.claims[name][edge]; ok && cl.set == s {
			delete(c.claims[name], edge)
			if len(c.claims[name]) == 0 {
				delete(c.claims, name)
			}
		}
	}
}
