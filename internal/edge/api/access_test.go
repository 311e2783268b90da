package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"iop/internal/edge/access"
	"iop/internal/edge/config"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	"iop/internal/sse"
	iop "iop/proto/gen/iop"
)

// accessSink is a slog.Handler keeping every record's attributes; wake is
// signalled on each one.
type accessSink struct {
	mu    sync.Mutex
	lines []map[string]any
	wake  chan struct{}
}

func newAccessSink() *accessSink { return &accessSink{wake: make(chan struct{}, 1)} }

func (s *accessSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *accessSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *accessSink) WithGroup(string) slog.Handler            { return s }
func (s *accessSink) Handle(_ context.Context, r slog.Record) error {
	m := map[string]any{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Any()
		return true
	})
	s.mu.Lock()
	s.lines = append(s.lines, m)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// byID returns the access lines of request id.
func (s *accessSink) byID(id string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range s.lines {
		if l["msg"] == access.Msg && l["request_id"] == id {
			out = append(out, l)
		}
	}
	return out
}

// wait waits until request id has an access line (the handler writes it
// after the response) and returns its lines.
func (s *accessSink) wait(t *testing.T, id string) []map[string]any {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		if ls := s.byID(id); len(ls) > 0 {
			return ls
		}
		select {
		case <-s.wake:
		case <-deadline:
			t.Fatalf("no access line for request %s", id)
		}
	}
}

// Response-wait graces of an access rig: a silent node meets the short one
// at once; the long one never fires while a test runs, however loaded the
// machine (a row that is not about the timeout must not race it).
const (
	shortWait = time.Millisecond
	longWait  = time.Hour
)

// newAccessRig is newRig with an access log, metrics and a response-wait
// timeout of 1 ms plus grace.
func newAccessRig(t *testing.T, typ string, sink *accessSink, m *access.Metrics, grace time.Duration) *rig {
	t.Helper()
	r := &rig{fp: newFakePool(typ), st: newFakeStream("run-1"), cfg: testConfig(nil)}
	r.fp.lease.StallTimeoutMs = 1 // response wait = 1 ms + grace
	r.p = r.fp
	r.d = newFakeDispatcher(r.st)
	cfg := r.cfg
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(),
		AccessLog: slog.New(sink), Metrics: m, Recent: access.NewRecent(0), ResponseWaitGrace: grace})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	t.Cleanup(r.st.kill)
	return r
}

// requestsTotal returns the iop_edge_requests_total sample with labels, 0
// when absent.
func requestsTotal(t *testing.T, m *access.Metrics, labels string) string {
	t.Helper()
	var buf bytes.Buffer
	if err := m.WritePrometheus(&buf); err != nil {
		t.Fatal(err)
	}
	prefix := "iop_edge_requests_total{" + labels + "} "
	for _, l := range strings.Split(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			return v
		}
	}
	return "0"
}

