package transport

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/registry"
	iop "iop/proto/gen/iop"
)

var _ dispatch.Dispatcher = (*Server)(nil)

// stream is one run or tunnel in flight; it implements dispatch.Stream.
// The read loop delivers into a queue bounded by bytes; Recv takes from it.
type stream struct {
	c   *session
	id  string
	gen uint64 // the node generation it was started on (for logs)

	mu        sync.Mutex // after session.mu
	q         []item     // q[head:] unread, in arrival order
	head      int
	bytes     int   // encoded size of q[head:]
	err       error // set once: what Recv returns after q is drained
	cancelled bool  // CancelRequest queued (or not wanted any more)
	closed    bool
	ord       order         // SPEC E3, T2; checked by deliver
	wake      chan struct{} // buffer 1: something to Recv
}

type item struct {
	env  *iop.Envelope
	size int
}

type deliverResult uint8

const (
	delivered  deliverResult = iota
	finished                 // the terminal was delivered: unregister
	overflowed               // the reader fell behind: unregister and cancel
	gone                     // the stream already ended: unregister
	misordered               // env broke the stream's order: unregister and cancel
)

// deliver queues env (size bytes on the wire) after checking the stream's
// order (SPEC E3, T2): an envelope out of order is dropped with everything
// after it, and the stream fails with dispatch.ErrProtocol (wrapping the
// *OrderError, returned as oe), so misordered content never reaches the
// client. Called by the read loop with session.mu held; never blocks.
func (st *stream) deliver(env *iop.Envelope, size int, limit int) (r deliverResult, oe error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil {
		return gone, nil
	}
	terminal, err := st.ord.step(env)
	if err != nil {
		st.err = fmt.Errorf("%w: %w", dispatch.ErrProtocol, err)
		st.cancelled = true // the read loop queues the CancelRequest
		st.signal()
		return misordered, err
	}
	if st.bytes > 0 && st.bytes+size > limit {
		clear(st.q)
		st.q, st.head, st.bytes = st.q[:0], 0, 0
		st.err = dispatch.ErrSlowConsumer
		st.cancelled = true // the read loop queues the CancelRequest
		st.signal()
		return overflowed, nil
	}
	st.q = append(st.q, item{env, size})
	st.bytes += size
	st.signal()
	if terminal {
		st.err = io.EOF
		return finished, nil
	}
	return delivered, nil
}

// end fails the stream with err unless it already ended (once: a stream
// gets exactly one terminal outcome). Frames already queued are still
// returned first.
func (st *stream) end(err error) {
	st.mu.Lock()
	if st.err == nil {
		st.err = err
		st.signal()
	}
	st.mu.Unlock()
}

func (st *stream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// RunID implements dispatch.Stream.
func (st *stream) RunID() string { return st.id }

// Recv implements dispatch.Stream: the next RunEvent or ProviderTunnelFrame
// envelope; io.EOF after the terminal one; dispatch.ErrSessionLost when the
// session ended first; dispatch.ErrSlowConsumer when the buffer overflowed
// (queued frames are dropped then); ErrStreamClosed after Close; ctx.Err()
// when ctx ends first (the stream stays usable).
func (st *stream) Recv(ctx context.Context) (*iop.Envelope, error) {
	for {
		st.mu.Lock()
		if st.head < len(st.q) {
			it := st.q[st.head]
			st.q[st.head] = item{}
			st.head++
			st.bytes -= it.size
			if st.head == len(st.q) {
				st.q, st.head = st.q[:0], 0
			}
			st.mu.Unlock()
			return it.env, nil
		}
		err := st.err
		st.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-st.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Pending implements dispatch.Stream.
func (st *stream) Pending() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.head < len(st.q)
}

// Cancel implements dispatch.Stream: CancelRequest{reason} is queued once,
// as a must-deliver message (SPEC T3, E5); a no-op after the terminal,
// session loss or a previous Cancel.
func (st *stream) Cancel(reason string) {
	st.mu.Lock()
	send := st.err == nil && !st.cancelled
	st.cancelled = true
	st.mu.Unlock()
	if send {
		st.c.sendMustDirect(cancelEnvelope(st.id, reason))
	}
}

// Close implements dispatch.Stream: unregisters the stream, cancelling it
// first when no terminal was seen; later frames are dropped. Idempotent.
func (st *stream) Close() {
	st.c.mu.Lock()
	if st.c.streams[st.id] == st {
		delete(st.c.streams, st.id)
	}
	st.c.mu.Unlock()
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return
	}
	st.closed = true
	send := st.err == nil && !st.cancelled
	st.cancelled = true
	clear(st.q)
	st.q, st.head, st.bytes = nil, 0, 0
	st.err = ErrStreamClosed
	st.mu.Unlock()
	if send {
		st.c.sendMustDirect(cancelEnvelope(st.id, "stream closed"))
	}
}

// readySession returns the session of the current ready owner (node, gen),
// or nil (SPEC L3, P3, N1).
func (s *Server) readySession(node string, gen uint64) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.reg.Current(node, gen)
	if !ok {
		return nil
	}
	return s.sessions[id]
}

