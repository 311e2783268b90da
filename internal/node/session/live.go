package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/gopool"
	"iop/internal/wire"
	"iop/internal/wire/direct"
	iop "iop/proto/gen/iop"
)

// maxIdleWorkers is how many finished run and tunnel goroutines a session
// keeps for the next ones (gopool).
const maxIdleWorkers = 64

// maxHeartbeat bounds the heartbeat settings taken from the Edge's payload so
// that a huge value can't overflow a time.Duration.
const maxHeartbeat = time.Hour

// session is one connection's state; see the package comment for ownership.
type session struct {
	ctx    context.Context // session lifetime; parents every run and tunnel (E6)
	cancel context.CancelCauseFunc
	conn   net.Conn // written through w once live
	r      *wire.Reader
	o      Options
	log    *slog.Logger

	// w is the live write side: work goroutines write their frames
	// directly when the connection is free and nothing is queued; the read
	// loop and a busy connection queue, and sendLoop drains the queue.
	w       *direct.Writer
	hbReset chan struct{} // cap 1: heartbeat interval changed
	// flushReq asks sendLoop to write everything queued and flush, then
	// close the channel it was given (a drain's last step).
	flushReq chan chan struct{}

	hbInterval atomic.Int64 // ns
	hbTimeout  atomic.Int64 // ns
	isLive     atomic.Bool  // the Edge answered ready=true

	// obsSeq is the per-connection health observation sequence (SPEC H5):
	// the first observation gets 1.
	obsSeq atomic.Uint64

	framesIn, framesOut, pongsDropped, pingNonce atomic.Uint64
	readySince                                   time.Time // set before live starts goroutines

	work sync.WaitGroup // run, tunnel and command goroutines
	// workers runs the runs and tunnels (startRun, startTunnel) on kept
	// goroutines whose stacks already grew (gopool); closed by live after
	// work.Wait.
	workers *gopool.Pool

	mu   sync.Mutex
	runs map[string]context.CancelCauseFunc // run_id → cancel, runs and tunnels (guarded by mu)
	exec *execRef                           // Executor for new work (guarded by mu)
	// idle, while a drain waits, is closed when runs becomes empty
	// (guarded by mu).
	idle chan struct{}

	fl fleetState // renewal and discovery (fleet.go)
}

// execRef counts the work running on one Executor so that a replaced one is
// closed only after its last run returns (SPEC N2). Fields guarded by
// session.mu.
type execRef struct {
	ex      Executor
	cfg     *iop.NodeConfigPayload
	refs    int
	retired bool
}

func newSession(ctx context.Context, cancel context.CancelCauseFunc, conn net.Conn, o Options, log *slog.Logger) *session {
	s := &session{
		ctx:    ctx,
		cancel: cancel,
		conn:   conn,
		r:      wire.NewReader(conn, wire.DefaultPreReadyCap),
		o:      o,
		log:    log,
		w: direct.New(conn, direct.Options{Queue: o.SendQueue, BufferSize: sendBufferSize,
			WriteTimeout: o.Timeouts.Write, MaxBurst: maxBurst}),
		hbReset:  make(chan struct{}, 1),
		flushReq: make(chan chan struct{}),
		runs:     make(map[string]context.CancelCauseFunc),
		workers:  gopool.New(maxIdleWorkers),
		fl:       newFleetState(),
	}
	s.hbInterval.Store(int64(DefaultHeartbeatInterval))
	s.hbTimeout.Store(int64(DefaultHeartbeatTimeout))
	return s
}

// live runs the ready session until it ends and returns the cause, after the
// writer and all work goroutines have returned and every Executor is closed.
// When stop closes first, the session drains (see Connect).
func (s *session) live(ex *execRef, stop <-chan struct{}) error {
	s.exec = ex
	s.readySince = time.Now()
	s.isLive.Store(true)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		s.sendLoop()
	}()
	s.startFleet() // SPEC J5, D1
	drainDone := make(chan struct{})
	go func() {
		defer close(drainDone)
		select {
		case <-stop:
			s.drain()
		case <-s.ctx.Done():
		}
	}()

	s.cancel(s.readLoop()) // the first cause wins; this also closes the conn
	<-writerDone
	<-drainDone
	s.work.Wait() // every run and tunnel saw ctx cancelled (E6)
	s.workers.Close()

	s.mu.Lock()
	last := s.exec
	last.retired = true
	closeNow := last.refs == 0
	s.mu.Unlock()
	if closeNow {
		last.ex.Close()
	}
	cause := context.Cause(s.ctx)
	s.log.Warn("session ended", "err", cause)
	return cause
}

