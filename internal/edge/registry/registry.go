// Package registry owns which connection is the owner of each node id on the
// Edge, the generation of that ownership and whether it is pending or ready
// (SPEC L1–L10, I3, P3).
//
// It is a pure state machine: every exported method is one
// transition that returns a Result and a list of Effects for the caller to
// carry out, in order. It never does I/O, starts goroutines, reads the
// clock (time arrives as an argument), logs or locks; the caller serializes
// calls. It knows connections only by an opaque ConnID and never sees an
// address or a certificate beyond the name in it.
//
// # States
//
// A node id is configured or not, and has at most one owner: the connection
// whose registration was accepted last, in phase Pending or Ready. Each
// accepted registration bumps the node's generation, an Edge-internal
// counter that is never sent on the wire and never reused for that node id,
// even across config reloads.
//
// A connection is unknown (never registered), Rejected (its first
// registration was refused; it is being closed), or Bound to the (node,
// generation) it registered. A bound connection whose generation is no
// longer its node's current owner is stale: its ready, close and timeout
// callbacks change nothing and emit nothing (SPEC L9).
//
// # Effects
//
// Effects come in the order they must be executed. For one ending
// generation the order is Fence, then Emit (node.disconnected, only when it
// was ready), then Close of its connection when that is still open — so
// lease return and queue settlement never wait for the droppable event
// fan-out (SPEC L8, L10). For a first ready transition it is Activate, then
// Emit (node.connected). Within one node, the Fence of generation g always
// comes in an earlier or the same transition as the Activate of g+1.
package registry

import (
	"errors"
	"fmt"
	"time"

	"iop/internal/edge/events"
)

// ConnID names one accepted connection. The caller assigns ids, unique for
// the life of the Registry; 0 is never a valid id.
type ConnID uint64

// Phase of a node id's current owner.
type Phase uint8

// Phases (SPEC L3, L5).
const (
	// Pending: registered, config sent, not dispatchable (SPEC L3, P3).
	Pending Phase = iota + 1
	// Ready: the owner acknowledged ready; dispatchable (SPEC L5).
	Ready
)

func (p Phase) String() string {
	switch p {
	case Pending:
		return "pending"
	case Ready:
		return "ready"
	}
	return "none"
}

// Rejection and disconnection causes. They are wrapped into Result.Err with
// the ids involved; Result.Reason() is the text sent to the node. Test with
// errors.Is.
var (
	// ErrAlreadyRegistered: a second RegisterRequest on a connection that
	// already registered (SPEC L1). The first binding is unchanged and the
	// connection stays open.
	ErrAlreadyRegistered = errors.New("connection already registered")
	// ErrRegistrationRejected: a RegisterRequest or NodeReadyRequest on a
	// connection whose registration was already rejected (SPEC L1, L6).
	ErrRegistrationRejected = errors.New("connection's registration was rejected")
	// ErrNameMismatch: the node id differs from the certificate's name
	// (SPEC I3).
	ErrNameMismatch = errors.New("node id does not match the certificate name")
	// ErrUnknownNode: the node id is not configured (SPEC L2).
	ErrUnknownNode = errors.New("unknown node id")
	// ErrNotRegistered: NodeReadyRequest on a connection that never
	// registered (SPEC L6).
	ErrNotRegistered = errors.New("connection has not registered")
	// ErrWrongNode: NodeReadyRequest names another node id than the
	// connection registered (SPEC L6).
	ErrWrongNode = errors.New("ready names another node id than the registration")
	// ErrSuperseded: the connection's generation is no longer current: a
	// newer connection registered the node id, or the node was removed from
	// config (SPEC L4, L6).
	ErrSuperseded = errors.New("connection superseded by a newer registration")
	// ErrRemoved: the node id was removed from the config (reload).
	ErrRemoved = errors.New("node removed from config")
	// ErrConnClosed: the current owner's connection closed.
	ErrConnClosed = errors.New("connection closed")
	// ErrHeartbeatTimeout: the current owner sent nothing for the heartbeat
	// timeout (SPEC L7).
	ErrHeartbeatTimeout = errors.New("heartbeat timeout")
	// ErrRegistrationRateLimited: the node id's identity registered more
	// often than the registration limit allows (LimitRegistrations); the
	// current owner is untouched and the connection is closed.
	ErrRegistrationRateLimited = errors.New("registrations of this node id too frequent; try again later")
)

// Result is the answer to a Register or Ready transition.
type Result struct {
	// OK: registration accepted (RegisterResponse.accepted) or ready
	// acknowledged (NodeReadyResponse.ready).
	OK bool
	// Err says why not; nil when OK.
	Err error
	// Node and Gen are the connection's binding after the transition
	// (zero when it has none).
	Node string
	Gen  uint64
	// CloseAfterReply: the caller sends the reply and then closes the
	// connection (a refused first registration, SPEC L2, I3).
	CloseAfterReply bool
}

