// Package session owns one connected Edge session of the Node: TCP dial, TLS
// handshake, registration, config apply, ready (SPEC L3, L5, L6), heartbeats
// (L7), and the dispatch of runs, tunnels, cancels, commands and config
// refreshes to an Executor (E1–E6, N1, N2, H5).
//
// It never reconnects (the supervisor does, SPEC S1), never reads files or
// the environment, never talks to a backend itself (the Executor does) and
// never logs a payload or a secret.
//
// # Peer input (B1)
//
// The Edge's frames are read with internal/wire: 64 KiB a frame until ready,
// 16 MiB after, each body buffered as its bytes arrive (a declared length
// reserves nothing). Every frame is decoded into a fresh Envelope and
// handed on; the session keeps no buffer of its own.
//
// # Goroutines
//
// Connect's caller is the session's only reader: it runs the pre-ready
// exchange and then the read loop. Once ready, the write side is a
// direct.Writer: a run, tunnel or command goroutine writes its frame itself
// when the connection is free and nothing is queued (no wake-up of another
// goroutine per frame); otherwise the frame goes to the bounded send queue,
// which one writer goroutine (sendLoop) drains in batches, also sending
// heartbeat pings. Writes happen under the Writer's lock only. Every run,
// tunnel and CAPABILITIES probe is one goroutine whose context the session's
// lifetime context parents (SPEC E6). When the session ends, for whatever
// reason, that context is cancelled with the cause, the connection is closed,
// and Connect returns only after the writer and every work goroutine have
// returned and the Executors are closed.
//
// # Drain (A3)
//
// A local shutdown (Connect's ctx) of a live session is graceful: drain
// sends NodeDrainingNotice (the Edge dispatches nothing new to this
// connection), waits for the run table to empty for up to
// Options.DrainTimeout, cancels what is left with Options.DrainCause
// (each still emits its terminal, which names the cause — the adapters'
// failure code node_shutdown —, waited for up to DrainCancelGrace), has
// sendLoop write and flush everything queued, and only then ends the
// session (ErrDrained).
//
// # Send queue policy (docs/wire.md, "Send queues and flushing")
//
//   - Pongs are droppable: when the queue is full they are dropped and
//     counted (the Node's own pings keep the Edge's view of it alive).
//   - Run events, tunnel frames, command and refresh responses and the error
//     terminal of a duplicate run are must-deliver. The read loop never
//     blocks on the queue: a must-deliver frame it cannot queue at once ends
//     the session with ErrSendQueueFull. A run, tunnel or command goroutine
//     waits up to Timeouts.Write for room (backpressure on the upstream
//     read), then ends the session with ErrSendQueueFull.
//   - Pings are written by the writer itself on its ticker, never queued.
//   - Flushes: a terminal, a stream's BODY and a DELTA are flushed at once
//     (SPEC T2); RESPONSE_START, USAGE, a run's START and a plain body's
//     BODY frames may wait up to direct.DefaultHoldMax for the next frame's
//     flush, so a small answer leaves in one TLS record.
//
// # Lock order
//
// session.mu guards the run table and the Executor pointers only; it is never
// held across I/O, a channel send or an Executor call.
package session

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"
	"unicode/utf8"

	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// Errors that end a session; test with errors.Is. All of them are remote
