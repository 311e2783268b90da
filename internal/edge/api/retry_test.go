package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iop/internal/edge/exchange"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// outlierRec records the passive-health verdicts the surface reports.
type outlierRec struct {
	mu       sync.Mutex
	failures []failureRec
	suspects []suspectRec
	oks      []pool.Key
}

type suspectRec struct {
	k         pool.Key
	r         outlier.Reason
	principal string
}

type failureRec struct {
	k          pool.Key
	r          outlier.Reason
	retryAfter time.Duration
}

func (o *outlierRec) Failure(k pool.Key, r outlier.Reason, retryAfter time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures = append(o.failures, failureRec{k, r, retryAfter})
}

func (o *outlierRec) Suspect(k pool.Key, r outlier.Reason, principal string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.suspects = append(o.suspects, suspectRec{k, r, principal})
}

func (o *outlierRec) Success(k pool.Key) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.oks = append(o.oks, k)
}

func (o *outlierRec) get() ([]failureRec, []pool.Key) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]failureRec(nil), o.failures...), append([]pool.Key(nil), o.oks...)
}

// failure is one way the first provider fails before the first byte, on
// the run path (events) and on the tunnel path (frames).
type failure struct {
	name       string
	events     []*iop.RunEvent
	frames     []*iop.ProviderTunnelFrame
	reason     string          // iop_edge_request_retries_total label
	eject      *outlier.Reason // the passive-health failure reported, nil = none
	retryAfter time.Duration
}

func reasonPtr(r outlier.Reason) *outlier.Reason { return &r }

func runStatus(status int32, retryAfterMs int64, msg string) *iop.RunEvent {
	ev := evError(2, protocol.CodeUpstreamStatus.String(), `adapter "ollama": upstream status `+msg)
	_, ev.Message, _ = strings.Cut(msg, ": ") // the upstream's own message, as the node sends it
	ev.UpstreamStatus, ev.RetryAfterMs = status, retryAfterMs
	return ev
}

func tunnelStatus(status int32, body string, hdr ...string) []*iop.ProviderTunnelFrame {
	return []*iop.ProviderTunnelFrame{fStart(status, append([]string{"Content-Type", "application/json"}, hdr...)...),
		fBody([]byte(body)), fEnd()}
}

