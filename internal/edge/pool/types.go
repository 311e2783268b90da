package pool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"iop/internal/edge/routing"
)

// Key identifies a provider resource fleet-wide: the node id and the adapter
// instance name on that node (SPEC terms: provider_id).
type Key struct {
	Node     string
	Provider string
}

func (k Key) String() string { return k.Node + "/" + k.Provider }

// Resource is one configured provider resource (one adapter instance of a
// node). Capacity and LongCapacity are request counts; a resource with
// Capacity <= 0 never admits, one with LongCapacity <= 0 never admits a long
// request (SPEC Q2, Q7).
type Resource struct {
	Key
	// Type is "ollama" or "openai_compat"; carried into the Lease so the
	// caller picks run or tunnel. It never excludes a candidate (SPEC Q3).
	Type string
	// Category is "api" or "local_inference" (SPEC N3).
	Category     string
	Capacity     int
	LongCapacity int
	// Operations the resource's profile supports (protocol.OpChatCompletions, …).
	Operations []string
	// PrefillTokensPerSecond is the prefill speed prefix_affinity assumes
	// for the resource until its answers have been timed
	// (ObserveFirstByte); <= 0 means routing.DefaultTokenTime.
	PrefillTokensPerSecond float64
	// Revision names what the config makes of the provider on its node
	// (an opaque string, config.AdapterRevision for the Edge). Once
	// NodeRuns has told the pool what the node's generation runs, the
	// resource is a candidate only while that generation runs this
	// revision of it, with the capacities it runs it with (SPEC N2).
	Revision string
}

// Run is one provider as a node generation runs it (NodeRuns, SPEC N2):
// the Resource.Revision of its definition there and the capacities it
// admits with, which bound the resource instead of Resource.Capacity and
// LongCapacity while that generation is ready.
type Run struct {
	Revision     string
	Capacity     int
	LongCapacity int
}

// Candidate is one models[].providers entry (SPEC Q1): a resource and the
// backend's own model name. StallTimeoutMs is the effective
// response_stall_timeout_ms in milliseconds (config.EffectiveStallTimeoutMs,
// > 0) copied into the lease, and from it into every request sent on it
// (SPEC Q6).
type Candidate struct {
	Key
	Target         string
	StallTimeoutMs int64
	// Slot is the route's credential slot (SPEC C2): the secret store slot
	// whose lease a request on this route carries; "" when it carries none
	// (the credential plane is off). Copied into the lease; a re-dispatch
	// stays within it (Request.SameSlot, SPEC C6).
	Slot string
	// Remote: the route's adapter is a hosted API (adapters[].location
	// "remote"); a local-only request is never given it (SPEC V3).
	Remote bool
}

// Group is one configured model: the external model name clients send, the
// long-context threshold in estimated prompt tokens (0 = no request is long,
// SPEC Q7), the candidates in config order and how to choose among them.
type Group struct {
	Name              string
	LongContextTokens int
	Candidates        []Candidate
	// Routing is the choice among free candidates (models[].routing); the
	// zero value is routing.LeastLoaded.
	Routing routing.Mode
	// Epsilon is prefix affinity's load-bound slack (≥ 0): a candidate
	// takes a request only while its in-flight count stays within
	// (1+Epsilon) × its capacity share of the group's load.
	Epsilon float64
	// AffinityWait: under prefix affinity, how long a request whose
	// conversation is held by a provider at capacity waits for that
	// provider while another candidate is free (models[].affinity_wait_ms;
	// 0 = never, the request takes the free candidate at once).
	AffinityWait time.Duration
	// Balance: under prefix affinity, the weight of the prefill queued on
	// a candidate against the prefill a turn saves there (routing.Policy;
	// models[].affinity_balance). 0 = the holder of a conversation takes
	// every turn while it has a free slot.
	Balance float64
	// Timed: some fallback of the group falls back on a predicted wait
	// (models[].fallbacks[].wait_ms, SPEC V1). Its leases' service times
	// are then measured (the pool reads its clock on every transition) for
	// GroupState's predicted wait; a group without one measures nothing.
	Timed bool
}

