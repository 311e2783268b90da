package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/edge/registry"
	"iop/internal/leakcheck"
)

// Short heartbeats for the liveness tests (ms): the node gives up on a
// silent Edge after nodeTimeout, the Edge fences a silent node after
// edgeTimeout (the defaults 5 s / 15 s / 20 s of docs/wire.md, scaled down). Short, but not
// shorter than this process can be kept off the CPU on a loaded 2-core
// machine under the race detector (stalls of 2 s were seen at load 30): a
// timeout below that ends healthy sessions before the test freezes
// anything. The exact timeouts are proved on synctest clocks in
// internal/node/session and internal/edge/transport.
const (
	hbInterval  = 500
	nodeTimeout = 5000
	edgeTimeout = 10000
)

func shortHeartbeats(c *config.Config) {
	c.Heartbeat = config.Heartbeat{IntervalMs: hbInterval, TimeoutMs: edgeTimeout, NodeTimeoutMs: nodeTimeout}
}

// eventTime parses a /events time.
func eventTime(t testing.TB, ev nodeEvent) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, ev.Time)
	if err != nil {
		t.Fatalf("event time %q: %v", ev.Time, err)
	}
	return at
}

// liveStack is one backend, one Edge and node gpu-1 (adapters "ollama" and
// "oa", capacity 2 each) dialing the Edge through a relay.
type liveStack struct {
	p      pkiDir
	bp     *backendProc
	e      *edgeProc
	rl     *relay
	adm    *adminClient
	api    *apiClient
	events *recorder[nodeEvent]
	logs   *logSink
}

func newLiveStack(t *testing.T, tweak func(*config.Config)) *liveStack {
	s := &liveStack{logs: newLogSink(t), p: newPKI(t, "gpu-1")}
	s.bp = startBackend(t, backend.Options{TokenDelay: 5 * time.Millisecond, LoopTokens: 100000})
	url := s.bp.serve(t, nil)
	cfg := edgeConfig(t, s.p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 2), compatAdapter("oa", url, 2)}}},
		[]config.Model{
			modelGroup("tiny", provider("gpu-1", "ollama", "tiny")),
			modelGroup("tiny-oa", provider("gpu-1", "oa", "tiny")),
			modelGroup("loop", provider("gpu-1", "ollama", "tiny-loop")),
			modelGroup("loop-oa", provider("gpu-1", "oa", "tiny-loop")),
		}, tweak)
	s.e = startEdge(t, cfg, nil, s.logs.logger("edge"))
	s.rl = startRelay(t, s.e.nodeAddr)
	s.adm = newAdminClient(t, s.e)
	s.api = newAPIClient(t, s.e)
	s.events = s.adm.subscribeEvents(t)
	return s
}

// startNode starts gpu-1 through the relay, reconnecting at once after a
// session ends (interval 0, finite attempts).
func (s *liveStack) startNode(t *testing.T) *nodeProc {
	zero := 0
	return startNode(t, s.p, "gpu-1", s.rl.addr(), nodeOpts{intervalSec: &zero, maxAttempts: 1000, log: s.logs.logger("node"), drainMs: 1})
}

// waitDisconnected waits until /status shows gpu-1 disconnected.
func (s *liveStack) waitDisconnected(t *testing.T) {
	t.Helper()
	eventually(t, 5*time.Second, "gpu-1 disconnected", func() (bool, string) {
		d, err := s.adm.status()
		if err != nil {
			return false, err.Error()
		}
		ns, _ := d.node("gpu-1")
		return !ns.Connected, "still connected"
	})
}

// checkServes sends one non-stream request per path and wants the answer.
func (s *liveStack) checkServes(t *testing.T, what string) {
	t.Helper()
	for _, m := range []string{"tiny", "tiny-oa"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := s.api.chat(ctx, chatRequest{model: m})
		cancel()
		if err != nil || res.status != http.StatusOK || res.text != answer {
			t.Fatalf("%s: model %s: err %v status %d body %s", what, m, err, res.status, res.raw)
		}
	}
}

// waitEvents waits until at least n events arrived.
func (s *liveStack) waitEvents(t *testing.T, n int) []nodeEvent {
	t.Helper()
	evs, err := s.events.waitFor(10*time.Second, func(es []nodeEvent) bool { return len(es) >= n })
	if err != nil {
		t.Fatalf("N4: want %d node events: %v; got %+v", n, err, evs)
	}
	return evs
}

// oneStreamError checks a stream that failed after its first bytes: exactly
// one error event and no normal end (T5, L8, E6).
func oneStreamError(t *testing.T, raw []byte) {
	t.Helper()
	var res chatResult
	if err := parseStream(&res, raw); err != nil {
		t.Fatal(err)
	}
	if len(res.errs) != 1 || res.done || res.finish != "" {
		t.Errorf("L8: stream after losing its node: %d error events, [DONE]=%v, finish_reason %q; want exactly one error, no [DONE], no finish; stream:\n%s",
			len(res.errs), res.done, res.finish, raw)
	}
}