// failures is the table of failure kinds. The idle-close
// race reaches the Edge as upstream_reset: the node never resends a POST it
// wrote (internal/node/adapter/client.go).
func failures() []failure {
	sf := stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1)
	return []failure{
		{name: "connect refused", events: []*iop.RunEvent{evStart(), evError(2, protocol.CodeUpstreamConnect.String(), `adapter "ollama": dial tcp 10.0.0.1:11434: connect: connection refused`)},
			frames: []*iop.ProviderTunnelFrame{fError(protocol.CodeUpstreamConnect.String(), "dial tcp: connection refused")},
			reason: "connect", eject: reasonPtr(outlier.ReasonConnect)},
		{name: "reset before the first byte", events: []*iop.RunEvent{evStart(), evError(2, protocol.CodeUpstreamReset.String(), "EOF")},
			frames: []*iop.ProviderTunnelFrame{fError(protocol.CodeUpstreamReset.String(), "connection reset by peer")},
			reason: "reset", eject: reasonPtr(outlier.ReasonReset)},
		{name: "idle-close race (upstream_reset)", events: []*iop.RunEvent{evStart(), evError(2, protocol.CodeUpstreamReset.String(), "server closed idle connection")},
			frames: []*iop.ProviderTunnelFrame{fError(protocol.CodeUpstreamReset.String(), "server closed idle connection")},
			reason: "reset", eject: reasonPtr(outlier.ReasonReset)},
		{name: "500", events: []*iop.RunEvent{evStart(), runStatus(500, 0, "500: boom")},
			frames: tunnelStatus(500, `{"error":{"message":"boom"}}`), reason: "status", eject: reasonPtr(outlier.ReasonStatus)},
		{name: "502", events: []*iop.RunEvent{evStart(), runStatus(502, 0, "502: bad gateway")},
			frames: tunnelStatus(502, `{"error":{"message":"bad gateway"}}`), reason: "status", eject: reasonPtr(outlier.ReasonStatus)},
		{name: "503", events: []*iop.RunEvent{evStart(), runStatus(503, 0, "503: Loading model")},
			frames: tunnelStatus(503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`),
			reason: "status", eject: reasonPtr(outlier.ReasonStatus)},
		{name: "429 with Retry-After", events: []*iop.RunEvent{evStart(), runStatus(429, 5000, "429: slow down")},
			frames: tunnelStatus(429, `{"error":{"message":"slow down"}}`, "Retry-After", "5"),
			reason: "rate_limited", eject: reasonPtr(outlier.ReasonRateLimited), retryAfter: 5 * time.Second},
		{name: "429 without Retry-After", events: []*iop.RunEvent{evStart(), runStatus(429, 0, "429: slow down")},
			frames: tunnelStatus(429, `{"error":{"message":"slow down"}}`), reason: "rate_limited", eject: reasonPtr(outlier.ReasonRateLimited)},
		{name: "stall", events: []*iop.RunEvent{evStart(), evStall(2, sf)},
			frames: []*iop.ProviderTunnelFrame{fStart(200, "Content-Type", "text/event-stream"), fStall(sf)}, reason: "stall"},
		{name: "upstream error after the response head, before any byte reached the client", events: []*iop.RunEvent{evStart(), evError(2, protocol.CodeUpstreamError.String(), "stream ended before done")},
			frames: []*iop.ProviderTunnelFrame{fStart(200, "Content-Type", "application/json"), fError(protocol.CodeUpstreamError.String(), "unexpected EOF")},
			reason: "provider_error"},
		{name: "node capacity gate", events: []*iop.RunEvent{evStart(), evError(2, protocol.CodeOverCapacity.String(), "at capacity")},
			frames: []*iop.ProviderTunnelFrame{fError(protocol.CodeOverCapacity.String(), "at capacity")}, reason: "over_capacity"},
		{name: "the node's drain timeout", events: []*iop.RunEvent{evStart(), evError(2, protocol.CodeNodeShutdown.String(), "run cancelled: the node is shutting down")},
			frames: []*iop.ProviderTunnelFrame{fError(protocol.CodeNodeShutdown.String(), "tunnel cancelled: the node is shutting down")}, reason: "node_lost"},
	}
}

// retryRig is a Handler on a real HTTP server with a leasePool, a
// streamDispatcher, a health Tracker and an outlier recorder.
type retryRig struct {
	p   *leasePool
	d   *streamDispatcher
	out *outlierRec
	h   *Handler
	srv *httptest.Server
}

func newRetryRig(t *testing.T, cfg *config.Config, o Options, leases ...*pool.Lease) *retryRig {
	t.Helper()
	r := &retryRig{p: &leasePool{leases: leases, err: pool.ErrWaitTimeout}, d: &streamDispatcher{}, out: &outlierRec{}}
	o.Config = func() *config.Config { return cfg }
	o.Pool, o.Dispatcher, o.Outlier = r.p, r.d, r.out
	o.Now, o.NewID = fixedNow, seqIDs()
	if o.Health == nil {
		o.Health = health.New(health.Options{Overlay: &overlayRec{}})
	}
	r.h = New(o)
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	return r
}

func (r *retryRig) stream(t *testing.T, id string, evs []*iop.RunEvent, frs []*iop.ProviderTunnelFrame) {
	st := newFakeStream(id)
	t.Cleanup(st.kill)
	st.run(evs...)
	st.frames(frs...)
	if len(evs)+len(frs) == 0 {
		st.kill() // a dispatch that must not happen fails fast
	}
	r.d.mu.Lock()
	r.d.streams = append(r.d.streams, st)
	r.d.mu.Unlock()
}

func (r *retryRig) post(t *testing.T, path, body string) (*http.Response, string) {
	t.Helper()
	resp, err := r.srv.Client().Post(r.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

func (r *retryRig) retries(reason string) float64 {
	return r.h.Metrics()[0].Samples()[`reason="`+reason+`"`]
}

// SPEC H11, Q2: a provider that fails before the first byte
// never costs the client its answer while another provider could give
// it. For every failure kind × path (run, tunnel) × stream/non-stream,
// with two providers: the client gets the second provider's answer, with
// exactly one terminal; the request went to each provider once (the second
// Acquire excluded the first); each lease went back exactly once; passive
// health heard the first provider's failure (for the ejecting kinds) and
// the second's success; the retry counter names the reason.
func TestRedispatchEveryFailureKind(t *testing.T) {
	const chatStream = `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, f := range failures() {
		for _, path := range []string{protocol.TypeOllama, protocol.TypeOpenAICompat} {
			for _, stream := range []bool{false, true} {
				name := "H11 " + f.name + " run"
				if path == protocol.TypeOpenAICompat {
					name = "H11 " + f.name + " tunnel"
				}
				body := chatBody
				if stream {
					name += " stream"
					body = chatStream
				}
				t.Run(name, func(t *testing.T) {
					leakcheck.Check(t)
					a, b := withType(leaseA, path), withType(leaseB, path)
					r := newRetryRig(t, retryConfig(2), Options{}, a, b)
					if path == protocol.TypeOllama {
						r.stream(t, "a", f.events, nil)
						r.stream(t, "b", []*iop.RunEvent{evStart(), evDelta(2, "hello"), evComplete(3, "hello", "stop", nil, nil)}, nil)
					} else {
						answer := []*iop.ProviderTunnelFrame{fStart(200, "Content-Type", "application/json"),
							fBody([]byte(`{"choices":[{"message":{"content":"hello"}}]}`)), fEnd()}
						if stream {
							answer = []*iop.ProviderTunnelFrame{fStart(200, "Content-Type", "text/event-stream"),
								fBody([]byte("data: {\"content\":\"hello\"}\n\ndata: [DONE]\n\n")), fEnd()}
						}
						r.stream(t, "a", nil, f.frames)
						r.stream(t, "b", nil, answer)
					}
					resp, got := r.post(t, "/v1/chat/completions", body)
					if resp.StatusCode != 200 || !strings.Contains(got, "hello") || strings.Contains(got, `"error"`) {
						t.Fatalf("got %d %s, want the second provider's answer and no error", resp.StatusCode, got)
					}
					if stream && strings.Count(got, "[DONE]") != 1 {
						t.Errorf("want exactly one terminal [DONE], got %s", got)
					}
					want := []dispatch.Target{{Node: a.Node, Generation: a.Generation}, {Node: b.Node, Generation: b.Generation}}
					if d := r.d.dispatched(); !reflect.DeepEqual(d, want) {
						t.Errorf("dispatched %v, want %v (each provider once)", d, want)
					}
					r.p.checkReleased(t)
					wantExclude := []pool.Key{a.Key}
					if f.reason == "over_capacity" {
						wantExclude = nil // E4: a refusal is no attempt; the provider may take it again
					}
					if reqs := r.p.reqs; len(reqs) != 2 || (len(wantExclude) > 0 || len(reqs[1].Exclude) > 0) && !reflect.DeepEqual(reqs[1].Exclude, wantExclude) {
						t.Errorf("pool requests %+v, want the second to exclude %v", reqs, wantExclude)
					}
					fails, oks := r.out.get()
					var wantFails []failureRec
					if f.eject != nil {
						wantFails = []failureRec{{a.Key, *f.eject, f.retryAfter}}
					}
					if !reflect.DeepEqual(fails, wantFails) {
						t.Errorf("passive health failures %+v, want %+v", fails, wantFails)
					}
					wantOK := []pool.Key{b.Key}
					if path == protocol.TypeOpenAICompat && f.frames[0].Kind == iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START &&
						f.frames[0].Status < 400 {
						wantOK = []pool.Key{a.Key, b.Key} // a 200 head is an answer: the stall or break is not passive health's
					}
					if !reflect.DeepEqual(oks, wantOK) {
						t.Errorf("passive health successes %v, want %v", oks, wantOK)
					}
					if v := r.retries(f.reason); v != 1 {
						t.Errorf("%s{reason=%q} = %v, want 1", MetricRetries, f.reason, v)
					}
				})
			}
		}
	}
}

// when no candidate can answer, the client gets the last
// failure's class in its surface's shape — on the run path 429 with a
// Retry-After, 503, 400 with the upstream's message and never the adapter
// name; on the tunnel path the upstream's own answer with its Retry-After —
// after every provider was tried once and no more.
func TestNoCandidateLeftErrorClass(t *testing.T) {
	rows := []struct {
		name       string
		typ        string
		events     func(seq int) []*iop.RunEvent
		frames     func(seq int) []*iop.ProviderTunnelFrame
		dispatches int
		want       int
		retryAfter string
		contains   []string
		absent     []string
	}{
		{name: "run 429 with Retry-After: 429 with it", typ: protocol.TypeOllama,
			events: func(int) []*iop.RunEvent {
				return []*iop.RunEvent{evStart(), runStatus(429, 5000, "429: quota exceeded")}
			},
			dispatches: 2, want: 429, retryAfter: "5", contains: []string{"quota exceeded", `"type":"rate_limit_error"`},
			absent: []string{`adapter`, "ollama", "upstream status"}},
		{name: "run 429 without Retry-After: 429 with 1 s", typ: protocol.TypeOllama,
			events:     func(int) []*iop.RunEvent { return []*iop.RunEvent{evStart(), runStatus(429, 0, "429: quota exceeded")} },
			dispatches: 2, want: 429, retryAfter: "1", contains: []string{"quota exceeded"}},
		{name: "run 503: 503 with the upstream's message", typ: protocol.TypeOllama,
			events:     func(int) []*iop.RunEvent { return []*iop.RunEvent{evStart(), runStatus(503, 0, "503: Loading model")} },
			dispatches: 2, want: 503, contains: []string{"Loading model"}, absent: []string{"adapter", "upstream status"}},
		{name: "run 400: the client's fault, not re-dispatched, with the upstream's message", typ: protocol.TypeOllama,
			events: func(int) []*iop.RunEvent {
				return []*iop.RunEvent{evStart(), runStatus(400, 0, "400: context too long")}
			},
			dispatches: 1, want: 400, contains: []string{"context too long"}, absent: []string{"adapter", "upstream status"}},
		{name: "run 413: passes through", typ: protocol.TypeOllama,
			events:     func(int) []*iop.RunEvent { return []*iop.RunEvent{evStart(), runStatus(413, 0, "413: too large")} },
			dispatches: 1, want: 413, contains: []string{"too large"}},
		{name: "run connect refused everywhere: 502 without the address", typ: protocol.TypeOllama,
			events: func(int) []*iop.RunEvent {
				return []*iop.RunEvent{evStart(), evError(2, protocol.CodeUpstreamConnect.String(), `adapter "ollama": Post "http://10.0.0.7:11434/api/chat": connection refused`)}
			},
			dispatches: 2, want: 502, contains: []string{"could not be reached"}, absent: []string{"10.0.0.7", "ollama"}},
		{name: "tunnel 429 everywhere: the upstream's 429 and Retry-After", typ: protocol.TypeOpenAICompat,
			frames: func(int) []*iop.ProviderTunnelFrame {
				return tunnelStatus(429, `{"error":{"message":"slow down"}}`, "Retry-After", "7")
			},
			dispatches: 2, want: 429, retryAfter: "7", contains: []string{"slow down"}},
		{name: "tunnel 503 everywhere: the upstream's 503", typ: protocol.TypeOpenAICompat,
			frames: func(int) []*iop.ProviderTunnelFrame {
				return tunnelStatus(503, `{"error":{"code":503,"message":"Loading model"}}`)
			},
			dispatches: 2, want: 503, contains: []string{"Loading model"}},
		{name: "tunnel 400: not re-dispatched, passed through", typ: protocol.TypeOpenAICompat,
			frames: func(int) []*iop.ProviderTunnelFrame {
				return tunnelStatus(400, `{"error":{"message":"bad tools"}}`)
			},
			dispatches: 1, want: 400, contains: []string{"bad tools"}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			a, b := withType(leaseA, row.typ), withType(leaseB, row.typ)
			r := newRetryRig(t, retryConfig(2), Options{}, a, b)
			for i := range 2 {
				if row.events != nil {
					r.stream(t, "s", row.events(i), nil)
				} else {
					r.stream(t, "s", nil, row.frames(i))
				}
			}
			resp, got := r.post(t, "/v1/chat/completions", chatBody)
			if resp.StatusCode != row.want || resp.Header.Get("Retry-After") != row.retryAfter {
				t.Fatalf("got %d Retry-After %q %s, want %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"), got,
					row.want, row.retryAfter)
			}
			for _, c := range row.contains {
				if !strings.Contains(got, c) {
					t.Errorf("body %s lacks %q", got, c)
				}
			}
			for _, c := range row.absent {
				if strings.Contains(got, c) {
					t.Errorf("body %s shows %q", got, c)
				}
			}
			if strings.Count(got, `"error"`) != 1 {
				t.Errorf("want exactly one error outcome, got %s", got)
			}
			if n := len(r.d.dispatched()); n != row.dispatches {
				t.Errorf("%d dispatches, want %d", n, row.dispatches)
			}
			r.p.checkReleased(t)
		})
	}
}