// Reason is the human-readable reason for the wire (RegisterResponse.reason,
// NodeReadyResponse.reason); empty when OK.
func (r Result) Reason() string {
	if r.Err == nil {
		return ""
	}
	return r.Err.Error()
}

// EffectKind says what the caller must do.
type EffectKind uint8

// Effect kinds.
const (
	// Fence: generation Gen of Node ended (SPEC L8). Fail everything in
	// flight on Conn; when WasReady, return the generation's leases and
	// take its resources offline. Emitted once per accepted generation.
	Fence EffectKind = iota + 1
	// Activate: generation Gen of Node became ready for the first time
	// (SPEC L5): bring its resources online and pump waiters.
	Activate
	// Emit: publish Event on the droppable fan-out (SPEC N4, L10).
	Emit
	// Close: close connection Conn; Err says why.
	Close
)

func (k EffectKind) String() string {
	switch k {
	case Fence:
		return "fence"
	case Activate:
		return "activate"
	case Emit:
		return "emit"
	case Close:
		return "close"
	}
	return fmt.Sprintf("EffectKind(%d)", uint8(k))
}

// Effect is one thing the caller must do, in the order given.
type Effect struct {
	Kind EffectKind
	Conn ConnID
	Node string
	Gen  uint64
	// WasReady (Fence): the generation had been activated.
	WasReady bool
	// Event (Emit).
	Event events.Event
	// Err (Fence, Close): the cause.
	Err error
}

// NodeState is one configured node as status shows it (SPEC N3): connected
// only once ready (SPEC L3).
type NodeState struct {
	ID string
	// Phase is 0 when no connection owns the node id.
	Phase Phase
	// Gen is the current owner's generation, 0 when none.
	Gen uint64
	// ReadySince is when the current generation became ready; zero unless
	// Phase is Ready.
	ReadySince time.Time
}

// Connected reports whether the node is dispatchable and shown connected.
func (n NodeState) Connected() bool { return n.Phase == Ready }

type node struct {
	configured bool
	gen        uint64 // last generation handed out; never decreases
	owner      ConnID // 0 = none
	phase      Phase  // of owner
	readySince time.Time
	// tat is the registration limit's theoretical arrival time (GCRA):
	// a registration at now is allowed when now ≥ tat − (burst−1)·every.
	tat time.Time
}

type connState uint8

const (
	connBound connState = iota + 1
	connRejected
)

type conn struct {
	state connState
	node  string
	gen   uint64
}

// Registry is the state. The zero value is not usable; call New. It is not
// safe for concurrent use: the caller serializes transitions.
type Registry struct {
	order []string // configured ids, config order
	nodes map[string]*node
	conns map[ConnID]*conn
	// The registration limit per node id (LimitRegistrations); every = 0
	// means none.
	burst int
	every time.Duration
}

// LimitRegistrations bounds how often one node id — one certificate
// identity, since a registration must name its certificate's node (SPEC
// I3) — can register: burst registrations at once, then one per every
// (the generic cell rate algorithm, as a token bucket of burst tokens
// refilled one per every). A registration beyond it is refused and its
// connection closed, and the current owner keeps its session: a stolen
// or duplicated certificate re-registering in a loop can take the node id
// over at most that often, instead of dropping the real node's session
// (and costing log lines and events) each time. every ≤ 0 or burst ≤ 0
// removes the limit (the default).
func (r *Registry) LimitRegistrations(burst int, every time.Duration) {
	if burst <= 0 || every <= 0 {
		r.burst, r.every = 0, 0
		return
	}
	r.burst, r.every = burst, every
}

// allowRegistration is the limit's decision for n at now; it consumes one
// registration when it allows. A clock that went back does not refill.
func (r *Registry) allowRegistration(n *node, now time.Time) bool {
	if r.every == 0 {
		return true
	}
	tat := n.tat
	if tat.Before(now) {
		tat = now
	}
	if tat.Sub(now) > time.Duration(r.burst-1)*r.every {
		return false
	}
	n.tat = tat.Add(r.every)
	return true
}

// New returns a Registry with the configured node ids, in config order.
func New(nodeIDs []string) *Registry {
	r := &Registry{nodes: make(map[string]*node), conns: make(map[ConnID]*conn)}
	r.Reconfigure(nodeIDs, time.Time{})
	return r
}

