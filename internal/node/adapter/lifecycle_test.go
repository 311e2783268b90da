package adapter_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// work is one run or tunnel started on its own goroutine, as the session
// does.
type work struct {
	done   chan struct{}
	events []*iop.RunEvent
	frames []*iop.ProviderTunnelFrame
	first  chan struct{} // closed at the first DELTA or BODY
}

func startWork(ctx context.Context, s *adapter.Set, tunnel bool, adapterName, marker string) *work {
	w := &work{done: make(chan struct{}), first: make(chan struct{})}
	closed := false
	signal := func() {
		if !closed {
			closed = true
			close(w.first)
		}
	}
	go func() {
		defer close(w.done)
		if tunnel {
			s.Tunnel(ctx, "t-"+marker, &iop.ProviderTunnelRequest{Adapter: adapterName, Target: "tiny", Operation: protocol.OpChatCompletions,
				Body: []byte(`{"model":"tiny","marker":"` + marker + `"}`)}, func(f *iop.ProviderTunnelFrame) {
				w.frames = append(w.frames, f)
				if f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_BODY {
					signal()
				}
			})
			return
		}
		s.Run(ctx, "r-"+marker, &iop.RunRequest{Stream: true, Adapter: adapterName, Target: "tiny", Input: userInput(marker)}, func(ev *iop.RunEvent) {
			w.events = append(w.events, ev)
			if ev.GetType() == iop.RunEventType_RUN_EVENT_DELTA {
				signal()
			}
		})
	}()
	return w
}

func (w *work) wait(t testing.TB) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		t.Fatal("run or tunnel did not return")
	}
}

// blockingBackend answers every request: "stream" mode writes one SSE chunk
// and then waits; "silent" mode accepts and never answers. It reports each
// request's arrival and the moment the server saw its context end.
type blockingBackend struct {
	arrived chan string
	ctxDone chan time.Time
}