// every outcome, on both paths (tunnel and run), appears exactly
// once in the access log (with its status, path and request id) and in
// iop_edge_requests_total; the client's X-Request-Id comes back on the
// response (errors included) and reaches the node in the request.
func TestAccessOutcomes(t *testing.T) {
	streamBody := `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`
	sseStart := fStart(200, "Content-Type", "text/event-stream")
	type row struct {
		outcome access.Outcome
		typ     string
		prime   func(r *rig)
		body    string
		status  int
		leave   bool // the client reads the first event and goes away
	}
	tun, run := protocol.TypeOpenAICompat, protocol.TypeOllama
	rows := []row{
		{outcome: access.OK, typ: tun, status: 200, prime: func(r *rig) {
			r.st.frames(fStart(200, "Content-Type", "application/json"), fBody([]byte(`{}`)),
				&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: usage(3, 4)}, fEnd())
		}},
		{outcome: access.OK, typ: run, status: 200, prime: func(r *rig) {
			r.st.run(evStart(), evComplete(2, "hi", "stop", usage(3, 4), nil))
		}},
		{outcome: access.ClientCancelled, typ: tun, status: 200, body: streamBody, leave: true, prime: func(r *rig) {
			r.st.frames(sseStart, fBody([]byte("data: 1\n\n")))
		}},
		{outcome: access.ClientCancelled, typ: run, status: 200, body: streamBody, leave: true, prime: func(r *rig) {
			r.st.run(evStart(), evDelta(2, "partial"))
		}},
		{outcome: access.UpstreamError, typ: tun, status: 502, prime: func(r *rig) {
			r.st.frames(fError("upstream_error", "connection refused"))
		}},
		{outcome: access.UpstreamError, typ: run, status: 200, body: streamBody, prime: func(r *rig) {
			r.st.run(evStart(), evDelta(2, "partial"), evError(3, "upstream_error", "reset"))
		}},
		{outcome: access.Stalled, typ: tun, status: 504, prime: func(r *rig) {
			r.st.frames(fError(protocol.CodeResponseStalled.String(), "stalled"))
		}},
		{outcome: access.Stalled, typ: run, status: 200, body: streamBody, prime: func(r *rig) {
			r.st.run(evStart(), evDelta(2, "partial"), evError(3, protocol.CodeResponseStalled.String(), "stalled"))
		}},
		{outcome: access.Rejected, typ: tun, status: 400, prime: func(r *rig) {
			r.st.frames(fStart(400, "Content-Type", "application/json"), fBody([]byte(`{"error":"bad"}`)), fEnd())
		}},
		{outcome: access.Rejected, typ: run, status: 400, prime: func(r *rig) {
			r.st.run(evStart(), &iop.RunEvent{Seq: 2, Type: iop.RunEventType_RUN_EVENT_ERROR, FailureCode: "upstream_status",
				Error: "bad", UpstreamStatus: 400})
		}},
		{outcome: access.Timeout, typ: tun, status: 504, prime: func(r *rig) {}}, // the node says nothing: response-wait timeout
		{outcome: access.Timeout, typ: run, status: 504, prime: func(r *rig) { r.st.run(evStart()) }},
		{outcome: access.RateLimited, typ: tun, status: 429, prime: func(r *rig) {
			r.st.frames(fStart(429, "Content-Type", "application/json", "Retry-After", "3"), fBody([]byte(`{}`)), fEnd())
		}},
		{outcome: access.RateLimited, typ: run, status: 429, prime: func(r *rig) {
			r.st.run(evStart(), &iop.RunEvent{Seq: 2, Type: iop.RunEventType_RUN_EVENT_ERROR, FailureCode: "upstream_status",
				Error: "slow down", UpstreamStatus: 429})
		}},
	}
	sink, m := newAccessSink(), access.NewMetrics()
	for i, row := range rows {
		path := access.PathTunnel
		if row.typ == run {
			path = access.PathRun
		}
		t.Run(fmt.Sprintf("%s %s", row.outcome, path), func(t *testing.T) {
			leakcheck.Check(t)
			grace := longWait
			if row.outcome == access.Timeout {
				grace = shortWait
			}
			r := newAccessRig(t, row.typ, sink, m, grace)
			row.prime(r)
			body := row.body
			if body == "" {
				body = chatBody
			}
			id := fmt.Sprintf("client-%d", i)
			labels := fmt.Sprintf(`model="tiny",surface="chat_completions",path=%q,code="%d",outcome=%q`, path, row.status, row.outcome)
			before := requestsTotal(t, m, labels)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := r.send(t, ctx, "POST", "/v1/chat/completions", body, "X-Request-Id", id)
			if got := resp.Header.Get("X-Request-Id"); got != id {
				t.Errorf("response X-Request-Id = %q, want %q", got, id)
			}
			if resp.StatusCode != row.status {
				t.Errorf("status %d, want %d", resp.StatusCode, row.status)
			}
			if row.leave {
				readEvents(t, sse.NewReader(resp.Body, sse.DefaultMaxLine), 1)
				cancel()
			} else {
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			resp.Body.Close()
			lines := sink.wait(t, id)
			r.srv.Close() // every handler has returned: no second line can come
			if lines = sink.byID(id); len(lines) != 1 {
				t.Fatalf("%d access lines for %s, want exactly 1: %v", len(lines), id, lines)
			}
			l := lines[0]
			if l["outcome"] != string(row.outcome) || l["path"] != path || l["status"] != int64(row.status) ||
				l["model"] != "tiny" || l["node"] != "n1" || l["provider"] != "prov" {
				t.Errorf("access line %v: want outcome %s, path %s, status %d, model tiny on n1/prov", l, row.outcome, path, row.status)
			}
			if after := requestsTotal(t, m, labels); fmt.Sprint(after) != fmt.Sprint(atoi(t, before)+1) {
				t.Errorf("iop_edge_requests_total{%s}: %s before, %s after; want one more", labels, before, after)
			}
			var gotID string
			if row.typ == run {
				gotID = r.d.lastRun().GetRequestId()
			} else {
				gotID = r.d.lastTunnel().GetRequestId()
			}
			if gotID != id {
				t.Errorf("request_id sent to the node = %q, want %q", gotID, id)
			}
			if row.outcome == access.OK && (l["prompt_tokens"] != int64(3) || l["completion_tokens"] != int64(4)) {
				t.Errorf("tokens in the access line: %v / %v, want 3 / 4", l["prompt_tokens"], l["completion_tokens"])
			}
		})
	}
	// Exactly one line per request over the whole table.
	sink.mu.Lock()
	n := len(sink.lines)
	sink.mu.Unlock()
	if n != len(rows) {
		t.Errorf("%d access lines for %d requests", n, len(rows))
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("metric value %q: %v", s, err)
	}
	return n
}

