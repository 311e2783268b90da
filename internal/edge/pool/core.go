package pool

import (
	"context"
	"fmt"
	"time"

	"iop/internal/edge/routing"
	"iop/internal/protocol"
)

// state is the pool's state machine. Its methods are the transitions; none
// does I/O, blocks, or reads a clock. Effects for the wrapper collect in fx
// and are drained by the caller after each transition.
type state struct {
	nodes     map[string]*nodeState
	nodeOrder []*nodeState // configured nodes in config order
	resources map[Key]*resource
	groups    map[string]*group
	groupList []*group // config order

	maxWaiters  int
	waitTimeout time.Duration
	affEntries  int // routing.Table limit per resource

	// routeStats counts prefix_affinity decisions per model name; it
	// survives Reconfigure so the counters only rise.
	routeStats map[string]*routeCounts
	scratch    []routing.Candidate // reused by pickAffinity

	seq     uint64  // arrival number of the last waiter
	waiters int     // queued waiters, all groups
	leavers int     // queued waiters with Request.LeaveUnavailable (leave.go)
	leases  int     // held leases, all resources
	all     wlist   // every queued waiter in arrival order
	fx      effects // effects of the current transition

	// fits are the prefix_affinity groups' calibrations by model name
	// (cost.go); like routeStats they survive Reconfigure.
	fits map[string]*routing.Fit

	// Affinity wait (pin.go): waiters pinned to the provider holding their
	// conversation, in arrival order (class links), and the holder admit
	// chose for the next enqueue.
	pinned wlist
	pinTo  *resource

	// now is the time of the current transition, set by the wrapper when
	// some group weighs the cost of a turn (costed, cost.go); it only rises.
	now    time.Time
	costed bool

	// The scheduler (fair.go): each group's by name (it outlives
	// Reconfigure), the starvation bound and how many grants passed each
	// priority class over, the waiters per class, the waiters per key and
	// the weight of the keys that wait, the pass counter of the servable
	// memo, and the arrival number admit gave the next enqueue.
	fair         map[string]*fairGroup
	starveGrants int
	skipped      [NumPriorities]int
	tierWaiting  [NumPriorities]int
	keyWait      map[string]*keyCount
	waitWeight   int
	mark         uint64
	arrival      uint64

	// service holds each Timed group's measured service times by model
	// name (wait.go); like fits they survive Reconfigure.
	service map[string]*serviceTime
}

// effects are what a transition asks the wrapper to carry out.
type effects struct {
	grants []grant              // hand lease to waiter
	failed []failure            // fail waiter with err
	fenced []*Lease             // leases the fence returned (for tests and counts)
	closes []context.CancelFunc // fence contexts of generations that ended
	pins   []*waiter            // queued waiters the pump pinned: arm their affinity wait (pin.go)
	lifts  []lift               // refused providers' probe windows to arm (refused.go)
}

type grant struct {
	w *waiter
	l *Lease
}

type failure struct {
	w   *waiter
	err error
}

func (fx *effects) reset() {
	if cap(fx.grants) > 1024 { // do not keep one huge pump's buffer
		fx.grants = nil
	}
	clear(fx.grants)
	clear(fx.failed)
	clear(fx.fenced)
	clear(fx.closes)
	clear(fx.pins)
	clear(fx.lifts)
	fx.grants, fx.failed, fx.fenced, fx.closes, fx.pins = fx.grants[:0], fx.failed[:0], fx.fenced[:0], fx.closes[:0], fx.pins[:0]
	fx.lifts = fx.lifts[:0]
}

// nodeState tracks one node id's generation high-water mark. gen only
// rises; a ready or fence for a lower generation is stale (SPEC L9).
type nodeState struct {
	id         string
	gen        uint64
	ready      bool // gen is the live, ready generation
	fenced     bool // gen was fenced; it cannot become ready again
	draining   bool // gen said it is shutting down: no new leases, held ones go on
	readySince time.Time
	// share is the ready generation's part of its resources' capacities
	// (NodeReadyShare; 0 = all of it).
	share float64
	// runs is what generation runsGen runs (NodeRuns), by provider name.
	// nil: never told, every configured resource is run as configured;
	// otherwise a resource is run only when runsGen is gen and runs has
	// its revision, with runs' capacities (SPEC N2).
	runs    map[string]Run
	runsGen uint64
	// fence is shared by every lease of the ready generation and cancelled
	// when that generation ends (one allocation per generation, not per
	// lease); nil while no generation is ready.
	fence       context.Context
	fenceCancel context.CancelFunc
	configured  bool
	resources   []*resource // configured, in config order
	all         []*resource // every resource ever known on this node
}

