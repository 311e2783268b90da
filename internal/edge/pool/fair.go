package pool

import (
	"fmt"
	"time"

	"iop/internal/protocol"
)

// Fair share and priority classes (SPEC G1–G3, G5). This file is the
// scheduler: which queued waiter a free provider slot goes to. Like the
// rest of state it reads no clock and starts nothing; the pump (core.go)
// asks it.
//
// Order of service, for the waiters some free live candidate could serve
// now (servable):
//
//  1. Priority class: critical before interactive before batch, pool-wide,
//     with a starvation bound: once a class with a servable waiter has been
//     passed over by Config.StarvationGrants consecutive grants to higher
//     classes, the next grant is its own (the class passed over most
//     first, the lower on a tie). So a class with a servable waiter is
//     passed over by at most StarvationGrants consecutive grants (G2).
//  2. Key, inside one model group and class: start-time fair queuing
//     (SFQ; Goyal, Vin and Cheng, SIGCOMM 1996) over the keys that wait.
//     Each key's flow has a finish tag; a key's next waiter starts at
//     max(finish, V), where V is the start tag of the group's class's last
//     grant; the key with the lowest start is served and its finish becomes
//     start + cost/weight. The cost is the request's estimated tokens
//     (Request.Cost). So while keys wait, each receives tokens in
//     proportion to its weight, within one request's cost/weight of its
//     share (the SFQ bound); a key alone takes every slot (work-conserving);
//     a key that stops waiting banks nothing (G1).
//  3. Within a key, arrival order (FIFO); Request.Arrival keeps a
//     re-dispatched or re-queued request's place (G5).
//
// Between model groups that share a provider, the earliest arrival among
// the groups' choices of the same class wins.
//
// The queue bound is shared too (G3): while other keys wait, a key may
// hold at most its share of queue.max_waiters, MaxWaiters × weight / (the
// weights of the keys waiting, its own included), at least one; the request
// beyond gets a KeyShareError (429). When the queue is full, a request of a
// key under its share still gets in: the newest waiter of the key most over
// its share is failed with a KeyShareError instead.

// Priority is a request's priority class (SPEC G2): PriorityCritical is
// served before PriorityInteractive (the zero value, the default) before
// PriorityBatch.
type Priority int8

// The priority classes, highest last.
const (
	PriorityBatch       Priority = -1
	PriorityInteractive Priority = 0
	PriorityCritical    Priority = 1
)

// NumPriorities is the number of priority classes.
const NumPriorities = 3

// Priorities lists the classes from the highest down (the index order of
// Priority.Index).
var Priorities = [NumPriorities]Priority{PriorityCritical, PriorityInteractive, PriorityBatch}

// Index is p's rank: 0 for critical, 1 interactive, 2 batch; a value out of
// range counts as interactive.
func (p Priority) Index() int {
	if p < PriorityBatch || p > PriorityCritical {
		return 1
	}
	return int(PriorityCritical - p)
}

// String is the class's configuration name, which is also its name on the
// wire (RunRequest.priority_class, SPEC G7): "critical", "interactive" or
// "batch".
func (p Priority) String() string {
	switch p {
	case PriorityCritical:
		return protocol.ClassCritical
	case PriorityBatch:
		return protocol.ClassBatch
	}
	return protocol.ClassInteractive
}

// ParsePriority reads a class name ("critical", "interactive", "batch");
// ok is false for anything else.
func ParsePriority(s string) (p Priority, ok bool) {
	switch s {
	case protocol.ClassCritical:
		return PriorityCritical, true
	case protocol.ClassInteractive:
		return PriorityInteractive, true
	case protocol.ClassBatch:
		return PriorityBatch, true
	}
	return PriorityInteractive, false
}

// Scheduler defaults (docs/config.md).
const (
	// DefaultCompletionTokens is the completion a request that sets no
	// max_tokens is costed at (SPEC G1).
	DefaultCompletionTokens = 256
	// DefaultStarvationGrants is queue.starvation_grants' default (G2).
	DefaultStarvationGrants = 8
	// MaxWeight bounds a key's weight.
	MaxWeight = 1000
)