// failures in the sense of SPEC S3: the supervisor retries after any of them.
var (
	// ErrDial: the TCP dial failed or timed out (Timeouts.Dial).
	ErrDial = errors.New("session: dial edge")
	// ErrSameEdge: Options.ClaimPeer refused the connection: another of
	// the node's edges[] entries is connected to the same edge address
	// (SPEC S1: one session per edge).
	ErrSameEdge = errors.New("session: another edges[] entry is connected to this edge")
	// ErrHandshake: the TLS handshake failed (wrong CA, role or name, SPEC
	// I2) or exceeded Timeouts.Handshake.
	ErrHandshake = errors.New("session: TLS handshake")
	// ErrRegisterRejected: RegisterResponse{accepted=false}; the error text
	// carries the Edge's reason (SPEC L1, L2, I3).
	ErrRegisterRejected = errors.New("session: registration rejected")
	// ErrRegisterFatal comes with ErrRegisterRejected when the Edge set
	// RegisterResponse.fatal: retrying cannot succeed until its operator
	// changes its config (SPEC N6); the caller should stop.
	ErrRegisterFatal = errors.New("session: the edge says retrying cannot succeed")
	// ErrConfig: the Executor could not be built from the registration's
	// NodeConfigPayload; no ready was sent.
	ErrConfig = errors.New("session: apply node config")
	// ErrNotReady: NodeReadyResponse{ready=false}; the error text carries the
	// reason (SPEC L6).
	ErrNotReady = errors.New("session: edge answered ready=false")
	// ErrReadyTimeout: registration and ready did not complete within
	// Timeouts.Ready.
	ErrReadyTimeout = errors.New("session: register/ready timed out")
	// ErrProtocol: a malformed or oversized frame, or a message that is not
	// allowed at this point (SPEC W1, W5).
	ErrProtocol = errors.New("session: protocol error")
	// ErrHeartbeatTimeout: no frame at all from the Edge for the heartbeat
	// timeout (SPEC L7; default 15000 ms).
	ErrHeartbeatTimeout = errors.New("session: edge silent past heartbeat timeout")
	// ErrEdgeClosed: the Edge closed the connection.
	ErrEdgeClosed = errors.New("session: edge closed the connection")
	// ErrConnLost: reading from the connection failed.
	ErrConnLost = errors.New("session: connection lost")
	// ErrWrite: writing a frame failed or exceeded Timeouts.Write.
	ErrWrite = errors.New("session: write to edge")
	// ErrSendQueueFull: a must-deliver frame could not be queued (see the
	// package comment).
	ErrSendQueueFull = errors.New("session: send queue full for a must-deliver frame")
	// ErrDrained: the session ended after a graceful drain (local
	// shutdown of a ready session; see Connect).
	ErrDrained = errors.New("session: drained for shutdown")
)

// Executor runs work on the adapter instances of one NodeConfigPayload. The
// Node's adapter set (internal/node/adapter) implements it; the session only
// sees this interface. Its methods are called concurrently.
//
// emit queues the event or frame for the Edge without copying it: the
// Executor must not touch it after emit returns. emit is safe for concurrent
// use, but its call order is the wire order, so emits of one run must be
// serialized. It may block up to Timeouts.Write waiting for queue room
// (backpressure) and returns at once after the session ended. The session
// stamps ExecutionFailure.health_observation_seq (and the metadata key of the
// same name) on every event or frame that carries an ExecutionFailure and
// has seq 0, from its per-connection counter (SPEC H5).
type Executor interface {
	// Run executes one normalized run and blocks until it has emitted
	// exactly one terminal event (SPEC E3). Cancelling ctx aborts it (E5,
	// E6): the session cancels it on CancelRequest and on session end.
	Run(ctx context.Context, runID string, req *iop.RunRequest, emit func(*iop.RunEvent))
	// Tunnel executes one provider raw tunnel and blocks until it has
	// emitted exactly one END or ERROR frame (SPEC T2).
	Tunnel(ctx context.Context, runID string, req *iop.ProviderTunnelRequest, emit func(*iop.ProviderTunnelFrame))
	// Probe runs one bounded, fail-closed exact-target health probe of an
	// adapter instance and returns "available", "unavailable" or "unknown"
	// (SPEC H2, H10). l and b are the CAPABILITIES command's credential
	// lease and binding (SPEC C3; nil without one).
	Probe(ctx context.Context, adapter, target string, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) string
	// Close releases the instances; called once, after every Run, Tunnel
	// and Probe on this Executor has returned.
	Close()
}

