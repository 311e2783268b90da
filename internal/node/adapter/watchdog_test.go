package adapter_test

// Stall watchdog tests (SPEC H1–H7, E2) on the fake clock of a
// testing/synctest bubble. The upstream is a real net/http server and the
// client a real http.Transport, joined by net.Pipe connections: a blocked
// read on a loopback socket is not "durably blocked" for synctest, so the
// bubble's clock would never move past a stalled upstream, while a pipe's
// is. synctest.Test itself fails when a goroutine of the bubble outlives
// it; leakcheck.Check guards the rest of the process.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// pipeListener hands the server ends of net.Pipe pairs to an http.Server.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "pipe"} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ignoreCancel makes chat requests deaf to their context, like a provider
// call that does not return when cancelled (SPEC H7); probes stay normal.
type ignoreCancel struct{ *http.Transport }

func (c ignoreCancel) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/chat/completions") || r.URL.Path == "/api/chat" {
		r = r.WithContext(context.WithoutCancel(r.Context()))
	}
	return c.Transport.RoundTrip(r)
}

// pipeClient serves h inside the current bubble and returns a client for
// it; t.Cleanup closes both (inside the bubble).
func pipeClient(t *testing.T, h http.Handler, deaf bool) *http.Client {
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: h}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(l) }()
	tr := &http.Transport{DialContext: l.dial, DisableCompression: true}
	t.Cleanup(func() { tr.CloseIdleConnections(); _ = srv.Close(); <-served })
	if deaf {
		return &http.Client{Transport: ignoreCancel{tr}}
	}
	return &http.Client{Transport: tr}
}

// plan is what the fake upstream does with a chat request.
type plan struct {
	status    int           // ≠ 0: answer this status with a JSON error, nothing else
	noHeaders bool          // never answer at all (http.Client.Do blocks)
	headersAt time.Duration // answer the headers this late
	chunks    int           // after the headers, this many chunks
	gap       time.Duration // before each chunk
	keepalive bool          // chunks are SSE comments, not content
	finish    bool          // then end the stream properly; else stall
	hold      chan struct{} // stalled: wait for this, ignoring the request context
	probe     string        // model list: "available" (lists tiny), "unavailable", "broken" (not JSON); "hang": /health never answers
}

const (
	sseTok    = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n"
	sseFinish = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	ndTok     = `{"model":"tiny","message":{"role":"assistant","content":"tok"},"done":false}` + "\n"
	ndFinish  = `{"model":"tiny","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":1}` + "\n"
)

// upstream is the fake backend of one test: chat per plan, /health 200,
// the model lists per plan.probe. chats counts chat requests (SPEC H6: no
// retry).
func upstream(p plan, chats *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			if p.probe == "hang" {
				<-r.Context().Done()
				return
			}
			_, _ = w.Write([]byte(`{"status":"ok"}`))
			return
		case "/v1/models", "/api/tags":
			switch p.probe {
			case "broken":
				_, _ = w.Write([]byte(`{"data":[`))
			case "unavailable":
				_, _ = w.Write([]byte(`{"data":[{"id":"other"}],"models":[{"name":"other:latest"}]}`))
			default:
				_, _ = w.Write([]byte(`{"data":[{"id":"tiny"}],"models":[{"name":"tiny:latest"}]}`))
			}
			return
		}
		chats.Add(1)
		_, _ = io.Copy(io.Discard, r.Body) // the server then watches the connection, so r.Context() ends when the client goes
		tok, finish := sseTok, sseFinish
		if r.URL.Path == "/api/chat" {
			tok, finish = ndTok, ndFinish
		}
		if p.keepalive {
			tok = ": keep-alive\n\n"
		}
		switch {
		case p.status != 0:
			w.WriteHeader(p.status)
			_, _ = w.Write([]byte(`{"error":{"message":"boom"}}`))
			return
		case p.noHeaders:
			<-r.Context().Done()
			return
		}
		time.Sleep(p.headersAt) // the bubble's fake clock: the upstream's pace
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		for range p.chunks {
			time.Sleep(p.gap) // the bubble's fake clock: the upstream's pace, not a wait for an event
			if _, err := w.Write([]byte(tok)); err != nil {
				return
			}
			_ = rc.Flush()
		}
		switch {
		case p.finish:
			_, _ = w.Write([]byte(finish))
		case p.hold != nil:
			<-p.hold
		default:
			<-r.Context().Done()
		}
	})
}

