package backend

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// readUntil reads resp.Body until the bytes read contain want, and returns them.
func readUntil(t *testing.T, r *bufio.Reader, want string) []byte {
	t.Helper()
	var got []byte
	for !bytes.Contains(got, []byte(want)) {
		b, err := r.ReadByte()
		if err != nil {
			t.Fatalf("read: got %v after %q, want %q", err, got, want)
		}
		got = append(got, b)
	}
	return got
}

// streamBodies are stream requests for "tiny<suffix>" on each chat route.
func streamBodies(suffix string) []struct{ name, path, body string } {
	return []struct{ name, path, body string }{
		{"ollama", "/api/chat", `{"model":"tiny` + suffix + `",` + hiMessages + `}`},
		{"v1", "/v1/chat/completions", `{"model":"tiny` + suffix + `","stream":true,` + hiMessages + `}`},
		{"messages", "/v1/messages", `{"model":"tiny` + suffix + `","max_tokens":64,"stream":true,` + hiMessages + `}`},
	}
}

// TestStallFault: H1 needs an upstream that goes silent mid-stream. After 3
// tokens nothing more is sent, the request stays active, and it ends within
// 1 s of the client going away (T3).
func TestStallFault(t *testing.T) {
	for _, tt := range streamBodies("+stall=3") {
		t.Run("H1 "+tt.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			resp, cancel, err := h.open(t, tt.path, tt.body)
			defer cancel()
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			got := readUntil(t, r, "tiny-gguf!")
			if n := h.b.Active(); n != 1 {
				t.Errorf("Active during the stall: got %d, want 1", n)
			}
			select {
			case e := <-h.ends:
				t.Fatalf("request ended during the stall: %+v", e)
			default:
			}
			aborted := time.Now()
			cancel()
			e := h.nextEnd(t, time.Second)
			if e.Outcome != OutcomeStalled || e.Tokens != 3 || e.Fault != "stall=3" || e.Model != "tiny" {
				t.Errorf("RequestEnd: got %+v, want outcome stalled after 3 tokens of tiny", e)
			}
			if d := time.Since(aborted); d > time.Second {
				t.Errorf("request ended %s after the abort, want <= 1s", d)
			}
			rest, _ := io.ReadAll(r)
			if all := string(got) + string(rest); strings.Contains(all, " This") {
				t.Errorf("a 4th token was sent: %q", all)
			}
			if n := h.b.Active(); n != 0 {
				t.Errorf("Active after the abort: got %d, want 0", n)
			}
		})
	}
}

// TestResetFault: after 3 tokens the connection closes without the stream's
// terminal chunk; a non-stream request gets no response at all.
func TestResetFault(t *testing.T) {
	for _, tt := range streamBodies("+reset=3") {
		t.Run("issue6 stream "+tt.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			resp, cancel, err := h.open(t, tt.path, tt.body)
			defer cancel()
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read: got %v, want io.ErrUnexpectedEOF (chunked stream cut)", err)
			}
			if !strings.Contains(string(got), "tiny-gguf!") || strings.Contains(string(got), " This") {
				t.Errorf("body: got %q, want exactly 3 tokens", got)
			}
			if e := h.nextEnd(t, 5*time.Second); e.Outcome != OutcomeReset || e.Tokens != 3 {
				t.Errorf("RequestEnd: got %+v, want reset after 3 tokens", e)
			}
		})
	}
	t.Run("issue6 non-stream", func(t *testing.T) {
		h := newHarness(t, Options{})
		resp, cancel, err := h.open(t, "/v1/chat/completions", `{"model":"tiny+reset=0",`+hiMessages+`}`)
		defer cancel()
		if err == nil {
			resp.Body.Close()
			t.Fatalf("got a response (%d), want a transport error", resp.StatusCode)
		}
		if e := h.nextEnd(t, 5*time.Second); e.Outcome != OutcomeReset || e.Status != 0 {
			t.Errorf("RequestEnd: got %+v, want reset with no status", e)
		}
	})
}

