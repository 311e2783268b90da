package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"iop/internal/edge/exchange"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	"iop/internal/sse"
	iop "iop/proto/gen/iop"
)

// Q3, Q6, T5: an ollama lease gets a RunRequest with the normalized input,
// the adapter, target and stall timeout of the lease, and the client gets a
// chat.completion naming its own model.
func TestRunDispatchNonStream(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOllama, nil)
	r.st.run(evStart(), evDelta(2, "Hello"), evComplete(3, "Hello", "stop", usage(3, 1), nil))
	body := `{"model":"tiny","messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],` +
		`"max_tokens":9,"max_completion_tokens":7,"temperature":0.2,"stop":"END","seed":4}`
	resp, got := r.do(t, "POST", "/v1/chat/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	checkCompletion(t, []byte(got), 0, "stop")
	req := r.d.lastRun()
	if req == nil {
		t.Fatal("no RunRequest")
	}
	if req.Adapter != "prov" || req.Target != "tiny:latest" || req.ResponseStallTimeoutMs != 60000 {
		t.Errorf("Q3/Q6 fields: adapter %q target %q stall %d", req.Adapter, req.Target, req.ResponseStallTimeoutMs)
	}
	in := req.Input
	if len(in.Messages) != 2 || in.Messages[0].Role != "system" || in.Messages[1].Content != "a\nb" ||
		in.MaxTokens != 7 || in.GetTemperature() != 0.2 || len(in.Stop) != 1 || in.Stop[0] != "END" || in.GetSeed() != 4 {
		t.Errorf("normalized input: %v", in)
	}
	checkOneOutcome(t, r, 0)
}

// readEvents reads SSE events from body until n were read.
func readEvents(t *testing.T, rd *sse.Reader, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		ev, err := rd.Next()
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, string(ev.Data))
	}
	return out
}