// NewExecutorFunc builds an Executor from a NodeConfigPayload (never nil).
// Its error message is sent to the Edge in a FAILED refresh response — or a
// RESTART_REQUIRED one when it wraps ErrRestartRequired — so it must not
// contain secrets.
type NewExecutorFunc func(*iop.NodeConfigPayload) (Executor, error)

// ErrRestartRequired is wrapped by a NewExecutorFunc error when the payload
// is valid but this process cannot run it as it was started: it needs
// something only a restart picks up (the node's own key files or config,
// its environment). A refresh that fails so is answered RESTART_REQUIRED,
// not FAILED (SPEC N2); either way the previous config stays.
var ErrRestartRequired = errors.New("a restart of the node is required")

// Timeouts bound each step; a zero field means the default below
// (docs/wire.md, "Timeouts and bounds").
type Timeouts struct {
	Dial      time.Duration // TCP dial; default 10 s
	Handshake time.Duration // TLS handshake; default 5 s
	Ready     time.Duration // register sent → ready acknowledged; default 30 s
	Write     time.Duration // per frame, and a producer's wait for queue room; default 10 s
	Probe     time.Duration // CAPABILITIES health probe; default 2 s
}

// Defaults (docs/wire.md, "Timeouts and bounds").
const (
	DefaultDialTimeout       = 10 * time.Second
	DefaultHandshakeTimeout  = 5 * time.Second
	DefaultReadyTimeout      = 30 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultProbeTimeout      = 2 * time.Second
	DefaultHeartbeatInterval = 5000 * time.Millisecond  // NodeRuntimeConfig.heartbeat_interval_ms = 0
	DefaultHeartbeatTimeout  = 15000 * time.Millisecond // NodeRuntimeConfig.heartbeat_timeout_ms = 0
	DefaultSendQueue         = 256                      // frames
	DefaultDrainTimeout      = 30 * time.Second         // node shutdown.drain_timeout_ms
	// DrainCancelGrace bounds the wait for the terminals of the work a
	// drain timeout cancelled.
	DrainCancelGrace = 5 * time.Second
)

// Options configure Connect.
type Options struct {
	// NodeID is sent in RegisterRequest and NodeReadyRequest; it must be
	// the name in the Node's certificate (SPEC I3).
	NodeID string
	// Addr is the Edge's node listener, host:port.
	Addr string
	// TLS is the client config from identity.ClientConfig; used as built
	// (ServerName is filled from Addr when empty).
	TLS *tls.Config
	// NewExecutor applies a config payload (registration and refresh).
	NewExecutor NewExecutorFunc
	// Version is reported in RegisterRequest.version.
	Version string
	// BootID and TrustedIssuerKeyIDs are reported in RegisterRequest: this
	// process's lease boot id and the issuer keys it trusts
	// (lease.Opener.BootID, IssuerKeyIDs); empty without lease keys.
	BootID              string
	TrustedIssuerKeyIDs []string
	Logger              *slog.Logger // nil: discard
	Timeouts            Timeouts
	// SendQueue is the send queue length in frames; 0 = DefaultSendQueue.
	SendQueue int
	// DrainTimeout bounds the graceful drain of a ready session when
	// Connect's ctx ends; 0 = DefaultDrainTimeout.
	DrainTimeout time.Duration
	// DrainCause is the cause the work still in flight after DrainTimeout
	// is cancelled with (context.Cause of its context), so that the
	// Executor can end it with a terminal that says the node is going
	// away (the adapters' ErrNodeShutdown → failure code node_shutdown);
	// nil = ErrDrained.
	DrainCause error
	// Renewer renews the certificate over the live session when the
	// payload asks for it (SPEC J5); nil = never.
	Renewer CertRenewer
	// CapacityShare is reported in RegisterRequest.capacity_share: the
	// part of every adapter's capacity this edge may use (the node
	// config's edges[].capacity_share; 0 = no share of its own, SPEC E4).
	CapacityShare float64
	// OnReady, when set, is called once the Edge answered ready=true,
	// before the live session runs (the supervisor of a Node with several
	// edges counts attempts by it, supervisor.RunEdges).
	OnReady func()
	// ClaimPeer, when set, is asked right after the dial, with the
	// connection's remote address ("ip:port"), whether this session may
	// go on (SPEC S1): a Node with several edges refuses a second
	// connection to an address another edge's session holds, since two
	// sessions to one edge take the node's identity from each other (L4).
	// An error ends the attempt before the TLS handshake (ErrSameEdge);
	// release is called once when the session ends.
	ClaimPeer func(remote string) (release func(), err error)
	// Dial opens the connection to Addr ("tcp"), bounded by Timeouts.Dial
	// through ctx; nil = a net.Dialer. Tests pass the client end of a
	// net.Pipe to drive the heartbeat timers with testing/synctest.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (o *Options) applyDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Timeouts.Dial, DefaultDialTimeout)
	def(&o.Timeouts.Handshake, DefaultHandshakeTimeout)
	def(&o.Timeouts.Ready, DefaultReadyTimeout)
	def(&o.Timeouts.Write, DefaultWriteTimeout)
	def(&o.Timeouts.Probe, DefaultProbeTimeout)
	if o.SendQueue <= 0 {
		o.SendQueue = DefaultSendQueue
	}
	def(&o.DrainTimeout, DefaultDrainTimeout)
	if o.DrainCause == nil {
		o.DrainCause = ErrDrained
	}
}