// KeyShareRetryAfter is the Retry-After a KeyShareError suggests.
const KeyShareRetryAfter = time.Second

// ErrKeyShare: the request's key already holds its share of
// queue.max_waiters while other keys wait (SPEC G3).
var ErrKeyShare = fmt.Errorf("%w: the key's share of the queue is full", ErrQueueFull)

// KeyShareError wraps ErrKeyShare (and so ErrQueueFull). Key is the
// request's key, Share its share of the queue when refused, Waiting how
// many of its requests wait.
type KeyShareError struct {
	Model      string
	Key        string
	Share      int
	Waiting    int
	RetryAfter time.Duration
}

func (e *KeyShareError) Error() string {
	return fmt.Sprintf("model %q: this key's share of the queue is full (%d of its requests wait, its share is %d while other keys wait), retry after %s",
		e.Model, e.Waiting, e.Share, e.RetryAfter)
}

func (e *KeyShareError) Unwrap() error { return ErrKeyShare }

// Cost is r's scheduling cost in estimated tokens (SPEC G1): its prompt
// estimate plus its completion bound, DefaultCompletionTokens when it sets
// none; at least 1.
func (r Request) Cost() int {
	c := r.MaxTokens
	if c <= 0 {
		c = DefaultCompletionTokens
	}
	return max(r.PromptTokens, 0) + c
}

func weightOf(w int) int {
	return min(max(w, 1), MaxWeight)
}

// fairGroup is one model group's scheduler state, per priority class. It
// outlives Reconfigure (state.fair), so that tags carry over.
type fairGroup struct {
	tiers [NumPriorities]fairTier
}

// fairTier is one class of one group: the flows (one per key) and the
// virtual time of SFQ.
type fairTier struct {
	flows  map[string]*flow
	active []*flow // flows with waiters, in activation order
	vtime  float64 // start tag of the last grant
}

// flow is one key's waiters in one group and class, split by the pool
// class (operation, long, narrowed) they wait in: each list is FIFO by
// arrival number.
type flow struct {
	key    string
	weight float64
	finish float64
	n      int
	lists  []flowList
	active int // index in fairTier.active, -1 when idle
}

type flowList struct {
	c *class
	q wlist
}

func (f *flow) list(c *class) *flowList {
	for i := range f.lists {
		if f.lists[i].c == c {
			return &f.lists[i]
		}
	}
	return nil
}

// fairPush queues w (cls, key, weight, prio, seq set) in its group's
// scheduler, after every waiter of its key with a lower arrival number.
func (s *state) fairPush(w *waiter) {
	fg := w.cls.g.fair
	t := &fg.tiers[w.prio.Index()]
	f := t.flows[w.key]
	if f == nil {
		if t.flows == nil {
			t.flows = make(map[string]*flow)
		}
		f = &flow{key: w.key, active: -1}
		t.flows[w.key] = f
	}
	f.weight = float64(w.weight)
	l := f.list(w.cls)
	if l == nil {
		f.lists = append(f.lists, flowList{c: w.cls})
		l = &f.lists[len(f.lists)-1]
	}
	l.q.insertBySeq(w)
	w.flow = f
	f.n++
	if f.active < 0 {
		f.active = len(t.active)
		t.active = append(t.active, f)
	}
	w.cls.n++
	s.tierWaiting[w.prio.Index()]++
}

// fairRemove takes w out of its group's scheduler (granted, pinned,
// cancelled, timed out or evicted).
func (s *state) fairRemove(w *waiter) {
	f := w.flow
	l := f.list(w.cls)
	l.q.remove(w, false)
	if l.q.n == 0 {
		i := len(f.lists) - 1
		*l = f.lists[i]
		f.lists[i] = flowList{}
		f.lists = f.lists[:i]
	}
	f.n--
	w.cls.n--
	ti := w.prio.Index()
	s.tierWaiting[ti]--
	if f.n == 0 {
		t := &w.cls.g.fair.tiers[ti]
		last := len(t.active) - 1
		t.active[f.active] = t.active[last]
		t.active[f.active].active = f.active
		t.active[last] = nil
		t.active = t.active[:last]
		f.active = -1
		if f.finish <= t.vtime { // it banks nothing: forget it
			delete(t.flows, f.key)
		}
	}
}

