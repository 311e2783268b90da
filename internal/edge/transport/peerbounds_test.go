package transport

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/registry"
	"iop/internal/leakcheck"
	"iop/internal/ratelog"
	iop "iop/proto/gen/iop"
)

// What one compromised node can do to the edge, bounded at the
// transport's ingress (before the HTTP layer, logs and metrics): error
// texts and reasons are cut, implausible token usage is dropped, error
// metadata, command results and tunnel headers are bounded; what a client
// asked for (deltas, bodies, tool calls) is untouched.
func TestIngressBounds(t *testing.T) {
	huge := strings.Repeat("é", 2<<20) // 4 MiB of two-byte runes
	many := map[string]string{}
	for i := range 100 {
		many[strings.Repeat("k", 3)+string(rune('A'+i%26))+string(rune('a'+i/26))] = "v"
	}
	toolCalls := strings.Repeat("x", 1<<20)
	rows := []struct {
		name    string
		env     *iop.Envelope
		changed string
		check   func(t *testing.T, env *iop.Envelope)
	}{
		{"a 4 MiB error text is cut to maxErrorText at a rune boundary", &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{
			Type: iop.RunEventType_RUN_EVENT_ERROR, Error: huge, FailureCode: "upstream_status"}}}, "error text",
			func(t *testing.T, env *iop.Envelope) {
				e := env.GetRunEvent().GetError()
				if len(e) > maxErrorText || !strings.HasSuffix(e, truncatedMark) || !utf8.ValidString(e) {
					t.Errorf("error of %d bytes (valid UTF-8 %v), want ≤ %d ending in the mark", len(e), utf8.ValidString(e), maxErrorText)
				}
			}},
		{"usage of 2^50 tokens is dropped", &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{
			Type: iop.RunEventType_RUN_EVENT_COMPLETE, Usage: &iop.Usage{PromptTokens: 1 << 50, CompletionTokens: 3, TotalTokens: 1<<50 + 3}}}}, "usage",
			func(t *testing.T, env *iop.Envelope) {
				if env.GetRunEvent().GetUsage() != nil {
					t.Errorf("usage %v kept", env.GetRunEvent().GetUsage())
				}
			}},
		{"usage of exactly MaxUsageTokens is kept", &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{
			Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: &iop.Usage{PromptTokens: MaxUsageTokens, CompletionTokens: MaxUsageTokens, TotalTokens: MaxUsageTokens}}}}, "",
			func(t *testing.T, env *iop.Envelope) {
				if env.GetTunnelFrame().GetUsage().GetPromptTokens() != MaxUsageTokens {
					t.Errorf("usage at the bound: %v, want it kept", env.GetTunnelFrame().GetUsage())
				}
			}},
		{"usage of MaxUsageTokens+1 in one count is dropped", &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{
			Type: iop.RunEventType_RUN_EVENT_COMPLETE, Usage: &iop.Usage{PromptTokens: 3, CompletionTokens: MaxUsageTokens + 1, TotalTokens: 4}}}}, "usage",
			func(t *testing.T, env *iop.Envelope) {
				if env.GetRunEvent().GetUsage() != nil {
					t.Errorf("usage %v kept", env.GetRunEvent().GetUsage())
				}
			}},
		{"negative usage is dropped", &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{
			Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: &iop.Usage{CompletionTokens: -5}}}}, "usage",
			func(t *testing.T, env *iop.Envelope) {
				if env.GetTunnelFrame().GetUsage() != nil {
					t.Error("negative usage kept")
				}
			}},
		{"plausible usage and a complete answer are untouched", &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{
			Type: iop.RunEventType_RUN_EVENT_COMPLETE, Content: huge, Usage: &iop.Usage{PromptTokens: 120_000, CompletionTokens: 4096, TotalTokens: 124_096},
			Metadata: map[string]string{"openai_tool_calls": toolCalls}}}}, "",
			func(t *testing.T, env *iop.Envelope) {
				ev := env.GetRunEvent()
				if ev.GetUsage().GetPromptTokens() != 120_000 || len(ev.GetContent()) != len(huge) || len(ev.GetMetadata()["openai_tool_calls"]) != len(toolCalls) {
					t.Error("a legitimate COMPLETE was changed")
				}
			}},
		{"a delta is untouched", runEvent("r1", 2, iop.RunEventType_RUN_EVENT_DELTA, huge), "", func(t *testing.T, env *iop.Envelope) {
			if len(env.GetRunEvent().GetDelta()) != len(huge) {
				t.Error("delta changed")
			}
		}},
		{"long identifiers and stall evidence are cut", &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{
			Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, Error: "e", FailureCode: huge, Adapter: huge, Target: huge,
			Failure: &iop.ExecutionFailure{NodeRunId: huge, AttemptId: huge}}}}, "identifiers",
			func(t *testing.T, env *iop.Envelope) {
				f := env.GetTunnelFrame()
				for _, s := range []string{f.GetFailureCode(), f.GetAdapter(), f.GetTarget(), f.GetFailure().GetNodeRunId(), f.GetFailure().GetAttemptId()} {
					if len(s) > maxShortText {
						t.Errorf("a field of %d bytes kept", len(s))
					}
				}
			}},
		{"error metadata: at most maxMapEntries, values cut", &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{
			Type: iop.RunEventType_RUN_EVENT_ERROR, Error: "e", Metadata: many}}}, "error metadata",
			func(t *testing.T, env *iop.Envelope) {
				if n := len(env.GetRunEvent().GetMetadata()); n != maxMapEntries {
					t.Errorf("%d metadata entries, want %d", n, maxMapEntries)
				}
			}},
		{"tunnel headers: count and oversized values bounded", &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{
			Kind: iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, Status: 200,
			Headers: append([]*iop.Header{{Name: "Content-Type", Value: "text/event-stream"}, {Name: "X-Big", Value: huge}},
				make([]*iop.Header, 300)...)}}}, "headers",
			func(t *testing.T, env *iop.Envelope) {
				hs := env.GetTunnelFrame().GetHeaders()
				if len(hs) != 1 || hs[0].GetName() != "Content-Type" {
					t.Errorf("headers %d (first %v), want only Content-Type", len(hs), hs[0])
				}
			}},
		{"a command's error and results are bounded", &iop.Envelope{Kind: &iop.Envelope_CommandResponse{CommandResponse: &iop.NodeCommandResponse{
			Error: huge, Result: map[string]string{"adapter_key": huge}}}}, "error text",
			func(t *testing.T, env *iop.Envelope) {
				r := env.GetCommandResponse()
				if len(r.GetError()) > maxErrorText || len(r.GetResult()["adapter_key"]) > maxShortText {
					t.Error("command response not bounded")
				}
			}},
		{"a refresh reason is bounded", &iop.Envelope{Kind: &iop.Envelope_RefreshResponse{RefreshResponse: &iop.NodeConfigRefreshResponse{Reason: huge}}}, "error text",
			func(t *testing.T, env *iop.Envelope) {
				if len(env.GetRefreshResponse().GetReason()) > maxErrorText {
					t.Error("reason not bounded")
				}
			}},
		{"a registration's node id and version are bounded", &iop.Envelope{Kind: &iop.Envelope_RegisterRequest{RegisterRequest: &iop.RegisterRequest{
			NodeId: huge, Version: huge}}}, "identifiers",
			func(t *testing.T, env *iop.Envelope) {
				r := env.GetRegisterRequest()
				if len(r.GetNodeId()) > maxShortText || len(r.GetVersion()) > maxShortText {
					t.Error("registration not bounded")
				}
			}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if got := boundIngress(r.env); got != r.changed {
				t.Errorf("changed %q, want %q", got, r.changed)
			}
			r.check(t, r.env)
		})
	}
}