// requests that never reach a provider are accounted too, with
// path "none", and carry X-Request-Id (minted when the client sent none):
// rejected (bad input, unknown path, unknown model), rate_limited (queue
// full), timeout (no provider in time) and client_cancelled (left while
// queued).
func TestAccessBeforeDispatch(t *testing.T) {
	rows := []struct {
		name    string
		path    string
		body    string
		poolErr error
		block   bool
		status  int
		outcome access.Outcome
		surface string
	}{
		{"bad JSON", "/v1/chat/completions", `{"model":`, nil, false, 400, access.Rejected, "chat_completions"},
		{"unknown path", "/v1/nope", `{}`, nil, false, 404, access.Rejected, "other"},
		{"Q4 unknown model", "/v1/chat/completions", chatBody, pool.ErrUnknownModel, false, 404, access.Rejected, "chat_completions"},
		{"Q4 queue full", "/v1/messages", `{"model":"tiny","messages":[]}`, &pool.QueueFullError{Model: "tiny"}, false, 429, access.RateLimited, "messages"},
		{"Q4 wait timeout", "/v1/chat/completions", chatBody, &pool.WaitTimeoutError{Model: "tiny"}, false, 503, access.Timeout, "chat_completions"},
		{"Q4 left while queued", "/v1/chat/completions", chatBody, nil, true, access.StatusClientClosed, access.ClientCancelled, "chat_completions"},
	}
	m := access.NewMetrics()
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			sink := newAccessSink() // minted ids repeat across rigs
			r := newAccessRig(t, protocol.TypeOllama, sink, m, longWait)
			r.fp.err, r.fp.block = row.poolErr, row.block
			var id string
			if row.block {
				ctx, cancel := context.WithCancel(context.Background())
				done := r.sendAsync(ctx, row.path, row.body)
				waitClosed(t, r.fp.queued, "the request to queue")
				cancel()
				<-done
				r.srv.Close()
				sink.mu.Lock()
				id, _ = sink.lines[len(sink.lines)-1]["request_id"].(string)
				sink.mu.Unlock()
			} else {
				resp, _ := r.do(t, "POST", row.path, row.body)
				id = resp.Header.Get("X-Request-Id")
				if resp.StatusCode != row.status || id == "" {
					t.Fatalf("status %d, X-Request-Id %q; want %d and a minted id", resp.StatusCode, id, row.status)
				}
				r.srv.Close()
			}
			lines := sink.byID(id)
			if len(lines) != 1 {
				t.Fatalf("%d access lines for %q, want 1", len(lines), id)
			}
			l := lines[0]
			if l["outcome"] != string(row.outcome) || l["status"] != int64(row.status) || l["path"] != access.PathNone ||
				l["surface"] != row.surface {
				t.Errorf("access line %v: want outcome %s, status %d, path none, surface %s", l, row.outcome, row.status, row.surface)
			}
		})
	}
	var buf bytes.Buffer
	_ = m.WritePrometheus(&buf)
	if !strings.Contains(buf.String(), `iop_edge_requests_in_flight{model="tiny"} 0`) {
		t.Errorf("in-flight gauge did not return to 0:\n%s", buf.String())
	}
}

