package session_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/session"
	"iop/internal/node/supervisor"
	iop "iop/proto/gen/iop"
)

func payload(rev string) *iop.NodeConfigPayload {
	return &iop.NodeConfigPayload{
		Revision: rev,
		Adapters: []*iop.AdapterConfig{
			{Name: "ollama", Type: "ollama", Category: "local_inference", Capacity: 4, LongCapacity: 1, BaseUrl: "http://127.0.0.1:11434"},
			{Type: "openai_compat", Category: "api", Capacity: 2, BaseUrl: "http://127.0.0.1:8081"},
		},
		Runtime: &iop.NodeRuntimeConfig{},
	}
}

func withHeartbeat(p *iop.NodeConfigPayload, intervalMs, timeoutMs int64) *iop.NodeConfigPayload {
	p.Runtime = &iop.NodeRuntimeConfig{HeartbeatIntervalMs: intervalMs, HeartbeatTimeoutMs: timeoutMs}
	return p
}

// liveSession is a node session that reached ready against the fake edge.
type liveSession struct {
	c      *edgeConn
	f      *fakeFactory
	res    <-chan connectResult
	cancel context.CancelFunc
}

func startReady(t *testing.T, cfg *iop.NodeConfigPayload, tweak func(*session.Options)) *liveSession {
	t.Helper()
	dir := newPKI(t)
	e := startEdge(t, dir)
	f := newFactory()
	o := nodeOptions(t, dir, e.addr(), f)
	if tweak != nil {
		tweak(&o)
	}
	res, cancel := startConnect(t, o, f)
	c := e.next()
	c.register(cfg)
	return &liveSession{c: c, f: f, res: res, cancel: cancel}
}

func runReq(id, target string) *iop.Envelope {
	return &iop.Envelope{RunId: id, Kind: &iop.Envelope_RunRequest{RunRequest: &iop.RunRequest{Adapter: "ollama", Target: target}}}
}

func tunnelReq(id, target string, body []byte) *iop.Envelope {
	return &iop.Envelope{RunId: id, Kind: &iop.Envelope_TunnelRequest{TunnelRequest: &iop.ProviderTunnelRequest{
		Adapter: "openai_compat", Target: target, Operation: "chat_completions", Body: body}}}
}

func cancelReq(id string) *iop.Envelope {
	return &iop.Envelope{RunId: id, Kind: &iop.Envelope_CancelRequest{CancelRequest: &iop.CancelRequest{Reason: "client_disconnected"}}}
}

// expectRunEvents reads events until a terminal and returns their types.
func (c *edgeConn) runEvents(runID string) []*iop.RunEvent {
	c.t.Helper()
	var evs []*iop.RunEvent
	for {
		env := c.recv()
		ev := env.GetRunEvent()
		if ev == nil || env.GetRunId() != runID {
			c.t.Fatalf("got %v, want a RunEvent for %q", env, runID)
		}
		evs = append(evs, ev)
		switch ev.GetType() {
		case iop.RunEventType_RUN_EVENT_COMPLETE, iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
			return evs
		}
	}
}

// alive proves the session still reads and writes: a ping gets its pong.
func (c *edgeConn) alive(nonce uint64) {
	c.t.Helper()
	c.send(&iop.Envelope{Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{Nonce: nonce}}})
	env := c.recv()
	if env.GetPong().GetNonce() != nonce {
		c.t.Fatalf("got %v, want pong with nonce %d", env, nonce)
	}
}