// flight is one run or tunnel started on its own goroutine, as the session
// does, collecting what it emits.
type flight struct {
	mu       sync.Mutex
	events   []*iop.RunEvent
	frames   []*iop.ProviderTunnelFrame
	endedAt  time.Time
	ended    chan struct{} // closed at the terminal
	returned chan struct{} // closed when Run or Tunnel returned
}

type knobs struct {
	tunnel     bool
	adapter    string
	stallMs    int64 // request response_stall_timeout_ms
	timeoutSec int64
}

func fly(ctx context.Context, s *adapter.Set, runID string, k knobs, onTerminal func()) *flight {
	f := &flight{ended: make(chan struct{}), returned: make(chan struct{})}
	terminal := func() {
		f.endedAt = time.Now()
		close(f.ended)
		if onTerminal != nil {
			onTerminal()
		}
	}
	go func() {
		defer close(f.returned)
		if k.tunnel {
			s.Tunnel(ctx, runID, &iop.ProviderTunnelRequest{Adapter: k.adapter, Target: "tiny", Operation: protocol.OpChatCompletions,
				Body: []byte(`{"model":"tiny","stream":true}`), ResponseStallTimeoutMs: k.stallMs, TimeoutSec: k.timeoutSec},
				func(fr *iop.ProviderTunnelFrame) {
					f.mu.Lock()
					defer f.mu.Unlock()
					f.frames = append(f.frames, fr)
					if k := fr.GetKind(); k == iop.TunnelFrameKind_TUNNEL_FRAME_END || k == iop.TunnelFrameKind_TUNNEL_FRAME_ERROR {
						terminal()
					}
				})
			return
		}
		s.Run(ctx, runID, &iop.RunRequest{Stream: true, Adapter: k.adapter, Target: "tiny", Input: userInput("Hi"),
			ResponseStallTimeoutMs: k.stallMs, TimeoutSec: k.timeoutSec},
			func(ev *iop.RunEvent) {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.events = append(f.events, ev)
				switch ev.GetType() {
				case iop.RunEventType_RUN_EVENT_COMPLETE, iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
					terminal()
				}
			})
	}()
	return f
}

// end checks the stream grammar (E3 / T2: one terminal, last, seq 1, 2, 3…)
// and returns the terminal's failure code (or its kind when it succeeded),
// Failure, metadata and the relayed content (deltas or body).
func (f *flight) end(t *testing.T) (code string, fail *iop.ExecutionFailure, meta map[string]string, content string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frames != nil {
		last, _, body, _ := checkTunnel(t, f.frames)
		code = last.GetFailureCode()
		if last.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_END {
			code = "END"
		}
		return code, last.GetFailure(), last.GetMetadata(), string(body)
	}
	last, deltas := checkRun(t, f.events)
	code = last.GetFailureCode()
	if last.GetType() == iop.RunEventType_RUN_EVENT_COMPLETE {
		code = "COMPLETE"
	}
	return code, last.GetFailure(), last.GetMetadata(), deltas
}

