package exchange

import (
	"strings"
	"testing"
	"time"

	"iop/internal/edge/reply"
	"iop/internal/protocol"
)

// epChat is the chat completions endpoint as its exchange sees it.
var epChat = Endpoint{reply.OpenAI, protocol.OpChatCompletions, "/v1/chat/completions", RunChat}

// BenchmarkSSEEndScan: the last-event tracking of a streamed tunnel
// (sseEnd, SPEC T2, T5) over a 100-chunk chat completion stream, the cost
// it adds to each BODY frame.
func BenchmarkSSEEndScan(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}` + "\n\n")
	b.SetBytes(int64(100*len(chunk) + len("data: [DONE]\n\n")))
	b.ReportAllocs()
	for b.Loop() {
		var e sseEnd
		for range 100 {
			e.scan(chunk, &epChat)
		}
		e.scan([]byte("data: [DONE]\n\n"), &epChat)
		if ended, _ := e.ended(); !ended {
			b.Fatal("the stream's [DONE] was not seen")
		}
	}
}

// BenchmarkSSECost: counting a streamed tunnel's events for its key's
// charge (tunnelSink.noteCost, SPEC K5) over a 100-chunk chat completion
// stream, the cost it adds to each BODY frame.
func BenchmarkSSECost(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}` + "\n\n")
	b.SetBytes(int64(100 * len(chunk)))
	b.ReportAllocs()
	s := &tunnelSink{sse: true, x: &Exchange{Acc: &reply.Recorder{}}}
	for b.Loop() {
		s.x.Acc.MinTokens = 0
		for range 100 {
			s.noteCost(chunk)
			s.noteTail(chunk)
		}
		if s.x.Acc.MinTokens != 100 {
			b.Fatalf("%d events counted, want 100", s.x.Acc.MinTokens)
		}
	}
}

// K5: an event stream's events are counted once each, however the frames
// cut them (between the two newlines of a blank line, "\r\n" endings), a
// plain body by bytes ÷ 4.
func TestNoteCost(t *testing.T) {
	for _, row := range []struct {
		sse    bool
		frames []string
		want   int64
	}{
		{true, []string{"data: a\n\ndata: b\n\n"}, 2},
		{true, []string{"data: a\n", "\ndata: b\n", "\n"}, 2},
		{true, []string{"data: a\r\n\r\ndata: b\r\n", "\r\n"}, 2},
		{true, []string{"data: a\r\n\r", "\n", "data: b\n\n\n\n"}, 4},
		{true, []string{"data: a", "\n", "\n", "data: b"}, 1},
		{false, []string{`{"choices":[{"message":{"content":"`, "0123456789abcdef", `"}}]}`}, 8 + 4 + 1},
	} {
		s := &tunnelSink{sse: row.sse, x: &Exchange{Acc: &reply.Recorder{}}}
		for _, f := range row.frames {
			s.noteCost([]byte(f))
			s.noteTail([]byte(f))
		}
		if got := s.x.Acc.MinTokens; got != row.want {
			t.Errorf("%q: %d, want %d", row.frames, got, row.want)
		}
	}
}

// Retry-After values (RFC 9110 §10.2.3).
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rows := []struct {
		v    string
		want time.Duration
	}{
		{"", 0}, {"5", 5 * time.Second}, {" 12 ", 12 * time.Second}, {"-3", 0}, {"soon", 0},
		{"Fri, 02 Jan 2026 03:04:35 GMT", 30 * time.Second}, {"Fri, 02 Jan 2026 03:00:00 GMT", 0},
		{"99999999999", maxRetryAfter},
	}
	for _, r := range rows {
		if got := parseRetryAfter(r.v, now); got != r.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", r.v, got, r.want)
		}
	}
}

// P4, N3: node failure messages reach the client without internal topology:
// the legacy error string (upstream addresses, adapter instance names, Go
// type names) stays in the operator's log; the client gets the code's words
// and the terminal's message field (the node's client words, see the
// node's TestMessageHidesInternals).
func TestNodeFailureHidesInternals(t *testing.T) {
	rows := []struct {
		name, code, message, msg string
		status                   int
		banned                   []string
		want                     string
	}{
		{"dial error", "upstream_error", "", `adapter "ollama": Post "http://10.1.2.3:11434/api/chat": dial tcp 10.1.2.3:11434: connect: connection refused`,
			502, []string{"10.1.2.3", "ollama", "dial"}, "the provider failed to answer"},
		{"invalid input", "invalid_request", "json: cannot unmarshal number into", `adapter "ollama": json: cannot unmarshal number into Go struct field ToolFunction.function.arguments of type string`,
			400, []string{`adapter "ollama"`, "Go struct field"}, "invalid request: json: cannot unmarshal number into"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			e := nodeFailure(r.code, r.message, r.msg, 0, nil)
			if e.Status != r.status || !strings.HasPrefix(e.Message, r.want) {
				t.Errorf("got %d %q, want %d %q…", e.Status, e.Message, r.status, r.want)
			}
			body := string(reply.AppendErrorBody(nil, reply.OpenAI, e))
			for _, b := range r.banned {
				if strings.Contains(body, b) {
					t.Errorf("client body mentions %q: %s", b, body)
				}
			}
			if e.Detail != r.msg {
				t.Errorf("detail for the log: got %q, want the node's message", e.Detail)
			}
		})
	}
}

// T2: the tunnel's response header allow-list, name by name: what clients
// read about the answer and their limits is relayed; what could set
// policy on the edge's origin, redirect, or shadow the edge's own headers
// is not (any case; a prefix match must still be a header name).
func TestRelayedHeaderAllowList(t *testing.T) {
	relayed := []string{
		"openai-processing-ms", "openai-version", "openai-organization", "openai-project",
		"OpenAI-Version", "Openai-Organization", "OPENAI-PROJECT",
		"request-id", "Request-Id", "retry-after-ms", "x-should-retry",
		"x-ratelimit-limit-requests", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-requests", "X-RateLimit-Limit-Tokens",
		"anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-tokens-reset",
	}
	notRelayed := []string{
		"Set-Cookie", "Set-Cookie2", "Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Location",
		"Content-Location", "Refresh", "Link", "Cache-Control", "Expires", "Vary", "ETag", "Age",
		"Strict-Transport-Security", "Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
		"Content-Length", "Content-Encoding", "Transfer-Encoding", "Connection", "Keep-Alive", "Trailer",
		"X-Request-Id", "Iop-Ignored-Fields", "Server", "Date", "Alt-Svc",
		"openai-beta", "openai-organization-x", "x-openai-project", "OpenAI-Processing", "openai",
		"x-ratelimit-", "x-ratelimit-a b", "x-ratelimit-a:b", "anthropic-ratelimit-\x00", "anthropic-beta",
		"", "request-id ", "x-iop-node",
	}
	for _, name := range relayed {
		if !relayedHeader(name) {
			t.Errorf("T2: %q is not relayed", name)
		}
	}
	for _, name := range notRelayed {
		if relayedHeader(name) {
			t.Errorf("T2: %q is relayed", name)
		}
	}
}