// Config is the pool's part of the Edge config. The config layer validates
// it; the pool ignores a candidate whose Key names no Resource and lets the
// last of duplicate Resources win.
type Config struct {
	// Nodes lists configured node ids in config order for Snapshot; nodes
	// that appear only in Resources are appended in their order there.
	Nodes     []string
	Resources []Resource
	Groups    []Group
	// MaxWaiters bounds the waiters of all groups together
	// (queue.max_waiters); one more gets a QueueFullError. <= 0 means no
	// request may wait: one with no free candidate fails at once.
	MaxWaiters int
	// WaitTimeout bounds how long a waiter waits (queue.wait_timeout_ms);
	// <= 0 means until the caller's context ends.
	WaitTimeout time.Duration
	// AffinityEntries bounds each provider's affinity table (prefix
	// hashes, routing.TableEntryBytes each); <= 0 means
	// routing.DefaultTableEntries.
	AffinityEntries int
	// StarvationGrants is the starvation bound of the priority classes
	// (queue.starvation_grants, SPEC G2): a class with a servable waiter
	// is passed over by at most this many consecutive grants to higher
	// classes before it gets the next; <= 0 means DefaultStarvationGrants.
	StarvationGrants int
}

// Request is what the HTTP layer asks for. PromptTokens is the estimated
// prompt size in tokens (see EstimatePromptTokens); the request is long when
// it reaches the group's LongContextTokens (SPEC Q7). Prefix is the
// request's conversation as cumulative hashes at message boundaries
// (routing.Chain; Prefix[0] is the conversation key), nil when the request
// carries no conversation; only prefix_affinity groups read it. The pool
// reads Prefix during Acquire only and keeps a copy of nothing but the
// hashes it records.
type Request struct {
	Model        string
	Operation    string
	PromptTokens int
	Prefix       []uint64
	// Exclude lists providers the request must not be given: those a
	// re-dispatched request already tried (SPEC H11: never the
	// same provider twice in one request). Empty for a first admission.
	Exclude []Key
	// SameSlot limits the request to the routes whose credential slot is
	// Slot: a re-dispatch of a failed request stays within the credential
	// slot of the route it was bound to (SPEC C6; "" is the slot of routes
	// that carry none). False for a first admission.
	SameSlot bool
	Slot     string
	// LocalOnly limits the request to the routes that are not Remote
	// (SPEC V3: a local-only key's data never leaves the site); a group
	// with none serves it no candidate (NoCandidateError).
	LocalOnly bool
	// LeaveUnavailable: the request's group has a fallback on
	// unavailable (SPEC V1), so it does not wait for a provider to come
	// back: while none it may use is live, Acquire fails with an
	// *UnavailableError (ErrUnavailable) at once or, queued, as soon as
	// the last one stops being live (leave.go).
	LeaveUnavailable bool

	// Key names who the request is fair-shared as (SPEC G1, G3): the
	// client key's principal; "" for an unauthenticated request (open
	// mode: all of them are one key). Weight is that key's weight, 1 to
	// MaxWeight (out of range is clamped; 0 = 1).
	Key    string
	Weight int
	// Priority is the request's class (SPEC G2); the zero value is
	// interactive.
	Priority Priority
	// MaxTokens is the completion bound the request sets (max_tokens and
	// its aliases), 0 when none: the request costs PromptTokens +
	// MaxTokens (or DefaultCompletionTokens) in the fair share (Cost).
	MaxTokens int
	// Arrival is the place of a request that asks again (a re-dispatch, a
	// re-queue after over_capacity): the Lease.Arrival of its previous
	// lease, so that it keeps its place in its key's FIFO (SPEC G5). 0 for
	// a first admission, which gets a new one.
	Arrival uint64
}

// QueueFullRetryAfter is the Retry-After a QueueFullError suggests.
const QueueFullRetryAfter = time.Second

// Errors returned by Acquire; test with errors.Is (and errors.As for the
// typed ones). The HTTP layer maps them: ErrUnknownModel → 404,
// ErrNoCandidate → 400 (the model cannot serve that operation or size),
// ErrQueueFull → 429 with Retry-After, ErrWaitTimeout → 503 (SPEC Q4).
var (
	// ErrUnknownModel: no configured model group has that name (or the
	// group was removed by Reconfigure while the request waited).
	ErrUnknownModel = errors.New("pool: unknown model")
	// ErrNoCandidate: the group has no configured provider that supports the
	// operation (and, for a long request, has long capacity). Liveness plays
	// no part: a configured but offline provider makes the request wait.
	ErrNoCandidate = errors.New("pool: no configured provider for the request")
	// ErrQueueFull: no free candidate and MaxWaiters requests already wait.
	ErrQueueFull = errors.New("pool: queue full")
	// ErrWaitTimeout: the request waited WaitTimeout without a lease.
	ErrWaitTimeout = errors.New("pool: wait timeout")
	// ErrUnavailable (leave.go): Request.LeaveUnavailable and no live
	// provider the request may use.
	//
	// ErrAllTried: Request.Exclude (and Request.SameSlot) leaves no
	// configured provider for the request: a re-dispatch has no candidate
	// left to try.
	ErrAllTried = errors.New("pool: every provider of the request was tried")
)