// H1–H7, E2: one row per behaviour, for runs (Ollama and OpenAI-compatible)
// and tunnels. Times are on the bubble's clock, so they are exact.
func TestStallWatchdog(t *testing.T) {
	const stall = 10 * time.Second
	type row struct {
		name     string
		ollama   bool
		k        knobs
		p        plan
		probeTO  time.Duration // Options.ProbeTimeout
		cancelAt time.Duration // > 0: the caller cancels then
		code     string        // terminal failure code, or COMPLETE / END
		at       time.Duration // when the terminal goes out
		health   string        // "" = no Failure (H4)
		fence    string
		content  string
	}
	tok3 := strings.Repeat("tok", 3)
	rows := []row{
		{name: "H1 run stalls after 3 chunks; probe available", k: knobs{stallMs: 10000}, p: plan{chunks: 3},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "available", fence: "confirmed", content: tok3},
		{name: "H1 ollama run stalls after 3 lines; probe available", ollama: true, k: knobs{stallMs: 10000}, p: plan{chunks: 3},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "available", fence: "confirmed", content: tok3},
		{name: "H1 tunnel stalls after 3 chunks: BODY frames, then the stall ERROR", k: knobs{tunnel: true, stallMs: 10000}, p: plan{chunks: 3},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "available", fence: "confirmed", content: strings.Repeat(sseTok, 3)},
		{name: "H1 run: headers, then nothing (stall before the first byte)", k: knobs{stallMs: 10000}, p: plan{},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "available", fence: "confirmed"},
		{name: "H1 tunnel: headers, then nothing", k: knobs{tunnel: true, stallMs: 10000}, p: plan{},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "available", fence: "confirmed"},
		{name: "H1 run: the headers arriving are activity (headers at 6 s, then nothing: stall at 16 s)", k: knobs{stallMs: 10000},
			p: plan{headersAt: 6 * time.Second}, code: protocol.CodeResponseStalled.String(), at: 16 * time.Second, health: "available", fence: "confirmed"},
		{name: "H1 ollama run: the headers arriving are activity", ollama: true, k: knobs{stallMs: 10000},
			p: plan{headersAt: 6 * time.Second}, code: protocol.CodeResponseStalled.String(), at: 16 * time.Second, health: "available", fence: "confirmed"},
		{name: "H1 tunnel: the headers arriving are activity", k: knobs{tunnel: true, stallMs: 10000},
			p: plan{headersAt: 6 * time.Second}, code: protocol.CodeResponseStalled.String(), at: 16 * time.Second, health: "available", fence: "confirmed"},
		{name: "H1 run: no headers ever (Client.Do blocks)", k: knobs{stallMs: 10000}, p: plan{noHeaders: true},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "available", fence: "confirmed"},
		{name: "H1 tunnel: no headers ever", k: knobs{tunnel: true, stallMs: 10000}, p: plan{noHeaders: true},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "available", fence: "confirmed"},
		{name: "H1 activity re-arms: a chunk every 0.6 × stall for 3 × stall completes", k: knobs{stallMs: 10000},
			p: plan{chunks: 5, gap: 6 * time.Second, finish: true}, code: "COMPLETE", at: 30 * time.Second, content: strings.Repeat("tok", 5)},
		{name: "H1 tunnel activity re-arms", k: knobs{tunnel: true, stallMs: 10000},
			p: plan{chunks: 5, gap: 6 * time.Second, finish: true}, code: "END", at: 30 * time.Second, content: strings.Repeat(sseTok, 5) + sseFinish},
		{name: "H1 SSE keep-alive comments are activity (bytes arrived)", k: knobs{stallMs: 10000},
			p: plan{chunks: 4, gap: 9 * time.Second, keepalive: true, finish: true}, code: "COMPLETE", at: 36 * time.Second},
		{name: "H1 keep-alives, then silence: stalls one timeout after the last one", k: knobs{tunnel: true, stallMs: 10000},
			p: plan{chunks: 2, gap: 9 * time.Second, keepalive: true}, code: protocol.CodeResponseStalled.String(), at: 28 * time.Second,
			health: "available", fence: "confirmed", content: strings.Repeat(": keep-alive\n\n", 2)},
		{name: "H2 probe unavailable: provider_unhealthy", k: knobs{stallMs: 10000}, p: plan{chunks: 1, probe: "unavailable"},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "unavailable", fence: "confirmed", content: "tok"},
		{name: "H2 ollama probe unavailable", ollama: true, k: knobs{stallMs: 10000}, p: plan{chunks: 1, probe: "unavailable"},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "unavailable", fence: "confirmed", content: "tok"},
		{name: "H2 probe answer broken: health_unknown", k: knobs{tunnel: true, stallMs: 10000}, p: plan{probe: "broken"},
			code: protocol.CodeResponseStalled.String(), at: stall, health: "unknown", fence: "confirmed"},
		{name: "H1 H2 probe bounded by ProbeTimeout: unknown after 3 s, not longer", k: knobs{stallMs: 10000}, p: plan{probe: "hang"},
			probeTO: 3 * time.Second, code: protocol.CodeResponseStalled.String(), at: stall + 3*time.Second, health: "unknown", fence: "confirmed"},
		{name: "H7 deadline first keeps its timeout terminal", k: knobs{stallMs: 10000, timeoutSec: 4}, p: plan{chunks: 1},
			code: protocol.CodeTimeout.String(), at: 4 * time.Second, content: "tok"},
		{name: "H7 tunnel deadline first", k: knobs{tunnel: true, stallMs: 10000, timeoutSec: 4}, p: plan{noHeaders: true},
			code: protocol.CodeTimeout.String(), at: 4 * time.Second},
		{name: "H7 cancel first keeps its CANCELLED terminal", k: knobs{stallMs: 10000}, p: plan{chunks: 1}, cancelAt: 5 * time.Second,
			code: protocol.CodeCancelled.String(), at: 5 * time.Second, content: "tok"},
		{name: "H7 tunnel cancel first", k: knobs{tunnel: true, stallMs: 10000}, p: plan{}, cancelAt: 5 * time.Second,
			code: protocol.CodeCancelled.String(), at: 5 * time.Second},
		{name: "H4 a non-stall failure has no Failure", k: knobs{stallMs: 10000}, p: plan{status: 500},
			code: protocol.CodeUpstreamStatus.String(), at: 0},
		// Q6: a pool call carries the Edge's resolved value, which the node
		// takes as it is; it has no adapter value of its own to resolve.
		{name: "Q6 E2 run: the request's timeout is the one applied", k: knobs{stallMs: 1500}, p: plan{},
			code: protocol.CodeResponseStalled.String(), at: 1500 * time.Millisecond, health: "available", fence: "confirmed"},
		{name: "Q6 E2 tunnel: the request's timeout is the one applied", k: knobs{tunnel: true, stallMs: 1500}, p: plan{},
			code: protocol.CodeResponseStalled.String(), at: 1500 * time.Millisecond, health: "available", fence: "confirmed"},
		{name: "Q6 E2 run: a value above the default is applied as it is, not capped", k: knobs{stallMs: 600000}, p: plan{},
			code: protocol.CodeResponseStalled.String(), at: 600 * time.Second, health: "available", fence: "confirmed"},
		{name: "Q6 E2 run: 0 (a direct call) is the node default 300000 ms", k: knobs{}, p: plan{},
			code: protocol.CodeResponseStalled.String(), at: 300 * time.Second, health: "available", fence: "confirmed"},
		{name: "Q6 E2 tunnel: 0 (a direct call) is the node default 300000 ms", k: knobs{tunnel: true}, p: plan{},
			code: protocol.CodeResponseStalled.String(), at: 300 * time.Second, health: "available", fence: "confirmed"},
	}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			synctest.Test(t, func(t *testing.T) {
				var chats atomic.Int32
				client := pipeClient(t, upstream(tc.p, &chats), false)
				cfg := compatAdapter("llama", llamaProfile("http://upstream"), 1)
				if tc.ollama {
					cfg = ollamaAdapter("llama", "http://upstream", 1)
				}
				s := newSet(t, adapter.Options{HTTPClient: client, ProbeTimeout: tc.probeTO}, cfg)
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				if tc.cancelAt > 0 {
					stop := time.AfterFunc(tc.cancelAt, func() { cancel(errors.New("CancelRequest")) })
					defer stop.Stop()
				}
				k := tc.k
				k.adapter = "llama"
				start := time.Now()
				f := fly(ctx, s, "run-1", k, nil)
				<-f.returned
				if got := f.endedAt.Sub(start); got != tc.at {
					t.Errorf("terminal after %v, want %v", got, tc.at)
				}
				code, fail, meta, content := f.end(t)
				if code != tc.code || content != tc.content {
					t.Fatalf("got %s after %q, want %s after %q", code, content, tc.code, tc.content)
				}
				if n := chats.Load(); n != 1 {
					t.Errorf("H6: %d chat requests, want 1 (no retry)", n)
				}
				if tc.health == "" {
					if fail != nil || meta[protocol.MetaFence] != "" {
						t.Fatalf("H4: Failure %v, metadata %v on a non-stall terminal, want none", fail, meta)
					}
					return
				}
				checkStallTerminal(t, fail, meta, "run-1", tc.health, tc.fence)
				if got, want := fail.GetIdleMs(), stallOf(tc.k.stallMs).Milliseconds(); got != want {
					t.Errorf("H1: idle_ms %d, want %d", got, want)
				}
			})
		})
	}
}

