package transport

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/registry"
	"iop/internal/identity"
	"iop/internal/wire"
	"iop/internal/wire/direct"
)

// A session's life: run (the handshake, then the read loop, until the
// connection ends), lose (its node id given up, its streams ended) and
// logEnd (its last log line).

// logEnd writes the session's last line. A connection that never owned a
// node id is a peer's to repeat at will (a registration flood, connect and
// close): its refused registration was already logged (rate limited), and
// any other end of it goes through the same peer limiter, so a flood costs
// a few lines a second (SPEC L1, L4; the ingress bounds).
func (c *session) logEnd(node string) {
	err := c.err
	switch {
	case c.tc == nil: // the handshake or identity refusal was logged by run
	case node == "" && errors.Is(err, ErrRefusedRegistration):
	case node == "":
		c.s.logLimited(&c.s.peerLog, "unregistered node connection closed", "cert_name", c.peer, "reason", err)
	case errors.Is(err, io.EOF), errors.Is(err, ErrServerClosed), errors.Is(err, registry.ErrSuperseded),
		errors.Is(err, ErrRefusedRegistration):
		c.s.log.Info("node session closed", "node", node, "cert_name", c.peer, "reason", err)
	case errors.Is(err, wire.ErrEmptyFrame), errors.Is(err, wire.ErrFrameTooLarge),
		errors.Is(err, wire.ErrTruncated), errors.Is(err, wire.ErrMalformed):
		c.s.log.Warn("node protocol error; connection closed", "node", node, "cert_name", c.peer, "err", err) // SPEC W5
	default:
		c.s.log.Warn("node session ended", "node", node, "cert_name", c.peer, "reason", err)
	}
}

// run does the handshake and the read loop; it returns why the session
// ended.
func (c *session) run(hb heartbeat) error {
	o := &c.s.o
	c.raw.SetDeadline(time.Now().Add(o.HandshakeTimeout))
	tc := tls.Server(c.raw, o.TLS)
	err := tc.Handshake()
	c.s.handshakes.done(c.hs) // admitted at accept (Serve)
	if err != nil {
		// SPEC I2: no certificate, wrong CA, role or name end here. Anyone
		// who can reach the port can cause this line: it is rate limited.
		c.s.logLimited(&c.s.handshakeLog, "node TLS handshake refused", "remote", c.raw.RemoteAddr().String(), "err", err)
		return fmt.Errorf("handshake: %w", err)
	}
	if c.s.joinConn(tc) { // SPEC J1: a join, not a session
		return errJoined
	}
	c.raw.SetDeadline(time.Time{})
	id, err := identity.PeerID(tc.ConnectionState())
	if err == nil && id.Role != identity.RoleNode {
		err = fmt.Errorf("%w: %s", ErrNotNodeRole, id)
	}
	if err != nil {
		c.s.log.Warn("node identity refused", "err", err)
		return err
	}
	c.peer = id.Name
	c.lastSeen.Store(c.s.mono())
	select {
	case <-c.done: // failed during the handshake (shutdown)
		return c.err
	default:
	}
	c.tc = tc
	c.w = direct.New(tc, direct.Options{Queue: c.s.o.SendQueue, BufferSize: 4 << 10, WriteTimeout: o.WriteTimeout,
		OnUnencodable: c.refuse})
	go c.writeLoop(hb)
	return c.readLoop(bufio.NewReader(tc))
}

// lose fails every stream and waiter with ErrSessionLost (ErrNodeDrained
// after the node's drain notice), once; frames and responses arriving later
// are dropped (SPEC E6, L9).
func (c *session) lose() {
	c.mu.Lock()
	if c.lost {
		c.mu.Unlock()
		return
	}
	c.lost = true
	close(c.lostCh)
	streams := c.streams
	c.streams = nil
	clear(c.waiters)
	err := dispatch.ErrSessionLost
	if c.drained {
		err = dispatch.ErrNodeDrained
	}
	c.mu.Unlock()
	for _, st := range streams {
		st.end(err)
	}
}
