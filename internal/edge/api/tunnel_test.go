package api

import (
	"bufio"
	"context"
	"io"
	"iop/internal/edge/exchange"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	"iop/internal/samples"
	iop "iop/proto/gen/iop"
)

func fStart(status int32, hdr ...string) *iop.ProviderTunnelFrame {
	f := &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, Status: status}
	for i := 0; i+1 < len(hdr); i += 2 {
		f.Headers = append(f.Headers, &iop.Header{Name: hdr[i], Value: hdr[i+1]})
	}
	return f
}

func fBody(b []byte) *iop.ProviderTunnelFrame {
	return &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: b}
}

func fEnd() *iop.ProviderTunnelFrame {
	return &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END}
}

// fError is an ERROR frame whose client words (message) are msg, as the
// node sends them beside the legacy error string.
func fError(code, msg string) *iop.ProviderTunnelFrame {
	return &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, FailureCode: code, Error: msg, Message: msg}
}

// Q3, Q6, T4: an openai_compat lease gets a ProviderTunnelRequest whose body
// is the client's with only the top-level "model" replaced, the lease's
// stall timeout, and only allow-listed headers; T2/T5: the upstream stream
// reaches the client byte for byte with only allowed response headers.
func TestTunnelDispatchAndPassthrough(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, map[string]string{"team-a": "sk-a"})
	body := "{ \"messages\":[{\"role\":\"user\",\"content\":\"hi \\u00e9\"}],\n  \"model\" : \"tiny\", \"temperature\":0.50," +
		"\"stream\":true,\"x_extra\":{\"model\":\"keep\"}}"
	wantBody := strings.Replace(body, `"tiny"`, `"tiny:latest"`, 1)
	up := sample(t, "llama_v1_chat_stream.sse")
	cut := len(up) / 3 // BODY frames need not align with events
	r.st.frames(fStart(200, "Content-Type", "text/event-stream", "Set-Cookie", "s=1", "Connection", "close", "X-Upstream", "v"),
		fBody(up[:cut]), &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: usage(5, 7)},
		fBody(up[cut:]), fEnd())
	var seen []*iop.Usage
	r.h.o.OnUsage = func(p, m string, u *iop.Usage) {
		if p == "team-a" && m == "tiny" {
			seen = append(seen, u)
		}
	}
	resp, got := r.do(t, "POST", "/v1/chat/completions", body,
		"Authorization", "Bearer sk-a", "X-Api-Key", "sk-a", "X-Iop-Node", "n9", "Cookie", "c=1",
		"Content-Type", "application/json", "Accept", "text/event-stream", "OpenAI-Beta", "assistants=v2",
		"Anthropic-Version", "2023-06-01", "Proxy-Authorization", "Basic x", "Te", "trailers")

	if resp.StatusCode != 200 || got != string(up) {
		t.Fatalf("T2 body: status %d, %d bytes; want 200 and the upstream's %d bytes unchanged", resp.StatusCode, len(got), len(up))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type: got %q", ct)
	}
	for _, h := range []string{"Set-Cookie", "X-Upstream"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("upstream header %s reached the client: %q", h, v)
		}
	}
	req := r.d.lastTunnel()
	if req == nil {
		t.Fatal("no tunnel request")
	}
	if string(req.Body) != wantBody {
		t.Errorf("Q3 body:\ngot  %s\nwant %s", req.Body, wantBody)
	}
	if req.Adapter != "prov" || req.Target != "tiny:latest" || req.Method != "POST" || req.Path != "/v1/chat/completions" ||
		req.Operation != protocol.OpChatCompletions || !req.Stream || req.ResponseStallTimeoutMs != 60000 {
		t.Errorf("Q3/Q6 request fields: %+v", req)
	}
	if d := r.d.targets[0]; d != (dispatch.Target{Node: "n1", Generation: 7}) {
		t.Errorf("dispatch target: %+v", d)
	}
	var names []string
	for _, h := range req.Headers {
		names = append(names, h.Name+"="+h.Value)
	}
	want := "Content-Type=application/json,Accept=text/event-stream,anthropic-version=2023-06-01,OpenAI-Beta=assistants=v2"
	if strings.Join(names, ",") != want {
		t.Errorf("T4 forwarded headers: got %v, want %s", names, want)
	}
	if len(seen) != 1 || seen[0].CompletionTokens != 7 {
		t.Errorf("USAGE observed: %v", seen)
	}
	checkOneOutcome(t, r, 0)
}