func newBlockingBackend(t testing.TB, stream bool) (*blockingBackend, *fake) {
	b := &blockingBackend{arrived: make(chan string, 16), ctxDone: make(chan time.Time, 16)}
	up := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte(`data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n\n"))
			_ = http.NewResponseController(w).Flush()
		}
		b.arrived <- string(body)
		<-r.Context().Done()
		b.ctxDone <- time.Now()
	})
	return b, up
}

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// E5, E6, T3: cancelling the run's context aborts the upstream request — the
// fake sees its request context end within 100 ms — and the stream still ends
// with exactly one terminal: CANCELLED (tunnel: ERROR cancelled), or, when
// the node's drain cancelled it (cause ErrNodeShutdown), ERROR
// node_shutdown on both.
func TestCancelAbortsUpstream(t *testing.T) {
	cases := []struct {
		name     string
		tunnel   bool
		stream   bool // the upstream streamed a first chunk (else: accepts and never answers)
		shutdown bool // cancelled by the node's drain
	}{
		{"E5 run cancelled mid-stream", false, true, false},
		{"E5 run cancelled while the upstream never answers", false, false, false},
		{"T3 tunnel cancelled mid-stream", true, true, false},
		{"T3 tunnel cancelled while the upstream never answers", true, false, false},
		{"run cut by the node's drain", false, true, true},
		{"tunnel cut by the node's drain", true, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			b, up := newBlockingBackend(t, tc.stream)
			s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			w := startWork(ctx, s, tc.tunnel, "llama", "x")
			recv(t, b.arrived, "the upstream request")
			if tc.stream {
				recv(t, w.first, "the first DELTA or BODY")
			}
			cancelled := time.Now()
			cause, code := errors.New("CancelRequest: client_disconnected"), protocol.CodeCancelled
			if tc.shutdown {
				cause, code = adapter.ErrNodeShutdown, protocol.CodeNodeShutdown
			}
			cancel(cause)
			seen := recv(t, b.ctxDone, "the upstream to see its context end")
			if d := seen.Sub(cancelled); d > 100*time.Millisecond {
				t.Fatalf("E5: upstream saw the cancel after %v, want ≤ 100 ms", d)
			}
			w.wait(t)
			if tc.tunnel {
				last, _, body, _ := checkTunnel(t, w.frames)
				if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_ERROR || last.GetFailureCode() != code.String() {
					t.Fatalf("T3: got %v %q, want ERROR %s", last.GetKind(), last.GetFailureCode(), code)
				}
				if tc.stream && len(body) == 0 {
					t.Fatalf("T2: the BODY sent before the cancel is missing")
				}
				return
			}
			last, deltas := checkRun(t, w.events)
			want := iop.RunEventType_RUN_EVENT_CANCELLED
			if tc.shutdown {
				want = iop.RunEventType_RUN_EVENT_ERROR
			}
			if last.GetType() != want || last.GetFailureCode() != code.String() {
				t.Fatalf("E5: got %v %q (%q), want %v %s", last.GetType(), last.GetFailureCode(), last.GetError(), want, code)
			}
			if tc.stream && deltas != "Hel" {
				t.Fatalf("E3: deltas %q before the cancel, want %q", deltas, "Hel")
			}
		})
	}
}

// E6: losing the session cancels every active run and tunnel under it.
func TestSessionLossCancelsAll(t *testing.T) {
	leakcheck.Check(t)
	b, up := newBlockingBackend(t, true)
	s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 4))
	session, lose := context.WithCancel(context.Background())
	var works []*work
	for i, tunnel := range []bool{false, true, false, true} {
		runCtx, cancel := context.WithCancel(session) // per-run context under the session's
		defer cancel()
		works = append(works, startWork(runCtx, s, tunnel, "llama", string(rune('a'+i))))
		recv(t, b.arrived, "upstream request")
	}
	lose()
	for i := range works {
		recv(t, b.ctxDone, "upstream cancel")
		works[i].wait(t)
	}
	for i, w := range works {
		if w.frames != nil {
			if last, _, _, _ := checkTunnel(t, w.frames); last.GetFailureCode() != protocol.CodeCancelled.String() {
				t.Fatalf("E6: tunnel %d ended %v %q", i, last.GetKind(), last.GetFailureCode())
			}
			continue
		}
		if last, _ := checkRun(t, w.events); last.GetType() != iop.RunEventType_RUN_EVENT_CANCELLED {
			t.Fatalf("E6: run %d ended %v", i, last.GetType())
		}
	}
}

// E4: one capacity gate per instance, shared by runs and tunnels; over
// capacity is an immediate error terminal and no upstream call, and the slot
// returns when the holder ends.
func TestCapacityGateShared(t *testing.T) {
	for _, holderIsTunnel := range []bool{false, true} {
		name := "E4 a run holds the only slot"
		if holderIsTunnel {
			name = "E4 a tunnel holds the only slot"
		}
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			release := make(chan struct{})
			held := make(chan struct{}, 1)
			stream := sample(t, "llama_v1_chat_stream.sse")
			up := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if bytes.Contains(body, []byte("hold")) {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = w.Write(stream[:200])
					_ = http.NewResponseController(w).Flush()
					held <- struct{}{}
					select {
					case <-release:
					case <-r.Context().Done():
						return
					}
					_, _ = w.Write(stream[200:])
					return
				}
				replay(200, "text/event-stream", stream)(w, r, body)
			})
			s := newSet(t, adapter.Options{}, compatAdapter("one", llamaProfile(up.URL), 1), compatAdapter("other", llamaProfile(up.URL), 1))
			holder := startWork(context.Background(), s, holderIsTunnel, "one", "hold")
			recv(t, held, "the holder's upstream request")
			before := len(up.requests())

			started := time.Now()
			rejectedRun, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")}))
			rejectedTun, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "one", Operation: protocol.OpChatCompletions, Body: []byte(`{}`)}))
			if rejectedRun.GetFailureCode() != protocol.CodeOverCapacity.String() || rejectedTun.GetFailureCode() != protocol.CodeOverCapacity.String() {
				t.Fatalf("E4: got run %q and tunnel %q, want over_capacity for both", rejectedRun.GetFailureCode(), rejectedTun.GetFailureCode())
			}
			if d := time.Since(started); d > time.Second {
				t.Fatalf("E4: rejections took %v; over capacity must not wait", d)
			}
			if n := len(up.requests()) - before; n != 0 {
				t.Fatalf("E4: %d upstream calls while over capacity", n)
			}
			// Another instance has its own gate.
			if other, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "other", Target: "tiny", Input: userInput("Hi")})); other.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
				t.Fatalf("E4: the other instance was blocked: %v %q", other.GetType(), other.GetError())
			}
			close(release)
			holder.wait(t)
			// The slot is back.
			again, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")}))
			if again.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
				t.Fatalf("E4: after release got %v %q, want COMPLETE", again.GetType(), again.GetError())
			}
		})
	}
}

// E4: the slot also returns after errors and rejections of every kind.
func TestCapacityReturnedAfterFailures(t *testing.T) {
	leakcheck.Check(t)
	s500, b500 := httpSample(t, "llama_error_bad_json.http")
	up := newFake(t, replay(s500, "application/json", b500))
	s := newSet(t, adapter.Options{}, compatAdapter("one", llamaProfile(up.URL), 1))
	for i := 0; i < 3; i++ {
		last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")}))
		if last.GetFailureCode() != protocol.CodeUpstreamStatus.String() {
			t.Fatalf("run %d: got %q, want upstream_status (a leaked slot would say over_capacity)", i, last.GetFailureCode())
		}
		tl, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "one", Path: "/../x"}))
		if tl.GetFailureCode() != protocol.CodeInvalidRequest.String() {
			t.Fatalf("tunnel %d: got %q", i, tl.GetFailureCode())
		}
		tl, _, _, _ = checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "one", Operation: protocol.OpModels}))
		if tl.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END {
			t.Fatalf("tunnel %d: got %v %q", i, tl.GetKind(), tl.GetFailureCode())
		}
	}
}

// Hard deadline: timeout_sec expiry ends a run with ERROR "timeout", not
// CANCELLED, and aborts the upstream request.
func TestRunTimeout(t *testing.T) {
	leakcheck.Check(t)
	b, up := newBlockingBackend(t, false)
	s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
	last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "llama", Target: "tiny", Input: userInput("Hi"), TimeoutSec: 1}))
	recv(t, b.ctxDone, "the upstream to see the deadline")
	if last.GetType() != iop.RunEventType_RUN_EVENT_ERROR || last.GetFailureCode() != protocol.CodeTimeout.String() || !strings.Contains(last.GetError(), "timeout_sec") {
		t.Fatalf("got %v %q (%q), want ERROR timeout", last.GetType(), last.GetFailureCode(), last.GetError())
	}
}

// E4, Q2: the slot is free by the time the terminal is emitted: the Edge
// returns its lease on the terminal and may dispatch the next request to the
// same instance at once, which must then be admitted. The next request is
// sent from inside emit, so any slot still held at that moment shows up as
// over_capacity.
func TestCapacityFreeAtTerminal(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, replay(200, "text/event-stream", sample(t, "llama_v1_chat_stream.sse")))
	s := newSet(t, adapter.Options{}, compatAdapter("one", llamaProfile(up.URL), 1))
	var nextRun []*iop.RunEvent
	var nextTunnel []*iop.ProviderTunnelFrame
	s.Run(context.Background(), "r1", &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")}, func(ev *iop.RunEvent) {
		if ev.GetType() == iop.RunEventType_RUN_EVENT_COMPLETE {
			nextTunnel = tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "one", Operation: protocol.OpModels})
		}
	})
	s.Tunnel(context.Background(), "t1", &iop.ProviderTunnelRequest{Adapter: "one", Operation: protocol.OpModels}, func(f *iop.ProviderTunnelFrame) {
		if f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_END {
			nextRun = runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "one", Target: "tiny", Input: userInput("Hi")})
		}
	})
	if tl, _, _, _ := checkTunnel(t, nextTunnel); tl.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END {
		t.Errorf("E4: tunnel sent at the run's terminal got %v %q, want END", tl.GetKind(), tl.GetFailureCode())
	}
	if last, _ := checkRun(t, nextRun); last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
		t.Errorf("E4: run sent at the tunnel's terminal got %v %q, want COMPLETE", last.GetType(), last.GetFailureCode())
	}
}