// L3, L5: register → config applied → ready, then live; a local shutdown
// drains (NodeDrainingNotice) and closes the Executor.
func TestRegisterApplyReady(t *testing.T) {
	leakcheck.Check(t)
	dir := newPKI(t)
	e := startEdge(t, dir)
	f := newFactory()
	res, cancel := startConnect(t, nodeOptions(t, dir, e.addr(), f), f)
	c := e.next()

	env := c.recv()
	if r := env.GetRegisterRequest(); r.GetNodeId() != nodeID || r.GetVersion() != "test" {
		t.Fatalf("first frame %v, want RegisterRequest{gpu-1, test}", env)
	}
	c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: payload("r1")}}})
	c.expectReady()
	// L5: ready is sent only after the config was applied.
	if n := f.count(); n != 1 || f.exec(0).cfg.GetRevision() != "r1" {
		t.Fatalf("executors built before ready = %d, want 1 with revision r1", n)
	}
	c.send(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Ready: true}}})
	c.send(runReq("run-1", tEcho))
	if evs := c.runEvents("run-1"); len(evs) != 4 {
		t.Fatalf("got %d events, want 4", len(evs))
	}
	cancel() // local shutdown of a ready session: it drains (A3)
	if env := c.recv(); env.GetDrainingNotice() == nil {
		t.Fatalf("after the local shutdown got %v, want NodeDrainingNotice", env)
	}
	r := waitResult(t, res)
	if !r.ready || !errors.Is(r.err, session.ErrDrained) {
		t.Errorf("Connect = (%v, %v), want (true, ErrDrained)", r.ready, r.err)
	}
	if ex := f.exec(0); ex.closes.Load() != 1 {
		t.Errorf("executor closed %d times, want 1", ex.closes.Load())
	}
}

// L5, L6, S3, W1, W5: everything that ends an attempt before ready.
func TestBeforeReady(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(f *fakeFactory)
		script    func(c *edgeConn)
		wantReady bool
		wantErr   error
		wantBuilt int
	}{
		{
			name: "L6 ready=false closes and reconnect is due",
			script: func(c *edgeConn) {
				c.expectRegister()
				c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: payload("r1")}}})
				c.expectReady()
				c.send(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Reason: "superseded"}}})
				c.expectClosed()
			},
			wantErr: session.ErrNotReady, wantBuilt: 1,
		},
		{
			name: "S3 rejected registration",
			script: func(c *edgeConn) {
				c.expectRegister()
				c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Reason: "unknown node id"}}})
				c.expectClosed()
			},
			wantErr: session.ErrRegisterRejected,
		},
		{
			name: "N6 a refusal marked fatal says retrying cannot help",
			script: func(c *edgeConn) {
				c.expectRegister()
				c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{
					Reason: "config payload too large", Fatal: true}}})
				c.expectClosed()
			},
			wantErr: session.ErrRegisterFatal,
		},
		{
			name:  "L5 N2 config that cannot be applied sends no ready but the reason, then closes",
			setup: func(f *fakeFactory) { f.setFail(errors.New("adapters[0].base_url: invalid")) },
			script: func(c *edgeConn) {
				c.expectRegister()
				c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: payload("r1")}}})
				env := c.recv()
				if r := env.GetConfigRejected(); r.GetRevision() != "r1" || r.GetReason() != "adapters[0].base_url: invalid" {
					c.t.Fatalf("got %v, want NodeConfigRejected{r1, the reason}", env)
				}
				c.expectClosed() // fails on a NodeReadyRequest
			},
			wantErr: session.ErrConfig,
		},
		{
			name: "W1 frame over the 64 KiB pre-ready cap",
			script: func(c *edgeConn) {
				c.expectRegister()
				// The node may reset the connection as soon as it reads the
				// header, so the edge's write error is expected.
				c.raw.SetWriteDeadline(time.Now().Add(waitFor))
				_ = c.w.WriteEnvelope(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Reason: strings.Repeat("x", 65<<10)}}})
				c.expectClosed()
			},
			wantErr: session.ErrProtocol,
		},
		{
			name: "W5 malformed frame before ready",
			script: func(c *edgeConn) {
				c.expectRegister()
				c.sendRaw([]byte{0xff, 0xff, 0xff})
				c.expectClosed()
			},
			wantErr: session.ErrProtocol,
		},
		{
			name: "L5 ready response before registration",
			script: func(c *edgeConn) {
				c.expectRegister()
				c.send(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Ready: true}}})
				c.expectClosed()
			},
			wantErr: session.ErrProtocol,
		},
		{
			name: "L7 ping before ready is answered, then ready; edge close ends it",
			script: func(c *edgeConn) {
				c.expectRegister()
				c.alive(7)
				c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: payload("r1")}}})
				c.expectReady()
				c.send(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Ready: true}}})
				c.alive(8)
				c.c.Close()
			},
			wantReady: true, wantErr: session.ErrEdgeClosed, wantBuilt: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			dir := newPKI(t)
			e := startEdge(t, dir)
			f := newFactory()
			if tc.setup != nil {
				tc.setup(f)
			}
			res, _ := startConnect(t, nodeOptions(t, dir, e.addr(), f), f)
			tc.script(e.next())
			r := waitResult(t, res)
			if r.ready != tc.wantReady || !errors.Is(r.err, tc.wantErr) {
				t.Errorf("Connect = (%v, %v), want (%v, %v)", r.ready, r.err, tc.wantReady, tc.wantErr)
			}
			if n := f.count(); n != tc.wantBuilt {
				t.Fatalf("executors built = %d, want %d", n, tc.wantBuilt)
			}
			for i := range tc.wantBuilt {
				if c := f.exec(i).closes.Load(); c != 1 {
					t.Errorf("executor %d closed %d times, want 1", i+1, c)
				}
			}
		})
	}
}

