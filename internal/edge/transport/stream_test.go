package transport

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/leakcheck"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

func runEvent(runID string, seq uint64, typ iop.RunEventType, delta string) *iop.Envelope {
	return &iop.Envelope{RunId: runID, Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Seq: seq, Type: typ, Delta: delta}}}
}

func tunnelFrame(runID string, seq uint64, kind iop.TunnelFrameKind, body string) *iop.Envelope {
	return &iop.Envelope{RunId: runID, Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{Seq: seq, Kind: kind, Body: []byte(body)}}}
}

func recvOK(t *testing.T, st dispatch.Stream) *iop.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	env, err := st.Recv(ctx)
	if err != nil {
		t.Fatalf("Recv on %s: %v", st.RunID(), err)
	}
	return env
}

func recvErr(t *testing.T, st dispatch.Stream, want error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	env, err := st.Recv(ctx)
	if !errors.Is(err, want) {
		t.Fatalf("Recv on %s = %v, %v; want error %v", st.RunID(), env, err, want)
	}
}

// readyNode connects gpu-1 and returns it with its dispatch target.
func readyNode(t *testing.T, h *harness) (*fakeNode, dispatch.Target) {
	t.Helper()
	n := h.dial("gpu-1")
	n.connect("gpu-1")
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	return n, dispatch.Target{Node: "gpu-1", Generation: 1}
}

