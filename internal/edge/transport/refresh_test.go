package transport

import (
	"context"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/leakcheck"
	iop "iop/proto/gen/iop"
)

// N2, L3, P3: a node that registered before a reload (payload P1) and says
// ready after it is never pushed while pending, and at its ready
// transition gets the current payload P2 right behind the ready answer —
// before any run of the new generation — and ends on P2 when it applies
// it. RESTART_REQUIRED and FAILED are not APPLIED: the node stays marked
// as running an older payload (Nodes().Payload, /status) and the next
// RefreshAll pushes P2 again. Running (what the pool serves the node
// from) is P2 only after APPLIED, which alone calls OnApplied; a new
// registration runs the current payload.
func TestReloadWhilePendingEndsOnCurrentPayload(t *testing.T) {
	rows := []struct {
		name      string
		answer    iop.RefreshStatus
		wantState PayloadState
		repushed  bool // a later RefreshAll pushes P2 again
	}{
		{"N2 applied", iop.RefreshStatus_REFRESH_APPLIED, PayloadCurrent, false},
		{"N2 restart required is not applied", iop.RefreshStatus_REFRESH_RESTART_REQUIRED, PayloadRestartRequired, true},
		{"N2 failed keeps the older payload", iop.RefreshStatus_REFRESH_FAILED, PayloadOutdated, true},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			leakcheck.Check(t)
			pushed := make(chan string, 4)
			applied := make(chan hookCall, 4)
			h := newHarness(t, harnessOpts{setup: func(s *Server) { s.afterPush = func(n string) { pushed <- n } },
				modify: func(o *Options) {
					o.Hooks.OnApplied = func(n string, g uint64) { applied <- hookCall{"applied", n, g} }
				}})
			running := func(gen uint64) string {
				t.Helper()
				p, ok := h.srv.Running("gpu-1", gen)
				if !ok {
					t.Fatalf("Running(gpu-1, %d): not the ready generation", gen)
				}
				return p.GetRevision()
			}
			n := h.dial("gpu-1")
			reg := n.register("gpu-1")
			p1 := reg.GetConfig().GetRevision()

			h.cfg.Store(testConfig(t, 0, 0, 0, 8)) // the reload: gpu-1 capacity 4 → 8
			p2 := h.cfg.Load().NodePayload("gpu-1").GetRevision()
			if p1 == p2 {
				t.Fatal("test setup: the reload did not change gpu-1's payload")
			}
			if got := h.srv.RefreshAll(context.Background()); len(got) != 0 {
				t.Fatalf("P3: RefreshAll pushed to a pending node: %+v", got)
			}
			if got := n.roundTrip(1); len(got) != 0 {
				t.Fatalf("P3: pending node got %v before ready", got)
			}

			n.send(&iop.Envelope{Kind: &iop.Envelope_ReadyRequest{ReadyRequest: &iop.NodeReadyRequest{NodeId: "gpu-1"}}})
			if env := n.recv(); !env.GetReadyResponse().GetReady() {
				t.Fatalf("got %v, want ready=true", env)
			}
			h.wantHooks(hookCall{"ready", "gpu-1", 1})
			st, err := h.srv.StartRun(dispatch.Target{Node: "gpu-1", Generation: 1}, &iop.RunRequest{Adapter: "ollama", Target: "tiny"})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			req := n.recv()
			if got := req.GetRefreshRequest().GetConfig(); got.GetRevision() != p2 || got.GetAdapters()[0].GetCapacity() != 8 {
				t.Fatalf("N2: after ready the node got %v, want a refresh to revision %s before anything else", req, p2)
			}
			if run := n.recv(); run.GetRunRequest() == nil {
				t.Fatalf("got %v, want the run after the refresh", run)
			}
			if s := h.node("gpu-1").Payload; s != PayloadOutdated {
				t.Errorf("before the answer: payload %q, want %q", s, PayloadOutdated)
			}
			n.send(&iop.Envelope{RequestId: req.GetRequestId(), Kind: &iop.Envelope_RefreshResponse{
				RefreshResponse: &iop.NodeConfigRefreshResponse{Status: r.answer, Reason: "test"}}})
			select {
			case <-pushed:
			case <-time.After(wait):
				t.Fatal("the pushed refresh's answer was not recorded")
			}
			if s := h.node("gpu-1").Payload; s != r.wantState {
				t.Errorf("after %v: payload %q, want %q", r.answer, s, r.wantState)
			}
			wantRunning := p1
			if !r.repushed {
				wantRunning = p2
				select {
				case got := <-applied:
					if got != (hookCall{"applied", "gpu-1", 1}) {
						t.Errorf("OnApplied: %v", got)
					}
				case <-time.After(wait):
					t.Error("APPLIED did not call OnApplied")
				}
			}
			if got := running(1); got != wantRunning {
				t.Errorf("N2: after %v the node runs %s, want %s", r.answer, got, wantRunning)
			}
			ce := h.srv.ConfigErrors()["gpu-1"]
			if r.repushed != strings.HasSuffix(ce, "of revision "+p2+": test") {
				t.Errorf("N2: config error after %v = %q", r.answer, ce)
			}

			res := make(chan []RefreshResult, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				res <- h.srv.RefreshAll(ctx)
			}()
			if r.repushed {
				again := n.recv()
				if again.GetRefreshRequest().GetConfig().GetRevision() != p2 {
					t.Fatalf("N2: RefreshAll after %v sent %v, want P2 again", r.answer, again)
				}
				n.send(&iop.Envelope{RequestId: again.GetRequestId(), Kind: &iop.Envelope_RefreshResponse{
					RefreshResponse: &iop.NodeConfigRefreshResponse{Status: r.answer}}})
			}
			select {
			case got := <-res:
				if (len(got) == 1) != r.repushed {
					t.Fatalf("RefreshAll = %+v, want a push: %v", got, r.repushed)
				}
			case <-time.After(wait):
				t.Fatal("RefreshAll did not return")
			}
			if s := h.node("gpu-1").Payload; s != r.wantState {
				t.Errorf("after RefreshAll: payload %q, want %q", s, r.wantState)
			}
			if got := running(1); got != wantRunning {
				t.Errorf("N2: after RefreshAll the node runs %s, want %s", got, wantRunning)
			}
			select {
			case got := <-applied:
				t.Errorf("OnApplied %v without an APPLIED answer", got)
			default:
			}

			b := h.dial("gpu-1") // the node restarts
			b.register("gpu-1")
			if !b.ready("gpu-1").GetReady() {
				t.Fatal("not ready after the restart")
			}
			h.wantHooks(hookCall{"fence", "gpu-1", 1}, hookCall{"ready", "gpu-1", 2})
			if _, ok := h.srv.Running("gpu-1", 1); ok {
				t.Error("Running of the fenced generation")
			}
			if got := running(2); got != p2 {
				t.Errorf("N2: the new registration runs %s, want the current %s", got, p2)
			}
		})
	}
}

