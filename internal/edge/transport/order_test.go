package transport

import (
	"context"
	"errors"
	"strings"
	"testing"

	"iop/internal/edge/dispatch"
	"iop/internal/leakcheck"
	iop "iop/proto/gen/iop"
)

// The order machine of one stream: each row feeds envelopes and names the
// index of the first one refused (-1: all accepted) and which envelope, if
// any, was the terminal.
func TestOrder(t *testing.T) {
	const (
		start    = iop.RunEventType_RUN_EVENT_START
		delta    = iop.RunEventType_RUN_EVENT_DELTA
		complete = iop.RunEventType_RUN_EVENT_COMPLETE
		rerror   = iop.RunEventType_RUN_EVENT_ERROR
		cancel   = iop.RunEventType_RUN_EVENT_CANCELLED
		unknown  = iop.RunEventType(99)
		rstart   = iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START
		body     = iop.TunnelFrameKind_TUNNEL_FRAME_BODY
		usage    = iop.TunnelFrameKind_TUNNEL_FRAME_USAGE
		end      = iop.TunnelFrameKind_TUNNEL_FRAME_END
		terr     = iop.TunnelFrameKind_TUNNEL_FRAME_ERROR
	)
	run := func(seq uint64, typ iop.RunEventType) *iop.Envelope {
		return &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Seq: seq, Type: typ}}}
	}
	tun := func(seq uint64, k iop.TunnelFrameKind) *iop.Envelope {
		return &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{Seq: seq, Kind: k}}}
	}
	rows := []struct {
		name     string
		tunnel   bool
		envs     []*iop.Envelope
		refused  int // index of the first refused envelope, -1 none
		terminal int // index of the terminal, -1 none
	}{
		{"E3 start, deltas, complete", false, []*iop.Envelope{run(1, start), run(2, delta), run(3, delta), run(4, complete)}, -1, 3},
		{"E3 start then error", false, []*iop.Envelope{run(1, start), run(2, rerror)}, -1, 1},
		{"E3 a lone error (refused at the node's boundary)", false, []*iop.Envelope{run(1, rerror)}, -1, 0},
		{"E3 a lone cancelled", false, []*iop.Envelope{run(1, cancel)}, -1, 0},
		{"E3 seq may skip", false, []*iop.Envelope{run(1, start), run(5, delta), run(9, complete)}, -1, 2},
		{"E3 unknown type ordered by seq only", false, []*iop.Envelope{run(1, start), run(2, unknown), run(3, complete)}, -1, 2},
		{"E3 DELTA before START", false, []*iop.Envelope{run(1, delta)}, 0, -1},
		{"E3 COMPLETE before START", false, []*iop.Envelope{run(1, complete)}, 0, -1},
		{"E3 START twice", false, []*iop.Envelope{run(1, start), run(2, start)}, 1, -1},
		{"E3 START after another event", false, []*iop.Envelope{run(1, unknown), run(2, start)}, 1, -1},
		{"E3 seq 0", false, []*iop.Envelope{run(0, start)}, 0, -1},
		{"E3 seq repeated", false, []*iop.Envelope{run(1, start), run(2, delta), run(2, delta)}, 2, -1},
		{"E3 seq going backwards", false, []*iop.Envelope{run(1, start), run(3, delta), run(2, delta)}, 2, -1},
		{"E3 tunnel frame on a run", false, []*iop.Envelope{run(1, start), tun(2, body)}, 1, -1},
		{"T2 start, body, usage, end", true, []*iop.Envelope{tun(1, rstart), tun(2, body), tun(3, usage), tun(4, body), tun(5, end)}, -1, 4},
		{"T2 body without RESPONSE_START", true, []*iop.Envelope{tun(1, body), tun(2, end)}, -1, 1},
		{"T2 a lone error", true, []*iop.Envelope{tun(1, terr)}, -1, 0},
		{"T2 RESPONSE_START twice", true, []*iop.Envelope{tun(1, rstart), tun(2, rstart)}, 1, -1},
		{"T2 RESPONSE_START after BODY", true, []*iop.Envelope{tun(1, body), tun(2, rstart)}, 1, -1},
		{"T2 seq going backwards", true, []*iop.Envelope{tun(1, rstart), tun(2, body), tun(1, body)}, 2, -1},
		{"T2 run event on a tunnel", true, []*iop.Envelope{run(1, start)}, 0, -1},
		{"T2 no payload", true, []*iop.Envelope{{}}, 0, -1},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			o := order{tunnel: row.tunnel}
			for i, env := range row.envs {
				before := o
				terminal, err := o.step(env)
				if i == row.refused {
					var oe *OrderError
					if !errors.As(err, &oe) || oe.What == "" {
						t.Fatalf("envelope %d: got %v, want an *OrderError", i, err)
					}
					if o != before {
						t.Fatalf("envelope %d: a refused envelope changed the order: %+v → %+v", i, before, o)
					}
					return
				}
				if err != nil {
					t.Fatalf("envelope %d: %v", i, err)
				}
				if terminal != (i == row.terminal) {
					t.Fatalf("envelope %d: terminal %v, want %v", i, terminal, i == row.terminal)
				}
			}
			if row.refused >= 0 {
				t.Fatalf("envelope %d was accepted", row.refused)
			}
		})
	}
}