// drain is the graceful end of a live session (local shutdown): tell the
// Edge (NodeDrainingNotice: no new dispatch), wait for the runs and tunnels
// in flight up to Options.DrainTimeout, cancel what is left and wait up to
// DrainCancelGrace for their terminals, then end the session with
// ErrDrained. It returns early when the session ends first.
func (s *session) drain() {
	s.mu.Lock()
	active := len(s.runs)
	s.mu.Unlock()
	s.log.Info("draining: no new work; waiting for the work in flight", "in_flight", active,
		"drain_timeout_ms", s.o.DrainTimeout.Milliseconds())
	s.sendFromWork(&iop.Envelope{Kind: &iop.Envelope_DrainingNotice{DrainingNotice: &iop.NodeDrainingNotice{
		DrainTimeoutMs: s.o.DrainTimeout.Milliseconds()}}}, direct.Flush)
	if !s.waitIdle(s.o.DrainTimeout) {
		if s.ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		left := make([]context.CancelCauseFunc, 0, len(s.runs))
		for _, c := range s.runs {
			left = append(left, c)
		}
		s.mu.Unlock()
		s.log.Warn("drain timeout: cancelling the work still in flight", "in_flight", len(left))
		for _, c := range left {
			c(s.o.DrainCause)
		}
		s.waitIdle(DrainCancelGrace)
	}
	done := make(chan struct{})
	select { // the terminals the Edge has not got yet leave before the close
	case s.flushReq <- done:
		select {
		case <-done:
		case <-s.ctx.Done():
		}
	case <-s.ctx.Done():
	}
	s.log.Info("drained")
	s.cancel(ErrDrained)
}

// waitIdle waits up to d for the run table to empty; false when it did not
// or the session ended.
func (s *session) waitIdle(d time.Duration) bool {
	s.mu.Lock()
	if len(s.runs) == 0 {
		s.mu.Unlock()
		return true
	}
	if s.idle == nil {
		s.idle = make(chan struct{})
	}
	idle := s.idle
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
	case <-s.ctx.Done():
	}
	return false
}

// readLoop is the session's only reader. Any inbound frame counts as
// liveness: the read deadline is the heartbeat timeout from the last frame
// (SPEC L7). Read errors are sticky: the first one ends the session.
func (s *session) readLoop() error {
	for {
		if err := s.conn.SetReadDeadline(time.Now().Add(s.heartbeatTimeout())); err != nil {
			return s.readErr(err, ErrConnLost)
		}
		env := new(iop.Envelope)
		if err := s.r.ReadEnvelope(env); err != nil {
			if errors.Is(err, wire.ErrNoPayload) {
				s.log.Warn("ignoring envelope of unknown kind (W5)")
				continue
			}
			return s.readErr(err, ErrConnLost)
		}
		s.framesIn.Add(1)
		s.dispatch(env)
		if s.ctx.Err() != nil {
			return context.Cause(s.ctx)
		}
	}
}

// sendLoop drains the send queue and writes a HeartbeatPing every
// heartbeat interval, each under Timeouts.Write. Frames already queued when
// one is written go out in the same flush (one TLS record and one write(2)
// for a burst); the buffer is flushed as soon as the queue is empty, so
// nothing waits behind an idle queue. Work goroutines write around it when
// the connection is free (sendFromWork).
func (s *session) sendLoop() {
	defer s.w.Close()
	tick := time.NewTicker(s.heartbeatInterval())
	defer tick.Stop()
	for {
		var n int
		var err error
		select {
		case <-s.ctx.Done():
			return
		case <-s.hbReset:
			tick.Reset(s.heartbeatInterval())
			continue
		case <-tick.C:
			n, err = s.w.Drain(&iop.Envelope{Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{
				SentUnixMs: time.Now().UnixMilli(), Nonce: s.pingNonce.Add(1),
			}}}, false)
		case env := <-s.w.Queue():
			n, err = s.w.Drain(env, true)
		case done := <-s.flushReq:
			n, err = s.w.Drain(nil, false)
			for err == nil && s.w.Queued() > 0 { // sendLoop is the queue's only reader
				var m int
				m, err = s.w.Drain(nil, false)
				n += m
			}
			close(done)
		}
		s.framesOut.Add(uint64(n))
		if err != nil {
			s.writeFailed(err)
			return
		}
	}
}

