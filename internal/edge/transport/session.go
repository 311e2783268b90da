package transport

import (
	"bufio"
	"container/list"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/events"
	"iop/internal/edge/registry"
	"iop/internal/wire"
	"iop/internal/wire/direct"
	iop "iop/proto/gen/iop"
)

// session is one node connection.
type session struct {
	s   *Server
	id  registry.ConnID
	raw net.Conn
	hs  *list.Element // raw's entry in Server.handshakes, until its handshake ends
	tc  *tls.Conn     // set before the writer starts
	// peer is the certificate's node name (SPEC I3); set before the read
	// loop starts.
	peer string

	// w is the write side, set before the writer and reader start: HTTP
	// handlers write their requests to it directly when it is free, the
	// read loop and a busy connection queue to it and writeLoop drains.
	w     *direct.Writer
	done  chan struct{} // closed by fail: the session is ending
	quit  chan struct{} // closed by closeAfterFlush: send what is queued, then close
	fOnce sync.Once
	qOnce sync.Once
	err   error // first cause; written in fOnce, read after done is closed
	wdone chan struct{}

	lastSeen  atomic.Int64 // Server.mono() of the last inbound frame
	activated atomic.Bool  // a ready was accepted; stops the register→ready timer
	renewing  atomic.Bool  // a CertificateRenewRequest is being answered (fleet.go)
	// cert is the certificate the last granted renewal of this session
	// issued; nil until one did (then the TLS peer's is current; fleet.go).
	cert atomic.Pointer[x509.Certificate]

	// payload is the NodeConfigPayload the node runs: the one its
	// registration was accepted with or the one it last answered APPLIED
	// to; revision is its revision, and restartRevision the revision it
	// last answered RESTART_REQUIRED to (SPEC N2: not applied; the node
	// stays on payload). Guarded by Server.mu (RefreshAll and Nodes compare
	// them with the current payload; Running gives payload to the pool).
	payload         *iop.NodeConfigPayload
	revision        string
	restartRevision string
	// bootID and trustedIssuers are what the registration reported
	// (RegisterRequest.boot_id, trusted_issuer_key_ids); guarded by
	// Server.mu.
	bootID         string
	trustedIssuers []string
	// capacityShare is RegisterRequest.capacity_share, 0 unless in
	// (0, 1]; guarded by Server.mu.
	capacityShare float64

	mu      sync.Mutex // guards the fields below; after Server.mu, before stream.mu
	lost    bool       // streams and waiters have been failed; no new ones
	drained bool       // the node sent NodeDrainingNotice: a loss is dispatch.ErrNodeDrained
	lostCh  chan struct{}
	streams map[string]*stream    // by run id
	waiters map[string]chan reply // by request id, buffer 1
	nextID  uint64                // run and request ids
	// ended: the last streams that ended with their terminal (route).
	ended     [endedRing]endedStream
	endedNext int
}

func (s *Server) newSession(raw net.Conn) *session {
	return &session{s: s, raw: raw,
		done:    make(chan struct{}),
		quit:    make(chan struct{}),
		wdone:   make(chan struct{}),
		lostCh:  make(chan struct{}),
		streams: make(map[string]*stream),
		waiters: make(map[string]chan reply)}
}

// serveConn is the connection goroutine: handshake, then the read loop,
// then teardown.
func (s *Server) serveConn(raw net.Conn, hs *list.Element) {
	defer s.wg.Done()
	c := s.newSession(raw)
	c.hs = hs
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		s.handshakes.done(hs)
		raw.Close()
		return
	}
	s.lastConn++
	c.id = s.lastConn
	s.sessions[c.id] = c
	hb := heartbeatOf(s.o.Config())
	s.mu.Unlock()

	err := c.run(hb)
	select {
	case <-c.quit: // our own clean close after a refusal ended the read loop
		err = ErrRefusedRegistration
	default:
	}
	c.fail(err)
	if c.tc != nil {
		<-c.wdone
	}
	c.lose()
	if f := s.beforeConnClosed; f != nil {
		f(c.id)
	}
	node := ""
	s.step(func(now time.Time) []registry.Effect {
		node, _, _ = s.reg.Binding(c.id)
		delete(s.sessions, c.id)
		return s.reg.ConnClosed(c.id, now)
	})
	if f := s.afterConnClosed; f != nil {
		f(c.id)
	}
	c.logEnd(node)
}