// TestStatusFault: the forced status comes with an error body in the
// route's own shape.
func TestStatusFault(t *testing.T) {
	h := newHarness(t, Options{})
	tests := []struct {
		name, path, model string
		want              int
		body              string // regexp
	}{
		{"issue6 ollama 500", "/api/chat", "tiny+status=500", 500, `^\{"error":"demo fault: forced status 500"\}$`},
		{"issue6 v1 503", "/v1/chat/completions", "tiny-loop+status=503", 503,
			`^\{"error":\{"message":"demo fault: forced status 503","type":"api_error","param":null,"code":null\}\}$`},
		{"issue6 v1 429", "/v1/chat/completions", "tiny+status=429", 429, `"type":"api_error"`},
		{"issue6 messages 529", "/v1/messages", "tiny+status=529", 529,
			`^\{"type":"error","error":\{"type":"overloaded_error","message":"demo fault: forced status 529"\}\}$`},
		{"issue6 messages 401", "/v1/messages", "tiny+status=401", 401, `"type":"authentication_error"`},
		{"issue6 count_tokens 400", "/v1/messages/count_tokens", "tiny+status=400", 400, `"type":"invalid_request_error"`},
		{"issue6 combined with slowheaders", "/api/chat", "tiny+slowheaders=1ms+status=502", 502, `forced status 502`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, got := h.do(t, "POST", tt.path, `{"model":"`+tt.model+`","stream":true,"max_tokens":8,`+hiMessages+`}`)
			if code != tt.want || !regexp.MustCompile(tt.body).Match(got) {
				t.Errorf("got %d %s, want %d matching %s", code, got, tt.want, tt.body)
			}
			if e := h.nextEnd(t, 5*time.Second); e.Status != tt.want || e.Err != nil {
				t.Errorf("RequestEnd: got %+v, want status %d and no error", e, tt.want)
			}
		})
	}
}

// TestClientAbort: T3/E5 — a client that leaves mid-stream ends the
// backend's request within 1 s, and Active returns to 0.
func TestClientAbort(t *testing.T) {
	h := newHarness(t, Options{TokenDelay: 2 * time.Millisecond})
	resp, cancel, err := h.open(t, "/v1/chat/completions", `{"model":"tiny-loop","max_tokens":100000,"stream":true,`+hiMessages+`}`)
	defer cancel()
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer resp.Body.Close()
	readUntil(t, bufio.NewReader(resp.Body), " ipsum")
	aborted := time.Now()
	cancel()
	e := h.nextEnd(t, time.Second)
	if e.Outcome != OutcomeClientGone || e.Tokens >= 100000 {
		t.Errorf("RequestEnd: got %+v, want client_gone mid-stream", e)
	}
	if d := time.Since(aborted); d > time.Second {
		t.Errorf("ended %s after the abort, want <= 1s", d)
	}
	if n := h.b.Active(); n != 0 {
		t.Errorf("Active: got %d, want 0", n)
	}
}

// TestServeShutdown: S4-style clean stop — cancelling Serve's context ends
// stalled streams and Serve returns nil.
func TestServeShutdown(t *testing.T) {
	leakcheck.Check(t)
	ends := make(chan RequestEnd, 4)
	b, err := New(Options{OnRequestEnd: func(e RequestEnd) { ends <- e }})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	served := make(chan error, 1)
	go func() { served <- b.Serve(ctx, ln) }()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+ln.Addr().String()+"/api/chat", "application/json",
		strings.NewReader(`{"model":"tiny+stall=1",`+hiMessages+`}`))
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()
	readUntil(t, bufio.NewReader(resp.Body), "Hello")
	stop()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: got %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return within 5s of cancel")
	}
	select {
	case e := <-ends:
		if e.Outcome != OutcomeStalled {
			t.Errorf("RequestEnd: got %+v, want stalled", e)
		}
	case <-time.After(time.Second):
		t.Fatal("the stalled request did not end")
	}
}