// T5: every chunk is flushed as produced: the client reads the role and the
// first delta before the run produces more.
func TestRunStreamFlushedPerChunk(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOllama, nil)
	r.st.run(evStart(), evDelta(2, "Hel"))
	resp := r.send(t, context.Background(), "POST", "/v1/chat/completions",
		`{"model":"tiny","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, ct)
	}
	rd := sse.NewReader(resp.Body, sse.DefaultMaxLine)
	first := readEvents(t, rd, 2)
	if !strings.Contains(first[0], `"role":"assistant"`) || !strings.Contains(first[1], `"content":"Hel"`) {
		t.Fatalf("first events: %q", first)
	}
	r.st.run(evDelta(3, "lo"), evComplete(4, "", "stop", usage(2, 2), nil))
	rest := readEvents(t, rd, 4)
	if !strings.Contains(rest[0], `"content":"lo"`) || !strings.Contains(rest[1], `"finish_reason":"stop"`) ||
		!strings.Contains(rest[2], `"choices":[],"usage":{"prompt_tokens":2`) || rest[3] != "[DONE]" {
		t.Errorf("rest: %q", rest)
	}
	var all bytes.Buffer
	for _, e := range append(first, rest...) {
		all.WriteString("data: " + e + "\n\n")
	}
	checkChatStream(t, all.Bytes(), true, 0, "stop", false)
	checkOneOutcome(t, r, 0)
}

// T5, H1: run failures: before any byte a status in OpenAI shape, after
// bytes an error event; the lease goes back once.
func TestRunFailures(t *testing.T) {
	stalled := &iop.RunEvent{Seq: 2, Type: iop.RunEventType_RUN_EVENT_ERROR, FailureCode: protocol.CodeResponseStalled.String(), Error: "stalled",
		Failure: &iop.ExecutionFailure{Code: protocol.CodeResponseStalled.String(), IdleMs: 60000}}
	rows := []struct {
		name     string
		body     string
		events   []*iop.RunEvent
		recvErr  error
		startErr error
		want     int
		contains string
		noStream bool // refused before a stream started
	}{
		{name: "H1 stall before any byte is 504", body: chatBody, events: []*iop.RunEvent{evStart(), stalled}, want: 504, contains: "60000 ms"},
		{name: "T5 upstream 400 passes through", body: chatBody,
			events: []*iop.RunEvent{{Seq: 1, Type: iop.RunEventType_RUN_EVENT_ERROR, Error: "context exceeded", Message: "context exceeded", UpstreamStatus: 400, FailureCode: "upstream_error"}},
			want:   400, contains: "context exceeded"},
		{name: "T5 upstream 404 is a provider failure", body: chatBody,
			events: []*iop.RunEvent{{Seq: 1, Type: iop.RunEventType_RUN_EVENT_ERROR, Error: "model not found", UpstreamStatus: 404}}, want: 502},
		{name: "T5 run cancelled by the node is 502", body: chatBody,
			events: []*iop.RunEvent{{Seq: 1, Type: iop.RunEventType_RUN_EVENT_CANCELLED}}, want: 502},
		{name: "T5 ERROR mid-stream is an error event", body: `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`,
			events: []*iop.RunEvent{evStart(), evDelta(2, "a"), evError(3, "upstream_error", "boom")}, want: 200, contains: `data: {"error":{"message":"the provider failed to answer"`},
		{name: "T5 session lost mid-stream is an error event", body: `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`,
			events: []*iop.RunEvent{evStart(), evDelta(2, "a")}, recvErr: dispatch.ErrSessionLost, want: 200, contains: `"code":"provider_lost"`},
		{name: "a dispatch that met a node closing after its drain is 503", body: chatBody,
			recvErr: dispatch.ErrNodeDrained, want: 503, contains: `"code":"node_shutdown"`},
		{name: "E3 a stream out of order before any byte is 502", body: chatBody,
			events: []*iop.RunEvent{evStart()}, recvErr: dispatch.ErrProtocol, want: 502, contains: `"code":"provider_protocol_error"`},
		{name: "E3 a stream out of order mid-stream is an error event", body: `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`,
			events: []*iop.RunEvent{evStart(), evDelta(2, "a")}, recvErr: dispatch.ErrProtocol, want: 200, contains: `"code":"provider_protocol_error"`},
		{name: "DELTAs past exchange.MaxRunText fail the run", body: chatBody,
			events: append([]*iop.RunEvent{evStart()}, bigDeltas(2, exchange.MaxRunText/(1<<20)+1, 1<<20)...), want: 502, contains: "exceeded"},
		{name: "T5 reasoning DELTAs past exchange.MaxRunText fail the run too", body: chatBody,
			events: append([]*iop.RunEvent{evStart()}, bigReasoning(2, exchange.MaxRunText/(1<<20)+1, 1<<20)...), want: 502, contains: "answer exceeded"},
		{name: "a field the node's driver cannot honour is a 400 naming it in param", body: chatBody,
			events: []*iop.RunEvent{{Seq: 1, Type: iop.RunEventType_RUN_EVENT_ERROR, FailureCode: protocol.CodeInvalidRequest.String(), Param: "tool_choice",
				Error:   `adapter "ollama": invalid run input: tool_choice "required" cannot be enforced by Ollama's /api/chat`,
				Message: `tool_choice "required" cannot be enforced by Ollama's /api/chat`}},
			want: 400, contains: `{"error":{"message":"invalid request: tool_choice \"required\" cannot be enforced by Ollama's /api/chat","type":"invalid_request_error","param":"tool_choice"`},
		{name: "Q2 dispatch to a node that is gone is 502", body: chatBody, startErr: dispatch.ErrNotReady, want: 502, contains: "no longer connected", noStream: true},
		{name: "Q3 non-text content on the run path is 400", body: `{"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			want: 400, contains: "image_url", noStream: true},
		{name: "Q3 unknown role is 400", body: `{"model":"tiny","messages":[{"role":"robot","content":"x"}]}`, want: 400, contains: "messages[0].role", noStream: true},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newRig(t, protocol.TypeOllama, nil)
			r.d.err = row.startErr
			r.st.run(row.events...)
			if row.recvErr != nil {
				r.st.ch <- recvItem{err: row.recvErr}
			}
			resp, got := r.do(t, "POST", "/v1/chat/completions", row.body)
			if resp.StatusCode != row.want {
				t.Fatalf("status: got %d, want %d; %s", resp.StatusCode, row.want, got)
			}
			if row.want != 200 {
				checkShape(t, got, false)
			} else if !strings.HasSuffix(got, "}}\n\n") || strings.Contains(got, "[DONE]") {
				t.Errorf("stream must end with the error event and no [DONE]: %q", got)
			}
			if !strings.Contains(got, row.contains) {
				t.Errorf("body %s does not contain %q", got, row.contains)
			}
			r.srv.Close()
			if n := r.fp.releases.Load(); n != 1 {
				t.Errorf("Q2: Release called %d times, want 1", n)
			}
			wantCloses := int32(1)
			if row.noStream {
				wantCloses = 0
			}
			if n := r.st.closes.Load(); n != wantCloses {
				t.Errorf("Close called %d times, want %d", n, wantCloses)
			}
		})
	}
}

// T3, Q2, Q4: a client that leaves at any phase makes the Edge cancel the
// node's work at once (before the first byte too: a long prefill must not
// hide a disconnect), close the stream and return the lease exactly once.
func TestClientDisconnect(t *testing.T) {
	streamBody := `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`
	rows := []struct {
		name   string
		typ    string
		queued bool
		prime  func(s *fakeStream) // what the node sends before the client leaves
		wait   func(t *testing.T, resp *http.Response)
	}{
		{name: "Q4 T3 while queued", typ: protocol.TypeOllama, queued: true},
		{name: "T3 run before the first byte (long prefill)", typ: protocol.TypeOllama,
			prime: func(s *fakeStream) { s.run(evStart()) }},
		{name: "T3 run mid-stream", typ: protocol.TypeOllama,
			prime: func(s *fakeStream) { s.run(evStart(), evDelta(2, "partial")) },
			wait: func(t *testing.T, resp *http.Response) {
				readEvents(t, sse.NewReader(resp.Body, sse.DefaultMaxLine), 2)
			}},
		{name: "T3 tunnel before the first byte", typ: protocol.TypeOpenAICompat,
			prime: func(s *fakeStream) { s.frames(fStart(200, "Content-Type", "text/event-stream")) }},
		{name: "T3 tunnel mid-stream", typ: protocol.TypeOpenAICompat,
			prime: func(s *fakeStream) {
				s.frames(fStart(200, "Content-Type", "text/event-stream"), fBody([]byte("data: 1\n\n")))
			},
			wait: func(t *testing.T, resp *http.Response) {
				readEvents(t, sse.NewReader(resp.Body, sse.DefaultMaxLine), 1)
			}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newRig(t, row.typ, nil)
			r.fp.block = row.queued
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := r.sendAsync(ctx, "/v1/chat/completions", streamBody)
			if row.queued {
				waitClosed(t, r.fp.queued, "the request to queue")
				cancel()
				waitClosed(t, r.fp.left, "the waiter to leave")
				<-done
				r.srv.Close()
				if n := r.fp.releases.Load(); n != 0 || len(r.d.targets) != 0 {
					t.Errorf("left while queued: %d releases, %d dispatches; want 0, 0", n, len(r.d.targets))
				}
				return
			}
			if row.prime != nil {
				row.prime(r.st)
			}
			if row.wait != nil {
				resp := mustResp(t, <-done)
				row.wait(t, resp)
				cancel()
				resp.Body.Close()
			} else {
				waitClosed(t, r.d.started, "dispatch")
				cancel()
				<-done
			}
			waitClosed(t, r.st.cancel, "Cancel")
			checkOneOutcome(t, r, 1)
			if got := r.st.cancelReasons(); got[0] != "client_disconnected" {
				t.Errorf("cancel reason: got %q", got)
			}
		})
	}
}

func mustResp(t *testing.T, r result) *http.Response {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.resp
}

// countingPool counts Release calls on a real pool.
type countingPool struct {
	*pool.Pool
	releases chan bool
}

func (p *countingPool) Release(l *pool.Lease) bool {
	ok := p.Pool.Release(l)
	p.releases <- ok
	return ok
}

// Q2, L8, T3: a lease fenced mid-request (real pool) ends the request with
// one error outcome, cancels the node's work, and the handler's Release is
// a no-op because the fence already returned the lease.
func TestFencedLease(t *testing.T) {
	for _, midStream := range []bool{false, true} {
		name := "Q2 fenced before the first byte is 502"
		if midStream {
			name = "Q2 fenced mid-stream ends with one error event"
		}
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			k := pool.Key{Node: "n1", Provider: "ollama"}
			p := pool.New(pool.Config{
				Nodes:     []string{"n1"},
				Resources: []pool.Resource{{Key: k, Type: protocol.TypeOllama, Capacity: 1, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}}},
				Groups:    []pool.Group{{Name: "tiny", Candidates: []pool.Candidate{{Key: k, Target: "tiny:latest"}}}},
			}, nil)
			if !p.NodeReady("n1", 1) {
				t.Fatal("NodeReady")
			}
			cp := &countingPool{Pool: p, releases: make(chan bool, 4)}
			r := &rig{p: cp, fp: newFakePool(""), st: newFakeStream("run-f"), cfg: testConfig(nil)}
			r.d = newFakeDispatcher(r.st)
			r.start(t)
			r.st.run(evStart())
			if midStream {
				r.st.run(evDelta(2, "partial"))
			}
			resps := r.sendAsync(context.Background(), "/v1/chat/completions",
				`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`)
			var resp *http.Response
			if midStream {
				resp = mustResp(t, <-resps)
				readEvents(t, sse.NewReader(resp.Body, sse.DefaultMaxLine), 2)
			} else {
				waitClosed(t, r.d.started, "dispatch")
			}
			if n := p.NodeFenced("n1", 1); n != 1 {
				t.Fatalf("NodeFenced returned %d leases, want 1", n)
			}
			if resp == nil {
				resp = mustResp(t, <-resps)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if midStream {
				evs := readEvents(t, sse.NewReader(bytes.NewReader(b), sse.DefaultMaxLine), 1)
				if !strings.Contains(evs[0], `"code":"provider_lost"`) || strings.Contains(string(b), "[DONE]") {
					t.Errorf("after fence: %q", b)
				}
			} else if resp.StatusCode != 502 {
				t.Errorf("status: got %d, want 502; %s", resp.StatusCode, b)
			}
			select {
			case ok := <-cp.releases:
				if ok {
					t.Error("Release returned true for a fenced lease; the fence must have returned it")
				}
			case <-time.After(waitFor):
				t.Fatal("Release not called")
			}
			r.srv.Close()
			if len(cp.releases) != 0 {
				t.Error("Release called more than once")
			}
			if leases, _ := p.Stats(); leases != 0 {
				t.Errorf("leases held: %d, want 0", leases)
			}
			if got := r.st.cancelReasons(); len(got) != 1 || got[0] != "fenced" {
				t.Errorf("cancels: %q, want [fenced]", got)
			}
		})
	}
}

// T3: a node that goes silent (no terminal within the stall timeout plus
// the grace) is cancelled by the Edge's response-wait timer: 504 before any
// byte, an error event after.
func TestResponseWaitTimeout(t *testing.T) {
	for _, midStream := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			fp := newFakePool(protocol.TypeOllama)
			fp.lease.StallTimeoutMs = 1000
			st := newFakeStream("run-w")
			cfg := testConfig(nil)
			h := New(Options{Config: func() *config.Config { return cfg }, Pool: fp, Dispatcher: newFakeDispatcher(st),
				Now: fixedNow, NewID: seqIDs(), ResponseWaitGrace: time.Second})
			st.run(evStart())
			if midStream {
				st.run(evDelta(2, "x"))
			}
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("POST", "/v1/chat/completions",
				strings.NewReader(`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`))
			t0 := time.Now()
			h.ServeHTTP(rec, req)
			if waited := time.Since(t0); waited != 2*time.Second {
				t.Errorf("gave up after %v, want 2s (stall 1s + grace 1s)", waited)
			}
			if midStream {
				if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"code":"response_timeout"`) {
					t.Errorf("mid-stream: %d %s", rec.Code, rec.Body)
				}
			} else if rec.Code != 504 {
				t.Errorf("status: got %d, want 504; %s", rec.Code, rec.Body)
			}
			if got := st.cancelReasons(); len(got) != 1 || got[0] != "response_wait_timeout" {
				t.Errorf("cancels: %q", got)
			}
			synctest.Wait() // the cancelled stream's lease is released once the node's terminal arrives
			waitReleased(t, fp, st)
		})
	}
}