// TestHalfOpen: after ready, the path between node and Edge stops
// forwarding in both directions with both sockets open (L7). Each side's
// detection is shown on its own, so that no row depends on which of two
// timers a loaded machine runs first (the exact times are the synctest
// unit tests': internal/node/session TestHeartbeat for the node,
// internal/edge/transport's for the Edge):
//
//   - the node notices (its 300 ms timeout; the Edge's is an hour): its
//     session ends and cancels the stream in flight upstream (E6), it
//     redials at once and the takeover fences the old generation (L4);
//   - the Edge notices (its 800 ms timeout): the relay refuses the node's
//     redials (every 1 s) until the old generation is fenced, so the Edge's
//     own heartbeat timeout must be what fences it (L7, L8); the node also
//     noticed and cancelled its upstream request (E6).
//
// Either way the stream ends for its client with exactly one error (L8),
// the Edge closes the old connection, the node is back through a fresh path
// and nothing is dispatched to the old generation.
func TestHalfOpen(t *testing.T) {
	leakcheck.Check(t)
	for _, tc := range []struct {
		name        string
		edgeTimeout int64 // ms
		intervalSec int   // the node's reconnect interval
		refuse      bool  // the relay refuses the node's redials until the fence
		reason      error // of the fence
	}{
		{"L7 L4 E6 the node notices, redials at once, the takeover fences", 3600_000, 0, false, registry.ErrSuperseded},
		{"L7 L8 E6 the Edge notices: its heartbeat timeout fences", edgeTimeout, 1, true, registry.ErrHeartbeatTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newLiveStack(t, func(c *config.Config) {
				shortHeartbeats(c)
				c.Heartbeat.TimeoutMs = tc.edgeTimeout
			})
			startNode(t, s.p, "gpu-1", s.rl.addr(), nodeOpts{intervalSec: &tc.intervalSec, maxAttempts: 1000, log: s.logs.logger("node")})
			s.adm.waitConnected(t, 10*time.Second, "gpu-1")
			s.waitEvents(t, 1)
			s.checkServes(t, "before the freeze")

			// A stream in flight on generation 1.
			mark := s.bp.b.Stats().Started
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := s.api.post(ctx, chatRequest{model: "loop", stream: true})
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if err := readChunks(resp, 2); err != nil {
				t.Fatal(err)
			}

			if tc.refuse {
				s.rl.refuse(true)
			}
			old := s.rl.freeze()
			t0 := time.Now()

			// E6: the node's session ends and cancels the upstream request.
			end := s.bp.waitEnd(t, 30*time.Second, "upstream of the stream on the old generation",
				func(e backend.RequestEnd) bool { return e.Seq > mark && e.Model == "tiny-loop" })
			if end.Outcome != backend.OutcomeClientGone {
				t.Errorf("E6: upstream of the old generation's stream ended %s, want %s", end.Outcome, backend.OutcomeClientGone)
			}
			// The old generation is fenced; then the node's redial gets
			// through and the new generation is ready.
			evs := s.waitEvents(t, 2)
			fence := evs[1]
			if fence.Type != "node.disconnected" {
				t.Fatalf("N4: events %+v, want connected, disconnected", evs)
			}
			if fence.Reason != tc.reason.Error() {
				t.Errorf("L4, L7: fence reason %q, want %q", fence.Reason, tc.reason)
			}
			refused := s.rl.refuse(false)
			acc, err := s.rl.accepted.waitFor(30*time.Second, func(ts []time.Time) bool { return len(ts) >= 2 })
			if err != nil {
				t.Fatalf("L7: the node did not reconnect: %v", err)
			}
			evs = s.waitEvents(t, 3)
			if ready := evs[2]; ready.Type != "node.connected" {
				t.Fatalf("N4: events %+v, want connected, disconnected, connected", evs)
			}
			t.Logf("after the freeze: node noticed in %v, old generation fenced in %v (%s), node's redials refused %d, fresh path in %v, new generation ready in %v",
				end.End.Sub(t0).Round(time.Millisecond), eventTime(t, fence).Sub(t0).Round(time.Millisecond), fence.Reason, refused,
				acc[1].Sub(t0).Round(time.Millisecond), eventTime(t, evs[2]).Sub(t0).Round(time.Millisecond))

			// L4, L7: the Edge closed the old connection.
			select {
			case <-old[0].edgeGone:
			case <-time.After(30 * time.Second):
				t.Errorf("L7: the Edge kept the old generation's connection open")
			}
			// L8: the stream on the old generation ends with exactly one error.
			raw, _ := io.ReadAll(resp.Body)
			oneStreamError(t, raw)

			// Nothing goes to the old generation: every request now takes
			// the new path and is answered (one sent into the frozen pipe
			// would hang until a fence and fail).
			s.adm.waitConnected(t, 10*time.Second, "gpu-1")
			for i := range 5 {
				s.checkServes(t, fmt.Sprintf("after the fence, round %d", i))
			}
			if got, _ := s.rl.accepted.snapshot(); len(got) != 2 {
				t.Errorf("node's paths to the Edge: %d, want 2 (the first path and one fresh path)", len(got))
			}
			s.adm.waitGauges(t, 10*time.Second, 0, 0)
		})
	}
}