// S1, S3, L6: the supervisor reconnects after every remote end.
func TestReconnect(t *testing.T) {
	tests := []struct {
		name  string
		first func(c *edgeConn)
	}{
		{"L6 ready=false then reconnect", func(c *edgeConn) {
			c.expectRegister()
			c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: payload("r1")}}})
			c.expectReady()
			c.send(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Reason: "stale connection"}}})
			c.expectClosed()
		}},
		{"S3 rejected registration is retried", func(c *edgeConn) {
			c.expectRegister()
			c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Reason: "edge starting"}}})
			c.expectClosed()
		}},
		{"S3 session loss after ready is retried", func(c *edgeConn) {
			c.register(payload("r1"))
			c.alive(1)
			c.c.Close()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			dir := newPKI(t)
			e := startEdge(t, dir)
			f := newFactory()
			o := nodeOptions(t, dir, e.addr(), f)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- supervisor.Run(ctx, supervisor.Policy{Interval: 10 * time.Millisecond}, func(ctx context.Context) (bool, error) {
					return session.Connect(ctx, o)
				}, o.Logger)
			}()
			defer func() {
				cancel()
				if err := recvOn(t, done, "supervisor exit"); err != nil {
					t.Errorf("supervisor.Run = %v, want nil on shutdown", err)
				}
			}()
			tc.first(e.next())
			c2 := e.next()
			c2.register(payload("r1"))
			c2.alive(2)
		})
	}
}

// startReadyPipe is startReady inside a testing/synctest bubble: the edge
// and the node talk over net.Pipe, so the heartbeat timers run on the
// bubble's clock. It returns when the node has read the ready response.
func startReadyPipe(t *testing.T, cfg *iop.NodeConfigPayload) *liveSession {
	t.Helper()
	dir := newPKI(t)
	e, dial := startPipeEdge(t, dir)
	f := newFactory()
	o := nodeOptions(t, dir, e.addr(), f)
	o.Dial = dial
	res, cancel := startConnect(t, o, f)
	c := e.next()
	c.register(cfg)
	synctest.Wait() // the node has read the ready response
	return &liveSession{c: c, f: f, res: res, cancel: cancel}
}

// L7: the node pings, answers pings, and gives up on a silent edge exactly
// one heartbeat timeout after the last frame it read. In a synctest bubble:
// the times are the bubble's, so they are exact whatever the machine's load.
func TestHeartbeat(t *testing.T) {
	const interval, timeout = 50, 300 // ms
	const to = timeout * time.Millisecond
	t.Run("L7 silent edge ends the session at the timeout", func(t *testing.T) {
		leakcheck.Check(t)
		synctest.Test(t, func(t *testing.T) {
			s := startReadyPipe(t, withHeartbeat(payload("r1"), interval, timeout))
			readyAt := time.Now()
			// The edge keeps the socket open and reads, but sends nothing; the
			// node pings until it gives up and closes.
			pings := 0
			for {
				env, err := s.c.recvAny()
				if err != nil {
					break
				}
				if env.GetPing() == nil {
					t.Fatalf("got %v, want only pings", env)
				}
				pings++
			}
			r := waitResult(t, s.res)
			if !r.ready || !errors.Is(r.err, session.ErrHeartbeatTimeout) {
				t.Fatalf("Connect = (%v, %v), want (true, ErrHeartbeatTimeout)", r.ready, r.err)
			}
			if d := r.at.Sub(readyAt); d != to {
				t.Errorf("session ended %v after ready, want %v (the heartbeat timeout)", d, to)
			}
			if want := timeout/interval - 1; pings < want {
				t.Errorf("edge saw %d pings in %v with a %d ms interval, want ≥ %d", pings, to, interval, want)
			}
		})
	})
	t.Run("L7 edge pings keep the session alive and get pongs", func(t *testing.T) {
		leakcheck.Check(t)
		synctest.Test(t, func(t *testing.T) {
			s := startReadyPipe(t, withHeartbeat(payload("r1"), interval, timeout))
			start := time.Now()
			var last time.Time
			for i := range uint64(8) { // 8 × 200 ms: well past one timeout
				time.Sleep(to * 2 / 3)
				last = time.Now()
				s.c.alive(100 + i)
				synctest.Wait()
				select {
				case r := <-s.res:
					t.Fatalf("session ended %v after ready while the edge was pinging: %v", r.at.Sub(start), r.err)
				default:
				}
			}
			r := waitResult(t, s.res) // the edge falls silent
			if !errors.Is(r.err, session.ErrHeartbeatTimeout) {
				t.Errorf("Connect = %v, want ErrHeartbeatTimeout", r.err)
			}
			if d := r.at.Sub(last); d != to {
				t.Errorf("session ended %v after the edge's last ping, want %v", d, to)
			}
		})
	})
}

