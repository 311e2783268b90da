package adapter

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/protocol"
)

// gate is the capacity gate of one adapter instance (SPEC E4): it admits a
// run or tunnel while fewer than limit requests run on the adapter, counted
// node-wide (use is shared by every Set of the process, through Capacity:
// every edge's, and the one a refresh replaces), and — for an edge with a
// capacity share — while fewer than edgeLimit of that edge's do. It never
// waits. It is defense-in-depth behind the Edge's provider leases, not a
// second queue; over it the request ends with the typed over_capacity
// terminal before any upstream call, carrying the edge's fair share.
//
// Between edges the gate is work-conserving: a free slot goes to whichever
// edge's request comes for it, however many of that edge's run, with one
// tie-breaker for the last free slots. An edge's fair share is ceil(limit
// / edges that want the adapter: requests running, or refused within
// fairWindow). An edge refused for want of a slot while below its share is
// due: its pool tries again within the edge's RefusedRetry (50 ms), and
// for holdWindow, or until one of its requests is admitted, the last free
// slot — one per due edge — is its: a request of an edge at or above its
// share that would take it is refused. Without the hold an edge whose
// pool refills every slot it frees the moment it frees it would take them
// all, and the other edge's retries would meet a full adapter until they
// give up. Nothing else holds a slot: an edge that stopped asking frees
// its hold within holdWindow. The refusal carries the fair share, and the
// edge's pool admits no more than it for a while (the edge above it steps
// back to it). An edge with a capacity share is a hard split: it is
// refused at ceil(limit × share) of its own even with a slot free. A limit
// ≤ 0 means no local limit.
type gate struct {
	limit     int64
	use       *atomic.Int64
	edgeLimit int64
	edge      *edgeCount // this gate's edge; nil only before bind
	peers     *atomic.Pointer[[]*edgeCount]
	clock     func() int64 // monotonic ns; nil = monoNow (tests set Capacity.clock)
}

// edgeCount is one edge's requests on one adapter name: how many run, when
// it was last refused because the adapter was full (its demand), and
// whether a retry of it is due.
type edgeCount struct {
	use    atomic.Int64
	wanted atomic.Int64 // monotonic ns (since clockBase) of its last refusal; 0 = never
	due    atomic.Int64 // as wanted, of its last refusal below its fair share; 0 once one of its requests is admitted
}

// fairWindow is how long a refusal marks an edge as wanting the adapter;
// holdWindow how long a refusal below its share holds the last free slot
// for its retry (twice the edge pool's RefusedRetry).
const (
	fairWindow = time.Second
	holdWindow = 100 * time.Millisecond
)

var clockBase = time.Now()

func monoNow() int64 { return int64(time.Since(clockBase)) + 1 }

func (g *gate) now() int64 {
	if g.clock != nil {
		return g.clock()
	}
	return monoNow()
}

// refusal is why tryAcquire refused; admitted when it did not.
type refusal uint8

const (
	admitted     refusal = iota
	refusedShare         // the edge's capacity share is used (the hard split)
	refusedFull          // every slot is taken
	refusedHeld          // the last free slots are held for other edges' due retries
)

// tryAcquire admits one request if a slot is free for its edge; it never
// blocks. On a refusal fair is the edge's fair share, for the
// over_capacity terminal. An admission far from full costs two atomic adds
// and two loads; the clock and the other edges are read only near full.
func (g *gate) tryAcquire() (why refusal, fair int64) {
	if g.limit <= 0 {
		return admitted, 0
	}
	switch {
	case g.edgeLimit <= 0:
		g.edge.use.Add(1)
	case !acquire(&g.edge.use, g.edgeLimit):
		return refusedShare, min(g.fairShare(g.now()), g.edgeLimit) // the hard split, a slot free or not
	}
	v, ok := acquireN(g.use, g.limit)
	if !ok {
		g.edge.use.Add(-1)
		now := g.now()
		fair = g.fairShare(now)
		g.edge.wanted.Store(now)
		if g.edge.use.Load() < fair {
			g.edge.due.Store(now)
		}
		return refusedFull, fair
	}
	if ps := g.peers.Load(); ps != nil && g.limit-v < int64(len(*ps)-1) { // near full: fewer free slots left than other edges
		now := g.now()
		fair = g.fairShare(now)
		if g.edge.use.Load() > fair && g.limit-v < g.dueEdges(*ps, now, fair) {
			g.edge.use.Add(-1)
			g.use.Add(-1)
			return refusedHeld, fair // the last free slots are held for the due edges' retries
		}
	}
	if g.edge.due.Load() != 0 {
		g.edge.due.Store(0) // its retry is in: the hold ends
	}
	return admitted, 0
}