// Connect runs one session attempt on the calling goroutine: dial (SPEC W1),
// TLS handshake (I1, I2), RegisterRequest{node_id}, apply the accepted
// NodeConfigPayload through NewExecutor, NodeReadyRequest{node_id} (L5) and,
// after ready=true, the live session until it ends. Frames are capped at 64
// KiB until ready and 16 MiB after.
//
// ctx is the local shutdown (SIGTERM). Before ready it aborts the attempt at
// once. A ready session drains instead: it sends NodeDrainingNotice (the
// Edge stops dispatching to it), lets its runs and tunnels finish for up to
// Options.DrainTimeout, then cancels what is left (each still ends with its
// terminal, waited for up to DrainCancelGrace), closes the connection and
// returns ErrDrained.
//
// reachedReady reports whether the Edge answered ready=true. The error says
// why the session ended: one of the sentinels above, or ctx's cause when ctx
// was done before ready. Connect returns only after every goroutine it
// started has returned. It matches supervisor.ConnectFunc when closed over
// its Options.
func Connect(ctx context.Context, o Options) (reachedReady bool, err error) {
	o.applyDefaults()
	if o.TLS == nil || o.NewExecutor == nil {
		return false, errors.New("session: Options.TLS and Options.NewExecutor are required")
	}
	log := o.Logger // the caller's logger already names the node

	dial := o.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	dctx, dcancel := context.WithTimeout(ctx, o.Timeouts.Dial)
	raw, err := dial(dctx, "tcp", o.Addr)
	dcancel()
	if err != nil {
		if ctx.Err() != nil {
			return false, context.Cause(ctx)
		}
		return false, fmt.Errorf("%w %s: %w", ErrDial, o.Addr, err)
	}
	if o.ClaimPeer != nil {
		release, err := o.ClaimPeer(raw.RemoteAddr().String())
		if err != nil {
			raw.Close()
			return false, fmt.Errorf("%w: %w", ErrSameEdge, err)
		}
		defer release()
	}
	cfg := o.TLS
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(o.Addr); err == nil {
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
	}
	conn := tls.Client(raw, cfg)

	// The session's lifetime context: cancelled with the cause when the
	// session ends. Closing the TCP connection (not the TLS one, whose Close
	// may wait up to 5 s to send close_notify to a peer that stopped
	// reading) unblocks the reader and the writer. A local shutdown ends it
	// at once only before ready (abort); a live session drains first.
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	abort := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	stop := context.AfterFunc(sctx, func() { raw.Close() })
	defer func() {
		stop()
		raw.Close()
	}()

	hctx, hcancel := context.WithTimeout(sctx, o.Timeouts.Handshake)
	err = conn.HandshakeContext(hctx)
	hcancel()
	if err != nil {
		if ctx.Err() != nil {
			return false, context.Cause(ctx)
		}
		return false, fmt.Errorf("%w: %w%s", ErrHandshake, err, ownCertificateExpired(cfg, time.Now()))
	}

	s := newSession(sctx, cancel, conn, o, log)
	ex, err := s.register()
	if err != nil {
		if ctx.Err() != nil {
			return false, context.Cause(ctx)
		}
		if hint := ownCertificateExpired(cfg, time.Now()); hint != "" {
			// TLS 1.3: the edge's refusal of the certificate arrives as an
			// alert at the first read, after the client's handshake.
			return false, fmt.Errorf("%w%s", err, hint)
		}
		return false, err
	}
	if !abort() { // the local shutdown came first
		ex.ex.Close()
		return false, context.Cause(ctx)
	}
	log.Info("session ready")
	if o.OnReady != nil {
		o.OnReady()
	}
	return true, s.live(ex, ctx.Done())
}