// resource is one provider resource's live state. The struct survives
// Reconfigure (leases point at it); configured says whether it is in the
// current config.
type resource struct {
	cfg          Resource
	configured   bool
	node         *nodeState
	inFlight     int
	longInFlight int
	leases       *Lease // head of held leases

	// Runtime-unavailable overlay (SPEC H8–H10), effective only while
	// overlayGen is the node's current generation (no inheritance, H9).
	overlaid   bool
	overlayGen uint64
	seqGen     uint64 // generation lastSeq belongs to
	lastSeq    uint64 // highest health_observation_seq accepted for seqGen

	// Prefix affinity (R1): the rendezvous identity and the table of
	// prefixes routed here, created on first use and valid only for the
	// node generation it names (a reconnected backend may have lost its
	// cache).
	id  uint64
	aff *routing.Table

	// The prefill queued on it (cost.go), kept while it is a candidate of
	// some prefix_affinity group (costed); fit is the calibration of the
	// first such group (its queue drains at that group's time per token).
	costed bool
	bl     routing.Backlog
	fit    *routing.Fit

	// What its node reports of its targets' residency (residency.go,
	// SPEC U6).
	resid residency

	// Passive-health ejection (cooling.go); no generation: it is about
	// the backend, not the node's connection.
	ejected      bool
	ejectedUntil time.Time
	ejectReason  string

	// Over-capacity refusals (refused.go): while limited, at most limit
	// leases; limitSeq names the current window, backoff is its length
	// and liftedAt when the last one ended.
	limited  bool
	limit    int
	limitSeq uint64
	backoff  time.Duration
	window   time.Duration // the current window's length
	liftedAt time.Time
}

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

type group struct {
	name         string
	longTokens   int
	classes      []*class
	mode         routing.Mode
	epsilon      float64
	affinityWait time.Duration
	balance      float64
	fit          *routing.Fit // prefix_affinity: the calibration of the cost of a turn (cost.go)
	stats        *routeCounts
	fair         *fairGroup // its scheduler (fair.go)
	// svc: a Timed group's measured service times (wait.go); nil otherwise.
	svc *serviceTime
}

func (g *group) isLong(promptTokens int) bool {
	return g.longTokens > 0 && promptTokens >= g.longTokens
}

func (g *group) class(op string, long bool) *class {
	for _, c := range g.classes {
		if c.long == long && c.op == op && !c.narrowed {
			return c
		}
	}
	return nil
}

// class is one group's waiters that want the same operation and the same
// long-ness, so they share one candidate list. They wait in the group's
// scheduler (fair.go), one FIFO per key and priority class; n counts them.
type class struct {
	g     *group
	op    string
	long  bool
	cands []cand // supporting, capacity > 0, deduplicated by Key, config order
	n     int
	// mark, ok: whether a free live candidate exists, as of scheduler
	// pass mark (state.servable).
	mark uint64
	ok   bool
	// narrowed: the class of re-dispatched requests that excluded some
	// providers (exclude.go); in g.classes only while it has waiters.
	narrowed   bool
	registered bool
}

type cand struct {
	res    *resource
	target string
	stall  int64
	slot   string // the route's credential slot (Candidate.Slot)
	remote bool   // Candidate.Remote
}

// waiter is one queued request. Its links are owned by the state; ch and
// stop by the wrapper.
type waiter struct {
	seq          uint64
	model        string
	op           string
	promptTokens int
	prefix       []uint64    // Request.Prefix, read while queued
	pin          *resource   // while pinned: the provider it waits for (pin.go)
	pinnedOnce   bool        // it was pinned once: after its affinity wait it takes any candidate
	stopPin      func() bool // stops the affinity-wait timer the wrapper armed for a pump-time pin
	exclude      []Key       // Request.Exclude
	sameSlot     bool        // Request.SameSlot
	slot         string      // Request.Slot
	localOnly    bool        // Request.LocalOnly
	leave        bool        // Request.LeaveUnavailable
	cls          *class
	queued       bool
	timeout      time.Duration
	// The scheduler's view (fair.go): Request.Key, weightOf(Weight),
	// Priority and Cost, and the key's flow it waits in.
	key          string
	weight       int
	prio         Priority
	cost         int
	flow         *flow
	prev, next   *waiter // the key's FIFO in its flow, or state.pinned
	aprev, anext *waiter // state.all
	ch           chan result
	stop         func() bool
}

type result struct {
	l   *Lease
	err error
}