// Q3: a lease whose type cannot serve the endpoint (one of a type this
// Edge does not know) is refused in the surface's shape and still released
// once.
func TestLeaseTypeCannotServeEndpoint(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, "vllm_native", nil)
	resp, got := r.do(t, "POST", "/v1/completions", `{"model":"tiny","prompt":"hi"}`)
	if resp.StatusCode != 502 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	checkShape(t, got, false)
	r.srv.Close()
	if r.fp.releases.Load() != 1 || len(r.d.targets) != 0 {
		t.Errorf("releases %d dispatches %d, want 1 0", r.fp.releases.Load(), len(r.d.targets))
	}
}

// T5: the usage observed on a run's COMPLETE reaches OnUsage.
func TestRunUsageObserved(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOllama, map[string]string{"p": "k"})
	got := make(chan string, 1)
	r.h.o.OnUsage = func(p, m string, u *iop.Usage) {
		b, _ := json.Marshal(map[string]any{"p": p, "m": m, "t": u.TotalTokens})
		got <- string(b)
	}
	r.st.run(evStart(), evComplete(2, "ok", "stop", usage(1, 2), nil))
	r.do(t, "POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer k")
	if s := <-got; s != `{"m":"tiny","p":"p","t":3}` {
		t.Errorf("OnUsage: %s", s)
	}
}