// fail ends the session: the first cause wins; the socket is closed at
// once, which unblocks the reader and the writer. Safe from any goroutine,
// never blocks.
func (c *session) fail(err error) {
	c.fOnce.Do(func() {
		c.err = err
		close(c.done)
		c.raw.Close()
	})
}

// closeAfterFlush asks the writer to send what is queued, close the TLS
// connection cleanly and end the session.
func (c *session) closeAfterFlush() { c.qOnce.Do(func() { close(c.quit) }) }

// send queues a refusable or droppable envelope; false when the queue is
// full or the session is ending. The read loop uses it: it never writes.
func (c *session) send(env *iop.Envelope) bool {
	select {
	case <-c.done:
		return false
	default:
	}
	return c.w.Enqueue(env)
}

// sendDirect writes env from a caller that may block (an HTTP handler,
// never the read loop): itself when the connection is free and nothing is
// queued, saving the writer goroutine's wake-up; otherwise it queues env,
// waiting up to d for room. It reports false when the session ended or the
// queue stayed full for d. An envelope that cannot be encoded is refused to
// whoever waits for it (refuse), as the writer would; a socket error fails
// the session (its streams then end with ErrSessionLost).
func (c *session) sendDirect(env *iop.Envelope, d time.Duration) bool {
	select {
	case <-c.done:
		return false
	default:
	}
	sent, err := c.w.Send(env, direct.Flush)
	switch {
	case errors.Is(err, direct.ErrUnencodable):
		c.refuse(env, err)
	case err != nil:
		c.fail(fmt.Errorf("write to node: %w", err))
	}
	if sent {
		return true
	}
	if d <= 0 {
		return c.w.Enqueue(env)
	}
	return c.w.EnqueueWait(env, c.done, d)
}

// sendMust queues a must-deliver envelope; a full queue fails the session.
func (c *session) sendMust(env *iop.Envelope) {
	if !c.send(env) {
		c.fail(fmt.Errorf("%w (%T)", ErrSendOverflow, env.Kind))
	}
}

// sendMustDirect is sendMust for callers that may block (sendDirect).
func (c *session) sendMustDirect(env *iop.Envelope) {
	if !c.sendDirect(env, 0) {
		select {
		case <-c.done:
		default:
			c.fail(fmt.Errorf("%w (%T)", ErrSendOverflow, env.Kind))
		}
	}
}

// phase of a connection as its read loop sees it.
type phase uint8

const (
	phaseNew phase = iota
	phasePending
	phaseReady
)

