package upstream

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"

	"iop/internal/protocol"
)

// E8, E9: the provider's own message is extracted from its error body.
func TestErrorMessage(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"E8 Ollama native", `{"error":"model 'no-such-model' not found"}`, "model 'no-such-model' not found"},
		{"E9 OpenAI object", `{"error":{"message":"bad key","type":"invalid_request_error"}}`, "bad key"},
		{"E9 Anthropic", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, "Overloaded"},
		{"E9 top-level message", `{"message":"nope"}`, "nope"},
		{"E9 plain text", "  upstream connect error \n", "upstream connect error"},
		{"E9 empty body", "", "503 Service Unavailable"},
		{"E9 long body is cut", strings.Repeat("x", 5000), strings.Repeat("x", 1024)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ErrorMessage([]byte(tc.body), "503 Service Unavailable"); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// T1: relative paths join below the base path, keeping a query.
func TestEndpointURL(t *testing.T) {
	cases := []struct{ base, rel, want string }{
		{"http://h:1", "/v1/models", "http://h:1/v1/models"},
		{"http://h:1/", "v1/models", "http://h:1/v1/models"},
		{"https://h/openai/", "/v1/chat/completions?x=1", "https://h/openai/v1/chat/completions?x=1"},
		{"http://h/a%20b", "/c", "http://h/a%20b/c"},
	}
	for _, tc := range cases {
		u, err := url.Parse(tc.base)
		if err != nil {
			t.Fatal(err)
		}
		if got := (&Endpoint{Base: u}).URL(tc.rel); got != tc.want {
			t.Errorf("T1: URL(%q, %q) = %q, want %q", tc.base, tc.rel, got, tc.want)
		}
	}
}

func TestToolsAndToolCalls(t *testing.T) {
	for _, raw := range []string{"", "null", "[]", " [ ] "} {
		if got, err := Tools([]byte(raw)); got != nil || err != nil {
			t.Errorf("E9: Tools(%q) = %s, %v; want no tools", raw, got, err)
		}
	}
	if _, err := Tools([]byte(`{"a":1}`)); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("E9: Tools(object) = %v, want ErrInvalidInput", err)
	}
	if calls, err := DecodeToolCalls([]byte(`[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]`)); err != nil || len(calls) != 1 || calls[0].Function.Name != "f" {
		t.Errorf("E9: DecodeToolCalls = %+v, %v", calls, err)
	}
	var r Result
	r.SetToolCalls(nil)
	if r.Metadata != nil || r.FinishReason != "" {
		t.Errorf("E8: SetToolCalls(nil) changed the result: %+v", r)
	}
	r.FinishReason = "stop"
	r.SetToolCalls([]ToolCall{{ID: "x", Type: "function", Function: ToolFunction{Name: "f", Arguments: `{"a":"<b>"}`}}})
	if r.FinishReason != "tool_calls" || r.Metadata[protocol.MetaToolCalls] != `[{"id":"x","type":"function","function":{"name":"f","arguments":"{\"a\":\"\u003cb\u003e\"}"}}]` {
		t.Errorf("E8: SetToolCalls = %+v", r)
	}
	if a, b := NewToolCallID(), NewToolCallID(); a == b || !strings.HasPrefix(a, "call_") || len(a) != 29 {
		t.Errorf("E8: NewToolCallID gave %q and %q", a, b)
	}
}

func TestSameModel(t *testing.T) {
	cases := []struct {
		listed, target string
		want           bool
	}{
		{"tiny:latest", "tiny", true}, {"tiny", "tiny:latest", true}, {"tiny:q4", "tiny", false},
		{"ns/tiny:latest", "ns/tiny", true}, {"host:5000/tiny", "host:5000/tiny:latest", true},
		{"tiny", "tin", false}, {"", "", false}, {"meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B", true},
	}
	for _, tc := range cases {
		if got := SameModel(tc.listed, tc.target); got != tc.want {
			t.Errorf("H10: SameModel(%q, %q) = %v, want %v", tc.listed, tc.target, got, tc.want)
		}
	}
}

// H1: the watchdog's activity hook fires on the headers (Activity) and on
// every read that returned bytes, never on an empty read; nil hooks are
// no-ops.
func TestHooksActivity(t *testing.T) {
	n := 0
	h := Hooks{OnActivity: func() { n++ }}
	h.Activity()
	r := h.Body(iotest.OneByteReader(strings.NewReader("ab")))
	buf := make([]byte, 8)
	for {
		if _, err := r.Read(buf); err != nil {
			break
		}
	}
	if n != 3 {
		t.Fatalf("H1: %d activity calls for the headers and 2 one-byte reads, want 3", n)
	}
	var none Hooks
	none.Activity()
	if got := none.Body(strings.NewReader("x")); got == nil {
		t.Fatal("H1: Body without a hook returned nil")
	}
}

// A1: the Edge's request id rides every upstream request made under
// the run's context as X-Request-Id; an id that could break the header is
// left out.
func TestRequestIDHeader(t *testing.T) {
	u, _ := url.Parse("http://h:1")
	ep := &Endpoint{Base: u}
	rows := []struct{ name, id, want string }{
		{"set", "req-1", "req-1"},
		{"none", "", ""},
		{"CR LF dropped", "a\r\nb", ""},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			ctx := WithRequestID(context.Background(), r.id)
			req, err := ep.NewRequest(ctx, "POST", "/v1/chat/completions", nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := req.Header.Get(HeaderRequestID); got != r.want {
				t.Errorf("X-Request-Id = %q, want %q", got, r.want)
			}
		})
	}
}