// after Drain every request is refused with 503,
// Retry-After and Connection: close in its surface's shape; Stop ends a
// stream in flight with an error event in its shape (code edge_shutdown),
// the node work is cancelled and the lease goes back once.
func TestDrainAndStop(t *testing.T) {
	leakcheck.Check(t)
	sink, m := newAccessSink(), access.NewMetrics()
	r := newAccessRig(t, protocol.TypeOllama, sink, m, longWait)
	r.st.run(evStart(), evDelta(2, "partial"))
	resp := r.send(t, context.Background(), "POST", "/v1/chat/completions",
		`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "long-1")
	defer resp.Body.Close()
	rd := sse.NewReader(resp.Body, sse.DefaultMaxLine)
	readEvents(t, rd, 2)

	r.h.Drain()
	for _, p := range []struct {
		path      string
		anthropic bool
	}{{"/v1/chat/completions", false}, {"/v1/messages", true}} {
		resp2, body := r.do(t, "POST", p.path, chatBody)
		if resp2.StatusCode != 503 || resp2.Header.Get("Retry-After") == "" || !resp2.Close {
			t.Errorf("%s while draining: status %d, Retry-After %q, close %v; want 503, set, true",
				p.path, resp2.StatusCode, resp2.Header.Get("Retry-After"), resp2.Close)
		}
		checkShape(t, body, p.anthropic)
	}
	if hz, _ := r.do(t, "GET", "/healthz", ""); hz.StatusCode != 503 {
		t.Errorf("healthz while draining: %d, want 503", hz.StatusCode)
	}
	if n := r.h.InFlight(); n != 1 {
		t.Errorf("in flight while draining: %d, want 1 (the stream)", n)
	}
	r.h.Stop()
	ev, err := rd.Next()
	if err != nil || !strings.Contains(string(ev.Data), `"code":"edge_shutdown"`) {
		t.Fatalf("after Stop: event %q, err %v; want the error event", ev.Data, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := r.h.WaitIdle(ctx); err != nil {
		t.Fatalf("WaitIdle: %v", err)
	}
	if got := r.st.cancelReasons(); len(got) != 1 || got[0] != "edge_shutdown" {
		t.Errorf("node cancels: %v, want [edge_shutdown]", got)
	}
	checkOneOutcome(t, r, 1)
	if l := sink.wait(t, "long-1"); l[0]["outcome"] != string(access.Timeout) || l[0]["code"] != access.CodeShutdown {
		t.Errorf("access line of the stream: %v, want outcome timeout, code edge_shutdown", l[0])
	}
}

// Q2 (edge.Serve returns with every lease back): WaitDetached
// waits for the goroutine that keeps a cancelled stream's lease until the
// node confirms the cancel, and returns once the lease went back — here
// when the node's session is lost (what closing the sessions at exit does).
func TestWaitDetached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fp := newFakePool(protocol.TypeOllama)
		st := newFakeStream("run-w")
		st.noTerminalOnCancel = true
		cfg := testConfig(nil)
		h := New(Options{Config: func() *config.Config { return cfg }, Pool: fp, Dispatcher: newFakeDispatcher(st),
			Now: fixedNow, NewID: seqIDs(), CancelDrainTimeout: time.Minute})
		if err := h.WaitDetached(context.Background()); err != nil {
			t.Fatalf("WaitDetached with nothing detached: %v", err)
		}
		st.run(evStart(), evDelta(2, "a"))
		w := &failingWriter{discardWriter: discardWriter{h: http.Header{}}}
		h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/chat/completions",
			strings.NewReader(`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"x"}]}`)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := h.WaitDetached(ctx); err != context.DeadlineExceeded {
			t.Fatalf("WaitDetached while the cancel is unconfirmed: %v, want %v", err, context.DeadlineExceeded)
		}
		if n := fp.releases.Load(); n != 0 {
			t.Fatalf("released %d times before the cancel was confirmed, want 0", n)
		}
		st.kill() // the node session closes
		if err := h.WaitDetached(context.Background()); err != nil {
			t.Fatalf("WaitDetached after the session closed: %v", err)
		}
		if n := fp.releases.Load(); n != 1 {
			t.Errorf("released %d times when WaitDetached returned, want 1", n)
		}
	})
}

// a client that half-closes its connection (shuts down its
// sending side, still reading) is taken for gone by net/http; it must not
// read a "200 OK" with an empty body, a success, where the access record
// says 499: the edge aborts the connection without a response.
func TestAccessClientHalfClosedGetsNoFakeSuccess(t *testing.T) {
	body := `{"model":"tiny","messages":[{"role":"user","content":"x"}]}`
	rows := []struct{ name, head, sent string }{
		{"body cut short of Content-Length", "Content-Length: 1000\r\n", `{"model":"tiny",`},
		{"whole body", fmt.Sprintf("Content-Length: %d\r\n", len(body)), body},
	}
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			sink, m := newAccessSink(), access.NewMetrics()
			r := newAccessRig(t, protocol.TypeOllama, sink, m, longWait)
			id := fmt.Sprintf("half-closed-%d", i)
			c, err := net.Dial("tcp", strings.TrimPrefix(r.srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"+
				"X-Request-Id: "+id+"\r\n"+row.head+"\r\n"+row.sent); err != nil {
				t.Fatal(err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(c) // until the edge closes the connection
			l := sink.wait(t, id)
			if len(l) != 1 || l[0]["outcome"] != string(access.ClientCancelled) || l[0]["status"] != int64(access.StatusClientClosed) {
				t.Errorf("access lines %v: want one, client_cancelled with status 499", l)
			}
			if len(got) != 0 {
				t.Errorf("the half-closed client read %q; want the connection closed without a response", got)
			}
		})
	}
}

// an error message that quotes the client's input (an unknown
// model or field name, up to http.max_body_bytes) is kept in the access
// record, hence the log line and /status's last errors, at most
// access.MaxErrorLen bytes, cut at a UTF-8 boundary; the 404's own message
// quotes at most access.MaxModelLen bytes of the model.
func TestAccessErrorMessageBounded(t *testing.T) {
	long := "a" + strings.Repeat("é", 1500) // 2 bytes a rune: a cut may fall inside one (the rig's bodies: up to 4 KiB)
	rows := []struct {
		name, body string
		poolErr    error
		status     int
		cut        bool // the message itself is over access.MaxErrorLen
	}{
		{"unknown model", `{"model":"` + long + `","messages":[{"role":"user","content":"x"}]}`, pool.ErrUnknownModel, http.StatusNotFound, false},
		{"unknown content type", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"` + long + `"}]}]}`, nil, http.StatusBadRequest, true},
	}
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			sink, m := newAccessSink(), access.NewMetrics()
			r := newAccessRig(t, protocol.TypeOllama, sink, m, longWait)
			r.fp.err = row.poolErr
			id := fmt.Sprintf("long-error-%d", i)
			resp := r.send(t, context.Background(), "POST", "/v1/chat/completions", row.body, "X-Request-Id", id)
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != row.status {
				t.Fatalf("status %d %.200s, want %d", resp.StatusCode, got, row.status)
			}
			if row.poolErr != nil && (len(got) > 2*access.MaxModelLen+200 || !utf8.Valid(got)) {
				t.Errorf("the 404 body is %d bytes (valid UTF-8: %v); want the model quoted at most %d bytes", len(got), utf8.Valid(got), access.MaxModelLen)
			}
			l := sink.wait(t, id)
			msg, _ := l[0]["error"].(string)
			if msg == "" || len(msg) > access.MaxErrorLen || !utf8.ValidString(msg) || strings.HasSuffix(msg, "…") != row.cut {
				t.Errorf("access error is %d bytes (valid UTF-8: %v); want at most %d, ending in …", len(msg), utf8.ValidString(msg), access.MaxErrorLen)
			}
			rec := r.h.o.Recent.List()
			if len(rec) != 1 || len(rec[0].Error) > access.MaxErrorLen {
				t.Errorf("last errors: %d entries, want one of at most %d bytes", len(rec), access.MaxErrorLen)
			}
		})
	}
}