// readLoop decodes frames until the connection fails. It never blocks on a
// consumer: streams buffer (bounded) and the send queue is non-blocking.
func (c *session) readLoop(br *bufio.Reader) error {
	rd := wire.NewReader(br, wire.DefaultPreReadyCap)
	ph := phaseNew
	drained := false // a NodeDrainingNotice was handled
	var env *iop.Envelope
	for {
		body, err := rd.ReadFrame()
		if err != nil {
			return err
		}
		c.lastSeen.Store(c.s.mono()) // any inbound frame is liveness (SPEC L7)
		if env == nil {
			env = new(iop.Envelope)
		}
		if err := wire.Decode(body, env); err != nil {
			if errors.Is(err, wire.ErrNoPayload) { // SPEC W5: log and ignore
				c.s.log.Debug("unknown envelope kind from node ignored", "node", c.peer, "bytes", len(body))
				continue
			}
			return err
		}
		if what := boundIngress(env); what != "" {
			c.s.logProtocol("node sent an oversized or implausible field; bounded", "node", c.peer, "field", what,
				"kind", fmt.Sprintf("%T", env.Kind), "run_id", boundText(env.GetRunId(), maxShortText))
		}
		kept := false
		switch k := env.Kind.(type) {
		case *iop.Envelope_Ping:
			c.send(&iop.Envelope{Kind: &iop.Envelope_Pong{Pong: &iop.HeartbeatPong{
				SentUnixMs: c.s.now().UnixMilli(), Nonce: k.Ping.GetNonce()}}})
		case *iop.Envelope_Pong:
		case *iop.Envelope_RegisterRequest:
			if c.register(k.RegisterRequest) && ph == phaseNew {
				ph = phasePending
			}
		case *iop.Envelope_ReadyRequest:
			if c.ready(k.ReadyRequest) && ph == phasePending {
				ph = phaseReady
				rd.SetMaxFrame(wire.DefaultMaxFrame)
				c.activated.Store(true)
			}
		case *iop.Envelope_RunEvent, *iop.Envelope_TunnelFrame:
			if ph == phaseReady {
				kept = c.route(env, len(body))
			}
		case *iop.Envelope_CommandResponse, *iop.Envelope_RefreshResponse:
			if ph == phaseReady {
				kept = c.answer(env)
			}
		case *iop.Envelope_RenewRequest, *iop.Envelope_ModelsReport, *iop.Envelope_ResidencyReport:
			if ph == phaseReady {
				c.fleetFrame(env) // SPEC J5, D1
			}
		case *iop.Envelope_ConfigRejected:
			if ph == phasePending {
				c.configRejected(k.ConfigRejected)
			}
		case *iop.Envelope_DrainingNotice:
			if ph == phaseReady && !drained {
				drained = true
				c.mu.Lock()
				c.drained = true
				c.mu.Unlock()
				c.draining(k.DrainingNotice)
			}
		default:
			c.s.log.Debug("envelope kind not expected from a node ignored", "node", c.peer, "kind", fmt.Sprintf("%T", k))
		}
		if kept {
			env = nil
		}
	}
}

// register runs the Register transition and queues the answer; true when
// accepted.
func (c *session) register(req *iop.RegisterRequest) bool {
	s := c.s
	var res registry.Result
	var oversize error
	s.step(func(now time.Time) []registry.Effect {
		if oversize = c.oversize(req.GetNodeId()); oversize != nil { // SPEC N6
			c.sendMust(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{
				Reason: oversize.Error(), Fatal: true}}})
			return nil
		}
		var fx []registry.Effect
		res, fx = s.reg.Register(c.id, req.GetNodeId(), c.peer, now)
		resp := &iop.RegisterResponse{Accepted: res.OK, Reason: res.Reason()}
		if res.OK {
			resp.Config = s.cfg.NodePayload(res.Node) // SPEC L3, N5
			c.payload, c.revision = resp.Config, resp.Config.GetRevision()
			c.bootID = req.GetBootId()
			c.trustedIssuers = boundList(req.GetTrustedIssuerKeyIds(), maxMapEntries, maxShortText)
			if sh := req.GetCapacityShare(); sh > 0 && sh <= 1 {
				c.capacityShare = sh // SPEC E4: anything else is the whole capacity
			}
		}
		c.sendMust(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: resp}})
		return fx
	})
	switch {
	case oversize != nil:
		s.log.Error("node registration refused", "node", req.GetNodeId(), "reason", oversize)
		c.closeAfterFlush()
	case res.OK:
		s.log.Info("node registered", "node", res.Node, "generation", res.Gen)
	case res.CloseAfterReply:
		s.logLimited(&s.peerLog, "node registration refused", "node", boundText(req.GetNodeId(), maxShortText), "cert_name", c.peer, "reason", res.Err)
		c.closeAfterFlush()
	default:
		s.logLimited(&s.peerLog, "duplicate node registration refused", "node", boundText(req.GetNodeId(), maxShortText), "reason", res.Err)
	}
	return res.OK
}