// The same over a real session: a ready node's 1 MiB error text and
// 2^50-token usage reach the stream bounded, and the log line about it is
// bounded too.
func TestIngressBoundsOnTheWire(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n, tgt := readyNode(t, h)
	st, err := h.srv.StartRun(tgt, &iop.RunRequest{Adapter: "ollama", Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	id := n.recv().GetRunId()
	n.send(runEvent(id, 1, iop.RunEventType_RUN_EVENT_START, ""))
	huge := strings.Repeat("A", 1<<20)
	n.send(&iop.Envelope{RunId: id, Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Seq: 2, Type: iop.RunEventType_RUN_EVENT_COMPLETE,
		Content: "ok", Usage: &iop.Usage{PromptTokens: 1 << 50, TotalTokens: 1 << 50}}}})
	recvOK(t, st)
	done := recvOK(t, st).GetRunEvent()
	if done.GetUsage() != nil || done.GetContent() != "ok" {
		t.Errorf("COMPLETE reached the stream with usage %v, content %q; want no usage", done.GetUsage(), done.GetContent())
	}
	st2, err := h.srv.StartRun(tgt, &iop.RunRequest{Adapter: "ollama", Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	id2 := n.recv().GetRunId()
	n.send(runEvent(id2, 1, iop.RunEventType_RUN_EVENT_START, ""))
	n.send(&iop.Envelope{RunId: id2, Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Seq: 2, Type: iop.RunEventType_RUN_EVENT_ERROR,
		Error: huge, FailureCode: "upstream_status"}}})
	recvOK(t, st2)
	if e := recvOK(t, st2).GetRunEvent().GetError(); len(e) > maxErrorText {
		t.Errorf("ERROR reached the stream with %d bytes of error text, want ≤ %d", len(e), maxErrorText)
	}
	h.stop()
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if len(line) > 4*maxErrorText {
			t.Errorf("a log line of %d bytes", len(line))
		}
	}
}

