package pool

import (
	"time"

	iop "iop/proto/gen/iop"
)

// Snapshot values for ProviderSnapshot.status and .health (SPEC N3, H9).
const (
	StatusAvailable   = "available"
	StatusUnavailable = "unavailable"
	// StatusDraining: the node is shutting down; the provider takes no new
	// request but still shows its load.
	StatusDraining    = "draining"
	HealthHealthy     = "healthy"
	HealthOffline     = "offline"
	HealthUnavailable = "unavailable"
)

// coolingTime is the format of ProviderSnapshot.cooling_until: RFC 3339,
// UTC, milliseconds.
const coolingTime = "2006-01-02T15:04:05.000Z07:00"

// NodeSnapshot is one configured node as the Edge sees it (SPEC N3).
// Connected is true only while a generation is ready (P3); ReadySince is
// the zero time otherwise. Providers are in config order.
type NodeSnapshot struct {
	Node       string
	Connected  bool
	ReadySince time.Time
	// Draining: the ready generation said it is shutting down.
	Draining bool
	// Generation is the node's current generation (Edge-internal; 0 when
	// none was ever ready or pending).
	Generation uint64
	Providers  []*iop.ProviderSnapshot
}

// snapshot projects the state (SPEC N3, Q8, H9):
//   - node not ready (disconnected, pending or fenced): connected=false and
//     every provider status=unavailable, health=offline, all numbers 0;
//   - overlaid provider, or one its node's generation does not run as
//     configured (NodeRuns, SPEC N2): status=unavailable,
//     health=unavailable, all numbers 0 (identity and category kept);
//   - ejected by passive health (cooling.go): as below but status=unavailable,
//     health=cooling; cooling_until and cooling_reason are set whenever it is
//     ejected, whatever its node's state;
//   - otherwise status=available, health=healthy, configured capacity and
//     long capacity, in_flight/long_in_flight = leases held, and
//     queued/long_queued = queued requests that count it as a live
//     candidate (each request once per provider, possibly under several);
//     status=draining instead while the node drains (no new leases).
func (s *state) snapshot() []NodeSnapshot {
	type counts struct{ queued, longQueued int }
	var pressure map[*resource]*counts
	if s.waiters > 0 {
		pressure = make(map[*resource]*counts)
		for w := s.pinned.head; w != nil; w = w.next { // a pinned waiter counts only its holder
			if w.pin.live() {
				pc := pressure[w.pin]
				if pc == nil {
					pc = &counts{}
					pressure[w.pin] = pc
				}
				pc.queued++
				if w.cls.long {
					pc.longQueued++
				}
			}
		}
		for _, g := range s.groupList {
			for _, c := range g.classes {
				if c.n == 0 {
					continue
				}
				for i := range c.cands {
					r := c.cands[i].res
					if !r.live() {
						continue
					}
					pc := pressure[r]
					if pc == nil {
						pc = &counts{}
						pressure[r] = pc
					}
					pc.queued += c.n
					if c.long {
						pc.longQueued += c.n
					}
				}
			}
		}
	}

	out := make([]NodeSnapshot, 0, len(s.nodeOrder))
	for _, n := range s.nodeOrder {
		ns := NodeSnapshot{Node: n.id, Connected: n.ready, Draining: n.ready && n.draining, Generation: n.gen,
			Providers: make([]*iop.ProviderSnapshot, 0, len(n.resources))}
		if n.ready {
			ns.ReadySince = n.readySince
		}
		for _, r := range n.resources {
			ps := &iop.ProviderSnapshot{ProviderId: r.cfg.Provider, Category: r.cfg.Category}
			switch {
			case !n.ready:
				ps.Status, ps.Health = StatusUnavailable, HealthOffline
			case r.isOverlaid() || !r.run():
				ps.Status, ps.Health = StatusUnavailable, HealthUnavailable
			default:
				ps.Status, ps.Health = StatusAvailable, HealthHealthy
				if n.draining {
					ps.Status = StatusDraining
				}
				if r.ejected {
					ps.Status, ps.Health = StatusUnavailable, HealthCooling
				}
				ps.Capacity = int32(r.capacity())
				ps.LongCapacity = int32(r.longCapacity())
				ps.InFlight = int32(r.inFlight)
				ps.LongInFlight = int32(r.longInFlight)
				if pc := pressure[r]; pc != nil {
					ps.Queued, ps.LongQueued = int32(pc.queued), int32(pc.longQueued)
				}
			}
			if r.ejected {
				ps.CoolingUntil = r.ejectedUntil.UTC().Format(coolingTime)
				ps.CoolingReason = r.ejectReason
			}
			if n.ready {
				ps.Residency = r.residencySnapshot() // SPEC U6
			}
			ns.Providers = append(ns.Providers, ps)
		}
		out = append(out, ns)
	}
	return out
}

// GroupSnapshot is one configured model group's queue (operator page).
// Waiters counts the requests waiting for a lease, LongWaiters those of
// them that are long (SPEC Q7); Live counts the group's candidates that
// could take a request now or once one of theirs is released (SPEC Q3).
type GroupSnapshot struct {
	Name        string `json:"name"`
	Waiters     int    `json:"waiters"`
	LongWaiters int    `json:"long_waiters"`
	Candidates  int    `json:"candidates"`
	Live        int    `json:"live"`
}

// Groups returns every configured model group in config order with its
// waiters and candidates; the caller owns the result.
func (p *Pool) Groups() []GroupSnapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.groupSnapshots()
}

func (s *state) groupSnapshots() []GroupSnapshot {
	out := make([]GroupSnapshot, 0, len(s.groupList))
	for _, g := range s.groupList {
		gs := GroupSnapshot{Name: g.name}
		seen := map[*resource]bool{}
		for _, c := range g.classes {
			gs.Waiters += c.n
			if c.long {
				gs.LongWaiters += c.n
			}
			for i := range c.cands {
				r := c.cands[i].res
				if seen[r] {
					continue
				}
				seen[r] = true
				gs.Candidates++
				if r.live() {
					gs.Live++
				}
			}
		}
		for w := s.pinned.head; w != nil; w = w.next { // waiting for the holder of their conversation (pin.go)
			if w.cls.g == g {
				gs.Waiters++
				if w.cls.long {
					gs.LongWaiters++
				}
			}
		}
		out = append(out, gs)
	}
	return out
}