// wlist is an intrusive FIFO of waiters; byAll selects the links.
type wlist struct {
	head, tail *waiter
	n          int
}

func (q *wlist) push(w *waiter, byAll bool) {
	if byAll {
		w.aprev, w.anext = q.tail, nil
		if q.tail != nil {
			q.tail.anext = w
		} else {
			q.head = w
		}
	} else {
		w.prev, w.next = q.tail, nil
		if q.tail != nil {
			q.tail.next = w
		} else {
			q.head = w
		}
	}
	q.tail = w
	q.n++
}

func (q *wlist) remove(w *waiter, byAll bool) {
	prev, next := w.prev, w.next
	if byAll {
		prev, next = w.aprev, w.anext
	}
	if prev != nil {
		if byAll {
			prev.anext = next
		} else {
			prev.next = next
		}
	} else {
		q.head = next
	}
	if next != nil {
		if byAll {
			next.aprev = prev
		} else {
			next.prev = prev
		}
	} else {
		q.tail = prev
	}
	if byAll {
		w.aprev, w.anext = nil, nil
	} else {
		w.prev, w.next = nil, nil
	}
	q.n--
}

func newState(cfg Config) *state {
	s := &state{
		nodes:      make(map[string]*nodeState),
		resources:  make(map[Key]*resource),
		routeStats: make(map[string]*routeCounts),
		fits:       make(map[string]*routing.Fit),
		fair:       make(map[string]*fairGroup),
		keyWait:    make(map[string]*keyCount),
		service:    make(map[string]*serviceTime),
	}
	s.reconfigure(cfg)
	return s
}

// admit is the first step of Acquire (SPEC Q3, Q4, Q7). It returns a lease
// when a candidate is free and no waiter of the same class is ahead; the
// class to enqueue on when the request must wait; or an error.
func (s *state) admit(r Request) (*Lease, *class, error) {
	g := s.groups[r.Model]
	if g == nil {
		return nil, nil, fmt.Errorf("model %q: %w", r.Model, ErrUnknownModel)
	}
	long := g.isLong(r.PromptTokens)
	c := g.class(r.Operation, long)
	if c == nil {
		return nil, nil, &NoCandidateError{Model: r.Model, Operation: r.Operation, Long: long}
	}
	if r.LocalOnly {
		if c = c.narrow(nil, false, "", true); c == nil {
			return nil, nil, &NoCandidateError{Model: r.Model, Operation: r.Operation, Long: long, LocalOnly: true}
		}
	}
	if len(r.Exclude) > 0 || r.SameSlot {
		if c = c.narrow(r.Exclude, r.SameSlot, r.Slot, r.LocalOnly); c == nil {
			return nil, nil, allTried(r.Model, r.SameSlot, r.Slot)
		}
	}
	s.arrival = r.Arrival
	if s.arrival == 0 {
		s.seq++
		s.arrival = s.seq
	}
	if r.LeaveUnavailable && !c.hasLive() { // SPEC V1: it falls back rather than wait (leave.go)
		return nil, nil, &UnavailableError{Model: r.Model, Reason: c.why(), Arrival: s.arrival}
	}
	if c.n == 0 {
		if cd, res, holder := s.choose(c, r.Prefix, r.PromptTokens); cd != nil {
			if holder == nil || g.affinityWait <= 0 || s.waiters >= s.maxWaiters || s.overShare(r.Key) {
				l := s.grant(c, cd, r.Prefix, r.PromptTokens, res)
				l.Arrival = s.arrival
				return l, nil, nil
			}
			s.pinTo = holder // the group waits for the holder (see pin.go)
			return nil, c, nil
		}
	}
	if err := s.admitShare(r.Model, r.Key, weightOf(r.Weight)); err != nil {
		return nil, nil, err
	}
	return nil, c, nil
}

// newWaiter is the queued form of r.
func newWaiter(r Request) *waiter {
	return &waiter{model: r.Model, op: r.Operation, promptTokens: r.PromptTokens, prefix: r.Prefix, exclude: r.Exclude,
		sameSlot: r.SameSlot, slot: r.Slot, localOnly: r.LocalOnly, leave: r.LeaveUnavailable, key: r.Key, weight: weightOf(r.Weight), prio: r.Priority, cost: r.Cost()}
}