// a client that closes its connection before its request body
// has arrived left: one access line, client_cancelled with status 499
// (nothing is written), not a rejected 400, and no "last errors" entry.
func TestAccessClientLeftDuringBody(t *testing.T) {
	rows := []struct{ name, head, partial string }{
		{"body cut short of Content-Length", "Content-Length: 1000\r\n", `{"model":"tiny",`},
		{"chunked body cut", "Transfer-Encoding: chunked\r\n", "10\r\n{\"model\":\"tiny\",\r\n"},
	}
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			sink, m := newAccessSink(), access.NewMetrics()
			r := newAccessRig(t, protocol.TypeOllama, sink, m, longWait)
			id := fmt.Sprintf("left-body-%d", i)
			c, err := net.Dial("tcp", strings.TrimPrefix(r.srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"+
				"X-Request-Id: "+id+"\r\n"+row.head+"\r\n"+row.partial)
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			l := sink.wait(t, id)
			if len(l) != 1 || l[0]["outcome"] != string(access.ClientCancelled) || l[0]["status"] != int64(access.StatusClientClosed) {
				t.Errorf("access lines %v: want one, client_cancelled with status 499", l)
			}
			if got := r.h.o.Recent.List(); len(got) != 0 {
				t.Errorf("last errors %v, want none for a client that left", got)
			}
			if r.fp.acquired != 0 {
				t.Errorf("%d leases acquired for a request whose body never arrived", r.fp.acquired)
			}
		})
	}
}
