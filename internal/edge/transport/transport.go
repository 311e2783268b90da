// Package transport is the Edge's side of the Edge–Node connection: the
// mutual-TLS listener for nodes, one session per connection (register,
// ready, heartbeats, frames in and out), and the dispatch of runs, tunnels,
// commands and config refreshes to ready node sessions (SPEC W1–W5, I2, I3,
// L1–L10, N1, N2, E6, T3).
//
// It owns sockets and session goroutines. Who owns which node id, and in
// which generation, is decided by the pure registry (internal/edge/registry);
// this package only executes its effects. It must never build an HTTP
// response (SPEC P2, T5), import a node package, log or expose an address in
// status, or let a slow peer or consumer block the read loop or a caller.
//
// # Peer input (B1)
//
// What a node (or anyone reaching node_listen) sends is bounded before it
// costs memory: at most Options.MaxHandshakes connections may be in their
// TLS handshake (one more takes the slot of the one in its handshake
// longest, which is closed: handshakes.go), the handshake has
// Options.HandshakeTimeout and its refusals are logged at most
// ratelog.DefaultBurst lines a second with a count of suppressed ones; one
// node identity registers at most Options.RegisterBurst times at once and
// then once per Options.RegisterInterval (a refused registration leaves
// the current owner alone; refusals are logged at a bounded rate); error
// texts, identifiers, usage, error metadata, command results and tunnel
// headers are bounded at ingress (ingress.go) before anything else sees
// them; frames are read with internal/wire (64 KiB until
// ready, 16 MiB after, buffered as the bytes arrive); a stream holds at
// most Options.StreamBuffer bytes of frames unread (then it is cancelled
// as a slow consumer); each stream's envelopes are checked against SPEC E3
// and T2 (order.go) and a misordered one is dropped, never delivered, with
// the stream failing with dispatch.ErrProtocol and the run cancelled on
// the node; the last endedRing streams that ended are remembered to log
// frames after their terminal.
//
// # Goroutines
//
// Serve runs the accept loop. Each accepted connection gets one goroutine
// (serveConn) that does the TLS handshake and then is the session's read
// loop, and one writer goroutine (writeLoop) that drains the send queue and
// owns the heartbeat ticker, the liveness timer and the register→ready
// timer; writes to the connection happen under the direct.Writer's lock,
// from it or from a handler writing directly. When the read loop ends (or anyone calls fail), the
// session closes the socket, waits for the writer, fails its streams and
// waiters with dispatch.ErrSessionLost, and reports ConnClosed to the
// registry. Serve returns only after every connection goroutine has exited.
//
// # Messages to the node and a full send queue (docs/wire.md)
//
// Each session's write side is a direct.Writer: an HTTP handler starting a
// run or tunnel, or cancelling one, writes its frame itself when the
// connection is free and nothing is queued (no wake-up of the writer
// goroutine); otherwise, and always from the read loop, frames go to a
// bounded send queue (Options.SendQueue frames) that the writer drains in
// batches, flushing when the queue is empty. Per message kind:
//
//	RegisterResponse, NodeReadyResponse  must-deliver: a full queue closes the session
//	CancelRequest                        must-deliver: a full queue closes the session
//	                                     (the node then cancels everything, SPEC E6)
//	RunRequest, ProviderTunnelRequest    refusable: the caller gets ErrSendQueueFull,
//	NodeCommandRequest,                  nothing is sent and the session is unaffected
//	NodeConfigRefreshRequest
//	HeartbeatPong                        droppable: the node's next ping gets one
//	HeartbeatPing                        written by the writer itself, never queued
//
// # Locks
//
// Lock order: Server.mu, then session.mu, then stream.mu; none is held
// across I/O, a channel send that can block, or a hook. Registry transitions
// run under Server.mu. Their effects are queued under it and executed after
// it is released, by whichever goroutine finds no other one executing
// (see Server.step): hooks and event publication therefore run outside every
// lock, one at a time and in exactly the registry's transition order, so
// for one node OnFence(g) always precedes OnReady(g+1). Hooks may call back
// into the Server.
package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/events"
	"iop/internal/edge/registry"
	"iop/internal/ratelog"
)