// ready runs the Ready transition and queues the answer before any
// dispatch can reach the session (SPEC L5, L6); true when ready.
//
// A config reload while the node was pending was not pushed to it (SPEC
// L3, N2), so the payload it registered with may be older than the
// current one. Then, in the same transition, right behind the ready
// answer and before the generation is activated (the Activate effect runs
// after this step), a NodeConfigRefreshRequest with the current payload is
// queued. The send queue is FIFO and the node applies a refresh on its
// read loop before it reads the next frame, so no run, tunnel or command
// of the new generation reaches the node ahead of the payload it was
// dispatched for. awaitRefresh collects the answer.
func (c *session) ready(req *iop.NodeReadyRequest) bool {
	s := c.s
	var res registry.Result
	var push *pendingRefresh
	s.step(func(now time.Time) []registry.Effect {
		var fx []registry.Effect
		res, fx = s.reg.Ready(c.id, req.GetNodeId(), now)
		c.sendMust(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{
			Ready: res.OK, Reason: res.Reason()}}})
		if res.OK && activates(fx) {
			delete(s.configErrs, res.Node) // it runs a payload of this edge's now
			push = c.pushIfOutdatedLocked(res.Node, res.Gen)
		}
		return fx
	})
	if !res.OK {
		s.logLimited(&s.peerLog, "node ready refused", "node", boundText(req.GetNodeId(), maxShortText), "reason", res.Err)
	}
	if push != nil {
		s.log.Info("node registered before a reload: pushing the current config", "node", push.node,
			"generation", push.gen, "revision", push.revision)
		s.wg.Add(1) // the session's own goroutine still holds one: Serve cannot be past Wait
		go c.awaitRefresh(push)
	}
	return res.OK
}

// configRejected records why the pending node could not run the payload
// its registration was accepted with (NodeConfigRejected, SPEC N2): shown
// in /status until the node becomes ready or answers a refresh. The node
// closes the connection next.
func (c *session) configRejected(r *iop.NodeConfigRejected) {
	s := c.s
	s.mu.Lock()
	node, _, ok := s.reg.Binding(c.id)
	if ok {
		s.configErrs[node] = "the node refused the config of revision " + boundText(r.GetRevision(), maxShortText) +
			" at registration: " + r.GetReason()
	}
	s.mu.Unlock()
	if ok {
		s.logLimited(&s.peerLog, "node refused its config", "node", node, "revision", boundText(r.GetRevision(), maxShortText),
			"reason", r.GetReason())
	}
}

// pendingRefresh is a refresh queued by ready for a node that registered
// before a reload.
type pendingRefresh struct {
	node, revision string
	payload        *iop.NodeConfigPayload
	gen            uint64
	id             string
	ch             chan reply
}

// pushIfOutdatedLocked queues the current payload as a refresh when it is
// not the one this session's node registered with (see ready). Called
// under Server.mu, inside the ready transition; nil when up to date. The
// refresh is must-deliver here: a queue full right after the ready answer
// closes the session, and the node registers again with the current
// payload.
func (c *session) pushIfOutdatedLocked(node string, gen uint64) *pendingRefresh {
	p := c.s.cfg.NodePayload(node)
	if p == nil || p.GetRevision() == c.revision {
		return nil
	}
	r := &pendingRefresh{node: node, gen: gen, revision: p.GetRevision(), payload: p, ch: make(chan reply, 1)}
	c.mu.Lock()
	if c.lost {
		c.mu.Unlock()
		return nil
	}
	r.id = c.newIDLocked('q')
	c.waiters[r.id] = r.ch
	c.mu.Unlock()
	c.sendMust(&iop.Envelope{RequestId: r.id, Kind: &iop.Envelope_RefreshRequest{
		RefreshRequest: &iop.NodeConfigRefreshRequest{Config: p}}})
	return r
}

// refreshAnswerWait bounds how long awaitRefresh waits for the node's
// answer (edge.reload waits as long for RefreshAll).
const refreshAnswerWait = 10 * time.Second

// awaitRefresh waits for the answer to a refresh queued by ready and
// records it as Refresh does. It ends with the answer, the session's loss
// or refreshAnswerWait; Serve waits for it (Server.wg).
func (c *session) awaitRefresh(r *pendingRefresh) {
	defer c.s.wg.Done()
	if f := c.s.afterPush; f != nil {
		defer f(r.node)
	}
	t := time.NewTimer(refreshAnswerWait)
	defer t.Stop()
	var env *iop.Envelope
	select {
	case got := <-r.ch:
		env = got.env
	case <-c.lostCh:
	case <-t.C:
		c.mu.Lock()
		delete(c.waiters, r.id)
		c.mu.Unlock()
	}
	resp, ok := env.GetKind().(*iop.Envelope_RefreshResponse)
	if !ok {
		c.s.log.Warn("node config refresh after ready got no answer", "node", r.node, "generation", r.gen, "revision", r.revision)
		return
	}
	st, reason := resp.RefreshResponse.GetStatus(), resp.RefreshResponse.GetReason()
	c.s.noteRefresh(r.node, r.gen, r.payload, st, reason)
	c.s.log.Info("node config refreshed", "node", r.node, "generation", r.gen, "revision", r.revision,
		"status", st.String(), "reason", reason)
}