// pick is SFQ over t's keys: the servable waiter of the key with the lowest
// start tag (ties: the earlier arrival), and that start; nil when no waiter
// of t is servable. servable reports whether a free live candidate of a
// class exists now.
func (t *fairTier) pick(servable func(*class) bool) (*waiter, float64) {
	var best *waiter
	var bestStart float64
	for _, f := range t.active {
		var h *waiter
		for i := range f.lists {
			l := &f.lists[i]
			if l.q.head != nil && (h == nil || l.q.head.seq < h.seq) && servable(l.c) {
				h = l.q.head
			}
		}
		if h == nil {
			continue
		}
		st := max(f.finish, t.vtime)
		if best == nil || st < bestStart || (st == bestStart && h.seq < best.seq) {
			best, bestStart = h, st
		}
	}
	return best, bestStart
}

// charge advances w's key's flow and its class's virtual time for a grant
// to w (SPEC G1): SFQ's finish = start + cost/weight. A pinned waiter's
// flow may have been forgotten while it was pinned; it is made again.
func (s *state) charge(w *waiter) {
	t := &w.cls.g.fair.tiers[w.prio.Index()]
	f := t.flows[w.key]
	if f == nil {
		if t.flows == nil {
			t.flows = make(map[string]*flow)
		}
		f = &flow{key: w.key, weight: float64(w.weight), active: -1}
		t.flows[w.key] = f
	}
	start := max(f.finish, t.vtime)
	f.finish = start + float64(w.cost)/f.weight
	t.vtime = start
}

// served counts a grant to class ti against the starvation bound (SPEC
// G2): every lower class with a servable waiter was passed over once more;
// ti's count restarts; a class with no waiter counts nothing.
func (s *state) served(ti int, servable *[NumPriorities]*waiter) {
	s.skipped[ti] = 0
	for u := ti + 1; u < NumPriorities; u++ {
		switch {
		case servable[u] != nil:
			s.skipped[u]++
		case s.tierWaiting[u] == 0:
			s.skipped[u] = 0
		}
	}
}

// next is the scheduler's choice for the pump: the waiter to serve now
// among the groups' servable waiters, with its class; nil when none is
// servable. forced reports that the starvation bound chose the class.
func (s *state) next() (w *waiter, ti int, forced bool, best [NumPriorities]*waiter) {
	s.mark++
	for _, g := range s.groupList {
		for t := range g.fair.tiers {
			ft := &g.fair.tiers[t]
			if len(ft.active) == 0 {
				continue
			}
			if c, _ := ft.pick(s.servable); c != nil && (best[t] == nil || c.seq < best[t].seq) {
				best[t] = c
			}
		}
	}
	// The starvation bound: the class passed over most often, once that
	// reaches starveGrants (ties: the lower class, which only higher ones
	// can pass over). Serving a class never passes over a higher one, so
	// no count goes past starveGrants.
	forcedAt := -1
	for t := range best {
		if best[t] != nil && s.skipped[t] >= s.starveGrants && (forcedAt < 0 || s.skipped[t] >= s.skipped[forcedAt]) {
			forcedAt = t
		}
	}
	if forcedAt >= 0 {
		return best[forcedAt], forcedAt, true, best
	}
	for t := range best {
		if best[t] != nil {
			return best[t], t, false, best
		}
	}
	return nil, -1, false, best
}

// servable reports whether a free live candidate of c exists now,
// remembered per scheduler pass (state.mark).
func (s *state) servable(c *class) bool {
	if c.mark != s.mark {
		c.mark, c.ok = s.mark, false
		for i := range c.cands {
			if r := c.cands[i].res; r.live() && r.free(c.long) {
				c.ok = true
				break
			}
		}
	}
	return c.ok
}