// Defaults (docs/wire.md, "Timeouts and bounds").
const (
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultReadyTimeout     = 30 * time.Second // register→ready
	DefaultWriteTimeout     = 10 * time.Second // per frame written to the socket
	DefaultSendQueue        = 256              // frames
	DefaultStreamBuffer     = 4 << 20          // bytes of frames a stream may hold unread
	// DefaultRegisterBurst and DefaultRegisterInterval bound registrations
	// per node identity (registry.LimitRegistrations): 8 at once, then one
	// every 2 s. A node reconnects every reconnect.interval_sec (10 s by
	// default), so a healthy one never meets the bound.
	DefaultRegisterBurst    = 8
	DefaultRegisterInterval = 2 * time.Second
	// DefaultMaxHandshakes bounds the connections accepted on node_listen
	// that have not finished their TLS handshake (each costs a goroutine
	// and ~12 KiB until HandshakeTimeout); beyond it a new connection
	// takes the slot of the one in its handshake longest, which is closed.
	DefaultMaxHandshakes = 256
)

// Errors of this package; test with errors.Is. Session-ending causes are
// logged; the dispatch sentinels (dispatch.ErrNotReady, ErrSessionLost,
// ErrSlowConsumer, ErrSendQueueFull) are what callers of the Dispatcher,
// Command and Refresh see.
var (
	// ErrNoTLS: Options.TLS is nil; nodes are only served over mutual TLS.
	ErrNoTLS = errors.New("transport: no TLS config")
	// ErrNoConfig: Options.Config is nil or returns nil.
	ErrNoConfig = errors.New("transport: no edge config")
	// ErrServing: Serve was called twice.
	ErrServing = errors.New("transport: already serving")
	// ErrNotNodeRole: the peer's certificate has a role other than node
	// (SPEC I2); normally the TLS config rejects it first.
	ErrNotNodeRole = errors.New("transport: peer certificate role is not node")
	// ErrReadyTimeout: no accepted ready within Options.ReadyTimeout of
	// the handshake.
	ErrReadyTimeout = errors.New("transport: node not ready in time")
	// ErrHeartbeatTimeout: nothing received for heartbeat.timeout_ms (SPEC L7).
	ErrHeartbeatTimeout = errors.New("transport: heartbeat timeout")
	// ErrSendOverflow: a must-deliver message found the send queue full.
	ErrSendOverflow = errors.New("transport: send queue full for a must-deliver message")
	// ErrRefusedRegistration: the session was closed after its
	// registration was refused (SPEC L2, I3).
	ErrRefusedRegistration = errors.New("transport: registration refused")
	// ErrServerClosed: Serve's context ended.
	ErrServerClosed = errors.New("transport: server closed")
	// ErrStreamClosed: Recv after Close.
	ErrStreamClosed = errors.New("transport: stream closed")
	// ErrUnexpectedResponse: a node answered a command or refresh with
	// the wrong message kind.
	ErrUnexpectedResponse = errors.New("transport: unexpected response kind")
	// ErrUnencodable: the request could not be encoded as a frame (over
	// the 16 MiB cap, or invalid UTF-8 in a string field); nothing was sent.
	ErrUnencodable = errors.New("transport: request cannot be encoded")
)

// Hooks connect node readiness to the provider pool. Both are called
// synchronously in registry transition order, outside every lock of this
// package; for one generation OnReady comes at most once and, if it came,
// exactly one OnFence follows it, before any OnReady of a later generation
// of the node (SPEC L5, L8). Either may be nil.
type Hooks struct {
	// OnReady: generation gen of node became ready (first transition only).
	OnReady func(node string, gen uint64)
	// OnFence: ready generation gen of node ended: takeover, connection
	// loss, heartbeat timeout, removal from config or shutdown.
	OnFence func(node string, gen uint64)
	// OnDraining: ready generation gen of node sent NodeDrainingNotice (it
	// is shutting down and wants no new work). Called from that session's
	// read loop, at most once per generation, and not ordered with the
	// other hooks: the callee must treat a generation that is no longer
	// the ready one as stale (pool.NodeDraining does).
	OnDraining func(node string, gen uint64)
	// OnApplied: ready generation gen of node answered APPLIED to a config
	// refresh, so Running(node, gen) is a new payload (SPEC N2). Called
	// from the goroutine that recorded the answer, after recording it,
	// and not ordered with the other hooks: the callee reads Running
	// itself and must treat a generation that is no longer current as
	// stale (pool.NodeRuns does).
	OnApplied func(node string, gen uint64)
}