// register runs the pre-ready exchange on the reader's goroutine: Register →
// RegisterResponse → apply config → NodeReadyRequest → NodeReadyResponse, all
// under one Timeouts.Ready deadline. The Edge may ping meanwhile; pings are
// answered here. On success the reader's cap moves to 16 MiB and the applied
// Executor is returned; on failure it is closed.
func (s *session) register() (*execRef, error) {
	if err := s.conn.SetDeadline(time.Now().Add(s.o.Timeouts.Ready)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnLost, err)
	}
	w := wire.NewWriter(s.conn, wire.DefaultPreReadyCap)
	send := func(env *iop.Envelope) error {
		if err := w.WriteEnvelope(env); err != nil {
			return s.readErr(err, ErrWrite)
		}
		return nil
	}
	if err := send(&iop.Envelope{Kind: &iop.Envelope_RegisterRequest{RegisterRequest: &iop.RegisterRequest{
		NodeId: s.o.NodeID, Version: s.o.Version, BootId: s.o.BootID, TrustedIssuerKeyIds: s.o.TrustedIssuerKeyIDs,
		CapacityShare: s.o.CapacityShare,
	}}}); err != nil {
		return nil, err
	}
	var ex *execRef
	fail := func(err error) (*execRef, error) {
		if ex != nil {
			ex.ex.Close()
		}
		return nil, err
	}
	for {
		env := new(iop.Envelope)
		if err := s.r.ReadEnvelope(env); err != nil {
			if errors.Is(err, wire.ErrNoPayload) {
				s.log.Warn("ignoring envelope of unknown kind before ready (W5)")
				continue
			}
			return fail(s.readErr(err, ErrConnLost))
		}
		s.framesIn.Add(1)
		switch k := env.Kind.(type) {
		case *iop.Envelope_Ping:
			pong := &iop.Envelope{Kind: &iop.Envelope_Pong{Pong: &iop.HeartbeatPong{
				SentUnixMs: time.Now().UnixMilli(), Nonce: k.Ping.GetNonce(),
			}}}
			if err := send(pong); err != nil {
				return fail(err)
			}
		case *iop.Envelope_Pong:
		case *iop.Envelope_RegisterResponse:
			if ex != nil {
				return fail(fmt.Errorf("%w: second RegisterResponse", ErrProtocol))
			}
			resp := k.RegisterResponse
			if !resp.GetAccepted() {
				if resp.GetFatal() {
					return fail(fmt.Errorf("%w: %w: %q", ErrRegisterRejected, ErrRegisterFatal, resp.GetReason()))
				}
				return fail(fmt.Errorf("%w: %q", ErrRegisterRejected, resp.GetReason()))
			}
			cfg := resp.GetConfig()
			if cfg == nil {
				cfg = &iop.NodeConfigPayload{}
			}
			e, err := s.o.NewExecutor(cfg)
			if err != nil {
				// The Edge shows why in its /status (SPEC N2); then the
				// connection closes and the supervisor retries.
				_ = send(&iop.Envelope{Kind: &iop.Envelope_ConfigRejected{ConfigRejected: &iop.NodeConfigRejected{
					Revision: cfg.GetRevision(), Reason: boundReason(err.Error())}}})
				return fail(fmt.Errorf("%w (revision %q): %w", ErrConfig, cfg.GetRevision(), err))
			}
			ex = &execRef{ex: e, cfg: cfg}
			s.log.Info("registered; config applied", "revision", cfg.GetRevision(), "adapters", len(cfg.GetAdapters()))
			if err := send(&iop.Envelope{Kind: &iop.Envelope_ReadyRequest{ReadyRequest: &iop.NodeReadyRequest{
				NodeId: s.o.NodeID,
			}}}); err != nil {
				return fail(err)
			}
		case *iop.Envelope_ReadyResponse:
			if ex == nil {
				return fail(fmt.Errorf("%w: NodeReadyResponse before RegisterResponse", ErrProtocol))
			}
			if !k.ReadyResponse.GetReady() {
				return fail(fmt.Errorf("%w: %q", ErrNotReady, k.ReadyResponse.GetReason()))
			}
			if err := s.conn.SetDeadline(time.Time{}); err != nil {
				return fail(fmt.Errorf("%w: %w", ErrConnLost, err))
			}
			s.r.SetMaxFrame(wire.DefaultMaxFrame)
			s.setHeartbeat(ex.cfg.GetRuntime())
			return ex, nil
		default:
			return fail(fmt.Errorf("%w: %T before ready", ErrProtocol, env.Kind))
		}
	}
}