// E3, T2, W1: runs and tunnels are dispatched and their events come back in
// order, wrapped with the run_id; after ready a frame above 64 KiB is fine.
func TestDispatch(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	t.Run("E3 run events in order", func(t *testing.T) {
		s.c.send(runReq("run-1", tEcho))
		evs := s.c.runEvents("run-1")
		want := []iop.RunEventType{iop.RunEventType_RUN_EVENT_START, iop.RunEventType_RUN_EVENT_DELTA, iop.RunEventType_RUN_EVENT_DELTA, iop.RunEventType_RUN_EVENT_COMPLETE}
		if len(evs) != len(want) {
			t.Fatalf("got %d events, want %d", len(evs), len(want))
		}
		for i, ev := range evs {
			if ev.GetType() != want[i] || ev.GetSeq() != uint64(i+1) {
				t.Errorf("event %d = %v seq %d, want %v seq %d", i, ev.GetType(), ev.GetSeq(), want[i], i+1)
			}
		}
	})
	t.Run("T2 tunnel frames in order, body passed through", func(t *testing.T) {
		body := []byte(`{"model":"tiny"}`)
		s.c.send(tunnelReq("tun-1", tEcho, body))
		want := []iop.TunnelFrameKind{iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, iop.TunnelFrameKind_TUNNEL_FRAME_BODY, iop.TunnelFrameKind_TUNNEL_FRAME_END}
		for i, k := range want {
			env := s.c.recv()
			fr := env.GetTunnelFrame()
			if env.GetRunId() != "tun-1" || fr.GetKind() != k || fr.GetSeq() != uint64(i+1) {
				t.Fatalf("frame %d = %v, want %v seq %d for tun-1", i, env, k, i+1)
			}
			if k == iop.TunnelFrameKind_TUNNEL_FRAME_BODY && string(fr.GetBody()) != string(body) {
				t.Errorf("body = %q, want %q", fr.GetBody(), body)
			}
		}
	})
	t.Run("W1 a 200 KiB tunnel request after ready", func(t *testing.T) {
		body := []byte(strings.Repeat("y", 200<<10))
		s.c.send(tunnelReq("tun-2", tEcho, body))
		s.c.recv() // RESPONSE_START
		if got := s.c.recv().GetTunnelFrame().GetBody(); len(got) != len(body) {
			t.Errorf("body length %d, want %d", len(got), len(body))
		}
		s.c.recv() // END
	})
}

// E5: CancelRequest reaches the run's context; unknown ids are ignored.
func TestCancel(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	s.f.releaseAll() // block runs finish as soon as they are cancelled
	s.c.send(runReq("run-1", tBlock))
	if got := recvOn(t, s.f.started, "run start"); got != "run-1" {
		t.Fatalf("started %q, want run-1", got)
	}
	if ev := s.c.recv().GetRunEvent(); ev.GetType() != iop.RunEventType_RUN_EVENT_START {
		t.Fatalf("got %v, want START", ev)
	}
	s.c.send(cancelReq("no-such-run"))
	s.c.alive(1)
	select {
	case id := <-s.f.cancelled:
		t.Fatalf("E5: cancel of an unknown id cancelled %q", id)
	default:
	}
	s.c.send(cancelReq("run-1"))
	if got := recvOn(t, s.f.cancelled, "run cancel"); got != "run-1" {
		t.Fatalf("cancelled %q, want run-1", got)
	}
	if ev := s.c.recv().GetRunEvent(); ev.GetType() != iop.RunEventType_RUN_EVENT_CANCELLED || ev.GetSeq() != 2 {
		t.Errorf("terminal = %v, want CANCELLED seq 2", ev)
	}
}