// enqueue appends w (with model, op, promptTokens and prefix set) to c,
// the class admit returned in the same critical section; timeout is the
// wait timeout the wrapper arms for w, kept for the error text. When admit
// decided that w waits for the provider holding its conversation, w is
// pinned to it instead (pin.go) and enqueue reports true: the wrapper then
// arms the group's affinity wait, after which unpin moves w to c.
func (s *state) enqueue(c *class, w *waiter, timeout time.Duration) (pinned bool) {
	w.seq = s.arrival
	w.weight = weightOf(w.weight)
	w.cls = c
	w.queued = true
	w.timeout = timeout
	if s.pinTo != nil {
		w.pin, s.pinTo = s.pinTo, nil
		w.pinnedOnce = true
		s.pinned.insertBySeq(w)
	} else {
		c.register()
		s.fairPush(w)
	}
	s.all.push(w, true)
	s.waiters++
	if w.leave {
		s.leavers++
	}
	s.countKey(w, 1)
	return w.pin != nil
}

// dequeue removes a queued waiter from its class (or the pinned list) and
// from the arrival list.
func (s *state) dequeue(w *waiter) {
	if w.pin != nil {
		s.pinned.remove(w, false)
		w.pin = nil
	} else {
		s.fairRemove(w)
		w.cls.unregisterIfEmpty()
	}
	s.all.remove(w, true)
	w.queued = false
	s.waiters--
	if w.leave {
		s.leavers--
	}
	s.countKey(w, -1)
}

// cancel removes w if still queued (SPEC Q4: a client leaving while queued
// removes the waiter). It reports whether w was queued; if not, its result
// is already in its channel. Removing a waiter frees nothing, so no pump.
func (s *state) cancel(w *waiter) bool {
	if !w.queued {
		return false
	}
	s.dequeue(w)
	return true
}

// timeout fails w with a WaitTimeoutError if it is still queued.
func (s *state) timeout(w *waiter) {
	if !w.queued {
		return
	}
	reason := w.cls.why()
	if w.pin != nil {
		reason = "waiting for provider " + w.pin.cfg.Key.String() + ", which holds the conversation: " + reason
	}
	s.dequeue(w)
	err := &WaitTimeoutError{Model: w.model, Waited: w.timeout, Reason: reason}
	s.fx.failed = append(s.fx.failed, failure{w, err})
}

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

// pump grants waiters until no queued waiter can be served: each round
// the scheduler (fair.go) chooses among the servable waiters by priority
// class, then by key (fair share), then by arrival. A chosen waiter that
// only another candidate than the busy holder of its conversation could
// serve is pinned to the holder instead when its group has an affinity
// wait (pin.go), and the round starts again. A pinned waiter whose holder
// is free competes with the scheduler's choice: it wins when its class is
// higher (unless the starvation bound chose the class), or the same and
// it arrived earlier.
func (s *state) pump() {
	for s.waiters > 0 {
		pw, pcd := s.servablePinned()
		w, ti, forced, best := s.next()
		if pw != nil {
			pt := pw.prio.Index()
			if w == nil || (!forced && pt < ti) || (pt == ti && pw.seq < w.seq) {
				c := pw.cls
				s.served(pt, &best)
				s.charge(pw)
				s.dequeue(pw)
				s.fx.grants = append(s.fx.grants, grant{pw, s.grantTo(pw, c, pcd, routing.ResultPrefixHit)})
				continue
			}
		}
		if w == nil {
			return
		}
		c := w.cls
		cd, res, holder := s.choose(c, w.prefix, w.promptTokens)
		if cd == nil { // servable said a candidate is free
			return
		}
		if holder != nil && c.g.affinityWait > 0 && !w.pinnedOnce {
			s.pinQueued(w, holder)
			continue
		}
		s.served(ti, &best)
		s.charge(w)
		s.dequeue(w)
		s.fx.grants = append(s.fx.grants, grant{w, s.grantTo(w, c, cd, res)})
	}
}

// grantTo is grant for queued waiter w, whose lease keeps its arrival
// number (Lease.Arrival).
func (s *state) grantTo(w *waiter, c *class, cd *cand, res routing.Result) *Lease {
	l := s.grant(c, cd, w.prefix, w.promptTokens, res)
	l.Arrival = w.seq
	return l
}

func (s *state) node(id string) *nodeState {
	n := s.nodes[id]
	if n == nil {
		n = &nodeState{id: id}
		s.nodes[id] = n
	}
	return n
}