// maxReason bounds NodeConfigRejected.reason (bytes), as the Edge bounds
// it at ingress.
const maxReason = 2 << 10

// boundReason cuts r to maxReason bytes at a rune boundary.
func boundReason(r string) string {
	if len(r) <= maxReason {
		return r
	}
	r = r[:maxReason]
	for len(r) > 0 && !utf8.ValidString(r) {
		r = r[:len(r)-1]
	}
	return r
}

// readErr maps an I/O or framing error to a session error: the session's
// cause if it already ended, ErrReadyTimeout or ErrHeartbeatTimeout for a
// deadline, ErrEdgeClosed for a clean EOF, ErrProtocol for a bad frame and
// ioKind otherwise.
func (s *session) readErr(err error, ioKind error) error {
	if s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	var fe *wire.FrameError
	var ne net.Error
	switch {
	case errors.As(err, &fe):
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	case errors.As(err, &ne) && ne.Timeout():
		if s.isLive.Load() {
			return fmt.Errorf("%w (%v)", ErrHeartbeatTimeout, s.heartbeatTimeout())
		}
		return fmt.Errorf("%w (%v): %w", ErrReadyTimeout, s.o.Timeouts.Ready, err)
	case errors.Is(err, io.EOF):
		return ErrEdgeClosed
	default:
		return fmt.Errorf("%w: %w", ioKind, err)
	}
}

// ownCertificateExpired says, for a handshake that failed, when the
// certificate this node presents expired (SPEC J5: a node away longer than
// its certificate cannot renew it and joins again), so that the log says
// what to do rather than only the edge's TLS alert; "" when it has not
// expired or cannot be read.
func ownCertificateExpired(cfg *tls.Config, now time.Time) string {
	if cfg.GetClientCertificate == nil {
		return ""
	}
	c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || c == nil || c.Leaf == nil || now.Before(c.Leaf.NotAfter) {
		return ""
	}
	return fmt.Sprintf(" (this node's certificate expired at %s: a node that joined with a token joins again with a new one,"+
		" edge tokens create then node join into a new directory; one from edge pki needs edge pki issue -force)",
		c.Leaf.NotAfter.UTC().Format(time.RFC3339))
}