// E3, T2, W2: run events and tunnel frames are routed by run_id, in order;
// after the terminal Recv returns io.EOF and later frames are dropped.
func TestStreamsRoutedByRunID(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n, tgt := readyNode(t, h)

	run, err := h.srv.StartRun(tgt, &iop.RunRequest{Adapter: "ollama", Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	tun, err := h.srv.StartTunnel(tgt, &iop.ProviderTunnelRequest{Adapter: "ollama", Operation: "models"})
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	if run.RunID() == tun.RunID() || run.RunID() == "" {
		t.Fatalf("run ids %q and %q, want distinct and non-empty", run.RunID(), tun.RunID())
	}
	if env := n.recv(); env.GetRunRequest().GetTarget() != "tiny" || env.GetRunId() != run.RunID() {
		t.Fatalf("node got %v, want the RunRequest with run id %s", env, run.RunID())
	}
	if env := n.recv(); env.GetTunnelRequest().GetOperation() != "models" || env.GetRunId() != tun.RunID() {
		t.Fatalf("node got %v, want the tunnel request with run id %s", env, tun.RunID())
	}

	n.send(runEvent(run.RunID(), 1, iop.RunEventType_RUN_EVENT_START, ""))
	n.send(tunnelFrame(tun.RunID(), 1, iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, ""))
	n.send(runEvent(run.RunID(), 2, iop.RunEventType_RUN_EVENT_DELTA, "hel"))
	n.send(tunnelFrame(tun.RunID(), 2, iop.TunnelFrameKind_TUNNEL_FRAME_BODY, `{"data":[]}`))
	n.send(runEvent(run.RunID(), 3, iop.RunEventType_RUN_EVENT_DELTA, "lo"))
	n.send(tunnelFrame(tun.RunID(), 3, iop.TunnelFrameKind_TUNNEL_FRAME_END, ""))
	n.send(runEvent(run.RunID(), 4, iop.RunEventType_RUN_EVENT_COMPLETE, ""))
	n.send(runEvent(run.RunID(), 5, iop.RunEventType_RUN_EVENT_DELTA, "after the terminal"))

	for seq := uint64(1); seq <= 4; seq++ {
		if env := recvOK(t, run); env.GetRunEvent().GetSeq() != seq || env.GetRunId() != run.RunID() {
			t.Fatalf("run event = %v, want seq %d", env, seq)
		}
	}
	recvErr(t, run, io.EOF)
	recvErr(t, run, io.EOF) // sticky
	for seq := uint64(1); seq <= 3; seq++ {
		if env := recvOK(t, tun); env.GetTunnelFrame().GetSeq() != seq {
			t.Fatalf("tunnel frame = %v, want seq %d", env, seq)
		}
	}
	recvErr(t, tun, io.EOF)
	// T3: Cancel and Close after the terminal send nothing.
	run.Cancel("late")
	run.Close()
	tun.Close()
	if extra := n.roundTrip(9); len(extra) != 0 {
		t.Fatalf("node got %v after terminals, want nothing", extra)
	}
}

// E5, T3: Cancel queues exactly one CancelRequest; Close after it sends no
// second one; Recv after Close reports ErrStreamClosed; frames for a closed
// run id are dropped.
func TestCancelSendsOnce(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n, tgt := readyNode(t, h)
	st, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	n.recv() // the RunRequest
	st.Cancel("client_disconnected")
	st.Cancel("again")
	st.Close()
	st.Close()
	got := n.roundTrip(1)
	if len(got) != 1 || got[0].GetCancelRequest().GetReason() != "client_disconnected" || got[0].GetRunId() != st.RunID() {
		t.Fatalf("node got %v, want exactly one CancelRequest{client_disconnected} for %s", got, st.RunID())
	}
	recvErr(t, st, ErrStreamClosed)
	n.send(runEvent(st.RunID(), 1, iop.RunEventType_RUN_EVENT_CANCELLED, ""))
	n.roundTrip(2)

	// Close without a terminal cancels first.
	st2, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	n.recv()
	st2.Close()
	if got := n.roundTrip(3); len(got) != 1 || got[0].GetCancelRequest() == nil || got[0].GetRunId() != st2.RunID() {
		t.Fatalf("node got %v after Close, want one CancelRequest for %s", got, st2.RunID())
	}
}

// E6, L8: losing the session gives every open stream ErrSessionLost once,
// after the frames already received; the generation is no longer
// dispatchable.
func TestSessionLossFailsStreams(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n, tgt := readyNode(t, h)
	a, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := h.srv.StartTunnel(tgt, &iop.ProviderTunnelRequest{Operation: "chat_completions"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n.recv()
	n.recv()
	n.send(runEvent(a.RunID(), 1, iop.RunEventType_RUN_EVENT_START, ""))
	n.roundTrip(1) // the START was read by the edge
	n.conn.Close()
	h.wantHooks(hookCall{"fence", "gpu-1", 1})

	if env := recvOK(t, a); env.GetRunEvent().GetSeq() != 1 {
		t.Fatalf("got %v, want the START received before the loss", env)
	}
	recvErr(t, a, dispatch.ErrSessionLost)
	recvErr(t, a, dispatch.ErrSessionLost)
	recvErr(t, b, dispatch.ErrSessionLost)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := b.Recv(ctx); errors.Is(err, dispatch.ErrNodeDrained) {
		t.Errorf("a loss without a drain notice is %v, want plain ErrSessionLost", err)
	}
	if _, err := h.srv.StartRun(tgt, &iop.RunRequest{}); !errors.Is(err, dispatch.ErrNotReady) {
		t.Fatalf("StartRun after loss = %v, want ErrNotReady", err)
	}
}

// P3, L3, L9: only the current ready generation is dispatchable.
func TestDispatchOnlyToCurrentReadyGeneration(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n := h.dial("gpu-1")
	n.register("gpu-1")
	tests := []struct {
		name string
		tgt  dispatch.Target
	}{
		{"P3 pending generation", dispatch.Target{Node: "gpu-1", Generation: 1}},
		{"L9 wrong generation", dispatch.Target{Node: "gpu-1", Generation: 2}},
		{"P3 unconnected node", dispatch.Target{Node: "gpu-2", Generation: 1}},
		{"unknown node", dispatch.Target{Node: "gpu-9", Generation: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := h.srv.StartRun(tc.tgt, &iop.RunRequest{}); !errors.Is(err, dispatch.ErrNotReady) {
				t.Errorf("StartRun = %v, want ErrNotReady", err)
			}
			if _, err := h.srv.StartTunnel(tc.tgt, &iop.ProviderTunnelRequest{}); !errors.Is(err, dispatch.ErrNotReady) {
				t.Errorf("StartTunnel = %v, want ErrNotReady", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if _, err := h.srv.Command(ctx, tc.tgt.Node, tc.tgt.Generation, &iop.NodeCommandRequest{}); !errors.Is(err, dispatch.ErrNotReady) {
				t.Errorf("Command = %v, want ErrNotReady (N1)", err)
			}
		})
	}
	if got := n.roundTrip(1); len(got) != 0 {
		t.Fatalf("pending node got %v, want nothing dispatched", got)
	}
}

// The send-queue policy (docs/wire.md, "Send queues and flushing"): a
// stream whose reader falls behind is cancelled with ErrSlowConsumer instead of blocking the read loop; the node gets a
// CancelRequest and the session and other streams carry on.
func TestSlowConsumerCancelled(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{modify: func(o *Options) { o.StreamBuffer = 4 << 10 }})
	n, tgt := readyNode(t, h)
	slow, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	other, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	n.recv()
	n.recv()
	delta := strings.Repeat("t", 1000)
	n.send(runEvent(slow.RunID(), 1, iop.RunEventType_RUN_EVENT_START, ""))
	for seq := uint64(2); seq <= 11; seq++ {
		n.send(runEvent(slow.RunID(), seq, iop.RunEventType_RUN_EVENT_DELTA, delta))
	}
	got := n.roundTrip(1)
	if len(got) != 1 || got[0].GetCancelRequest().GetReason() != "slow_consumer" || got[0].GetRunId() != slow.RunID() {
		t.Fatalf("node got %v, want one CancelRequest{slow_consumer} for %s", got, slow.RunID())
	}
	recvErr(t, slow, dispatch.ErrSlowConsumer)
	slow.Cancel("again") // no second CancelRequest
	n.send(runEvent(other.RunID(), 1, iop.RunEventType_RUN_EVENT_START, ""))
	n.send(runEvent(other.RunID(), 2, iop.RunEventType_RUN_EVENT_COMPLETE, ""))
	if env := recvOK(t, other); env.GetRunEvent().GetType() != iop.RunEventType_RUN_EVENT_START {
		t.Fatalf("other stream got %v", env)
	}
	if env := recvOK(t, other); env.GetRunEvent().GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
		t.Fatalf("other stream got %v", env)
	}
	if extra := n.roundTrip(2); len(extra) != 0 {
		t.Fatalf("node got %v, want nothing more", extra)
	}
}

// N1: Command is correlated by request_id and answered; a response for an
// unknown request id is dropped; session loss fails a pending command.
func TestCommand(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n, _ := readyNode(t, h)
	type result struct {
		resp *iop.NodeCommandResponse
		err  error
	}
	res := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		r, err := h.srv.Command(ctx, "gpu-1", 1, &iop.NodeCommandRequest{Type: iop.NodeCommandType_NODE_COMMAND_CAPABILITIES, Adapter: "ollama", Target: "tiny"})
		res <- result{r, err}
	}()
	req := n.recv()
	if req.GetCommandRequest().GetType() != iop.NodeCommandType_NODE_COMMAND_CAPABILITIES || req.GetRequestId() == "" {
		t.Fatalf("node got %v, want a CAPABILITIES command with a request id", req)
	}
	n.send(&iop.Envelope{RequestId: "unknown", Kind: &iop.Envelope_CommandResponse{CommandResponse: &iop.NodeCommandResponse{Ok: false}}})
	n.send(&iop.Envelope{RequestId: req.GetRequestId(), Kind: &iop.Envelope_CommandResponse{CommandResponse: &iop.NodeCommandResponse{
		Ok: true, Result: map[string]string{"provider_status": "available"}}}})
	select {
	case r := <-res:
		if r.err != nil || !r.resp.GetOk() || r.resp.GetResult()["provider_status"] != "available" {
			t.Fatalf("Command = %v, %v; want the matching ok response", r.resp, r.err)
		}
	case <-time.After(wait):
		t.Fatal("Command did not return")
	}

	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		r, err := h.srv.Command(ctx, "gpu-1", 1, &iop.NodeCommandRequest{Type: iop.NodeCommandType_NODE_COMMAND_TRANSPORT})
		res <- result{r, err}
	}()
	n.recv()
	n.conn.Close()
	select {
	case r := <-res:
		if !errors.Is(r.err, dispatch.ErrSessionLost) {
			t.Fatalf("Command across session loss = %v, %v; want ErrSessionLost", r.resp, r.err)
		}
	case <-time.After(wait):
		t.Fatal("Command did not return after session loss")
	}
}

// N2, P3: RefreshAll pushes the new payload only to ready nodes whose
// revision changed, and not again once applied; a reload that removes a
// node fences it.
func TestRefreshAll(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n, _ := readyNode(t, h)
	pending := h.dial("gpu-2")
	pending.register("gpu-2")

	if got := h.srv.RefreshAll(context.Background()); len(got) != 0 {
		t.Fatalf("RefreshAll with an unchanged config = %+v, want nothing", got)
	}
	h.cfg.Store(testConfig(t, 0, 0, 0, 8)) // gpu-1 capacity 4 → 8; gpu-2 unchanged
	want := h.cfg.Load().NodePayload("gpu-1")
	res := make(chan []RefreshResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		res <- h.srv.RefreshAll(ctx)
	}()
	req := n.recv()
	if got := req.GetRefreshRequest().GetConfig(); got.GetRevision() != want.GetRevision() || got.GetAdapters()[0].GetCapacity() != 8 {
		t.Fatalf("node got %v, want the refreshed payload with capacity 8", req)
	}
	n.send(&iop.Envelope{RequestId: req.GetRequestId(), Kind: &iop.Envelope_RefreshResponse{RefreshResponse: &iop.NodeConfigRefreshResponse{Status: iop.RefreshStatus_REFRESH_APPLIED}}})
	select {
	case got := <-res:
		if len(got) != 1 || got[0].Node != "gpu-1" || got[0].Err != nil || got[0].Status != iop.RefreshStatus_REFRESH_APPLIED {
			t.Fatalf("RefreshAll = %+v, want gpu-1 applied only", got)
		}
	case <-time.After(wait):
		t.Fatal("RefreshAll did not return")
	}
	if got := h.srv.RefreshAll(context.Background()); len(got) != 0 {
		t.Fatalf("second RefreshAll = %+v, want nothing (revision applied)", got)
	}
	if got := pending.roundTrip(1); len(got) != 0 {
		t.Fatalf("pending node got %v, want no refresh (P3)", got)
	}

	// A reload removing gpu-1 fences it and closes its connection.
	cfg := testConfig(t, 0, 0, 0, 8)
	cfg.Nodes = cfg.Nodes[1:]
	cfg.Models = nil
	h.cfg.Store(cfg)
	h.srv.RefreshAll(context.Background())
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
	n.expectClosed()
	if ns := h.srv.Nodes(); len(ns) != 1 || ns[0].ID != "gpu-2" {
		t.Fatalf("Nodes() after removing gpu-1 = %+v", ns)
	}
}

// BenchmarkRunEventRouting measures the hot path: one DELTA event (a
// 16-byte token) per op from a node over loopback TLS, through the read
// loop, into a stream and out of Recv.
func BenchmarkRunEventRouting(b *testing.B) {
	h := newHarness(b, harnessOpts{})
	n := h.dial("gpu-1")
	n.connect("gpu-1")
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	st, err := h.srv.StartRun(dispatch.Target{Node: "gpu-1", Generation: 1}, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	n.recv()
	// Every event carries the next seq (SPEC E3): the frames are encoded
	// ahead of the timer, a fixed-width seq keeping them one size.
	const firstSeq = 1 << 40
	frame := func(seq uint64) []byte {
		f, err := wire.AppendFrame(nil, runEvent(st.RunID(), seq, iop.RunEventType_RUN_EVENT_DELTA, "sixteen bytes!!!"), 0)
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	start, err := wire.AppendFrame(nil, runEvent(st.RunID(), 1, iop.RunEventType_RUN_EVENT_START, ""), 0)
	if err != nil {
		b.Fatal(err)
	}
	size := len(frame(firstSeq))
	frames := make([]byte, 0, size*b.N)
	for i := range b.N {
		frames = append(frames, frame(firstSeq+uint64(i))...)
	}
	if _, err := n.conn.Write(start); err != nil {
		b.Fatal(err)
	}
	if _, err := st.Recv(context.Background()); err != nil {
		b.Fatal(err)
	}
	const batch = 64
	sent := make(chan error, 1)
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	go func() {
		var err error
		for i := 0; i < b.N && err == nil; i += batch {
			_, err = n.conn.Write(frames[size*i : size*min(i+batch, b.N)])
		}
		sent <- err
	}()
	ctx := context.Background()
	for range b.N {
		if _, err := st.Recv(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := <-sent; err != nil {
		b.Fatal(err)
	}
}
