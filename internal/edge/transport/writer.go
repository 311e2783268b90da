package transport

import (
	"fmt"
	"time"

	"iop/internal/edge/registry"
	iop "iop/proto/gen/iop"
)

// writeLoop owns the writer side's timers and queue (the one owner of the write side): it drains
// the send queue in batches (HTTP handlers write directly when the
// connection is free, see session.sendDirect), writes heartbeat pings every
// interval, and runs the liveness timer (SPEC L7) and the register→ready
// timer. It exits when the session fails, failing it itself on a write
// error or a timeout.
func (c *session) writeLoop(hb heartbeat) {
	defer close(c.wdone)
	defer c.w.Close()
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
		case env := <-c.w.Queue():
			_, err = c.w.Drain(env, true)
		case <-ping.C:
			pingMsg.Nonce++
			pingMsg.SentUnixMs = c.s.now().UnixMilli()
			_, err = c.w.Drain(pingEnv, false)
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
			if err = c.drainAndClose(); err == nil {
				err = ErrRefusedRegistration
			}
		}
	}
	c.fail(err)
}

// drainAndClose writes what is queued, flushes, and closes the TLS
// connection with a close_notify (bounded by crypto/tls's own 5 s deadline).
func (c *session) drainAndClose() error {
	for {
		if _, err := c.w.Drain(nil, false); err != nil {
			return err
		}
		if c.w.Queued() == 0 {
			return c.tc.Close()
		}
	}
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