// StartRun implements dispatch.Dispatcher: it assigns a run id, registers
// the stream and queues RunRequest. The writer encodes req later: the
// caller must not modify it after the call. Errors: dispatch.ErrNotReady
// when t is not the current ready owner (SPEC L3, L9, P3),
// dispatch.ErrSendQueueFull when the request could not be queued (nothing
// was sent); a request that cannot be encoded (over 16 MiB, invalid UTF-8)
// ends the stream with ErrUnencodable.
func (s *Server) StartRun(t dispatch.Target, req *iop.RunRequest) (dispatch.Stream, error) {
	st, err := s.start(t, false, func(env *iop.Envelope) { env.Kind = &iop.Envelope_RunRequest{RunRequest: req} })
	if err != nil {
		return nil, fmt.Errorf("start run on node %s generation %d: %w", t.Node, t.Generation, err)
	}
	return st, nil
}

// StartTunnel implements dispatch.Dispatcher for ProviderTunnelRequest;
// ownership of req and errors as StartRun.
func (s *Server) StartTunnel(t dispatch.Target, req *iop.ProviderTunnelRequest) (dispatch.Stream, error) {
	st, err := s.start(t, true, func(env *iop.Envelope) { env.Kind = &iop.Envelope_TunnelRequest{TunnelRequest: req} })
	if err != nil {
		return nil, fmt.Errorf("start tunnel on node %s generation %d: %w", t.Node, t.Generation, err)
	}
	return st, nil
}

// startQueueWait bounds how long a stream start waits for room in a full
// send queue. It stays well below the write timeout: a queue that stays full
// that long means the writer is stuck, and the session is about to end.
const startQueueWait = 2 * time.Second

func (s *Server) start(t dispatch.Target, tunnel bool, set func(*iop.Envelope)) (*stream, error) {
	c := s.readySession(t.Node, t.Generation)
	if c == nil {
		return nil, dispatch.ErrNotReady
	}
	c.mu.Lock()
	if c.lost {
		c.mu.Unlock()
		return nil, dispatch.ErrNotReady
	}
	st := &stream{c: c, id: c.newIDLocked('r'), gen: t.Generation, ord: order{tunnel: tunnel}, wake: make(chan struct{}, 1)}
	c.streams[st.id] = st
	c.mu.Unlock()
	env := &iop.Envelope{RunId: st.id}
	set(env)
	if !c.sendDirect(env, min(startQueueWait, s.o.WriteTimeout/2)) {
		c.mu.Lock()
		delete(c.streams, st.id)
		c.mu.Unlock()
		return nil, dispatch.ErrSendQueueFull
	}
	return st, nil
}

// reply is a command or refresh answer, or why none will come.
type reply struct {
	env *iop.Envelope
	err error
}