// stallOf is the stall timeout a row's request gets (SPEC E2): its own,
// else 300000 ms.
func stallOf(reqMs int64) time.Duration {
	if reqMs > 0 {
		return time.Duration(reqMs) * time.Millisecond
	}
	return protocol.DefaultStallTimeoutMs * time.Millisecond
}

// checkStallTerminal checks H1–H3 on a stall terminal's Failure and
// metadata.
func checkStallTerminal(t *testing.T, f *iop.ExecutionFailure, meta map[string]string, runID, health, fence string) {
	t.Helper()
	liveness := map[string]string{"available": "request_stalled", "unavailable": "provider_unhealthy", "unknown": "health_unknown"}[health]
	if f == nil {
		t.Fatal("H1: stall terminal without Failure")
	}
	if f.GetCode() != protocol.CodeResponseStalled.String() || f.GetProviderHealth() != health || f.GetLivenessClassification() != liveness ||
		f.GetFence() != fence || f.GetNodeRunId() != runID || f.GetAttemptId() != runID+"/1" || f.GetAdapter() != "llama" || f.GetTarget() != "tiny" {
		t.Fatalf("H2: got Failure %v, want health %s/%s, fence %s", f, health, liveness, fence)
	}
	if f.GetHealthObservationSeq() != 0 {
		t.Fatalf("H5: the adapter set health_observation_seq %d; the session stamps it", f.GetHealthObservationSeq())
	}
	allowed := map[string]bool{protocol.MetaIdleMs: true, protocol.MetaRunID: true, protocol.MetaAttemptID: true, protocol.MetaFence: true,
		protocol.MetaAdapter: true, protocol.MetaTarget: true, protocol.MetaProviderHealth: true, protocol.MetaLivenessClassification: true}
	for k := range meta {
		if !allowed[k] {
			t.Fatalf("H3: metadata key %q is not allow-listed", k)
		}
	}
	if len(meta) != len(allowed) || meta[protocol.MetaFence] != fence || meta[protocol.MetaProviderHealth] != health {
		b, _ := json.Marshal(meta)
		t.Fatalf("H3: metadata %s, want all %d allow-listed keys with fence %s health %s", b, len(allowed), fence, health)
	}
}