// ready activates generation gen of node (SPEC L5): its resources become
// live and waiters are pumped. A generation below the high-water mark, or
// the current one already ready or fenced, is a no-op (L5 duplicate, L9
// stale). A newer generation first fences every lease of older ones: they
// belong to a superseded connection (L4, L8). It reports whether anything
// changed.
func (s *state) ready(id string, gen uint64, now time.Time, share float64) bool {
	n := s.node(id)
	if gen < n.gen || (gen == n.gen && (n.ready || n.fenced)) {
		return false
	}
	if gen > n.gen {
		s.endGeneration(n)
		s.fenceLeases(n, gen-1)
	}
	n.gen, n.ready, n.fenced, n.draining, n.readySince, n.share = gen, true, false, false, now, share
	n.fence, n.fenceCancel = context.WithCancel(context.Background())
	for _, r := range n.all {
		r.unlimit() // a new connection: what the node refused before says nothing now
	}
	s.pump()
	return true
}

// fence ends generation gen of node in one step (SPEC L8): every lease of
// that generation (or an older one) is returned exactly once and listed in
// fx.fenced, the node's resources go offline, and waiters stay queued
// against the remaining live candidates. A generation below the high-water
// mark, or one already fenced, is a no-op (L9). It returns the number of
// leases returned.
func (s *state) fence(id string, gen uint64) int {
	n := s.node(id)
	if gen < n.gen || (gen == n.gen && n.fenced) {
		return 0
	}
	s.endGeneration(n)
	n.gen, n.ready, n.fenced, n.draining, n.readySince = gen, false, true, false, time.Time{}
	count := s.fenceLeases(n, gen)
	s.repin()
	s.leaveUnavailable()
	return count
}

// drain marks ready generation gen of node as draining (its node is
// shutting down): its resources stop being candidates at once, while the
// leases it holds go on until they are released or the generation is
// fenced. Waiters stay queued against the remaining live candidates. Only
// the current ready generation can drain; anything else is a no-op (L9).
// It reports whether it changed anything.
func (s *state) drain(id string, gen uint64) bool {
	n := s.node(id)
	if gen != n.gen || !n.ready || n.draining {
		return false
	}
	n.draining = true
	s.repin() // waiters pinned to its providers may go elsewhere now
	s.leaveUnavailable()
	return true
}

// setRuns records what generation gen of node runs (SPEC N2; see
// Pool.NodeRuns). A generation below the high-water mark is stale: a
// no-op. For the ready generation, waiters are pumped (a provider may have
// become live) and pinned ones re-pinned (one may have stopped being
// live). It reports whether it applied.
func (s *state) setRuns(id string, gen uint64, runs map[string]Run) bool {
	n := s.node(id)
	if gen < n.gen {
		return false
	}
	n.runs, n.runsGen = make(map[string]Run, len(runs)), gen
	for k, v := range runs {
		n.runs[k] = v
	}
	if gen == n.gen && n.ready {
		s.pump()
		s.leaveUnavailable()
	}
	return true
}

// endGeneration schedules the close of the ready generation's fence
// channel, if a generation was ready.
func (s *state) endGeneration(n *nodeState) {
	if n.fence != nil {
		s.fx.closes = append(s.fx.closes, n.fenceCancel)
		n.fence, n.fenceCancel = nil, nil
	}
}

func (s *state) fenceLeases(n *nodeState, upTo uint64) int {
	count := 0
	for _, r := range n.all {
		for l := r.leases; l != nil; {
			next := l.next
			if l.Generation <= upTo {
				s.unhold(l)
				s.fx.fenced = append(s.fx.fenced, l)
				count++
			}
			l = next
		}
	}
	return count
}

// setOverlay records a fresh runtime-unavailable observation for k (SPEC
// H8): only for the node's current ready generation and only when seq is
// above every seq accepted for (k, gen). seq 0 (absent) is never fresh.
func (s *state) setOverlay(k Key, gen, seq uint64) bool {
	r := s.overlayTarget(k, gen, seq)
	if r == nil {
		return false
	}
	r.seqGen, r.lastSeq = gen, seq
	r.overlaid, r.overlayGen = true, gen
	s.repin()
	s.leaveUnavailable()
	return true
}

// clearOverlay lifts the overlay of k after a recovery probe (SPEC H10):
// only when k is overlaid at gen and seq is fresh. It pumps (Q5).
func (s *state) clearOverlay(k Key, gen, seq uint64) bool {
	r := s.overlayTarget(k, gen, seq)
	if r == nil || !r.isOverlaid() {
		return false
	}
	r.seqGen, r.lastSeq = gen, seq
	r.overlaid = false
	s.pump()
	return true
}

func (s *state) overlayTarget(k Key, gen, seq uint64) *resource {
	r := s.resources[k]
	if r == nil || !r.configured || seq == 0 {
		return nil
	}
	if !r.node.ready || r.node.gen != gen {
		return nil
	}
	if r.seqGen == gen && seq <= r.lastSeq {
		return nil
	}
	return r
}
