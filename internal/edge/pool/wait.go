package pool

import (
	"slices"
	"time"

	"iop/internal/edge/routing"
)

// The group's state a fallback decision reads (SPEC V1): whether the group
// can serve a request at all, whether its queue has room, and how long
// the request would wait for a slot — predicted from the group's queue,
// its leases in flight and its measured service times, never by waiting.

// DefaultServiceTime is a Timed group's service time until its first lease
// comes back (the prior of the predicted wait; the cost model's cold start
// assumes the same second when nothing was measured).
const DefaultServiceTime = time.Second

// serviceWeight is the weight of the newest lease in a group's mean
// service time (an exponentially weighted moving average, 1/8).
const serviceWeight = 8

// serviceTime is a group's measured service time: how long its leases are
// held, grant to release (the time a request occupies a slot, streaming
// included).
type serviceTime struct {
	mean time.Duration
	n    uint64
}

func (st *serviceTime) observe(d time.Duration) {
	d = max(d, 0)
	if st.n == 0 {
		st.mean = d
	} else {
		st.mean += (d - st.mean) / serviceWeight
	}
	st.n++
}

// observeService adds l's hold, its grant to now, to its group's service
// time (a group a reload removed measures nothing).
func (s *state) observeService(l *Lease) {
	if g := s.groups[l.Model]; g != nil && g.svc != nil {
		g.svc.observe(time.Duration(s.now.UnixNano() - l.granted))
	}
}

// estimate is the service time the predicted wait assumes.
func (st *serviceTime) estimate() time.Duration {
	if st == nil || st.n == 0 {
		return DefaultServiceTime
	}
	return st.mean
}

// PredictWait is how long a request that arrives behind ahead waiters
// waits for a slot (SPEC V1): free slots are taken in arrival order; once
// none is left, the slots held by the leases in flight free up as each
// lease ends. A lease of age a ends after max(service − a, 0); the next
// waiter then holds that slot for service again, so the k-th slot to free
// (0-based, k = ahead − free) is remaining[k mod n] + ⌊k / n⌋ × service,
// remaining sorted ascending over the n leases in flight. 0 when a slot
// is free for it; with nothing in flight and no free slot (a provider
// limited to no lease) one service time.
func PredictWait(ahead, free int, ages []time.Duration, service time.Duration) time.Duration {
	if ahead < free {
		return 0
	}
	n := len(ages)
	if n == 0 {
		return service
	}
	k := ahead - max(free, 0)
	remaining := make([]time.Duration, n)
	for i, a := range ages {
		remaining[i] = max(service-a, 0)
	}
	slices.Sort(remaining)
	return remaining[k%n] + time.Duration(k/n)*service
}

// GroupState is group r.Model's state for request r as of now (SPEC V1,
// V3), for routing.DecideFallback: Unavailable when the group is unknown,
// has no provider for r's operation (and size), or none live that r may
// use (a local-only request: no live local one); QueueFull when no slot
// is free and the queue has no room for r (queue.max_waiters, or r's key
// at its fair share of the queue); PredictedWait from the waiters ahead of
// r in the group (every key's, in arrival order: the fair share may serve
// r sooner or later), the live providers' free slots and leases in flight,
// and the group's measured service time (DefaultServiceTime until one
// lease came back; 0 for a group that is not Timed, which measures
// nothing). It never changes the pool.
func (p *Pool) GroupState(r Request) routing.GroupState {
	p.lock()
	defer p.mu.Unlock()
	return p.s.groupState(r)
}

func (s *state) groupState(r Request) routing.GroupState {
	g := s.groups[r.Model]
	if g == nil {
		return routing.GroupState{Unavailable: true}
	}
	long := g.isLong(r.PromptTokens)
	c := g.class(r.Operation, long)
	if c != nil && r.LocalOnly {
		c = c.narrow(nil, false, "", true)
	}
	if c == nil {
		return routing.GroupState{Unavailable: true}
	}
	live, free := 0, 0
	var ages []time.Duration
	for i := range c.cands {
		res := c.cands[i].res
		if !res.live() {
			continue
		}
		live++
		slots := res.capacity()
		if long {
			slots = min(slots, res.longCapacity())
		}
		if res.limited {
			slots = min(slots, res.limit)
		}
		held := res.inFlight
		if long {
			held = max(held, res.longInFlight)
		}
		free += max(slots-held, 0)
		if g.svc != nil {
			for l := res.leases; l != nil; l = l.next {
				if l.granted != 0 {
					ages = append(ages, time.Duration(s.now.UnixNano()-l.granted))
				} else {
					ages = append(ages, 0) // another group's lease: a whole service time ahead
				}
			}
		}
	}
	if live == 0 {
		return routing.GroupState{Unavailable: true}
	}
	ahead := 0
	for _, o := range g.classes {
		if o.op == c.op && o.long == long {
			ahead += o.n
		}
	}
	st := routing.GroupState{}
	if ahead >= free {
		st.QueueFull = s.waiters >= s.maxWaiters || s.queueShareFull(r.Key, weightOf(r.Weight))
	}
	if g.svc != nil {
		st.PredictedWait = PredictWait(ahead, free, ages, g.svc.estimate())
	}
	return st
}

// queueShareFull reports whether a request of key (weight) would be
// refused its place in the queue for the key's fair share (admitShare's
// first rule, without its effects).
func (s *state) queueShareFull(key string, weight int) bool {
	kc := s.keyWait[key]
	n, others := 0, s.waitWeight
	if kc != nil {
		n = kc.n
		others -= kc.weight
	}
	return others > 0 && n >= s.shareOf(weight, others)
}