// request queues env with a new request id to the ready session (node,
// gen) and waits for the envelope answering it.
func (s *Server) request(ctx context.Context, node string, gen uint64, env *iop.Envelope) (*iop.Envelope, error) {
	c := s.readySession(node, gen)
	if c == nil {
		return nil, dispatch.ErrNotReady
	}
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.lost {
		c.mu.Unlock()
		return nil, dispatch.ErrNotReady
	}
	id := c.newIDLocked('q')
	c.waiters[id] = ch
	c.mu.Unlock()
	drop := func() {
		c.mu.Lock()
		delete(c.waiters, id)
		c.mu.Unlock()
	}
	env.RequestId = id
	if !c.send(env) {
		drop()
		return nil, dispatch.ErrSendQueueFull
	}
	select {
	case r := <-ch:
		return r.env, r.err
	case <-c.lostCh:
		select {
		case r := <-ch: // answered just before the loss
			return r.env, r.err
		default:
		}
		return nil, dispatch.ErrSessionLost
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

// Command sends NodeCommandRequest to the ready session (node, gen) and
// returns its NodeCommandResponse (SPEC N1), correlated by request_id.
// Errors: dispatch.ErrNotReady (not the current ready owner: commands never
// go to pending nodes), dispatch.ErrSendQueueFull, dispatch.ErrSessionLost,
// ErrUnexpectedResponse, ErrUnencodable, ctx.Err().
func (s *Server) Command(ctx context.Context, node string, gen uint64, req *iop.NodeCommandRequest) (*iop.NodeCommandResponse, error) {
	env, err := s.request(ctx, node, gen, &iop.Envelope{Kind: &iop.Envelope_CommandRequest{CommandRequest: req}})
	if err != nil {
		return nil, fmt.Errorf("command %s to node %s generation %d: %w", req.GetType(), node, gen, err)
	}
	r, ok := env.Kind.(*iop.Envelope_CommandResponse)
	if !ok {
		return nil, fmt.Errorf("command %s to node %s: %w %T", req.GetType(), node, ErrUnexpectedResponse, env.Kind)
	}
	return r.CommandResponse, nil
}

// Refresh pushes payload to the ready session (node, gen) as
// NodeConfigRefreshRequest and returns the node's answer (SPEC N2). When the
// node answers APPLIED, payload.revision becomes the session's known
// revision (RefreshAll skips it next time); RESTART_REQUIRED and FAILED keep
// the old one, so the node stays marked as running an older payload
// (Nodes, /status) and every later RefreshAll pushes again. Errors as
// Command.
func (s *Server) Refresh(ctx context.Context, node string, gen uint64, payload *iop.NodeConfigPayload) (*iop.NodeConfigRefreshResponse, error) {
	env, err := s.request(ctx, node, gen, &iop.Envelope{Kind: &iop.Envelope_RefreshRequest{
		RefreshRequest: &iop.NodeConfigRefreshRequest{Config: payload}}})
	if err != nil {
		return nil, fmt.Errorf("config refresh of node %s generation %d: %w", node, gen, err)
	}
	r, ok := env.Kind.(*iop.Envelope_RefreshResponse)
	if !ok {
		return nil, fmt.Errorf("config refresh of node %s: %w %T", node, ErrUnexpectedResponse, env.Kind)
	}
	s.noteRefresh(node, gen, payload, r.RefreshResponse.GetStatus(), r.RefreshResponse.GetReason())
	return r.RefreshResponse, nil
}

// noteRefresh records a node's answer to a refresh with payload p (SPEC
// N2): APPLIED makes p the payload the session runs (Running) and calls
// Hooks.OnApplied; RESTART_REQUIRED is not APPLIED: the session's payload
// stays, and the node is marked as needing a restart for p's revision;
// FAILED changes nothing but the reason /status shows (ConfigErrors),
// which RESTART_REQUIRED sets too and APPLIED clears.
func (s *Server) noteRefresh(node string, gen uint64, p *iop.NodeConfigPayload, st iop.RefreshStatus, reason string) {
	s.mu.Lock()
	id, ok := s.reg.Current(node, gen)
	c := s.sessions[id]
	if !ok || c == nil {
		s.mu.Unlock()
		return
	}
	revision := p.GetRevision()
	switch st {
	case iop.RefreshStatus_REFRESH_APPLIED:
		c.payload, c.revision, c.restartRevision = p, revision, ""
		delete(s.configErrs, node)
		s.mu.Unlock()
		if f := s.o.Hooks.OnApplied; f != nil {
			f(node, gen)
		}
		return
	case iop.RefreshStatus_REFRESH_RESTART_REQUIRED:
		c.restartRevision = revision
	}
	s.configErrs[node] = "the node answered " + strings.TrimPrefix(st.String(), "REFRESH_") + " to the config of revision " +
		boundText(revision, maxShortText) + ": " + reason
	s.mu.Unlock()
}

// Running returns the NodeConfigPayload generation gen of node runs (SPEC
// N2): the one its registration was accepted with, or the one it last
// answered APPLIED to — never one it answered RESTART_REQUIRED or FAILED
// to. ok is false when gen is not the node's current owner. The result is
// shared: read it, never change it.
func (s *Server) Running(node string, gen uint64) (p *iop.NodeConfigPayload, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.reg.Current(node, gen)
	c := s.sessions[id]
	if !ok || c == nil {
		return nil, false
	}
	return c.payload, true
}

// ConfigErrors maps each node that could not run this edge's config to
// why, in its own words (SPEC N2): a NodeConfigRejected at registration
// (say an adapter name another edge's config gives another backend, SPEC
// E4), or the reason of a refresh answered FAILED or RESTART_REQUIRED.
// An entry goes when the node becomes ready, applies a refresh, or a
// reload makes the revision it runs the current one again. The result is
// a copy.
func (s *Server) ConfigErrors() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.configErrs)
}