// TestLateCallbackAfterTakeover: the node's path dies on its side only, so
// the node reconnects at once while the Edge's old connection is still open;
// the new registration takes over (fencing the old generation once, L4) and
// the old connection's read loop fails afterwards. That late close of a
// non-current generation leaves the new one ready and emits nothing (L9).
// Eight rounds; the log says in how many the old teardown came after the new
// ready. The final node stop is the barrier: its node.disconnected must come
// right after the last node.connected.
func TestLateCallbackAfterTakeover(t *testing.T) {
	leakcheck.Check(t)
	const rounds = 8
	s := newLiveStack(t, nil) // default heartbeats: only the takeover ends the old sessions
	n := s.startNode(t)
	s.adm.waitConnected(t, 10*time.Second, "gpu-1")
	s.waitEvents(t, 1)

	late := 0
	for round := 1; round <= rounds; round++ {
		before, _ := s.logs.recs.snapshot()
		old := s.rl.cutNodeSide()
		evs := s.waitEvents(t, 1+2*round)
		if d, c := evs[2*round-1], evs[2*round]; d.Type != "node.disconnected" || d.Reason != registry.ErrSuperseded.Error() || c.Type != "node.connected" {
			t.Fatalf("L4, N4: round %d events %+v, want disconnected (%s) then connected", round, evs, registry.ErrSuperseded)
		}
		// The Edge closed the old connection, and its session is torn down.
		select {
		case <-old[len(old)-1].edgeGone:
		case <-time.After(5 * time.Second):
			t.Fatalf("L4: round %d: the Edge kept the superseded connection open", round)
		}
		lines, err := s.logs.recs.waitFor(5*time.Second, func(ls []string) bool {
			return indexOf(ls[len(before):], "node session closed", registry.ErrSuperseded.Error()) >= 0
		})
		if err != nil {
			t.Fatalf("round %d: old session teardown not logged: %v", round, err)
		}
		lines = lines[len(before):]
		gen := fmt.Sprintf("generation=%d", round+1)
		if r, c := indexOf(lines, "node ready", gen), indexOf(lines, "node session closed", registry.ErrSuperseded.Error()); r >= 0 && r < c {
			late++
		}
		// L9: the new generation is still the ready one and serves.
		d := s.adm.mustStatus(t)
		if ns, _ := d.node("gpu-1"); !ns.Connected {
			t.Fatalf("L9: round %d: gpu-1 not connected after the old connection closed: %+v", round, ns)
		}
		s.checkServes(t, fmt.Sprintf("round %d after the late close", round))
	}
	t.Logf("old teardown after the new ready in %d of %d rounds", late, rounds)

	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	evs := s.waitEvents(t, 2+2*rounds)
	last := evs[len(evs)-1]
	if len(evs) != 2+2*rounds || last.Type != "node.disconnected" || last.Reason != registry.ErrConnClosed.Error() {
		t.Errorf("L9: events %+v, want exactly one disconnected (%s) after the last connected", evs, registry.ErrConnClosed)
	}
	s.adm.waitGauges(t, 5*time.Second, 0, 0)
}

// indexOf returns the index of the first line holding every part, or -1.
func indexOf(lines []string, parts ...string) int {
next:
	for i, l := range lines {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		return i
	}
	return -1
}

// TestNodeKilledMidStream: the node's Run context is cancelled while a
// stream is in flight. The client gets exactly one terminal error, the
// upstream request is cancelled with the session (E6), the lease comes back
// (L8), and once the node is back a new request succeeds.
func TestNodeKilledMidStream(t *testing.T) {
	leakcheck.Check(t)
	s := newLiveStack(t, nil)
	for _, path := range []struct{ name, model string }{{"run", "loop"}, {"tunnel", "loop-oa"}} {
		t.Run("E6 L8 "+path.name, func(t *testing.T) {
			n := s.startNode(t)
			s.adm.waitConnected(t, 10*time.Second, "gpu-1")
			mark := s.bp.b.Stats().Started
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := s.api.post(ctx, chatRequest{model: path.model, stream: true})
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if err := readChunks(resp, 2); err != nil {
				t.Fatal(err)
			}
			if err := n.stop(); err != nil {
				t.Fatal(err)
			}
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("client stream after the node died: %v", err)
			}
			oneStreamError(t, raw)
			end := s.bp.waitEnd(t, 5*time.Second, "upstream of the stream", func(e backend.RequestEnd) bool { return e.Seq > mark })
			if end.Outcome != backend.OutcomeClientGone {
				t.Errorf("E6: upstream request ended %s, want %s", end.Outcome, backend.OutcomeClientGone)
			}
			s.adm.waitGauges(t, 5*time.Second, 0, 0)

			n = s.startNode(t)
			s.adm.waitConnected(t, 10*time.Second, "gpu-1")
			s.checkServes(t, "after the node came back")
			s.adm.waitGauges(t, 5*time.Second, 0, 0)
			if err := n.stop(); err != nil {
				t.Fatal(err)
			}
			s.waitDisconnected(t)
		})
	}
}