// draining handles the ready node's NodeDrainingNotice: when this session
// is still the node's current ready generation, OnDraining stops new
// dispatch to it at once and a node.draining event is published; its
// streams in flight go on.
func (c *session) draining(n *iop.NodeDrainingNotice) {
	s := c.s
	node, gen, current := c.binding()
	if !current {
		return
	}
	s.log.Info("node draining", "node", node, "generation", gen, "node_drain_timeout_ms", n.GetDrainTimeoutMs())
	if f := s.o.Hooks.OnDraining; f != nil {
		f(node, gen)
	}
	if s.o.Events != nil {
		s.o.Events.Publish(events.Event{Type: events.TypeDraining, Node: node, Time: s.now()})
	}
}

// route hands a run event or tunnel frame to its stream; frames for
// unknown or finished run ids are dropped. A frame that breaks its
// stream's order (SPEC E3, T2) fails the stream with dispatch.ErrProtocol,
// cancels it on the node and is logged with the node and generation; so is
// a frame for one of the last few streams that ended with their terminal
// (anything after a terminal). It reports whether env was kept.
func (c *session) route(env *iop.Envelope, size int) bool {
	c.mu.Lock()
	st := c.streams[env.GetRunId()]
	if st == nil {
		gen, after := c.endedGen(env.GetRunId())
		c.mu.Unlock()
		if after {
			c.s.logProtocol("node protocol error: frame after the stream's terminal; dropped",
				"node", c.peer, "generation", gen, "run_id", env.GetRunId())
		}
		return false
	}
	r, oe := st.deliver(env, size, c.s.o.StreamBuffer)
	if r != delivered {
		delete(c.streams, st.id)
	}
	if r == finished {
		c.noteEnded(st)
	}
	c.mu.Unlock()
	switch r {
	case overflowed:
		c.s.log.Warn("stream reader too slow; stream cancelled", "node", c.peer, "run_id", st.id)
		c.sendMust(cancelEnvelope(st.id, "slow_consumer"))
	case misordered:
		c.s.logProtocol("node protocol error: stream out of order; stream failed and cancelled",
			"node", c.peer, "generation", st.gen, "run_id", st.id, "err", oe)
		c.sendMust(cancelEnvelope(st.id, "protocol_error"))
	}
	return r == delivered || r == finished
}

// endedRing is how many streams that ended with their terminal a session
// remembers, to tell a frame after a terminal from a late one for a stream
// the Edge closed.
const endedRing = 16

type endedStream struct {
	id  string
	gen uint64
}

// noteEnded remembers st as ended by its terminal. Called with c.mu held.
func (c *session) noteEnded(st *stream) {
	c.ended[c.endedNext%endedRing] = endedStream{st.id, st.gen}
	c.endedNext++
}

// endedGen reports whether id is one of the remembered streams that ended
// with their terminal, and its generation. Called with c.mu held.
func (c *session) endedGen(id string) (uint64, bool) {
	for _, e := range c.ended {
		if e.id == id && id != "" {
			return e.gen, true
		}
	}
	return 0, false
}

// answer hands a command or refresh response to its waiter.
func (c *session) answer(env *iop.Envelope) bool {
	c.mu.Lock()
	ch := c.waiters[env.GetRequestId()]
	delete(c.waiters, env.GetRequestId())
	c.mu.Unlock()
	if ch == nil {
		return false
	}
	ch <- reply{env: env} // buffer 1, one response per waiter
	return true
}

// newID returns a per-connection id with the given prefix: "r1", "q2", ….
func (c *session) newIDLocked(prefix byte) string {
	c.nextID++
	return string(strconv.AppendUint([]byte{prefix}, c.nextID, 36))
}