// E5: a duplicate run_id gets an error terminal; the first run is untouched.
func TestDuplicateRunID(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	s.c.send(runReq("run-1", tHold))
	recvOn(t, s.f.started, "run start")
	if ev := s.c.recv().GetRunEvent(); ev.GetType() != iop.RunEventType_RUN_EVENT_START {
		t.Fatalf("got %v, want START of run-1", ev)
	}
	s.c.send(runReq("run-1", tEcho))
	env := s.c.recv()
	if ev := env.GetRunEvent(); env.GetRunId() != "run-1" || ev.GetType() != iop.RunEventType_RUN_EVENT_ERROR || ev.GetFailureCode() != "invalid_request" {
		t.Fatalf("got %v, want an invalid_request error terminal for the duplicate", env)
	}
	s.c.send(tunnelReq("run-1", tEcho, nil))
	env = s.c.recv()
	if fr := env.GetTunnelFrame(); fr.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_ERROR {
		t.Fatalf("got %v, want an ERROR frame for the duplicate tunnel", env)
	}
	s.f.releaseAll()
	env = s.c.recv()
	if ev := env.GetRunEvent(); ev.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE || ev.GetSeq() != 2 {
		t.Fatalf("got %v, want the first run's COMPLETE seq 2", env)
	}
}

// E6: losing the session cancels every run and tunnel, and Connect returns
// only after all of them returned and the Executor was closed after them.
func TestSessionLossCancelsWork(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	ids := []string{"run-1", "run-2", "run-3", "tun-1"}
	for _, id := range ids[:3] {
		s.c.send(runReq(id, tBlock))
	}
	s.c.send(tunnelReq("tun-1", tBlock, nil))
	for range ids {
		recvOn(t, s.f.started, "work start")
	}
	s.c.c.Close() // session loss
	for range ids {
		recvOn(t, s.f.cancelled, "work cancelled")
	}
	ex := s.f.exec(0)
	select {
	case r := <-s.res:
		t.Fatalf("E6: Connect returned (%v) while runs were still running", r.err)
	default:
	}
	if ex.isClosed() {
		t.Fatal("E6: executor closed while runs were still running")
	}
	s.f.releaseAll()
	r := waitResult(t, s.res)
	if !r.ready || r.err == nil || errors.Is(r.err, context.Canceled) {
		t.Errorf("Connect = (%v, %v), want (true, a remote session error)", r.ready, r.err)
	}
	if ex.closes.Load() != 1 || ex.closedWhileActive.Load() || ex.active.Load() != 0 {
		t.Errorf("executor closes=%d closedWhileActive=%v active=%d, want 1, false, 0", ex.closes.Load(), ex.closedWhileActive.Load(), ex.active.Load())
	}
}

func refreshReq(id string, cfg *iop.NodeConfigPayload) *iop.Envelope {
	return &iop.Envelope{RequestId: id, Kind: &iop.Envelope_RefreshRequest{RefreshRequest: &iop.NodeConfigRefreshRequest{Config: cfg}}}
}