// H7: a fenced provider call that ignores its cancel. The terminal still
// goes out once the close grace is over — the stall terminal with fence
// "unconfirmed", or the cancel / timeout terminal that came first — but
// the capacity slot stays taken, and Run / Tunnel do not return, until the
// call finally returns; nothing follows the terminal. H1: the grace and
// the probe run side by side.
func TestFencedCallKeepsSlot(t *testing.T) {
	type row struct {
		name       string
		tunnel     bool
		timeoutSec int64
		cancelAt   time.Duration
		grace      time.Duration // Options.StallCloseGrace; 0 = 2 s
		probe      string
		probeTO    time.Duration
		code       string
		at         time.Duration
		health     string // stall rows
	}
	rows := []row{
		{name: "H7 run stalls, call deaf: fence unconfirmed after the 2 s grace", code: protocol.CodeResponseStalled.String(), at: 12 * time.Second, health: "available"},
		{name: "H7 tunnel stalls, call deaf", tunnel: true, code: protocol.CodeResponseStalled.String(), at: 12 * time.Second, health: "available"},
		{name: "H7 Options.StallCloseGrace bounds the wait", grace: 500 * time.Millisecond, code: protocol.CodeResponseStalled.String(),
			at: 10500 * time.Millisecond, health: "available"},
		{name: "H1 grace 2 s and a 3 s probe side by side: terminal at +3 s, not +5 s", probe: "hang", probeTO: 3 * time.Second,
			code: protocol.CodeResponseStalled.String(), at: 13 * time.Second, health: "unknown"},
		{name: "H1 H6 a probe slower than the grace does not confirm the fence", tunnel: true, probe: "hang", probeTO: 3 * time.Second,
			code: protocol.CodeResponseStalled.String(), at: 13 * time.Second, health: "unknown"},
		{name: "H7 cancel first, call deaf: CANCELLED after the grace", cancelAt: 5 * time.Second, code: protocol.CodeCancelled.String(), at: 7 * time.Second},
		{name: "H7 deadline first, call deaf: timeout after the grace", tunnel: true, timeoutSec: 4, code: protocol.CodeTimeout.String(), at: 6 * time.Second},
	}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			synctest.Test(t, func(t *testing.T) {
				hold := make(chan struct{})
				var chats atomic.Int32
				client := pipeClient(t, upstream(plan{chunks: 2, hold: hold, probe: tc.probe}, &chats), true)
				s := newSet(t, adapter.Options{HTTPClient: client, StallCloseGrace: tc.grace, ProbeTimeout: tc.probeTO},
					compatAdapter("llama", llamaProfile("http://upstream"), 1))
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				if tc.cancelAt > 0 {
					stop := time.AfterFunc(tc.cancelAt, func() { cancel(errors.New("CancelRequest")) })
					defer stop.Stop()
				}
				start := time.Now()
				k := knobs{tunnel: tc.tunnel, adapter: "llama", stallMs: 10000, timeoutSec: tc.timeoutSec}
				f := fly(ctx, s, "run-1", k, nil)
				<-f.ended
				if got := f.endedAt.Sub(start); got != tc.at {
					t.Errorf("terminal after %v, want %v", got, tc.at)
				}
				code, fail, meta, _ := f.end(t)
				if code != tc.code {
					t.Fatalf("got %s, want %s", code, tc.code)
				}
				if tc.health != "" {
					checkStallTerminal(t, fail, meta, "run-1", tc.health, protocol.FenceUnconfirmed)
				} else if fail != nil {
					t.Fatalf("H4, H7: the terminal that came first carries Failure %v", fail)
				}
				time.Sleep(time.Hour) // on the bubble's clock: however long the call takes
				synctest.Wait()
				select {
				case <-f.returned:
					t.Fatal("H7: returned while the provider call still runs")
				default:
				}
				busy := fly(context.Background(), s, "run-2", knobs{adapter: "llama"}, nil)
				<-busy.returned
				if code, _, _, _ := busy.end(t); code != protocol.CodeOverCapacity.String() {
					t.Fatalf("H7: a request while the fenced call runs got %s, want over_capacity (slot still owned)", code)
				}
				f.mu.Lock()
				n := len(f.events) + len(f.frames)
				f.mu.Unlock()
				close(hold) // the provider call finally returns
				<-f.returned
				if got := len(f.events) + len(f.frames); got != n {
					t.Fatalf("E3, T2: %d events or frames after the terminal", got-n)
				}
				last, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Operation: protocol.OpModels}))
				if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END {
					t.Fatalf("H7: after the call returned got %v %q, want END (slot back)", last.GetKind(), last.GetFailureCode())
				}
				if n := chats.Load(); n != 1 {
					t.Errorf("H6: %d chat requests, want 1 (no retry)", n)
				}
			})
		})
	}
}