// failingWriter fails every Write after the first n, like a connection the
// client dropped while its context has not noticed yet.
type failingWriter struct {
	discardWriter
	n int
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.n == 0 {
		return 0, io.ErrClosedPipe
	}
	w.n--
	return len(p), nil
}

// T3, Q2: a failed write to the client cancels the node's work at once and
// returns the lease once; nothing more is written.
func TestWriteFailureCancels(t *testing.T) {
	for _, typ := range []string{protocol.TypeOllama, protocol.TypeOpenAICompat} {
		t.Run("T3 "+typ, func(t *testing.T) {
			leakcheck.Check(t)
			fp := newFakePool(typ)
			st := newFakeStream("run-wf")
			st.run(evStart(), evDelta(2, "a"))
			st.frames(fStart(200, "Content-Type", "text/event-stream"), fBody([]byte("data: 1\n\n")))
			cfg := testConfig(nil)
			h := New(Options{Config: func() *config.Config { return cfg }, Pool: fp, Dispatcher: newFakeDispatcher(st), Now: fixedNow, NewID: seqIDs()})
			w := &failingWriter{discardWriter: discardWriter{h: http.Header{}}}
			req := httptest.NewRequest("POST", "/v1/chat/completions",
				strings.NewReader(`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`))
			h.ServeHTTP(w, req)
			if got := st.cancelReasons(); len(got) != 1 || got[0] != "write_failed" {
				t.Errorf("cancels: %q, want [write_failed]", got)
			}
			waitReleased(t, fp, st)
		})
	}
}