// N2: refresh applies a new config for new runs, lets running ones finish on
// the old one, answers APPLIED for an unchanged revision and FAILED (keeping
// the previous config) when the payload can't be applied.
func TestRefresh(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	s.c.send(runReq("held", tHold)) // stays on executor 1
	recvOn(t, s.f.started, "held run")
	s.c.recv() // its START

	steps := []struct {
		name       string
		cfg        *iop.NodeConfigPayload
		fail       error
		wantStatus iop.RefreshStatus
		wantBuilt  int
		wantExec   string // executor that serves a new run afterwards
	}{
		{"N2 new revision is APPLIED to new runs", payload("r2"), nil, iop.RefreshStatus_REFRESH_APPLIED, 2, "2"},
		{"N2 same revision is APPLIED without change", payload("r2"), nil, iop.RefreshStatus_REFRESH_APPLIED, 2, "2"},
		{"N2 failed refresh keeps the previous config", payload("r3"), errors.New("adapters[0].type: unknown"), iop.RefreshStatus_REFRESH_FAILED, 2, "2"},
		// N2: a payload only a restart could apply (the node's own keys or
		// environment) is RESTART_REQUIRED, not APPLIED, and the previous
		// config stays.
		{"N2 restart required keeps the previous config", payload("r4"), fmt.Errorf("%w: lease keys: issuer key unknown", session.ErrRestartRequired), iop.RefreshStatus_REFRESH_RESTART_REQUIRED, 2, "2"},
	}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			s.f.setFail(st.fail)
			id := "refresh-" + st.cfg.GetRevision() + "-" + string(rune('a'+i))
			s.c.send(refreshReq(id, st.cfg))
			env := s.c.recv()
			resp := env.GetRefreshResponse()
			if env.GetRequestId() != id || resp.GetStatus() != st.wantStatus {
				t.Fatalf("got %v, want %v for request %q", env, st.wantStatus, id)
			}
			if st.fail != nil && !strings.Contains(resp.GetReason(), "unknown") {
				t.Errorf("FAILED reason %q does not say why", resp.GetReason())
			}
			if n := s.f.count(); n != st.wantBuilt {
				t.Errorf("executors built = %d, want %d", n, st.wantBuilt)
			}
			s.c.send(runReq("probe-"+id, tEcho))
			evs := s.c.runEvents("probe-" + id)
			if got := evs[len(evs)-1].GetMetadata()["exec"]; got != st.wantExec {
				t.Errorf("new run served by executor %s, want %s", got, st.wantExec)
			}
		})
	}
	old := s.f.exec(0)
	if old.isClosed() {
		t.Fatal("N2: old executor closed while its run was still running")
	}
	s.f.releaseAll()
	evs := s.c.runEvents("held")
	if got := evs[len(evs)-1].GetMetadata()["exec"]; got != "1" {
		t.Errorf("held run finished on executor %s, want 1", got)
	}
	recvOn(t, old.closed, "old executor close")
	if old.closedWhileActive.Load() {
		t.Error("N2: old executor closed before its run returned")
	}
	if s.f.exec(1).isClosed() {
		t.Error("N2: current executor closed by a failed refresh")
	}
}

func commandReq(id string, typ iop.NodeCommandType, adapter, target string) *iop.Envelope {
	return &iop.Envelope{RequestId: id, Kind: &iop.Envelope_CommandRequest{CommandRequest: &iop.NodeCommandRequest{Type: typ, Adapter: adapter, Target: target}}}
}