// Register handles RegisterRequest{nodeID} on connection c whose verified
// certificate names certName (SPEC L1–L4, I3). In order:
//   - c already registered (accepted or rejected) → refused, binding and
//     generation unchanged, connection kept (L1);
//   - nodeID ≠ certName → refused and closed (I3);
//   - nodeID not configured → refused and closed (L2);
//   - nodeID registered more often than LimitRegistrations allows →
//     refused and closed, the current owner untouched;
//   - else accepted: c becomes nodeID's Pending owner with generation+1
//     (L3). A previous owner is fenced in the same step and its connection
//     closed (L4, L8); node.disconnected is emitted only if it was Ready.
func (r *Registry) Register(c ConnID, nodeID, certName string, now time.Time) (Result, []Effect) {
	if b, ok := r.conns[c]; ok {
		if b.state == connRejected {
			return Result{Err: fmt.Errorf("register %q: %w", nodeID, ErrRegistrationRejected)}, nil
		}
		return Result{Node: b.node, Gen: b.gen,
			Err: fmt.Errorf("register %q: %w as %q", nodeID, ErrAlreadyRegistered, b.node)}, nil
	}
	reject := func(err error) (Result, []Effect) {
		r.conns[c] = &conn{state: connRejected}
		return Result{Err: err, CloseAfterReply: true}, nil
	}
	if nodeID != certName {
		return reject(fmt.Errorf("register %q: %w %q", nodeID, ErrNameMismatch, certName))
	}
	n := r.nodes[nodeID]
	if n == nil || !n.configured {
		return reject(fmt.Errorf("register %q: %w", nodeID, ErrUnknownNode))
	}
	if !r.allowRegistration(n, now) {
		return reject(fmt.Errorf("register %q: %w", nodeID, ErrRegistrationRateLimited))
	}
	var fx []Effect
	if n.owner != 0 {
		fx = r.end(fx, nodeID, n, now, fmt.Errorf("%w (node %s)", ErrSuperseded, nodeID), true)
	}
	n.gen++
	n.owner, n.phase, n.readySince = c, Pending, time.Time{}
	r.conns[c] = &conn{state: connBound, node: nodeID, gen: n.gen}
	return Result{OK: true, Node: nodeID, Gen: n.gen}, fx
}

// Ready handles NodeReadyRequest{nodeID} on connection c (SPEC L5, L6):
//   - c is nodeID's current Pending owner → ready: the generation is
//     activated and node.connected emitted (the only first transition);
//   - c is nodeID's current Ready owner → ready again, no effects;
//   - otherwise (never registered, rejected, another node id, stale or
//     superseded) → not ready with the reason, no effects, nothing changed.
func (r *Registry) Ready(c ConnID, nodeID string, now time.Time) (Result, []Effect) {
	b, ok := r.conns[c]
	switch {
	case !ok:
		return Result{Err: fmt.Errorf("ready %q: %w", nodeID, ErrNotRegistered)}, nil
	case b.state == connRejected:
		return Result{Err: fmt.Errorf("ready %q: %w", nodeID, ErrRegistrationRejected)}, nil
	case b.node != nodeID:
		return Result{Node: b.node, Gen: b.gen,
			Err: fmt.Errorf("ready %q: %w (registered %q)", nodeID, ErrWrongNode, b.node)}, nil
	}
	n := r.nodes[nodeID]
	if n == nil || n.owner != c || n.gen != b.gen {
		return Result{Node: b.node, Gen: b.gen, Err: fmt.Errorf("ready %q: %w", nodeID, ErrSuperseded)}, nil
	}
	res := Result{OK: true, Node: nodeID, Gen: b.gen}
	if n.phase == Ready {
		return res, nil
	}
	n.phase, n.readySince = Ready, now
	return res, []Effect{
		{Kind: Activate, Conn: c, Node: nodeID, Gen: b.gen},
		{Kind: Emit, Node: nodeID, Gen: b.gen, Event: events.Event{Type: events.TypeConnected, Node: nodeID, Time: now}},
	}
}

// ConnClosed forgets connection c (its read loop ended). If c was its
// node's current owner the generation is fenced, with node.disconnected when
// it was Ready; a stale, rejected or unknown c changes nothing (SPEC L9).
// No Close effect: c is already closed.
func (r *Registry) ConnClosed(c ConnID, now time.Time) []Effect {
	b, ok := r.conns[c]
	if !ok {
		return nil
	}
	delete(r.conns, c)
	return r.endIfCurrent(nil, c, b, now, ErrConnClosed, false)
}

// HeartbeatTimeout reports that connection c sent nothing for the
// heartbeat timeout (SPEC L7). The current owner is fenced (node.disconnected
// if it was Ready) and c closed; a stale, rejected or unknown c changes
// nothing (SPEC L9) — the caller closes it anyway.
func (r *Registry) HeartbeatTimeout(c ConnID, now time.Time) []Effect {
	b, ok := r.conns[c]
	if !ok {
		return nil
	}
	return r.endIfCurrent(nil, c, b, now, ErrHeartbeatTimeout, true)
}

