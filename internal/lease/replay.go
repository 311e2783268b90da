package lease

import "sync"

// ReplayCache remembers the ids of opened leases until they can no longer
// be accepted (expiry plus skew), so that a lease opens at most once (SPEC
// C3). It holds at most its capacity of unexpired ids; when full it refuses
// new leases (fail closed) instead of forgetting one that could still be
// replayed. It is safe for concurrent use and shared by every request of a
// Node, across config refreshes.
type ReplayCache struct {
	mu   sync.Mutex
	cap  int
	seen map[string]int64 // lease id → forget after, Unix ms
	// order is the ids in insertion order, a ring: leases are issued with
	// one TTL, so they mostly expire in insertion order and eviction pops
	// from the front. An entry whose id has left seen is skipped.
	order []replayEntry
	head  int
	n     int
}

type replayEntry struct {
	id    string
	until int64
}

// NewReplayCache returns a cache of at most capacity unexpired ids
// (≤ 0: DefaultReplayCapacity).
func NewReplayCache(capacity int) *ReplayCache {
	if capacity <= 0 {
		capacity = DefaultReplayCapacity
	}
	return &ReplayCache{cap: capacity, seen: make(map[string]int64)}
}

// admit records id as used until until (Unix ms) and reports nil, or
// ErrReplayed when id is already recorded and not yet forgotten, or
// ErrReplayFull when capacity unexpired ids are held. now is in Unix ms.
func (c *ReplayCache) admit(id string, until, now int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	if u, ok := c.seen[id]; ok && u >= now {
		return ErrReplayed
	}
	if len(c.seen) >= c.cap {
		// Leases of a shorter TTL may sit behind longer ones in the
		// ring: sweep the map once before refusing.
		for k, u := range c.seen {
			if u < now {
				delete(c.seen, k)
			}
		}
		if len(c.seen) >= c.cap {
			return ErrReplayFull
		}
	}
	c.seen[id] = until
	c.push(replayEntry{id: id, until: until})
	return nil
}

// expire forgets every id at the front of the ring whose time has passed.
func (c *ReplayCache) expire(now int64) {
	for c.n > 0 {
		e := c.order[c.head]
		if e.until >= now {
			return
		}
		if u, ok := c.seen[e.id]; ok && u == e.until {
			delete(c.seen, e.id)
		}
		c.order[c.head] = replayEntry{}
		c.head = (c.head + 1) % len(c.order)
		c.n--
	}
}

func (c *ReplayCache) push(e replayEntry) {
	if c.n == len(c.order) {
		grown := make([]replayEntry, max(16, 2*len(c.order)))
		for i := 0; i < c.n; i++ {
			grown[i] = c.order[(c.head+i)%len(c.order)]
		}
		c.order, c.head = grown, 0
	}
	c.order[(c.head+c.n)%len(c.order)] = e
	c.n++
}

// Len is the number of ids held (for tests and metrics).
func (c *ReplayCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}