// checkOneOutcome waits for the handler to finish, then checks Q2 (exactly
// one Release), Close once and the number of Cancels.
func checkOneOutcome(t *testing.T, r *rig, wantCancels int32) {
	t.Helper()
	r.srv.Close()               // waits for the handlers
	waitReleased(t, r.fp, r.st) // a cancelled stream's lease goes back after the node's terminal
	if n := r.st.cancels.Load(); n != wantCancels {
		t.Errorf("T3: Cancel called %d times (%v), want %d", n, r.st.cancelReasons(), wantCancels)
	}
}

// T5, T2: an upstream 4xx/5xx passes through with its status and body, never
// as an empty 200.
func TestTunnelUpstreamStatusPassthrough(t *testing.T) {
	for _, name := range []string{"llama_error_context_exceeded.http", "ollama_v1_chat_error_unknown_model.http",
		"llama_error_bad_json.http", "ollama_v1_chat_error_bad_json.http"} {
		t.Run("T5 "+name, func(t *testing.T) {
			leakcheck.Check(t)
			status, up := httpSample(t, name)
			r := newRig(t, protocol.TypeOpenAICompat, nil)
			r.st.frames(fStart(status, "content-type", "application/json; charset=utf-8"), fBody(up), fEnd())
			resp, got := r.do(t, "POST", "/v1/chat/completions", chatBody)
			if int32(resp.StatusCode) != status || got != string(up) {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, got, status, up)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
				t.Errorf("Content-Type: %q", ct)
			}
			checkOneOutcome(t, r, 0)
		})
	}
}

