package session

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// maxHeartbeat bounds the heartbeat settings taken from the Edge's payload so
// that a huge value can't overflow a time.Duration.
const maxHeartbeat = time.Hour

// session is one connection's state; see the package comment for ownership.
type session struct {
	ctx    context.Context // session lifetime; parents every run and tunnel (E6)
	cancel context.CancelCauseFunc
	conn   net.Conn // write side owned by sendLoop once live
	r      *wire.Reader
	o      Options
	log    *slog.Logger

	sendq   chan *iop.Envelope // bounded; drained by sendLoop
	hbReset chan struct{}      // cap 1: heartbeat interval changed

	hbInterval atomic.Int64 // ns
	hbTimeout  atomic.Int64 // ns
	isLive     atomic.Bool  // the Edge answered ready=true

	// obsSeq is the per-connection health observation sequence (SPEC H5):
	// the first observation gets 1.
	obsSeq atomic.Uint64

	framesIn, framesOut, pongsDropped, pingNonce atomic.Uint64
	readySince                                   time.Time // set before live starts goroutines

	work sync.WaitGroup // run, tunnel and command goroutines

	mu   sync.Mutex
	runs map[string]context.CancelFunc // run_id → cancel, runs and tunnels (guarded by mu)
	exec *execRef                      // Executor for new work (guarded by mu)
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
		ctx:     ctx,
		cancel:  cancel,
		conn:    conn,
		r:       wire.NewReader(conn, wire.DefaultPreReadyCap),
		o:       o,
		log:     log,
		sendq:   make(chan *iop.Envelope, o.SendQueue),
		hbReset: make(chan struct{}, 1),
		runs:    make(map[string]context.CancelFunc),
	}
	s.hbInterval.Store(int64(DefaultHeartbeatInterval))
	s.hbTimeout.Store(int64(DefaultHeartbeatTimeout))
	return s
}

// live runs the ready session until it ends and returns the cause, after the
// writer and all work goroutines have returned and every Executor is closed.
func (s *session) live(ex *execRef) error {
	s.exec = ex
	s.readySince = time.Now()
	s.isLive.Store(true)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		s.sendLoop()
	}()

	s.cancel(s.readLoop()) // the first cause wins; this also closes the conn
	<-writerDone
	s.work.Wait() // every run and tunnel saw ctx cancelled (E6)

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

// sendLoop owns the connection's write side: it writes queued frames and a
// HeartbeatPing every heartbeat interval, each under Timeouts.Write. Frames
// that are already queued when one is written go out in the same flush (one
// TLS record and one write(2) for a burst instead of one per frame); the
// buffer is flushed as soon as the queue is empty, so nothing waits behind
// an idle queue.
func (s *session) sendLoop() {
	bw := bufio.NewWriterSize(s.conn, sendBufferSize)
	w := wire.NewWriter(bw, wire.DefaultMaxFrame)
	tick := time.NewTicker(s.heartbeatInterval())
	defer tick.Stop()
	for {
		var env *iop.Envelope
		select {
		case <-s.ctx.Done():
			return
		case <-s.hbReset:
			tick.Reset(s.heartbeatInterval())
			continue
		case <-tick.C:
			env = &iop.Envelope{Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{
				SentUnixMs: time.Now().UnixMilli(), Nonce: s.pingNonce.Add(1),
			}}}
		case env = <-s.sendq:
		}
		var err error
		for burst := 1; ; burst++ {
			if err = s.conn.SetWriteDeadline(time.Now().Add(s.o.Timeouts.Write)); err != nil {
				break
			}
			if err = w.WriteEnvelope(env); err != nil {
				break
			}
			s.framesOut.Add(1)
			if burst < maxBurst {
				select {
				case env = <-s.sendq:
					continue
				default:
				}
			}
			err = bw.Flush()
			break
		}
		if err != nil {
			if s.ctx.Err() == nil {
				s.cancel(fmt.Errorf("%w: %w", ErrWrite, err))
			}
			return
		}
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
	select {
	case s.sendq <- env:
		return
	case <-s.ctx.Done():
		return
	default:
	}
	if !mustDeliver {
		s.pongsDropped.Add(1)
		return
	}
	s.cancel(fmt.Errorf("%w (%d frames queued)", ErrSendQueueFull, cap(s.sendq)))
}

// sendFromWork queues a must-deliver frame from a run, tunnel or command
// goroutine, waiting up to Timeouts.Write for room; past that the session
// ends. After the session ended the frame is discarded.
func (s *session) sendFromWork(env *iop.Envelope) {
	select {
	case s.sendq <- env:
		return
	case <-s.ctx.Done():
		return
	default:
	}
	t := time.NewTimer(s.o.Timeouts.Write)
	defer t.Stop()
	select {
	case s.sendq <- env:
	case <-s.ctx.Done():
	case <-t.C:
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