// keyCount is one key's queued waiters over every group (SPEC G3).
type keyCount struct {
	n      int
	weight int
}

// shareOf is the share of queue.max_waiters of a key of weight w while
// keys of total weight others (not counting its own) wait: at least 1.
func (s *state) shareOf(w, others int) int {
	return max(1, s.maxWaiters*w/(w+others))
}

// admitShare decides whether a request of key with weight may queue
// (SPEC G3); it may fail the newest waiter of the key most over its share to
// make room. The error is a KeyShareError or a QueueFullError.
func (s *state) admitShare(model, key string, weight int) error {
	kc := s.keyWait[key]
	n, others := 0, s.waitWeight
	if kc != nil {
		n = kc.n
		others -= kc.weight
	}
	if others > 0 {
		if share := s.shareOf(weight, others); n >= share {
			return &KeyShareError{Model: model, Key: key, Share: share, Waiting: n, RetryAfter: KeyShareRetryAfter}
		}
	}
	if s.waiters < s.maxWaiters {
		return nil
	}
	// Full, and this key is under its share: push out the newest waiter of
	// the key furthest over its own.
	var victim string
	var worst float64
	for k, c := range s.keyWait {
		if k == key || c.n == 0 {
			continue
		}
		o := s.waitWeight - c.weight
		if kc == nil {
			o += weight
		}
		share := s.shareOf(c.weight, o)
		if c.n > share {
			if r := float64(c.n) / float64(share); r > worst || (r == worst && k < victim) {
				victim, worst = k, r
			}
		}
	}
	if victim == "" {
		return &QueueFullError{Model: model, MaxWaiters: s.maxWaiters, RetryAfter: QueueFullRetryAfter}
	}
	for w := s.all.tail; w != nil; w = w.aprev {
		if w.key == victim {
			c := s.keyWait[victim]
			share := s.shareOf(c.weight, s.waitWeight-c.weight)
			s.dequeue(w)
			s.fx.failed = append(s.fx.failed, failure{w, &KeyShareError{Model: w.model, Key: victim, Share: share,
				Waiting: c.n, RetryAfter: KeyShareRetryAfter}})
			return nil
		}
	}
	return &QueueFullError{Model: model, MaxWaiters: s.maxWaiters, RetryAfter: QueueFullRetryAfter}
}

// overShare reports whether key holds its share of the queue while other
// keys wait (admitShare would refuse it).
func (s *state) overShare(key string) bool {
	kc := s.keyWait[key]
	if kc == nil || kc.weight >= s.waitWeight {
		return false
	}
	return kc.n >= s.shareOf(kc.weight, s.waitWeight-kc.weight)
}

// insertBySeq links w (class links) after the last waiter of q with a
// lower arrival number.
func (q *wlist) insertBySeq(w *waiter) {
	at := q.tail
	for at != nil && at.seq > w.seq {
		at = at.prev
	}
	q.insertAfter(at, w)
}

// countKey adds d (±1) to w's key's waiting count.
func (s *state) countKey(w *waiter, d int) {
	kc := s.keyWait[w.key]
	if kc == nil {
		kc = &keyCount{}
		s.keyWait[w.key] = kc
	}
	if kc.n == 0 && d > 0 {
		kc.weight = w.weight
		s.waitWeight += kc.weight
	}
	kc.n += d
	if kc.n == 0 {
		s.waitWeight -= kc.weight
		delete(s.keyWait, w.key)
	}
}

// Waiting returns how many requests wait, per key ("" is open mode's)
// and per priority class in Priorities order, over every group (the
// /status view, SPEC G6).
func (p *Pool) Waiting() (byKey map[string]int, byClass [NumPriorities]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	byKey = make(map[string]int, len(p.s.keyWait))
	for k, c := range p.s.keyWait {
		byKey[k] = c.n
	}
	for w := p.s.all.head; w != nil; w = w.anext {
		byClass[w.prio.Index()]++
	}
	return byKey, byClass
}