// T5, P2: tunnel failures become exactly one outcome in the surface's shape:
// before any byte an error response, after bytes an error event.
func TestTunnelFailures(t *testing.T) {
	sseStart := fStart(200, "Content-Type", "text/event-stream")
	chunk := []byte("data: {\"choices\":[]}\n\n")
	rows := []struct {
		name      string
		path      string
		frames    []*iop.ProviderTunnelFrame
		recvErr   error
		want      int
		anthropic bool
		wantCode  string // error code (OpenAI) for error responses
		wantTail  string // the body must end with this (error events)
		exact     bool   // the body must be wantTail
		wantAbort bool   // the client sees a truncated body
		cancels   int32
	}{
		{name: "T5 ERROR before any byte is 502", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{sseStart, fError("upstream_error", "connection refused")}, want: 502, wantCode: "provider_error"},
		{name: "H1 stall before any byte is 504", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{fError(protocol.CodeResponseStalled.String(), "stalled")}, want: 504, wantCode: protocol.CodeResponseStalled.String()},
		{name: "T5 Anthropic ERROR before any byte is 502 in its shape", path: "/v1/messages",
			frames: []*iop.ProviderTunnelFrame{fError("upstream_error", "x")}, want: 502, anthropic: true},
		{name: "T5 session lost before any byte is 502", path: "/v1/chat/completions",
			recvErr: dispatch.ErrSessionLost, want: 502, wantCode: "provider_lost"},
		{name: "a dispatch that met a node closing after its drain is 503", path: "/v1/chat/completions",
			recvErr: dispatch.ErrNodeDrained, want: 503, wantCode: "node_shutdown"},
		{name: "T2 END without RESPONSE_START is 502", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{fEnd()}, want: 502, wantCode: "provider_error"},
		{name: "T5 ERROR after SSE bytes ends with a data error event", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody(chunk), fError("upstream_error", "reset")}, want: 200,
			wantTail: string(chunk) + `data: {"error":{"message":"the provider failed to answer: reset","type":"server_error","param":null,"code":"provider_error"}}` + "\n\n"},
		{name: "T5 Anthropic ERROR mid-event ends with event: error", path: "/v1/messages",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody([]byte("event: ping\ndata: {\"type\"")), fError("upstream_error", "reset")}, want: 200,
			wantTail: "data: {\"type\"\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the provider failed to answer: reset\"}}\n\n"},
		{name: "T5 Responses ERROR after SSE bytes ends with the Responses error event", path: "/v1/responses",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody([]byte("event: response.created\ndata: {}\n\n")), fError("upstream_error", "reset")}, want: 200,
			wantTail: "data: {}\n\nevent: error\ndata: {\"type\":\"error\",\"code\":\"provider_error\",\"message\":\"the provider failed to answer: reset\",\"param\":null," +
				`"error":{"message":"the provider failed to answer: reset","type":"server_error","param":null,"code":"provider_error"}}` + "\n\n"},
		{name: "T5 session lost mid-stream ends with an error event", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody(chunk)}, recvErr: dispatch.ErrSessionLost, want: 200,
			wantTail: `"code":"provider_lost"}}` + "\n\n"},
		// T2, T5: a failure after the upstream's own last event (the node's
		// connection lost between the stream's end and the tunnel's END)
		// adds no second terminal: the body is the upstream's, its last
		// event ended.
		{name: "T5 session lost after data: [DONE] adds no error event", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody(append(chunk, "data: [DONE]\n\n"...))}, recvErr: dispatch.ErrSessionLost, want: 200,
			wantTail: string(chunk) + "data: [DONE]\n\n", exact: true},
		{name: "T5 session lost after a [DONE] split across frames, before its blank line, ends the event", path: "/v1/chat/completions",
			frames:  []*iop.ProviderTunnelFrame{sseStart, fBody(append(chunk, "data: [DO"...)), fBody([]byte("NE]\r\n"))},
			recvErr: dispatch.ErrSessionLost, want: 200, wantTail: string(chunk) + "data: [DONE]\r\n\n", exact: true},
		{name: "T5 Anthropic ERROR after message_stop adds no error event", path: "/v1/messages",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")), fError("upstream_error", "reset")},
			want:   200, wantTail: "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", exact: true},
		{name: "T5 Responses session lost after response.completed adds no error event", path: "/v1/responses",
			frames:  []*iop.ProviderTunnelFrame{sseStart, fBody([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n"))},
			recvErr: dispatch.ErrSessionLost, want: 200,
			wantTail: "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n", exact: true},
		{name: "T5 an event after data: [DONE] is content: the failure still ends with an error event", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody(append([]byte("data: [DONE]\n\n"), chunk...))}, recvErr: dispatch.ErrSessionLost, want: 200,
			wantTail: `"code":"provider_lost"}}` + "\n\n"},
		{name: "T5 blank lines after data: [DONE] keep it the last event", path: "/v1/chat/completions",
			frames:  []*iop.ProviderTunnelFrame{sseStart, fBody([]byte("data: [DONE]\n\n")), fBody([]byte("\n\n"))},
			recvErr: dispatch.ErrSessionLost, want: 200, wantTail: "data: [DONE]\n\n\n\n", exact: true},
		{name: "T5 Anthropic ERROR after a CRLF message_stop adds no error event", path: "/v1/messages",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody([]byte("event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n")), fError("upstream_error", "reset")},
			want:   200, wantTail: "event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n", exact: true},
		{name: "T5 a data line that only starts with [DONE] is no last event", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{sseStart, fBody([]byte("data: [DONE] and more\n\n"))}, recvErr: dispatch.ErrSessionLost, want: 200,
			wantTail: `"code":"provider_lost"}}` + "\n\n"},
		{name: "T5 ERROR after held JSON bytes is still a clean 502", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{fStart(200, "Content-Type", "application/json"), fBody([]byte(`{"id":`)), fError("upstream_error", "reset")},
			want:   502, wantCode: "provider_error"},
		{name: "T5 ERROR after a passed-through large JSON body aborts the response", path: "/v1/chat/completions",
			frames: []*iop.ProviderTunnelFrame{fStart(200, "Content-Type", "application/json"), fBody(make([]byte, exchange.MaxHeldBody+1)), fError("upstream_error", "reset")},
			want:   200, wantAbort: true},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newRig(t, protocol.TypeOpenAICompat, nil)
			r.st.frames(row.frames...)
			if row.recvErr != nil {
				r.st.ch <- recvItem{err: row.recvErr}
			}
			resp := r.send(t, context.Background(), "POST", row.path, chatBody)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != row.want {
				t.Fatalf("status: got %d, want %d; %s", resp.StatusCode, row.want, b)
			}
			switch {
			case row.wantAbort:
				if err == nil {
					t.Fatalf("body read: got a complete body %q, want a truncated one", b)
				}
			case err != nil:
				t.Fatalf("body read: %v", err)
			case row.want != 200:
				e := checkShape(t, string(b), row.anthropic)
				if row.wantCode != "" && (e.Error.Code == nil || *e.Error.Code != row.wantCode) {
					t.Errorf("code: got %v, want %s", e.Error.Code, row.wantCode)
				}
			case row.exact:
				if string(b) != row.wantTail {
					t.Errorf("body:\n%q\nwant\n%q", b, row.wantTail)
				}
			default:
				if !strings.HasSuffix(string(b), row.wantTail) {
					t.Errorf("body:\n%q\nwant it to end with\n%q", b, row.wantTail)
				}
			}
			checkOneOutcome(t, r, 0)
		})
	}
}

