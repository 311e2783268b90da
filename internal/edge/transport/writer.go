package transport

import (
	"bufio"
	"fmt"
	"time"

	"iop/internal/edge/registry"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// writeLoop owns the write side of the connection (STYLE 1): it drains the
// send queue in batches, writes heartbeat pings every interval, and runs
// the liveness timer (SPEC L7) and the register→ready timer. It exits when
// the session fails, failing it itself on a write error or a timeout.
func (c *session) writeLoop(hb heartbeat) {
	defer close(c.wdone)
	w := frameWriter{c: c, bw: bufio.NewWriter(c.tc), timeout: c.s.o.WriteTimeout}
	ping := time.NewTicker(hb.interval)
	defer ping.Stop()
	// The liveness timer fires when the last inbound frame could be
	// timeout old; the read loop only stores a timestamp per frame.
	live := time.NewTimer(hb.timeout)
	defer live.Stop()
	readyTimer := time.NewTimer(c.s.o.ReadyTimeout)
	defer readyTimer.Stop()
	readyC := readyTimer.C
	pingMsg := &iop.HeartbeatPing{}
	pingEnv := &iop.Envelope{Kind: &iop.Envelope_Ping{Ping: pingMsg}}

	var err error
	for err == nil {
		select {
		case <-c.done:
			return
		case env := <-c.sendq:
			err = w.batch(env)
		case <-ping.C:
			pingMsg.Nonce++
			pingMsg.SentUnixMs = c.s.now().UnixMilli()
			if err = w.write(pingEnv); err == nil {
				err = w.flush()
			}
		case <-live.C:
			idle := time.Duration(c.s.mono() - c.lastSeen.Load())
			if idle < hb.timeout {
				live.Reset(hb.timeout - idle)
				continue
			}
			c.s.step(func(now time.Time) []registry.Effect { return c.s.reg.HeartbeatTimeout(c.id, now) })
			err = fmt.Errorf("%w: nothing received for %v", ErrHeartbeatTimeout, idle)
		case <-readyC:
			readyC = nil
			if !c.activated.Load() {
				err = fmt.Errorf("%w: %v after the handshake", ErrReadyTimeout, c.s.o.ReadyTimeout)
			}
		case <-c.quit:
			if err = w.drainAndClose(); err == nil {
				err = ErrRefusedRegistration
			}
		}
	}
	c.fail(err)
}

// frameWriter encodes envelopes into a bufio.Writer over the TLS conn. It
// belongs to writeLoop.
type frameWriter struct {
	c       *session
	bw      *bufio.Writer
	buf     []byte // reused frame buffer
	timeout time.Duration
}

// maxRetainedFrame bounds the frame buffer kept between writes, in bytes.
const maxRetainedFrame = 64 << 10

// write encodes env and buffers it, setting the write deadline whenever
// the bytes will reach the socket (SPEC: every network write has a
// deadline). An envelope that cannot be encoded is refused to its caller
// and nothing is written; only socket errors are returned.
func (w *frameWriter) write(env *iop.Envelope) error {
	frame, err := wire.AppendFrame(w.buf[:0], env, wire.DefaultMaxFrame)
	if err != nil {
		w.c.refuse(env, err)
		return nil
	}
	if len(frame) > w.bw.Available() {
		w.deadline()
	}
	_, err = w.bw.Write(frame)
	if cap(frame) <= maxRetainedFrame {
		w.buf = frame[:0]
	} else {
		w.buf = nil
	}
	return err
}

// batch writes env and whatever else is queued, then flushes once.
func (w *frameWriter) batch(env *iop.Envelope) error {
	for {
		if err := w.write(env); err != nil {
			return err
		}
		select {
		case env = <-w.c.sendq:
			continue
		default:
		}
		return w.flush()
	}
}

func (w *frameWriter) flush() error {
	if w.bw.Buffered() == 0 {
		return nil
	}
	w.deadline()
	return w.bw.Flush()
}

func (w *frameWriter) deadline() { w.c.raw.SetWriteDeadline(time.Now().Add(w.timeout)) }

// drainAndClose writes what is queued, flushes, and closes the TLS
// connection with a close_notify (bounded by crypto/tls's own 5 s deadline).
func (w *frameWriter) drainAndClose() error {
	for {
		select {
		case env := <-w.c.sendq:
			if err := w.write(env); err != nil {
				return err
			}
			continue
		default:
		}
		break
	}
	if err := w.flush(); err != nil {
		return err
	}
	return w.c.tc.Close()
}

// refuse reports an envelope that could not be encoded to whoever waits
// for it: the stream of a run or tunnel request, or the waiter of a
// command or refresh.
func (c *session) refuse(env *iop.Envelope, cause error) {
	err := fmt.Errorf("%w: %w", ErrUnencodable, cause)
	c.s.log.Error("frame to node not sent", "node", c.peer, "kind", fmt.Sprintf("%T", env.Kind), "err", err)
	switch env.Kind.(type) {
	case *iop.Envelope_RunRequest, *iop.Envelope_TunnelRequest:
		c.mu.Lock()
		st := c.streams[env.GetRunId()]
		delete(c.streams, env.GetRunId())
		c.mu.Unlock()
		if st != nil {
			st.end(err)
		}
	case *iop.Envelope_CommandRequest, *iop.Envelope_RefreshRequest:
		c.mu.Lock()
		ch := c.waiters[env.GetRequestId()]
		delete(c.waiters, env.GetRequestId())
		c.mu.Unlock()
		if ch != nil {
			ch <- reply{err: err}
		}
	}
}