// SPEC H11: never after a byte was written, never beyond the
// group's bound, never when re-dispatch is off, and never the same
// provider twice: a pool with nothing untried left ends it with the last
// failure.
func TestRedispatchBounds(t *testing.T) {
	const chatStream = `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	fail503 := []*iop.RunEvent{evStart(), runStatus(503, 0, "503: busy")}
	ok := []*iop.RunEvent{evStart(), evDelta(2, "hello"), evComplete(3, "hello", "stop", nil, nil)}
	rows := []struct {
		name       string
		cfg        *config.Config
		o          Options
		body       string
		streams    [][]*iop.RunEvent
		leases     int
		allTried   bool // the pool answers ErrAllTried once its leases are used
		want       int
		contains   string
		dispatches int
	}{
		{name: "H11 error after a streamed byte is an error event, no re-dispatch", cfg: retryConfig(2), body: chatStream,
			streams: [][]*iop.RunEvent{{evStart(), evDelta(2, "par"), evError(3, protocol.CodeUpstreamError.String(), "EOF")}, ok},
			leases:  2, want: 200, contains: `data: {"error"`, dispatches: 1},
		{name: "max_attempts 1: no re-dispatch", cfg: func() *config.Config { c := retryConfig(2); c.Models[0].MaxAttempts = 1; return c }(),
			body: chatBody, streams: [][]*iop.RunEvent{fail503, ok}, leases: 2, want: 503, contains: "busy", dispatches: 1},
		{name: "re-dispatch off (RedispatchWait < 0)", cfg: retryConfig(2), o: Options{RedispatchWait: -1},
			body: chatBody, streams: [][]*iop.RunEvent{fail503, ok}, leases: 2, want: 503, contains: "busy", dispatches: 1},
		{name: "three providers: the third answers after two failures", cfg: retryConfig(3), body: chatBody,
			streams: [][]*iop.RunEvent{fail503, {evStart(), evError(2, protocol.CodeUpstreamReset.String(), "EOF")}, ok}, leases: 3, want: 200,
			contains: "hello", dispatches: 3},
		{name: "H11 every untried provider gone: the last failure, at once", cfg: retryConfig(3), body: chatBody,
			streams: [][]*iop.RunEvent{fail503}, leases: 1, allTried: true, want: 503, contains: "busy", dispatches: 1},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			var leases []*pool.Lease
			for i := range row.leases {
				l := withType(leaseA, protocol.TypeOllama)
				l.Node = string(rune('a' + i))
				leases = append(leases, l)
			}
			r := newRetryRig(t, row.cfg, row.o, leases...)
			if row.allTried {
				r.p.err = pool.ErrAllTried
			}
			for _, s := range row.streams {
				r.stream(t, "s", s, nil)
			}
			resp, got := r.post(t, "/v1/chat/completions", row.body)
			if resp.StatusCode != row.want || !strings.Contains(got, row.contains) {
				t.Fatalf("got %d %s, want %d containing %s", resp.StatusCode, got, row.want, row.contains)
			}
			if n := len(r.d.dispatched()); n != row.dispatches {
				t.Errorf("%d dispatches, want %d", n, row.dispatches)
			}
			r.p.checkReleased(t)
			seen := map[pool.Key]bool{}
			for _, req := range r.p.reqs {
				for _, k := range req.Exclude {
					seen[k] = true
				}
			}
			if len(r.p.reqs) > 1 && len(r.p.reqs[len(r.p.reqs)-1].Exclude) != len(r.p.reqs)-1 {
				t.Errorf("the last Acquire excluded %v, want every provider tried before", r.p.reqs[len(r.p.reqs)-1].Exclude)
			}
		})
	}
}

// SPEC Q2, Q4: a client that leaves while its request waits for
// a re-dispatch lease (the first provider failed before the first byte,
// every other one is busy) ends the request quietly: the failed lease went
// back once, before the wait, and nothing else was granted or sent.
func TestClientLeavesDuringRedispatch(t *testing.T) {
	for _, typ := range []string{protocol.TypeOllama, protocol.TypeOpenAICompat} {
		t.Run(typ, func(t *testing.T) {
			leakcheck.Check(t)
			r := newRetryRig(t, retryConfig(2), Options{}, withType(leaseA, typ))
			r.p.block = true
			waiting := make(chan struct{})
			r.p.waiting = waiting
			if typ == protocol.TypeOllama {
				r.stream(t, "s", []*iop.RunEvent{evStart(), runStatus(503, 0, "503: busy")}, nil)
			} else {
				r.stream(t, "s", nil, tunnelStatus(503, `{"error":{"message":"busy"}}`))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
			done := make(chan error, 1)
			go func() {
				resp, err := r.srv.Client().Do(req)
				if err == nil {
					resp.Body.Close()
					err = fmt.Errorf("got %s, want the request cancelled", resp.Status)
				}
				done <- err
			}()
			select {
			case <-waiting:
			case <-time.After(10 * time.Second):
				t.Fatal("the re-dispatch never asked the pool for a second lease")
			}
			r.p.mu.Lock()
			early := r.p.releases[r.p.leases[0]]
			r.p.mu.Unlock()
			if early != 1 {
				t.Errorf("the failed lease was released %d times before the re-dispatch wait, want 1 (its slot is free for others)", early)
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("client: %v, want context.Canceled", err)
			}
			r.srv.Close() // waits for the handler to return
			r.p.checkReleased(t)
			if n := len(r.d.dispatched()); n != 1 {
				t.Errorf("%d dispatches, want 1", n)
			}
			if got := r.retries("status"); got != 0 {
				t.Errorf("retries{status} = %v, want 0 (no second provider was reached)", got)
			}
		})
	}
}

// E4: a node's over-capacity refusal (the other edges hold its capacity)
// is no attempt: the request goes back to the pool with its only provider
// not excluded and max_attempts untouched, the lease goes back as refused
// (ReleaseRefused), passive health hears nothing, and the next lease on
// the same provider answers. A node that refuses every time is answered
// 503 over_capacity after exchange.MaxRefusals.
func TestOverCapacityRequeued(t *testing.T) {
	refusal := []*iop.RunEvent{evStart(), evError(2, protocol.CodeOverCapacity.String(), "at capacity")}
	answer := []*iop.RunEvent{evStart(), evDelta(2, "hello"), evComplete(3, "hello", "stop", nil, nil)}
	for _, refusals := range []int{2, exchange.MaxRefusals + 1} {
		t.Run(fmt.Sprintf("E4 %d refusals", refusals), func(t *testing.T) {
			leakcheck.Check(t)
			var leases []*pool.Lease
			for range refusals + 1 {
				leases = append(leases, withType(leaseA, protocol.TypeOllama))
			}
			r := newRetryRig(t, retryConfig(1), Options{}, leases...)
			for i := range refusals {
				r.stream(t, fmt.Sprint("a", i), refusal, nil)
			}
			r.stream(t, "answer", answer, nil)
			resp, got := r.post(t, "/v1/chat/completions", chatBody)
			served := refusals <= exchange.MaxRefusals
			switch {
			case served && (resp.StatusCode != 200 || !strings.Contains(got, "hello")):
				t.Fatalf("got %d %s, want the answer after %d refusals", resp.StatusCode, got, refusals)
			case !served && (resp.StatusCode != 503 || !strings.Contains(got, `"code":"over_capacity"`)):
				t.Fatalf("got %d %s, want 503 over_capacity after %d refusals", resp.StatusCode, got, exchange.MaxRefusals)
			}
			r.p.checkReleased(t)
			for i, req := range r.p.reqs {
				if len(req.Exclude) != 0 {
					t.Fatalf("pool request %d excludes %v, want nothing excluded", i, req.Exclude)
				}
			}
			wantReqs := refusals + 1
			if !served {
				wantReqs = exchange.MaxRefusals + 1
			}
			if len(r.p.reqs) != wantReqs {
				t.Errorf("%d pool requests, want %d", len(r.p.reqs), wantReqs)
			}
			if r.p.refused != wantReqs-1 {
				t.Errorf("%d leases released as refused, want %d", r.p.refused, wantReqs-1)
			}
			if fails, _ := r.out.get(); len(fails) != 0 {
				t.Errorf("passive health heard %+v, want nothing (no provider cools for a refusal)", fails)
			}
			if v := r.retries("over_capacity"); int(v) != wantReqs-1 {
				t.Errorf("retries{over_capacity} = %v, want %d", v, wantReqs-1)
			}
		})
	}
}