// N1, H5, H10: commands; the health observation sequence starts at 1 per
// connection and rises across CAPABILITIES probes and stall terminals.
func TestCommands(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	capab := iop.NodeCommandType_NODE_COMMAND_CAPABILITIES
	tests := []struct {
		name    string
		send    *iop.Envelope
		wantOK  bool
		want    map[string]string // exact values; "" = key must exist
		wantSeq string            // stall terminal's seq when send is a run
	}{
		{name: "H5 first probe has seq 1", send: commandReq("c1", capab, "ollama", "llama3.1:8b"), wantOK: true,
			want: map[string]string{"adapter_key": "ollama", "target": "llama3.1:8b", "provider_status": "available", "health_observation_seq": "1", "adapter": "ollama", "instance_key": "ollama/ollama"}},
		{name: "H5 second probe has seq 2", send: commandReq("c2", capab, "ollama", "llama3.1:8b"), wantOK: true,
			want: map[string]string{"health_observation_seq": "2"}},
		{name: "H5 stall terminal takes seq 3", send: runReq("stall-1", tStall), wantSeq: "3"},
		{name: "H10 unknown adapter is not probed and takes no seq", send: commandReq("c3", capab, "nope", "tiny")},
		{name: "H10 legacy unnamed instance resolves by type", send: commandReq("c4", capab, "openai_compat", "tiny"), wantOK: true,
			want: map[string]string{"adapter_key": "openai_compat", "health_observation_seq": "4", "instance_key": "openai_compat/openai_compat"}},
		{name: "N1 TRANSPORT reports session facts", send: commandReq("c5", iop.NodeCommandType_NODE_COMMAND_TRANSPORT, "", ""), wantOK: true,
			want: map[string]string{"node_id": nodeID, "config_revision": "r1", "heartbeat_timeout_ms": "15000", "frames_received": ""}},
		{name: "N1 PROVIDER_LIFECYCLE lists instances", send: commandReq("c6", iop.NodeCommandType_NODE_COMMAND_PROVIDER_LIFECYCLE, "", ""), wantOK: true,
			want: map[string]string{"instances": "ollama,openai_compat", "ollama.capacity": "4", "openai_compat.category": "api"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.c.send(tc.send)
			if tc.send.GetRunRequest() != nil {
				evs := s.c.runEvents(tc.send.GetRunId())
				f := evs[len(evs)-1]
				if got := f.GetFailure().GetHealthObservationSeq(); got != 3 || f.GetMetadata()["health_observation_seq"] != tc.wantSeq {
					t.Errorf("stall seq = %d, metadata %q, want %s", got, f.GetMetadata()["health_observation_seq"], tc.wantSeq)
				}
				return
			}
			env := s.c.recv()
			resp := env.GetCommandResponse()
			if env.GetRequestId() != tc.send.GetRequestId() || resp.GetOk() != tc.wantOK {
				t.Fatalf("got %v, want ok=%v for %s", env, tc.wantOK, tc.send.GetRequestId())
			}
			for k, v := range tc.want {
				got, ok := resp.GetResult()[k]
				if !ok || (v != "" && got != v) {
					t.Errorf("result[%q] = %q (present %v), want %q", k, got, ok, v)
				}
			}
			for k, v := range resp.GetResult() {
				if strings.Contains(v, "127.0.0.1") || strings.Contains(v, "BEGIN") {
					t.Errorf("N3: result[%q] = %q exposes an address or key material", k, v)
				}
			}
		})
	}
	if got := recvOn(t, s.f.probes, "probe"); got != [2]string{"ollama", "llama3.1:8b"} {
		t.Errorf("probed %v, want [ollama llama3.1:8b]", got)
	}
	if !s.f.probeBounded.Load() {
		t.Error("H10: probe ran without a deadline of at most 2 s")
	}
}

// C3, H10: a CAPABILITIES command's credential lease and binding reach the
// executor's probe, which opens it like a request's (adapter package).
func TestCapabilitiesCarryLease(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	env := commandReq("c1", iop.NodeCommandType_NODE_COMMAND_CAPABILITIES, "ollama", "tiny")
	env.GetCommandRequest().CredentialLease = &iop.CredentialLease{LeaseId: "lease-1"}
	env.GetCommandRequest().CredentialBinding = &iop.CredentialLeaseBinding{Slot: "openai"}
	s.c.send(env)
	if resp := s.c.recv().GetCommandResponse(); !resp.GetOk() {
		t.Fatalf("CAPABILITIES: %v", resp)
	}
	if l := recvOn(t, s.f.leases, "probe lease"); l.GetLeaseId() != "lease-1" {
		t.Fatalf("C3: the probe got lease %v, want lease-1", l)
	}
}

// H5: the observation sequence belongs to the connection: a new session
// starts again at 1.
func TestObservationSeqPerConnection(t *testing.T) {
	leakcheck.Check(t)
	for i := range 2 {
		s := startReady(t, payload("r1"), nil)
		s.c.send(commandReq("c", iop.NodeCommandType_NODE_COMMAND_CAPABILITIES, "ollama", "tiny"))
		if got := s.c.recv().GetCommandResponse().GetResult()["health_observation_seq"]; got != "1" {
			t.Errorf("session %d: first seq = %q, want 1", i+1, got)
		}
		s.cancel()
		waitResult(t, s.res)
	}
}

// W5: an envelope of an unknown kind is ignored; a malformed frame closes the
// session.
func TestUnknownAndMalformedFrames(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), nil)
	// Field 99, varint 1: a payload from a newer peer.
	s.c.sendRaw([]byte{0x98, 0x06, 0x01})
	s.c.send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true}}})
	s.c.alive(1)
	s.c.sendRaw([]byte{0xff, 0xff, 0xff})
	r := waitResult(t, s.res)
	if !r.ready || !errors.Is(r.err, session.ErrProtocol) {
		t.Errorf("Connect = (%v, %v), want (true, ErrProtocol)", r.ready, r.err)
	}
}