// L4 (registrations per identity): a node certificate re-registering in a
// loop takes the node id over at most RegisterBurst times; every other
// registration is refused and closed, the ready owner keeps its session
// (no fence, no event), and the refusals cost ratelog.DefaultBurst log
// lines, not one each.
func TestRegistrationFloodBounded(t *testing.T) {
	leakcheck.Check(t)
	const burst, flood = 3, 40
	frozen := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC) // one log window, however slow the machine
	h := newHarness(t, harnessOpts{modify: func(o *Options) {
		o.RegisterBurst, o.RegisterInterval = burst, time.Hour
		o.Now = func() time.Time { return frozen }
	}})
	n, tgt := readyNode(t, h) // one registration of the burst
	h.wantEvent("node.connected", "gpu-1")
	var accepted int
	for range flood {
		a := h.dial("gpu-1")
		if r := a.register("gpu-1"); r.GetAccepted() {
			accepted++
			a.conn.Close()
			continue
		} else if !strings.Contains(r.GetReason(), registry.ErrRegistrationRateLimited.Error()) {
			t.Fatalf("refusal reason %q", r.GetReason())
		}
		a.expectClosed()
	}
	if accepted != burst-1 {
		t.Fatalf("%d takeovers accepted, want %d (the burst less the first registration)", accepted, burst-1)
	}
	// The takeovers fenced generation 1 once; the refusals changed nothing.
	h.wantHooks(hookCall{"fence", "gpu-1", 1})
	h.wantEvent("node.disconnected", "gpu-1")
	n.expectClosed()
	gen := h.node("gpu-1").Generation
	real := h.dial("gpu-1")
	if r := real.register("gpu-1"); r.GetAccepted() {
		t.Fatal("a registration beyond the burst was accepted")
	}
	if g := h.node("gpu-1").Generation; g != gen {
		t.Fatalf("generation %d after refusals, want %d", g, gen)
	}
	if _, err := h.srv.StartRun(tgt, &iop.RunRequest{}); err == nil {
		t.Fatal("generation 1 still dispatchable")
	}
	h.stop()
	if c := strings.Count(h.logs.String(), "node registration refused"); c > ratelog.DefaultBurst {
		t.Errorf("%d refusal log lines for %d refusals, want ≤ %d", c, flood-accepted+1, ratelog.DefaultBurst)
	}
	h.noEvents()
}

