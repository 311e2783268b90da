package pool

import (
	"context"
	"fmt"
	"time"

	"iop/internal/edge/routing"
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
