// Package pool owns the Edge's provider pool: provider resources
// (node_id, provider_id) with their capacity and long-context capacity, the
// lease each admitted request holds, the waiters of every model group and
// the scheduler that orders them by priority class and fair share per key,
// the runtime-unavailable overlay, and the projections of all of that into
// ProviderSnapshots (SPEC Q1–Q8, L8–L10, P3, H8–H10, N3).
//
// It must never do I/O, start goroutines of its own, read the wall clock
// directly, log, build HTTP responses, or depend on any event fan-out: lease
// return, fencing and queue settlement happen inside the call that causes
// them (SPEC L10). Time arrives through an injected Clock.
//
// # Structure
//
// core.go is the state machine: a plain value (state) whose methods are the
// transitions (admit, enqueue, release, ready, fence, overlay, reconfigure,
// timeout, cancel). They do no I/O and collect their effects — leases handed
// to waiters, waiters failed, fence channels to close — in state.fx. pool.go is the
// thin concurrency wrapper: it takes the mutex, runs one transition, carries
// out its effects and unlocks. core.go holds the state, its types and the
// transitions of a request's arrival and wait (admit, enqueue, timeout,
// cancel, pump); the machine's other transitions are methods of the same
// value in files of their own, as pure: lease.go (grant, release),
// nodes.go (a node's generations: ready, fence, drain, runs; the overlay),
// reconfigure.go. resource.go holds a resource's predicates (live, free,
// capacities), wlist.go the waiter list.
//
// # Scheduling rule (SPEC Q4, Q5, G1–G3, G5)
//
// Waiters of a model group wait by class, the pair (operation, long):
// every waiter of one class can be served by exactly the same providers.
// A class is servable while one of its candidates is live and free. A pump
// repeatedly grants the scheduler's choice (fair.go) among the waiters of
// servable classes, until no class with a waiter is servable: the highest
// priority class first (critical, interactive, batch; a lower class is
// passed over at most queue.starvation_grants consecutive times), then
// within the group by fair share among the keys that wait (start-time
// fair queuing costed in estimated tokens, weighted), then in arrival
// order within a key; between groups sharing a provider, the earliest
// arrival of the class. So a freed slot is never left idle while someone
// could use it, and a waiter that cannot be served (say a long request
// while long capacity is full, or an operation only a busy provider has)
// never blocks one that can. After every transition no queued waiter is
// servable; that is why a new request whose class has no waiters may take
// free capacity at once without overtaking anybody who could have used it.
//
// The choice among servable candidates — live, with free capacity (and
// free long capacity for a long request) — is the group's routing mode
// (route.go, R1): least_loaded (the default) takes the lowest
// in_flight/capacity, then config order; ordered the first in config
// order; prefix_affinity asks internal/edge/routing for the candidate
// holding the longest prefix of the request's conversation unless the
// prefill queued on it outweighs what it saves, else a bounded-load
// rendezvous hash (SPEC Q1, Q3). Each resource keeps its affinity table
// (prefixes granted to it) for its node's current generation only, and,
// while a prefix_affinity group routes to it, its prefill queue (cost.go). Provider type never excludes a candidate, and no mode
// makes a request wait while a candidate is free — except a
// prefix_affinity group with an affinity wait, whose request may wait that
// long for the busy provider holding its conversation as a pinned waiter
// (pin.go) that blocks nobody behind it.
//
// A provider ejected by passive health (cooling.go, decided by
// internal/edge/outlier) is no candidate until it is re-admitted, which
// pumps. A re-dispatched request that must not get the providers it already
// tried (Request.Exclude) waits in a narrowed class of its own
// (exclude.go), so the rule above still holds for every class.
//
// # Concurrency
//
// One mutex (Pool.mu) guards all state. It is held only for one transition
// and its effects, which are non-blocking: a send on a waiter's channel that
// has a free buffer slot, and close of a generation's Fenced channel. Pool never
// calls out of the package while holding it (Clock.AfterFunc is called after
// unlocking), so callers may hold their own locks when calling in: Pool.mu is
// a leaf in every lock order. The only goroutines involved are the callers'
// and the Clock's timer callbacks (one per queued Acquire, stopped when it
// returns).
//
// # Cost
//
// An uncontended Acquire+Release allocates only the Lease; the Fenced
// channel is one per node generation. A pump does O(classes × candidates)
// work per grant (× the prefix's boundaries under prefix_affinity: one
// table lookup each), and nothing when no request waits. Affinity tables
// are bounded: Config.AffinityEntries hashes per resource, about
// routing.TableEntryBytes each.
package pool