// NoCandidateError wraps ErrNoCandidate.
type NoCandidateError struct {
	Model     string
	Operation string
	Long      bool
	// LocalOnly: the group has candidates, but none local (SPEC V3).
	LocalOnly bool
}

func (e *NoCandidateError) Error() string {
	if e.LocalOnly {
		return fmt.Sprintf("model %q: no configured provider on this site (the key is local-only)", e.Model)
	}
	if e.Long {
		return fmt.Sprintf("model %q: no configured provider supports %s with long-context capacity", e.Model, e.Operation)
	}
	return fmt.Sprintf("model %q: no configured provider supports operation %q", e.Model, e.Operation)
}

func (e *NoCandidateError) Unwrap() error { return ErrNoCandidate }

// QueueFullError wraps ErrQueueFull. RetryAfter is the suggested
// Retry-After (whole seconds on the wire, RFC 9110 §10.2.3).
type QueueFullError struct {
	Model      string
	MaxWaiters int
	RetryAfter time.Duration
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("model %q: queue full (%d waiters), retry after %s", e.Model, e.MaxWaiters, e.RetryAfter)
}

func (e *QueueFullError) Unwrap() error { return ErrQueueFull }

// WaitTimeoutError wraps ErrWaitTimeout. Reason says why no lease was
// granted, e.g. "no live provider: node gpu-1 not ready" or "all 3 live
// providers at capacity".
type WaitTimeoutError struct {
	Model  string
	Waited time.Duration
	Reason string
}

func (e *WaitTimeoutError) Error() string {
	return fmt.Sprintf("model %q: no provider within %s: %s", e.Model, e.Waited, e.Reason)
}

func (e *WaitTimeoutError) Unwrap() error { return ErrWaitTimeout }

// Lease is one admitted request's hold on a provider resource (SPEC Q2). The
// exported fields are fixed at grant: Key and Generation say which node
// connection must carry the request, Target and Type how (tunnel for
// "openai_compat", normalized run otherwise, SPEC Q3), StallTimeoutMs the
// response_stall_timeout_ms in ms to put on the wire (SPEC Q6), Long whether
// it also holds long capacity (SPEC Q7). Return it with Pool.Release.
type Lease struct {
	Key
	Model          string
	Generation     uint64
	Target         string
	Type           string
	StallTimeoutMs int64
	Long           bool
	// Slot is the route's credential slot (Candidate.Slot).
	Slot string
	// Arrival is the request's arrival number in the queue (SPEC G5):
	// pass it back as Request.Arrival when the request asks again.
	Arrival uint64

	// Owned by the pool's state; read and written under Pool.mu only.
	res        *resource
	prev, next *Lease // the resource's list of held leases
	returned   bool
	fenced     context.Context // the generation's fence context; immutable
	sample     routing.Sample  // what it met on its resource when granted (routing.Backlog.Grant)
	fit        *routing.Fit    // its group's calibration; nil unless prefix_affinity
	granted    int64           // state.now at the grant (Unix ns) when its group is Timed, else 0 (wait.go)
}

// Fenced is closed when the node generation the lease was granted on is
// fenced (SPEC L8). If that happens while the lease is held, the pool has
// already returned it (Release will report false) and the request must end
// with exactly one terminal. The channel is shared by all leases of the
// generation, so it may also close after the lease was released; only a
// held lease needs to watch it.
func (l *Lease) Fenced() <-chan struct{} {
	if l.fenced == nil {
		return nil
	}
	return l.fenced.Done()
}

// FenceContext is done when Fenced is closed. It lets a holder register a
// callback with context.AfterFunc instead of parking a goroutine on the
// channel for every request. Nil when the lease has no generation fence.
func (l *Lease) FenceContext() context.Context { return l.fenced }