// waitReleased waits until the stream was closed and the lease released,
// each exactly once. A cancelled stream's lease is released by the
// Handler's drain after the node's terminal (SPEC Q2, E4), so it may come
// after ServeHTTP returned.
func waitReleased(t *testing.T, fp *fakePool, st *fakeStream) {
	t.Helper()
	select {
	case <-st.closed:
	case <-time.After(waitFor):
		t.Fatal("stream not closed")
	}
	deadline := time.Now().Add(waitFor)
	for fp.releases.Load() == 0 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if fp.releases.Load() != 1 || st.closes.Load() != 1 {
		t.Errorf("releases %d closes %d, want 1 1", fp.releases.Load(), st.closes.Load())
	}
}

// Q2, E4: a cancelled stream keeps its lease until the node's terminal
// arrives (the node's capacity gate still counts the call until then), and
// releases it after CancelDrainTimeout when no terminal comes.
func TestCancelledLeaseWaitsForTerminal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fp := newFakePool(protocol.TypeOllama)
		st := newFakeStream("run-d")
		st.noTerminalOnCancel = true
		cfg := testConfig(nil)
		h := New(Options{Config: func() *config.Config { return cfg }, Pool: fp, Dispatcher: newFakeDispatcher(st),
			Now: fixedNow, NewID: seqIDs(), CancelDrainTimeout: 3 * time.Second})
		st.run(evStart(), evDelta(2, "a"))
		w := &failingWriter{discardWriter: discardWriter{h: http.Header{}}}
		req := httptest.NewRequest("POST", "/v1/chat/completions",
			strings.NewReader(`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`))
		h.ServeHTTP(w, req)
		synctest.Wait()
		if n := fp.releases.Load(); n != 0 {
			t.Fatalf("Q2: released %d times before the node's terminal, want 0", n)
		}
		st.run(&iop.RunEvent{Seq: 3, Type: iop.RunEventType_RUN_EVENT_CANCELLED})
		synctest.Wait()
		if n := fp.releases.Load(); n != 1 {
			t.Fatalf("Q2: released %d times after the terminal, want 1", n)
		}

		fp2 := newFakePool(protocol.TypeOllama)
		st2 := newFakeStream("run-e")
		st2.noTerminalOnCancel = true
		h2 := New(Options{Config: func() *config.Config { return cfg }, Pool: fp2, Dispatcher: newFakeDispatcher(st2),
			Now: fixedNow, NewID: seqIDs(), CancelDrainTimeout: 3 * time.Second})
		st2.run(evStart(), evDelta(2, "a"))
		w2 := &failingWriter{discardWriter: discardWriter{h: http.Header{}}}
		req2 := httptest.NewRequest("POST", "/v1/chat/completions",
			strings.NewReader(`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`))
		h2.ServeHTTP(w2, req2)
		time.Sleep(2 * time.Second) // synctest: fake time
		synctest.Wait()
		if n := fp2.releases.Load(); n != 0 {
			t.Fatalf("released %d times before the drain timeout, want 0", n)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := fp2.releases.Load(); n != 1 {
			t.Fatalf("released %d times after the drain timeout, want 1", n)
		}
	})
}

// bigDeltas returns n DELTA events of size bytes each, from seq.
// bigReasoning is n DELTAs of size bytes of reasoning each.
func bigReasoning(seq uint64, n, size int) []*iop.RunEvent {
	out := bigDeltas(seq, n, size)
	for _, ev := range out {
		ev.ReasoningDelta, ev.Delta = ev.Delta, ""
	}
	return out
}

func bigDeltas(seq uint64, n, size int) []*iop.RunEvent {
	text := strings.Repeat("x", size)
	out := make([]*iop.RunEvent, n)
	for i := range out {
		out[i] = evDelta(seq+uint64(i), text)
	}
	return out
}