func (r *Registry) endIfCurrent(fx []Effect, c ConnID, b *conn, now time.Time, cause error, closeConn bool) []Effect {
	if b.state != connBound {
		return fx
	}
	n := r.nodes[b.node]
	if n == nil || n.owner != c || n.gen != b.gen {
		return fx
	}
	return r.end(fx, b.node, n, now, cause, closeConn)
}

// end fences the current owner of id and clears the ownership.
func (r *Registry) end(fx []Effect, id string, n *node, now time.Time, cause error, closeConn bool) []Effect {
	owner, wasReady := n.owner, n.phase == Ready
	fx = append(fx, Effect{Kind: Fence, Conn: owner, Node: id, Gen: n.gen, WasReady: wasReady, Err: cause})
	if wasReady {
		fx = append(fx, Effect{Kind: Emit, Node: id, Gen: n.gen,
			Event: events.Event{Type: events.TypeDisconnected, Node: id, Time: now, Reason: reasonText(cause)}})
	}
	if closeConn {
		fx = append(fx, Effect{Kind: Close, Conn: owner, Node: id, Gen: n.gen, Err: cause})
	}
	n.owner, n.phase, n.readySince = 0, 0, time.Time{}
	return fx
}

// reasonText is the event reason: the sentinel's text, never ids of
// connections or addresses.
func reasonText(err error) string {
	for _, s := range []error{ErrSuperseded, ErrRemoved, ErrConnClosed, ErrHeartbeatTimeout} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "fenced"
}

// Reconfigure replaces the set of configured node ids (a config reload).
// A removed node's current owner is fenced and its connection closed
// (node.disconnected if it was Ready); generation counters are kept, so a
// node id that comes back never reuses a generation.
func (r *Registry) Reconfigure(nodeIDs []string, now time.Time) []Effect {
	keep := make(map[string]bool, len(nodeIDs))
	order := make([]string, 0, len(nodeIDs))
	for _, id := range nodeIDs {
		if !keep[id] {
			keep[id] = true
			order = append(order, id)
		}
	}
	var fx []Effect
	for _, id := range r.order { // old order: effects are deterministic
		if n := r.nodes[id]; !keep[id] && n.configured {
			n.configured = false
			if n.owner != 0 {
				fx = r.end(fx, id, n, now, fmt.Errorf("%w (node %s)", ErrRemoved, id), true)
			}
		}
	}
	r.order = order
	for _, id := range r.order {
		n := r.nodes[id]
		if n == nil {
			n = &node{}
			r.nodes[id] = n
		}
		n.configured = true
	}
	return fx
}

// Current returns the connection of node's generation gen when it is the
// current Ready owner: the only target that may receive runs, tunnels,
// commands or refreshes (SPEC L3, N1, P3).
func (r *Registry) Current(nodeID string, gen uint64) (ConnID, bool) {
	n := r.nodes[nodeID]
	if n == nil || n.owner == 0 || n.phase != Ready || n.gen != gen {
		return 0, false
	}
	return n.owner, true
}

// Owner returns the connection that owns nodeID now, pending or ready.
func (r *Registry) Owner(nodeID string) (ConnID, bool) {
	n := r.nodes[nodeID]
	if n == nil || n.owner == 0 {
		return 0, false
	}
	return n.owner, true
}

// Binding returns the (node, generation) connection c registered, and
// whether it is still that node's current owner.
func (r *Registry) Binding(c ConnID) (nodeID string, gen uint64, current bool) {
	b, ok := r.conns[c]
	if !ok || b.state != connBound {
		return "", 0, false
	}
	n := r.nodes[b.node]
	return b.node, b.gen, n != nil && n.owner == c && n.gen == b.gen
}

// Node returns the state of one configured node id.
func (r *Registry) Node(nodeID string) (NodeState, bool) {
	n := r.nodes[nodeID]
	if n == nil || !n.configured {
		return NodeState{}, false
	}
	return r.state(nodeID, n), true
}

// Nodes returns every configured node in config order (SPEC N3).
func (r *Registry) Nodes() []NodeState {
	out := make([]NodeState, 0, len(r.order))
	for _, id := range r.order {
		out = append(out, r.state(id, r.nodes[id]))
	}
	return out
}

func (r *Registry) state(id string, n *node) NodeState {
	s := NodeState{ID: id, Phase: n.phase, ReadySince: n.readySince}
	if n.owner != 0 {
		s.Gen = n.gen
	}
	return s
}
