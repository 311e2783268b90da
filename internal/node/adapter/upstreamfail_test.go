package adapter_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// connServer is a TCP server speaking minimal HTTP/1.1 whose answer per
// request is decided by answer(connection's request index, idle time of the
// connection before this request): write a response (keep-alive), or
// return "" to read the request whole and reset the connection unanswered.
// It counts the connections accepted and the requests read.
type connServer struct {
	rawConns
	answer func(i int, idle time.Duration) string
	reqs   atomic.Int64
}

func startConnServer(t *testing.T, answer func(i int, idle time.Duration) string) *connServer {
	t.Helper()
	s := &connServer{answer: answer}
	s.listen(t, s.serve)
	return s
}

func (s *connServer) serve(c net.Conn) {
	defer s.done(c)
	br := bufio.NewReader(c)
	last := time.Now()
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		s.reqs.Add(1)
		resp := s.answer(i, time.Since(last))
		if resp == "" {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // RST
			}
			return
		}
		if _, err := io.WriteString(c, resp); err != nil {
			return
		}
		last = time.Now()
	}
}

// okChat is llama-server's streamed chat completion (samples/) as one
// keep-alive response.
func okChat(t *testing.T) string {
	b := sample(t, "llama_v1_chat_stream.sse")
	return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + string(b)
}

func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return "http://" + a
}

// a request that got no response head is upstream_connect (no
// connection could be opened) or upstream_reset (closed or reset before
// the status line), on the run path and the tunnel; the node never resends
// it (the backend saw it once). A non-2xx
// answer on the run path carries its status and Retry-After.
func TestUpstreamFailureCodes(t *testing.T) {
	reset := func(int, time.Duration) string { return "" }
	tooMany := func(ra string) func(int, time.Duration) string {
		return func(int, time.Duration) string {
			b := `{"error":{"message":"slow down"}}`
			return "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: " + ra +
				"\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b
		}
	}
	rows := []struct {
		name       string
		answer     func(int, time.Duration) string // nil: nothing listens
		code       string
		status     int32
		retryAfter int64 // ms
	}{
		{name: "connection refused", code: protocol.CodeUpstreamConnect.String()},
		{name: "reset before the response head", answer: reset, code: protocol.CodeUpstreamReset.String()},
		{name: "429 with Retry-After seconds", answer: tooMany("5"), code: protocol.CodeUpstreamStatus.String(), status: 429, retryAfter: 5000},
		{name: "429 with a malformed Retry-After", answer: tooMany("soon"), code: protocol.CodeUpstreamStatus.String(), status: 429},
	}
	for _, r := range rows {
		for _, typ := range []string{"run-ollama", "run-compat", "tunnel"} {
			t.Run(r.name+" "+typ, func(t *testing.T) {
				leakcheck.Check(t)
				base := closedAddr(t)
				var srv *connServer
				if r.answer != nil {
					srv = startConnServer(t, r.answer)
					base = srv.url()
				}
				ac := compatAdapter("x", llamaProfile(base), 2)
				if typ == "run-ollama" {
					ac = ollamaAdapter("x", base, 2)
				}
				s := newSet(t, adapter.Options{}, ac)
				ctx := context.Background()
				var code, msg string
				var status int32
				var retryAfter int64
				if typ == "tunnel" {
					frs := tunnelAll(ctx, s, &iop.ProviderTunnelRequest{Adapter: "x", Target: "tiny",
						Operation: protocol.OpChatCompletions, Body: []byte(`{"model":"tiny"}`)})
					last, st, _, _ := checkTunnel(t, frs)
					code, msg, status = last.GetFailureCode(), last.GetError(), st
					if r.status != 0 { // the tunnel relays a status as the upstream said it
						if status != r.status || last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END {
							t.Fatalf("tunnel: got %v status %d, want the upstream's %d then END", last.GetKind(), status, r.status)
						}
						return
					}
				} else {
					last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "x", Target: "tiny", Input: userInput("hi")}))
					code, msg, status, retryAfter = last.GetFailureCode(), last.GetError(), last.GetUpstreamStatus(), last.GetRetryAfterMs()
				}
				if code != r.code || status != r.status || retryAfter != r.retryAfter {
					t.Fatalf("got %q status %d retry_after_ms %d (%s), want %q %d %d", code, status, retryAfter, msg,
						r.code, r.status, r.retryAfter)
				}
				if srv != nil && srv.reqs.Load() != 1 {
					t.Errorf("the backend read %d requests, want 1 (a written POST is never resent)", srv.reqs.Load())
				}
			})
		}
	}
}

// the keep-alive race and the idle lifetime that removes it. The
// backend answers a request on a connection that was idle for less than
// 150 ms and resets one that was idle longer (llama-server closing an idle
// connection as the request arrives, at 150 ms instead of 5 s). With an
// idle lifetime of 50 ms the node never reuses such a connection: both
// requests succeed, on two connections. Without one (the default, for a
// server that keeps connections) the second request meets the race: it
// fails with upstream_reset and is not resent (the backend read it once).
func TestUpstreamIdleLifetime(t *testing.T) {
	const serverIdle, gap = 150 * time.Millisecond, 300 * time.Millisecond
	ok := okChat(t)
	answer := func(i int, idle time.Duration) string {
		if i > 0 && idle >= serverIdle {
			return ""
		}
		return ok
	}
	for _, r := range []struct {
		idleMs    int64
		wantCode  string
		wantConns int64
	}{{50, "", 2}, {0, protocol.CodeUpstreamReset.String(), 1}} {
		t.Run("idle "+strconv.FormatInt(r.idleMs, 10)+" ms", func(t *testing.T) {
			leakcheck.Check(t)
			srv := startConnServer(t, answer)
			ac := compatAdapter("x", llamaProfile(srv.url()), 2)
			ac.UpstreamIdleTimeoutMs = r.idleMs
			s := newSet(t, adapter.Options{}, ac)
			run := func() *iop.RunEvent {
				last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "x", Target: "tiny", Input: userInput("hi")}))
				return last
			}
			if last := run(); last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
				t.Fatalf("first request: %v %q", last.GetFailureCode(), last.GetError())
			}
			<-time.After(gap) // the scenario: the connection sits idle this long (elapsed time, not an event)
			last := run()
			if last.GetFailureCode() != r.wantCode {
				t.Fatalf("second request after %v idle: %q (%s), want %q", gap, last.GetFailureCode(), last.GetError(), r.wantCode)
			}
			if n := srv.conns.Load(); n != r.wantConns {
				t.Errorf("%d connections, want %d", n, r.wantConns)
			}
			if n := srv.reqs.Load(); n != 2 {
				t.Errorf("the backend read %d requests, want 2 (never a resend)", n)
			}
		})
	}
}

// AdapterConfig.upstream_idle_timeout_ms is checked at NewSet.
func TestUpstreamIdleTimeoutBounds(t *testing.T) {
	for _, ms := range []int64{-1, 86400001} {
		ac := ollamaAdapter("x", "http://127.0.0.1:1", 1)
		ac.UpstreamIdleTimeoutMs = ms
		if _, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ac}}, adapter.Options{}); err == nil ||
			!strings.Contains(err.Error(), "upstream_idle_timeout_ms") {
			t.Errorf("%d ms: got %v, want a bad upstream_idle_timeout_ms error", ms, err)
		}
	}
}