// Options configure a Server. TLS and Config are required.
type Options struct {
	// TLS is the listener's config, from identity.ServerConfig: TLS 1.3,
	// client certificate required, role node checked (SPEC I1, I2).
	TLS *tls.Config
	// Config returns the current Edge config. It is read when a session
	// starts (heartbeat settings), at every registration (known node ids,
	// NodeConfigPayload) and by RefreshAll; a different pointer than last
	// time counts as a reload.
	Config func() *config.Config
	// Logger; nil discards.
	Logger *slog.Logger
	// Events receives node.connected / node.disconnected; nil drops them.
	Events *events.Bus
	Hooks  Hooks
	// Fleet serves joins, renewals and model reports (SPEC J1, J5, D1);
	// the zero value serves none of them.
	Fleet FleetHooks
	// Now stamps ready_since and event times; nil means time.Now. Timers
	// (heartbeats, deadlines) use the time package: drive them in tests
	// with testing/synctest.
	Now func() time.Time
	// SendQueue bounds each session's send queue, in frames; ≤ 0 means
	// DefaultSendQueue.
	SendQueue int
	// StreamBuffer bounds the frames a stream holds unread, in bytes of
	// their encoding; ≤ 0 means DefaultStreamBuffer. One frame always fits.
	StreamBuffer int
	// Timeouts; ≤ 0 means the defaults above.
	HandshakeTimeout time.Duration
	ReadyTimeout     time.Duration
	WriteTimeout     time.Duration
	// RegisterBurst and RegisterInterval bound how often one node identity
	// may register (registry.LimitRegistrations); ≤ 0 means the defaults
	// above; a negative RegisterBurst removes the bound.
	RegisterBurst    int
	RegisterInterval time.Duration
	// MaxHandshakes bounds connections still in their TLS handshake; ≤ 0
	// means DefaultMaxHandshakes.
	MaxHandshakes int
}

// Server accepts node connections and dispatches to ready sessions. It
// implements dispatch.Dispatcher. Make one with New.
type Server struct {
	o     Options
	log   *slog.Logger
	now   func() time.Time
	epoch time.Time // base of session.lastSeen (monotonic)

	mu   sync.Mutex // guards the fields below; never held across I/O or hooks
	reg  *registry.Registry
	cfg  *config.Config    // the config reg was last reconciled with
	revs map[string]string // NodePayload revisions of cfg by node, filled by Nodes
	// configErrs: why a node could not run this edge's config (ConfigErrors).
	configErrs map[string]string
	sessions   map[registry.ConnID]*session
	lastConn   registry.ConnID
	closing    bool
	fxq        []queued // effects waiting to be executed, in transition order
	draining   bool     // a goroutine is executing fxq

	wg     sync.WaitGroup // connection goroutines
	served atomic.Bool

	// handshakeLog, protoLog and peerLog bound the lines a peer can cause
	// at will: refused TLS handshakes and connections shed at MaxHandshakes
	// (anyone who reaches the port), stream protocol errors and bounded
	// fields (a node), refused registrations and readies (a node
	// certificate), ratelog.DefaultBurst a second each.
	handshakeLog, protoLog, peerLog ratelog.Limiter

	handshakes handshakes // connections accepted whose handshake has not ended

	// beforeConnClosed and afterConnClosed, when set (tests only), run in
	// a session's teardown around its ConnClosed transition.
	beforeConnClosed, afterConnClosed func(registry.ConnID)
	// afterPush, when set (tests only), runs when a refresh pushed at a
	// ready transition has been answered and recorded, or given up.
	afterPush func(node string)
}

type queued struct {
	registry.Effect
	sess *session // the session of Effect.Conn when it was queued, or nil
}