func (s *session) writeFailed(err error) {
	if s.ctx.Err() == nil {
		s.cancel(fmt.Errorf("%w: %w", ErrWrite, err))
	}
}

// sendBufferSize is the write buffer of a live session in bytes: a burst of
// small frames (tokens, SSE chunks) shares one TLS record of up to 16 KiB;
// larger frames pass through.
const sendBufferSize = 32 << 10

// maxBurst bounds the frames written between two flushes, so a queue that
// never empties still reaches the peer steadily.
const maxBurst = 64

// sendFromReader queues env without blocking (the read loop must never
// block). A full queue drops a droppable frame and counts it, and ends the
// session for a must-deliver one.
func (s *session) sendFromReader(env *iop.Envelope, mustDeliver bool) {
	if s.ctx.Err() != nil || s.w.Enqueue(env) {
		return
	}
	if !mustDeliver {
		s.pongsDropped.Add(1)
		return
	}
	s.cancel(fmt.Errorf("%w (%d frames queued)", ErrSendQueueFull, s.w.QueueCap()))
}

// sendFromWork sends a must-deliver frame from a run, tunnel or command
// goroutine: written at once when the connection is free and nothing is
// queued (no hand-off to the writer goroutine), with m saying whether it may
// wait for the next frame's flush; otherwise queued, waiting up to
// Timeouts.Write for room, past which the session ends. A frame that cannot
// be encoded, or a socket error, ends the session (ErrWrite). After the
// session ended the frame is discarded. A tunnel BODY frame's body is
// copied before it is queued: the Executor reuses that buffer once emit
// returns (adapter.Options.ReuseBodyBuffers).
func (s *session) sendFromWork(env *iop.Envelope, m direct.Mode) {
	if s.ctx.Err() != nil {
		return
	}
	sent, err := s.w.Send(env, m)
	if err != nil {
		s.writeFailed(err)
		return
	}
	if sent {
		s.framesOut.Add(1)
		return
	}
	if tf := env.GetTunnelFrame(); tf != nil && tf.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_BODY {
		tf.Body = bytes.Clone(tf.Body)
	}
	if !s.w.EnqueueWait(env, s.ctx.Done(), s.o.Timeouts.Write) && s.ctx.Err() == nil {
		s.cancel(fmt.Errorf("%w: no room for %v", ErrSendQueueFull, s.o.Timeouts.Write))
	}
}

// setHeartbeat applies NodeRuntimeConfig.heartbeat_interval_ms and
// heartbeat_timeout_ms (0 or negative = default 5000 / 15000 ms).
func (s *session) setHeartbeat(rt *iop.NodeRuntimeConfig) {
	iv := msDuration(rt.GetHeartbeatIntervalMs(), DefaultHeartbeatInterval)
	to := msDuration(rt.GetHeartbeatTimeoutMs(), DefaultHeartbeatTimeout)
	old := time.Duration(s.hbInterval.Swap(int64(iv)))
	s.hbTimeout.Store(int64(to))
	if old != iv {
		select {
		case s.hbReset <- struct{}{}:
		default:
		}
	}
}

func msDuration(ms int64, def time.Duration) time.Duration {
	if ms <= 0 {
		return def
	}
	return min(time.Duration(min(ms, int64(maxHeartbeat/time.Millisecond)))*time.Millisecond, maxHeartbeat)
}

func (s *session) heartbeatInterval() time.Duration { return time.Duration(s.hbInterval.Load()) }
func (s *session) heartbeatTimeout() time.Duration  { return time.Duration(s.hbTimeout.Load()) }