// C3: a registration's boot id and trusted issuer key ids are kept for
// its generation: BootID names the current owner's (pending or ready)
// boot, so the credential plane binds leases to it, and a new
// registration (a restart) replaces it; UntrustingNodes lists the ready
// nodes that reported their trusted issuer keys without the one asked.
func TestRegistrationReportsBootAndIssuers(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	reg := func(n *fakeNode, boot string, issuers ...string) {
		n.send(&iop.Envelope{Kind: &iop.Envelope_RegisterRequest{RegisterRequest: &iop.RegisterRequest{
			NodeId: "gpu-1", BootId: boot, TrustedIssuerKeyIds: issuers}}})
		if env := n.recv(); !env.GetRegisterResponse().GetAccepted() {
			t.Fatalf("register: %v", env)
		}
	}
	if got := h.srv.BootID("gpu-1"); got != "" {
		t.Fatalf("BootID before any registration = %q", got)
	}
	a := h.dial("gpu-1")
	reg(a, "boot-a", "old")
	if got := h.srv.BootID("gpu-1"); got != "boot-a" {
		t.Fatalf("C3: BootID of the pending owner = %q, want boot-a", got)
	}
	if got := h.srv.UntrustingNodes("new"); len(got) != 0 {
		t.Fatalf("UntrustingNodes counts a pending node: %v", got)
	}
	if !a.ready("gpu-1").GetReady() {
		t.Fatal("not ready")
	}
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	if got := h.srv.UntrustingNodes("new"); len(got) != 1 || got[0] != "gpu-1" {
		t.Fatalf("C3: UntrustingNodes(new) = %v, want [gpu-1]", got)
	}
	if got := h.srv.UntrustingNodes("old"); len(got) != 0 {
		t.Fatalf("UntrustingNodes(old) = %v, want none", got)
	}
	b := h.dial("gpu-1") // the node restarted
	reg(b, "boot-b", "old", "new")
	if got := h.srv.BootID("gpu-1"); got != "boot-b" {
		t.Fatalf("C3: BootID after the restart = %q, want boot-b", got)
	}
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
}