// The ready owner is not dropped by a refused registration of its id.
func TestRateLimitedRegistrationKeepsOwner(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{modify: func(o *Options) { o.RegisterBurst, o.RegisterInterval = 1, time.Hour }})
	n, tgt := readyNode(t, h)
	a := h.dial("gpu-1")
	if r := a.register("gpu-1"); r.GetAccepted() {
		t.Fatal("second registration within a burst of 1 accepted")
	}
	a.expectClosed()
	st, err := h.srv.StartRun(tgt, &iop.RunRequest{Adapter: "ollama", Target: "tiny"})
	if err != nil {
		t.Fatalf("L4: the owner lost its session to a refused registration: %v", err)
	}
	defer st.Close()
	if env := n.recv(); env.GetRunRequest() == nil {
		t.Fatalf("owner got %v, want the run", env)
	}
	h.noHooks()
}

// B1 (node listener before the handshake): at most MaxHandshakes
// connections may sit in their TLS handshake; at the bound a new one takes
// the slot of the one in its handshake longest, which is closed — so a
// real node gets in while an attacker holds the bound's worth of idle
// connections (were the new one refused instead, anyone renewing
// MaxHandshakes idle connections before HandshakeTimeout would keep every
// node out), and however many connections arrive, at most MaxHandshakes
// stay open.
func TestHandshakesBounded(t *testing.T) {
	leakcheck.Check(t)
	const max = 4
	h := newHarness(t, harnessOpts{modify: func(o *Options) {
		o.MaxHandshakes, o.HandshakeTimeout = max, time.Minute // no deadline frees a slot in this test
	}})
	rawDial := func() net.Conn {
		t.Helper()
		c, err := h.dialer()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	idle := make([]net.Conn, 0, max)
	for range max {
		idle = append(idle, rawDial())
	}
	// Accepted in the order they connected: the node's connection comes
	// after the four idle ones and takes the oldest one's slot.
	n := h.dial("gpu-1")
	n.connect("gpu-1")
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	st, err := h.srv.StartRun(dispatch.Target{Node: "gpu-1", Generation: 1}, &iop.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if !closed(idle[0], wait) {
		t.Fatal("the connection in its handshake longest was not closed when a new one came at the bound")
	}
	// A flood: each new connection sheds the oldest; the newest max stay.
	var flood []net.Conn
	for range 20 {
		flood = append(flood, rawDial())
	}
	for i, c := range append(idle[1:], flood[:len(flood)-max]...) {
		if !closed(c, wait) {
			t.Fatalf("connection %d of the flood's oldest was not closed: more than MaxHandshakes=%d held", i, max)
		}
	}
	for i, c := range flood[len(flood)-max:] {
		if closed(c, 200*time.Millisecond) {
			t.Errorf("one of the %d newest connections (%d) was closed: the bound sheds the oldest", max, i)
		}
	}
	if got := h.srv.handshakes.len(); got > max {
		t.Errorf("%d connections in their handshake, want at most %d", got, max)
	}
	if strings.Count(h.logs.String(), "too many in progress") == 0 {
		t.Error("shedding a connection in its handshake was not logged")
	}
}

// closed reports whether the server closes c within d (a read ends with
// EOF or a reset rather than its deadline).
func closed(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return closedNotTimedOut(err)
}

// closedNotTimedOut reports whether a read error says the peer closed the
// connection (EOF or a reset) rather than the read deadline passing.
func closedNotTimedOut(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err == io.EOF || strings.Contains(err.Error(), "reset")
}