// E3 (B1): an event out of order fails its stream with
// dispatch.ErrProtocol after the events before it, is never delivered, is
// logged with the node and generation, and cancels the run on the node;
// the session and its other streams carry on.
func TestMisorderedStreamFails(t *testing.T) {
	leakcheck.Check(t)
	h := newHarness(t, harnessOpts{})
	n, tgt := readyNode(t, h)
	bad, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	other, err := h.srv.StartRun(tgt, &iop.RunRequest{Target: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	n.recv()
	n.recv()
	n.send(runEvent(bad.RunID(), 1, iop.RunEventType_RUN_EVENT_START, ""))
	n.send(runEvent(bad.RunID(), 2, iop.RunEventType_RUN_EVENT_DELTA, "ok"))
	n.send(runEvent(bad.RunID(), 2, iop.RunEventType_RUN_EVENT_DELTA, "EVIL"))
	n.send(runEvent(bad.RunID(), 3, iop.RunEventType_RUN_EVENT_COMPLETE, ""))
	got := n.roundTrip(1)
	if len(got) != 1 || got[0].GetCancelRequest().GetReason() != "protocol_error" || got[0].GetRunId() != bad.RunID() {
		t.Fatalf("node got %v, want one CancelRequest{protocol_error} for %s", got, bad.RunID())
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if env := recvOK(t, bad); env.GetRunEvent().GetSeq() != seq {
			t.Fatalf("got %v, want seq %d", env, seq)
		}
	}
	recvErr(t, bad, dispatch.ErrProtocol)
	var oe *OrderError
	if _, err := bad.Recv(context.Background()); !errors.As(err, &oe) || oe.What != "seq not increasing" {
		t.Fatalf("got %v, want the *OrderError", err)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "stream out of order") || !strings.Contains(logs, "node=gpu-1 generation=1 run_id="+bad.RunID()) {
		t.Fatalf("no protocol error line with node and generation:\n%s", logs)
	}
	n.send(runEvent(other.RunID(), 1, iop.RunEventType_RUN_EVENT_START, ""))
	if env := recvOK(t, other); env.GetRunEvent().GetType() != iop.RunEventType_RUN_EVENT_START {
		t.Fatalf("other stream got %v", env)
	}
}

// FuzzOrder: any sequence of envelopes a node sends for one stream (peer
// input) is accepted exactly when it follows SPEC E3/T2 as the simple
// model below reads it; a refusal changes nothing, and nothing is accepted
// after a terminal.
func FuzzOrder(f *testing.F) {
	f.Add([]byte{1, 1, 2, 2, 3, 2, 4, 3}, false)
	f.Add([]byte{1, 1, 2, 2, 2, 2}, false)
	f.Add([]byte{1, 1, 2, 2, 3, 4, 4, 5}, true)
	f.Add([]byte{2, 1, 1, 2}, true)
	f.Fuzz(func(t *testing.T, script []byte, tunnel bool) {
		o := order{tunnel: tunnel}
		var lastSeq uint64
		started, body, ended := false, false, false
		for i := 0; i+1 < len(script); i += 2 {
			kind, seq := int32(script[i]%7), uint64(script[i+1])
			var env *iop.Envelope
			if tunnel {
				env = &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{Seq: seq, Kind: iop.TunnelFrameKind(kind)}}}
			} else {
				env = &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Seq: seq, Type: iop.RunEventType(kind)}}}
			}
			// The model.
			ok, term := seq > lastSeq && !ended, false
			if !tunnel {
				switch iop.RunEventType(kind) {
				case iop.RunEventType_RUN_EVENT_START:
					ok = ok && !started && lastSeq == 0
				case iop.RunEventType_RUN_EVENT_DELTA:
					ok = ok && started
				case iop.RunEventType_RUN_EVENT_COMPLETE:
					ok, term = ok && started, true
				case iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
					term = true
				}
			} else {
				switch iop.TunnelFrameKind(kind) {
				case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
					ok = ok && !started && !body
				case iop.TunnelFrameKind_TUNNEL_FRAME_END, iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
					term = true
				}
			}
			before := o
			gotTerm, err := o.step(env)
			if ended {
				// The session unregisters a stream at its terminal: step is
				// never called after it, so the model stops here.
				return
			}
			if (err == nil) != ok {
				t.Fatalf("envelope %d (kind %d seq %d after %d): accepted=%v, model says %v", i/2, kind, seq, lastSeq, err == nil, ok)
			}
			if err != nil {
				if o != before {
					t.Fatalf("a refusal changed the order")
				}
				return // the stream failed
			}
			if gotTerm != term {
				t.Fatalf("envelope %d: terminal %v, model says %v", i/2, gotTerm, term)
			}
			lastSeq, ended = seq, term
			if !tunnel && iop.RunEventType(kind) == iop.RunEventType_RUN_EVENT_START {
				started = true
			}
			if tunnel {
				switch iop.TunnelFrameKind(kind) {
				case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
					started = true
				case iop.TunnelFrameKind_TUNNEL_FRAME_BODY, iop.TunnelFrameKind_TUNNEL_FRAME_USAGE:
					body = true
				}
			}
		}
	})
}