// The send-queue policy (docs/wire.md, "Send queues and flushing"): a
// must-deliver frame that cannot be queued or written within the
// write timeout ends the session instead of blocking or being dropped.
func TestMustDeliverOverflow(t *testing.T) {
	leakcheck.Check(t)
	s := startReady(t, payload("r1"), func(o *session.Options) {
		o.SendQueue = 1
		o.Timeouts.Write = 200 * time.Millisecond
	})
	s.c.send(runReq("flood", tFlood)) // the edge never reads again
	r := waitResult(t, s.res)
	if !r.ready || !(errors.Is(r.err, session.ErrSendQueueFull) || errors.Is(r.err, session.ErrWrite)) {
		t.Errorf("Connect = (%v, %v), want (true, ErrSendQueueFull or ErrWrite)", r.ready, r.err)
	}
}

// A3, S4, E3: a local shutdown of a ready session drains it: the
// Edge gets NodeDrainingNotice at once, the session keeps serving (pongs,
// terminals) while the work in flight finishes, or — past the drain timeout
// — the work is cancelled and still ends with its terminal; then Connect
// returns ErrDrained, after every terminal went out.
func TestDrain(t *testing.T) {
	t.Run("work finishes within the drain", func(t *testing.T) {
		leakcheck.Check(t)
		s := startReady(t, payload("r1"), nil)
		s.c.send(runReq("run-1", tHold))
		recvOn(t, s.f.started, "run start")
		if ev := s.c.recv().GetRunEvent(); ev.GetType() != iop.RunEventType_RUN_EVENT_START {
			t.Fatalf("got %v, want START", ev)
		}
		s.cancel()
		if env := s.c.recv(); env.GetDrainingNotice().GetDrainTimeoutMs() != session.DefaultDrainTimeout.Milliseconds() {
			t.Fatalf("got %v, want NodeDrainingNotice{30000}", env)
		}
		s.c.alive(7) // still serving
		select {
		case r := <-s.res:
			t.Fatalf("session ended with work in flight: %v", r.err)
		default:
		}
		s.f.releaseAll()
		if ev := s.c.recv().GetRunEvent(); ev.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
			t.Fatalf("got %v, want the run's COMPLETE", ev)
		}
		if r := waitResult(t, s.res); !r.ready || !errors.Is(r.err, session.ErrDrained) {
			t.Errorf("Connect = (%v, %v), want (true, ErrDrained)", r.ready, r.err)
		}
	})
	// The work is cancelled with Options.DrainCause (ErrDrained when
	// unset) as its context's cause, which the Executor's terminal names
	// (the adapters: failure code node_shutdown).
	errShutdown := errors.New("test: node shutting down")
	for _, row := range []struct {
		name  string
		cause error
		want  error
	}{
		{"drain timeout cancels what is left", nil, session.ErrDrained},
		{"drain timeout cancels with DrainCause", errShutdown, errShutdown},
	} {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			s := startReady(t, payload("r1"), func(o *session.Options) {
				o.DrainTimeout, o.DrainCause = 50*time.Millisecond, row.cause
			})
			s.f.releaseAll() // block runs end once cancelled
			s.c.send(runReq("run-1", tBlock))
			recvOn(t, s.f.started, "run start")
			s.c.recv() // START
			s.cancel()
			if env := s.c.recv(); env.GetDrainingNotice() == nil {
				t.Fatalf("got %v, want NodeDrainingNotice", env)
			}
			if got := recvOn(t, s.f.cancelled, "run cancel"); got != "run-1" {
				t.Fatalf("cancelled %q, want run-1", got)
			}
			ev := s.c.recv().GetRunEvent()
			if ev.GetType() != iop.RunEventType_RUN_EVENT_CANCELLED {
				t.Fatalf("got %v, want the run's CANCELLED terminal before the close", ev)
			}
			if ev.GetError() != row.want.Error() {
				t.Errorf("the run's context was cancelled with %q, want %q", ev.GetError(), row.want)
			}
			if r := waitResult(t, s.res); !errors.Is(r.err, session.ErrDrained) {
				t.Errorf("Connect = %v, want ErrDrained", r.err)
			}
		})
	}
}