// E4, Q2, H7: when the stalled call returned within the grace, the slot
// is back before the stall terminal goes out: the Edge may dispatch the
// next request on it at once, sent here from inside emit.
func TestConfirmedStallReturnsSlotFirst(t *testing.T) {
	for _, tunnel := range []bool{false, true} {
		name := "E4 run"
		if tunnel {
			name = "E4 tunnel"
		}
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			synctest.Test(t, func(t *testing.T) {
				var chats atomic.Int32
				client := pipeClient(t, upstream(plan{chunks: 1}, &chats), false)
				s := newSet(t, adapter.Options{HTTPClient: client}, compatAdapter("llama", llamaProfile("http://upstream"), 1))
				var next []*iop.ProviderTunnelFrame
				f := fly(context.Background(), s, "run-1", knobs{tunnel: tunnel, adapter: "llama", stallMs: 1000}, func() {
					next = tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Operation: protocol.OpModels})
				})
				<-f.returned
				code, fail, meta, _ := f.end(t)
				if code != protocol.CodeResponseStalled.String() {
					t.Fatalf("got %s, want response_stalled", code)
				}
				checkStallTerminal(t, fail, meta, "run-1", "available", protocol.FenceConfirmed)
				if last, _, _, _ := checkTunnel(t, next); last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END {
					t.Fatalf("E4: request sent at the stall terminal got %v %q, want END", last.GetKind(), last.GetFailureCode())
				}
			})
		})
	}
}

// H1 over real loopback sockets (no bubble): an httptest upstream that
// stalls after one chunk ends the tunnel with the stall terminal.
func TestStallOverLoopback(t *testing.T) {
	leakcheck.Check(t)
	var chats atomic.Int32
	up := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		upstream(plan{chunks: 1}, &chats).ServeHTTP(w, r)
	})
	s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
	started := time.Now()
	frs := tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: protocol.OpChatCompletions,
		Body: []byte(`{}`), ResponseStallTimeoutMs: 100})
	last, _, body, _ := checkTunnel(t, frs)
	if last.GetFailureCode() != protocol.CodeResponseStalled.String() || string(body) != sseTok {
		t.Fatalf("got %v %q after %q, want the stall ERROR after one chunk", last.GetKind(), last.GetFailureCode(), body)
	}
	checkStallTerminal(t, last.GetFailure(), last.GetMetadata(), "tun-1", "available", protocol.FenceConfirmed)
	if d := time.Since(started); d < 100*time.Millisecond || d > 5*time.Second {
		t.Fatalf("H1: stall terminal after %v, want ≥ 100 ms and well under the 2 s grace + probe", d)
	}
}