// CapacityShare is the capacity share the current owner of (node, gen)
// registered with (RegisterRequest.capacity_share, SPEC E4): in (0, 1],
// or 0 for the whole capacity (also when gen is not the current owner).
func (s *Server) CapacityShare(node string, gen uint64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.reg.Current(node, gen)
	if c := s.sessions[id]; ok && c != nil {
		return c.capacityShare
	}
	return 0
}

// RefreshResult is the outcome of one node's refresh in RefreshAll.
type RefreshResult struct {
	Node       string
	Generation uint64
	// Revision pushed.
	Revision string
	// Status answered by the node; unset when Err is not nil.
	Status iop.RefreshStatus
	Reason string
	Err    error
}

// RefreshAll is the reload step (SPEC N2, P3): it reconciles the registry
// with the current config (a node removed from it is fenced and closed),
// then pushes NodePayload, concurrently, to every ready node whose payload
// revision differs from the one it last accepted, and waits for all
// answers (or ctx); a ready node that runs the current revision already
// loses its config error. Pending nodes are never refreshed (SPEC L3, P3): one
// whose registration came before the reload is pushed the current payload
// at its ready transition instead (session.ready). Results are in config
// order.
func (s *Server) RefreshAll(ctx context.Context) []RefreshResult {
	var todo []RefreshResult
	var payloads []*iop.NodeConfigPayload
	s.step(func(time.Time) []registry.Effect {
		for _, n := range s.reg.Nodes() {
			id, ok := s.reg.Current(n.ID, n.Gen)
			if !ok || s.sessions[id] == nil {
				continue
			}
			p := s.cfg.NodePayload(n.ID)
			if p == nil {
				continue
			}
			if p.GetRevision() == s.sessions[id].revision {
				// The node runs this config already: an error about another
				// revision (a refresh it refused, which the reload undid) is
				// no longer its state (SPEC N2).
				delete(s.configErrs, n.ID)
				continue
			}
			todo = append(todo, RefreshResult{Node: n.ID, Generation: n.Gen, Revision: p.GetRevision()})
			payloads = append(payloads, p)
		}
		return nil
	})
	var wg sync.WaitGroup
	for i := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &todo[i]
			resp, err := s.Refresh(ctx, r.Node, r.Generation, payloads[i])
			if err != nil {
				r.Err = err
				s.log.Warn("node config refresh failed", "node", r.Node, "err", err)
				return
			}
			r.Status, r.Reason = resp.GetStatus(), resp.GetReason()
			s.log.Info("node config refreshed", "node", r.Node, "status", r.Status, "reason", r.Reason)
		}()
	}
	wg.Wait()
	return todo
}

// BootID returns the boot id the current owner of node (pending or ready)
// registered with (RegisterRequest.boot_id), or "" when it has none or
// reported none. The credential plane binds it into the node's leases
// (CredentialLeaseBinding.node_boot_id), so a lease issued before the node
// restarted is refused by the restarted node.
func (s *Server) BootID(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.ownerLocked(node); c != nil {
		return c.bootID
	}
	return ""
}

// UntrustingNodes lists the ready nodes, in config order, that reported
// the issuer keys they trust at registration and do not trust the issuer
// key keyID: a config whose leases they would all refuse (SPEC C3).
func (s *Server) UntrustingNodes(keyID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, n := range s.reg.Nodes() {
		id, ok := s.reg.Current(n.ID, n.Gen)
		c := s.sessions[id]
		if !ok || c == nil || len(c.trustedIssuers) == 0 {
			continue
		}
		if !slices.Contains(c.trustedIssuers, keyID) {
			out = append(out, n.ID)
		}
	}
	return out
}

// ownerLocked is the session of node's current owner in either phase, or
// nil. Called with s.mu held.
func (s *Server) ownerLocked(node string) *session {
	if id, ok := s.reg.Owner(node); ok {
		return s.sessions[id]
	}
	return nil
}