// New returns a Server; it does not listen until Serve.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SendQueue <= 0 {
		o.SendQueue = DefaultSendQueue
	}
	if o.StreamBuffer <= 0 {
		o.StreamBuffer = DefaultStreamBuffer
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.RegisterBurst == 0 {
		o.RegisterBurst = DefaultRegisterBurst
	}
	if o.RegisterInterval <= 0 {
		o.RegisterInterval = DefaultRegisterInterval
	}
	if o.MaxHandshakes <= 0 {
		o.MaxHandshakes = DefaultMaxHandshakes
	}
	s := &Server{o: o, log: o.Logger, now: o.Now, epoch: time.Now(),
		sessions: make(map[registry.ConnID]*session), configErrs: make(map[string]string)}
	s.reg = registry.New(nil)
	s.reg.LimitRegistrations(o.RegisterBurst, o.RegisterInterval) // a negative burst: no limit
	if o.Config != nil {
		s.reconcileLocked(o.Now()) // node ids for Nodes() before Serve; no effects yet
	}
	return s
}

// Serve accepts node connections on ln until ctx is done, then closes ln
// and every session (fencing their generations) and returns nil once every
// connection goroutine has exited. It returns ErrNoTLS, ErrNoConfig or
// ErrServing without accepting, and an accept error other than ln being
// closed after closing every session.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	defer ln.Close()
	switch {
	case s.o.TLS == nil:
		return ErrNoTLS
	case s.o.Config == nil || s.o.Config() == nil:
		return ErrNoConfig
	case !s.served.CompareAndSwap(false, true):
		return ErrServing
	}
	s.step(func(time.Time) []registry.Effect { return nil }) // load the node ids
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var err error
	backoff := 5 * time.Millisecond
	for {
		raw, aerr := ln.Accept()
		if aerr == nil {
			backoff = 5 * time.Millisecond
			// Bound what anyone who reaches the port can hold before
			// proving an identity, as http.max_connections bounds the
			// client listener: past MaxHandshakes connections in their
			// handshake a new one takes the slot of the one in its
			// handshake longest, which is closed (handshakes.go).
			e, shed := s.handshakes.admit(raw, s.o.MaxHandshakes)
			if shed != nil {
				shed.Close()
				s.logLimited(&s.handshakeLog, "node connection closed before its TLS handshake ended: too many in progress; the longest in progress goes",
					"max_handshakes", s.o.MaxHandshakes)
			}
			s.wg.Add(1)
			go s.serveConn(raw, e)
			continue
		}
		if ctx.Err() != nil || errors.Is(aerr, net.ErrClosed) {
			if ctx.Err() == nil {
				err = fmt.Errorf("transport: accept: %w", aerr)
			}
			break
		}
		// Transient (e.g. out of file descriptors): retry with backoff.
		s.log.Warn("node listener accept failed; retrying", "err", aerr, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, time.Second)
	}
	s.mu.Lock()
	s.closing = true
	for _, c := range s.sessions {
		c.fail(ErrServerClosed)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// step runs one registry transition: fn runs under s.mu (after the config
// is reconciled) and returns its effects, which are appended to the queue.
// Then, unless another goroutine is already executing the queue, this one
// executes it, outside the lock, until it is empty. So effects run one at a
// time in exactly the order the transitions happened (Hooks' guarantee),
// and a hook may re-enter the Server: its own effects are queued behind.
func (s *Server) step(fn func(now time.Time) []registry.Effect) {
	s.mu.Lock()
	now := s.now()
	s.enqueueLocked(s.reconcileLocked(now))
	s.enqueueLocked(fn(now))
	if s.draining {
		s.mu.Unlock()
		return
	}
	s.draining = true
	for len(s.fxq) > 0 {
		batch := s.fxq
		s.fxq = nil
		s.mu.Unlock()
		for _, q := range batch {
			s.exec(q)
		}
		s.mu.Lock()
	}
	s.draining = false
	s.mu.Unlock()
}

func (s *Server) enqueueLocked(fx []registry.Effect) {
	for _, e := range fx {
		s.fxq = append(s.fxq, queued{Effect: e, sess: s.sessions[e.Conn]})
	}
}

// reconcileLocked gives the registry the configured node ids when the
// config changed since the last transition (a reload).
func (s *Server) reconcileLocked(now time.Time) []registry.Effect {
	cfg := s.o.Config()
	if cfg == nil || cfg == s.cfg {
		return nil
	}
	s.cfg, s.revs = cfg, nil
	ids := make([]string, len(cfg.Nodes))
	for i := range cfg.Nodes {
		ids[i] = cfg.Nodes[i].ID
	}
	return s.reg.Reconfigure(ids, now)
}

// exec carries out one effect; no lock is held.
func (s *Server) exec(q queued) {
	switch q.Kind {
	case registry.Fence:
		if q.sess != nil {
			q.sess.lose() // in-flight streams get ErrSessionLost before the leases go (SPEC L8, L9)
		}
		if q.WasReady {
			s.log.Info("node fenced", "node", q.Node, "generation", q.Gen, "reason", q.Err)
			if f := s.o.Hooks.OnFence; f != nil {
				f(q.Node, q.Gen)
			}
		}
	case registry.Activate:
		s.log.Info("node ready", "node", q.Node, "generation", q.Gen)
		if f := s.o.Hooks.OnReady; f != nil {
			f(q.Node, q.Gen)
		}
	case registry.Emit:
		if s.o.Events != nil {
			s.o.Events.Publish(q.Event)
		}
	case registry.Close:
		if q.sess != nil {
			q.sess.fail(q.Err)
		}
	}
}

// NodeState is one configured node for /status (SPEC N3): never an address.
type NodeState struct {
	ID string
	// Connected: the node is ready (false while pending, SPEC L3).
	Connected bool
	// Pending: a connection registered and has not yet said ready.
	Pending bool
	// Generation of the current owner; 0 when none. Edge-internal.
	Generation uint64
	// ReadySince: when the current generation became ready; zero unless
	// Connected.
	ReadySince time.Time
	// Payload says whether a connected node runs the current config
	// payload (SPEC N2); empty unless Connected.
	Payload PayloadState
}

// PayloadState is whether a ready node runs the Edge's current
// NodeConfigPayload (SPEC N2), as /status shows it.
type PayloadState string

// Payload states.
const (
	// PayloadCurrent: the node applied the current payload (at
	// registration or by a refresh).
	PayloadCurrent PayloadState = "current"
	// PayloadOutdated: the node runs an older payload: a refresh is on its
	// way, or the node answered FAILED, or none reached it.
	PayloadOutdated PayloadState = "outdated"
	// PayloadRestartRequired: the node answered RESTART_REQUIRED to the
	// current payload: it runs an older one until it is restarted (with
	// whatever local change its reason names).
	PayloadRestartRequired PayloadState = "restart_required"
)

// Nodes lists every configured node, in config order, as of the last
// registration or RefreshAll (SPEC N3), with whether each ready one runs
// the current payload (SPEC N2).
func (s *Server) Nodes() []NodeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.reg.Nodes()
	out := make([]NodeState, len(ns))
	for i, n := range ns {
		out[i] = NodeState{ID: n.ID, Connected: n.Connected(), Pending: n.Phase == registry.Pending,
			Generation: n.Gen, ReadySince: n.ReadySince}
		if out[i].Connected {
			out[i].Payload = s.payloadStateLocked(n.ID, n.Gen)
		}
	}
	return out
}