// N2, E4: a node that cannot run the payload its registration was
// accepted with says why (NodeConfigRejected) before it closes; the
// reason is the node's config error until it becomes ready. A
// registration's capacity share in (0, 1] is kept for its generation,
// anything else is the whole capacity.
func TestConfigRejectedAndCapacityShare(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	a := h.dial("gpu-1")
	reg := a.register("gpu-1")
	a.send(&iop.Envelope{Kind: &iop.Envelope_ConfigRejected{ConfigRejected: &iop.NodeConfigRejected{
		Revision: reg.GetConfig().GetRevision(), Reason: `adapter "ollama": base_url differs from edge edge-2's`}}})
	a.roundTrip(1) // the read loop has handled the rejection
	want := "the node refused the config of revision " + reg.GetConfig().GetRevision() + ` at registration: adapter "ollama": base_url differs from edge edge-2's`
	if got := h.srv.ConfigErrors()["gpu-1"]; got != want {
		t.Fatalf("N2: config error %q, want %q", got, want)
	}
	a.conn.Close()
	for _, row := range []struct {
		share, want float64
	}{{0.5, 0.5}, {1.5, 0}} {
		b := h.dial("gpu-1")
		b.send(&iop.Envelope{Kind: &iop.Envelope_RegisterRequest{RegisterRequest: &iop.RegisterRequest{NodeId: "gpu-1", CapacityShare: row.share}}})
		if env := b.recv(); !env.GetRegisterResponse().GetAccepted() {
			t.Fatalf("register: %v", env)
		}
		if !b.ready("gpu-1").GetReady() {
			t.Fatal("not ready")
		}
		gen := h.node("gpu-1").Generation
		if got := h.srv.CapacityShare("gpu-1", gen); got != row.want {
			t.Errorf("E4: share %v registered: CapacityShare = %v, want %v", row.share, got, row.want)
		}
		if got := h.srv.ConfigErrors(); len(got) != 0 {
			t.Errorf("N2: config errors %v after ready, want none", got)
		}
		b.conn.Close()
	}
}

// N2, E4: a config error is about a config the edge no longer has once a
// reload puts back the payload the node runs: the operator who reverts a
// change the node refused (say an adapter base_url another edge's payload
// gives another backend) sees the node's config current and no error,
// although the reload pushes nothing (the node already runs that revision).
func TestN2ConfigErrorClearsWhenReloadRevertsToApplied(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n := h.dial("gpu-1")
	n.register("gpu-1")
	if !n.ready("gpu-1").GetReady() {
		t.Fatal("not ready")
	}
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	p1 := h.cfg.Load()
	h.cfg.Store(testConfig(t, 0, 0, 0, 8)) // a change the node refuses
	res := make(chan []RefreshResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		res <- h.srv.RefreshAll(ctx)
	}()
	req := n.recv()
	if req.GetRefreshRequest() == nil {
		t.Fatalf("got %v, want a refresh", req)
	}
	n.send(&iop.Envelope{RequestId: req.GetRequestId(), Kind: &iop.Envelope_RefreshResponse{
		RefreshResponse: &iop.NodeConfigRefreshResponse{Status: iop.RefreshStatus_REFRESH_FAILED, Reason: "conflict"}}})
	<-res
	if ce := h.srv.ConfigErrors()["gpu-1"]; !strings.HasSuffix(ce, ": conflict") {
		t.Fatalf("N2: config error after FAILED = %q", ce)
	}
	h.cfg.Store(p1) // the operator reverts the change
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if got := h.srv.RefreshAll(ctx); len(got) != 0 {
		t.Fatalf("RefreshAll pushed %+v, want nothing: the node runs that revision", got)
	}
	if s := h.node("gpu-1").Payload; s != PayloadCurrent {
		t.Errorf("payload %q, want %q", s, PayloadCurrent)
	}
	if got := h.srv.ConfigErrors(); len(got) != 0 {
		t.Errorf("N2: config errors %v after the revert, want none", got)
	}
}