// fairShare is ceil(limit / k), k the edges that want the adapter (this
// one included).
func (g *gate) fairShare(now int64) int64 {
	k := int64(1)
	if ps := g.peers.Load(); ps != nil {
		for _, p := range *ps {
			if p != g.edge && (p.use.Load() > 0 || wants(p, now)) {
				k++
			}
		}
	}
	return (g.limit + k - 1) / k
}

// dueEdges counts the other edges whose retry is due (refused below their
// share within holdWindow, none of their requests admitted since) and that
// still run fewer than fair.
func (g *gate) dueEdges(ps []*edgeCount, now, fair int64) int64 {
	n := int64(0)
	for _, p := range ps {
		if d := p.due.Load(); p != g.edge && d != 0 && now-d < int64(holdWindow) && p.use.Load() < fair {
			n++
		}
	}
	return n
}

func wants(e *edgeCount, now int64) bool {
	w := e.wanted.Load()
	return w != 0 && now-w < int64(fairWindow)
}

// release returns a slot taken by tryAcquire.
func (g *gate) release() {
	if g.limit <= 0 {
		return
	}
	g.edge.use.Add(-1)
	g.use.Add(-1)
}

// full says why the gate refused, for the terminal's error text.
func (g *gate) full(why refusal, fair int64) string {
	switch why {
	case refusedShare:
		return fmt.Sprintf("its capacity share of %d concurrent requests from this edge", g.edgeLimit)
	case refusedHeld:
		return fmt.Sprintf("its fair share of %d concurrent requests from this edge while another edge's retry is due for the last free slot (capacity %d)", fair, g.limit)
	}
	return fmt.Sprintf("its capacity of %d concurrent requests", g.limit)
}

func acquire(n *atomic.Int64, limit int64) bool {
	_, ok := acquireN(n, limit)
	return ok
}

// acquireN adds one to n if it is below limit, and returns the new value.
func acquireN(n *atomic.Int64, limit int64) (int64, bool) {
	for {
		v := n.Load()
		if v >= limit {
			return v, false
		}
		if n.CompareAndSwap(v, v+1) {
			return v + 1, true
		}
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
	clock  func() int64                // the gates' clock; nil = monoNow
}

// counts are one adapter name's requests running: in all and per edge.
type counts struct {
	all    atomic.Int64
	_      [56]byte              // all, which every admission changes, on a cache line of its own: the gates read edges beside it
	byEdge map[string]*edgeCount // guarded by Capacity.mu
	// edges is byEdge's values, replaced (never changed) under
	// Capacity.mu, for the gates to read without it.
	edges atomic.Pointer[[]*edgeCount]
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
		n = &counts{byEdge: map[string]*edgeCount{}}
		c.counts[name] = n
	}
	e := n.byEdge[edge]
	if e == nil {
		e = new(edgeCount)
		n.byEdge[edge] = e
		all := make([]*edgeCount, 0, len(n.byEdge))
		for _, x := range n.byEdge {
			all = append(all, x)
		}
		n.edges.Store(&all)
	}
	g := gate{limit: capacity, use: &n.all, edge: e, peers: &n.edges, clock: c.clock}
	if el := protocol.ShareOf(capacity, share); share > 0 && el > 0 {
		g.edgeLimit = el
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
				return fmt.Errorf("adapter %q: %w: %s sent %s %q, edge %s runs %q under that name (one adapter name is one backend on a node: give the other backend another name; a node takes a new backend under the same name only when it starts, so restart it once every edge sends the new one)",
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
// replaced the others), and the count of each of its names that no Set
// claims any more and no request runs on: the names a node was ever sent
// do not pile up (a Set is closed after its requests returned, and only
// the newest Set of an edge takes new ones).
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
		if n := c.counts[name]; n != nil && c.claims[name] == nil && n.all.Load() == 0 {
			delete(c.counts, name)
		}
	}
}