// T5: a tunnel's BODY reaches the client as it arrives, not at the end.
func TestTunnelBodyFlushedAsItArrives(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, nil)
	r.st.frames(fStart(200, "Content-Type", "text/event-stream"), fBody([]byte("data: one\n\n")))
	resp := r.send(t, context.Background(), "POST", "/v1/chat/completions", chatBody)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first line: %q, %v", line, err)
	}
	r.st.frames(fBody([]byte("data: two\n\n")), fEnd())
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if string(rest) != "\ndata: two\n\n" {
		t.Errorf("rest: %q", rest)
	}
	checkOneOutcome(t, r, 0)
}

// T2, T5: a plain (non-stream) body arriving in several BODY frames reaches
// the client whole, bytes unchanged, with a Content-Length.
func TestTunnelPlainBodyWhole(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, nil)
	r.st.frames(fStart(200, "Content-Type", "application/json"), fBody([]byte(`{"id":"x",`)), fBody([]byte(`"object":"chat.completion"}`)), fEnd())
	resp, body := r.do(t, "POST", "/v1/chat/completions", chatBody)
	if resp.StatusCode != 200 || body != `{"id":"x","object":"chat.completion"}` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if resp.ContentLength != int64(len(body)) {
		t.Errorf("Content-Length: got %d, want %d", resp.ContentLength, len(body))
	}
	checkOneOutcome(t, r, 0)
}

func sample(t *testing.T, name string) []byte { t.Helper(); return samples.Read(t, name) }

// httpSample splits a "*.http" capture into its status and body.
func httpSample(t *testing.T, name string) (int32, []byte) {
	t.Helper()
	status, body := samples.ReadHTTP(t, name)
	return int32(status), body
}

// flushCounter is a ResponseWriter that counts flushes.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
	flushed chan struct{} // one token per flush
}

func (f *flushCounter) Flush() {
	f.flushes++
	f.ResponseRecorder.Flush()
	f.flushed <- struct{}{}
}

// T2, T5: frames of a stream that are already queued together go to the
// client in one flush (the last of the burst), never one flush per frame;
// TestTunnelBodyFlushedAsItArrives shows a frame is never held to wait for
// a later one.
func TestStreamBurstOneFlush(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, nil)
	r.st.frames(fStart(200, "Content-Type", "text/event-stream"), fBody([]byte("data: one\n\n")),
		fBody([]byte("data: two\n\n")), fBody([]byte("data: three\n\n")))
	done := make(chan struct{})
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder(), flushed: make(chan struct{}, 8)}
	go func() {
		defer close(done)
		req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"tiny","stream":true,"messages":[]}`))
		r.h.ServeHTTP(w, req)
	}()
	// The three BODY frames were queued before the handler read any: one
	// flush after the third. END comes later, on its own.
	select {
	case <-w.flushed:
	case <-time.After(10 * time.Second):
		t.Fatal("the burst was never flushed")
	}
	r.st.frames(fEnd())
	<-done
	if w.flushes != 1 || w.Body.String() != "data: one\n\ndata: two\n\ndata: three\n\n" {
		t.Fatalf("%d flushes, body %q; want 1 flush of the three events", w.flushes, w.Body.String())
	}
	checkOneOutcome(t, r, 0)
}

// T2: a burst whose last frame writes nothing of its own (USAGE) still ends
// with a flush: the BODY before it reaches the client without waiting for a
// later frame.
func TestBurstEndingInUsageFlushes(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, nil)
	r.st.frames(fStart(200, "Content-Type", "text/event-stream"), fBody([]byte("data: one\n\n")),
		&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: usage(1, 1)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := r.send(t, ctx, "POST", "/v1/chat/completions", `{"model":"tiny","stream":true,"messages":[]}`)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first line %q, %v: the burst's BODY was held", line, err)
	}
	r.st.frames(fEnd())
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	checkOneOutcome(t, r, 0)
}