// payloadStateLocked compares the ready session's applied revision with
// the current payload's. Called with s.mu held.
func (s *Server) payloadStateLocked(node string, gen uint64) PayloadState {
	id, ok := s.reg.Current(node, gen)
	c := s.sessions[id]
	if !ok || c == nil || s.cfg == nil {
		return ""
	}
	if s.revs == nil {
		s.revs = map[string]string{} // of s.cfg; reset by reconcileLocked
	}
	rev, ok := s.revs[node]
	if !ok {
		rev = s.cfg.NodePayload(node).GetRevision()
		s.revs[node] = rev
	}
	switch rev {
	case c.revision:
		return PayloadCurrent
	case c.restartRevision:
		return PayloadRestartRequired
	}
	return PayloadOutdated
}

func (s *Server) mono() int64 { return int64(time.Since(s.epoch)) }

// logLimited writes one Warn line through l, at most its burst a second,
// adding "suppressed": the lines l refused since the previous one.
func (s *Server) logLimited(l *ratelog.Limiter, msg string, args ...any) {
	ok, suppressed := l.Allow(s.now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	s.log.Warn(msg, args...)
}

// logProtocol logs a node's stream protocol error (rate limited).
func (s *Server) logProtocol(msg string, args ...any) { s.logLimited(&s.protoLog, msg, args...) }
