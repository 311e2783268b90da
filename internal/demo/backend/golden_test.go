package backend

import (
	"bytes"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

const (
	hiMessages   = `"messages":[{"role":"user","content":"Hi"}]`
	weatherTools = `"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	weatherRespTools = `"tools":[{"type":"function","name":"get_weather","description":"Get the weather",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`
)

// TestGolden compares each emulated route's bytes with the real server's
// capture after normalize (ids, timestamps, durations, timings and
// prompt-size-derived counts); everything else must match byte for byte.
// E8, E9 and T2 rely on it: the adapters and the tunnel are exercised against
// the demo backend as if it were the real server.
func TestGolden(t *testing.T) {
	dropTinyRandom := func(b []byte) []byte {
		re := regexp.MustCompile(`\{"name":"tiny-random:latest".*?"quantization_level":"unknown"\}\},`)
		out := re.ReplaceAll(b, nil)
		if bytes.Equal(out, b) {
			t.Fatalf("tags capture: tiny-random entry not found")
		}
		return out
	}
	tests := []struct {
		name    string
		models  []string // Options.Models
		setup   string   // a POST /api/chat body sent first, "" = none
		method  string
		path    string
		body    string
		capture string
		ctype   string
		fixWant func([]byte) []byte
		isHTTP  bool // capture is status line + body
	}{
		{name: "E8 ollama /api/chat stream", method: "POST", path: "/api/chat",
			body: `{"model":"tiny",` + hiMessages + `}`, capture: "ollama_api_chat_stream.ndjson", ctype: "application/x-ndjson"},
		{name: "E8 ollama /api/chat tool stream", method: "POST", path: "/api/chat",
			body: `{"model":"tiny-tool",` + hiMessages + `,` + weatherTools + `}`, capture: "ollama_api_chat_tool_stream.ndjson", ctype: "application/x-ndjson"},
		{name: "issue6 ollama /api/tags", method: "GET", path: "/api/tags",
			capture: "ollama_api_tags.json", ctype: "application/json; charset=utf-8", fixWant: dropTinyRandom},
		{name: "issue6 ollama /api/ps after a tiny chat", setup: `{"model":"tiny","stream":false,` + hiMessages + `}`,
			method: "GET", path: "/api/ps", capture: "ollama_api_ps.json", ctype: "application/json; charset=utf-8"},
		{name: "issue6 ollama /api/chat unknown model", method: "POST", path: "/api/chat",
			body: `{"model":"no-such-model",` + hiMessages + `}`, capture: "ollama_api_chat_error_unknown_model.http",
			ctype: "application/json; charset=utf-8", isHTTP: true},
		{name: "T2 llama /v1/chat/completions stream include_usage", method: "POST", path: "/v1/chat/completions",
			body:    `{"model":"tiny","stream":true,"stream_options":{"include_usage":true},` + hiMessages + `}`,
			capture: "llama_v1_chat_stream.sse", ctype: "text/event-stream"},
		{name: "T2 llama /v1/chat/completions non-stream", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"tiny",` + hiMessages + `}`, capture: "llama_v1_chat_nonstream.json", ctype: "application/json; charset=utf-8"},
		{name: "E9 llama /v1/chat/completions tool stream", method: "POST", path: "/v1/chat/completions",
			body:    `{"model":"tiny-tool","stream":true,"stream_options":{"include_usage":true},` + hiMessages + `,` + weatherTools + `}`,
			capture: "llama_v1_chat_tool_stream.sse", ctype: "text/event-stream"},
		{name: "E9 llama /v1/chat/completions tool non-stream", method: "POST", path: "/v1/chat/completions",
			body:    `{"model":"tiny-tool",` + hiMessages + `,` + weatherTools + `}`,
			capture: "llama_v1_chat_tool_nonstream.json", ctype: "application/json; charset=utf-8"},
		{name: "T2 llama /v1/messages stream", method: "POST", path: "/v1/messages",
			body:    `{"model":"tiny","max_tokens":64,"stream":true,` + hiMessages + `}`,
			capture: "llama_v1_messages_stream.sse", ctype: "text/event-stream"},
		{name: "F1 llama /v1/responses stream", method: "POST", path: "/v1/responses",
			body: `{"model":"tiny","stream":true,"input":"Hi"}`, capture: "llama_v1_responses_stream.sse", ctype: "text/event-stream"},
		{name: "F1 llama /v1/responses non-stream", method: "POST", path: "/v1/responses",
			body: `{"model":"tiny","input":"Hi"}`, capture: "llama_v1_responses_nonstream.json", ctype: "application/json; charset=utf-8"},
		{name: "F1 llama /v1/responses tool stream", method: "POST", path: "/v1/responses",
			body:    `{"model":"tiny-tool","stream":true,"input":"Hi",` + weatherRespTools + `}`,
			capture: "llama_v1_responses_tool_stream.sse", ctype: "text/event-stream"},
		{name: "F1 ollama /api/chat logprobs stream", method: "POST", path: "/api/chat",
			body:    `{"model":"tiny",` + hiMessages + `,"logprobs":true,"top_logprobs":2}`,
			capture: "ollama_api_chat_logprobs_stream.ndjson", ctype: "application/x-ndjson"},
		{name: "F1 ollama /api/embed", method: "POST", path: "/api/embed",
			body: `{"model":"tiny","input":["Hi","there"]}`, capture: "ollama_api_embed.json", ctype: "application/json; charset=utf-8"},
		{name: "F1 ollama /v1/embeddings", method: "POST", path: "/v1/embeddings",
			body: `{"model":"tiny","input":"Hi"}`, capture: "ollama_v1_embeddings.json", ctype: "application/json"},
		{name: "F1 llama /v1/completions stream", method: "POST", path: "/v1/completions",
			body: `{"model":"tiny","prompt":"Hi","stream":true}`, capture: "llama_v1_completions_stream.sse", ctype: "text/event-stream"},
		{name: "F1 llama /v1/completions non-stream", method: "POST", path: "/v1/completions",
			body: `{"model":"tiny","prompt":"Hi"}`, capture: "llama_v1_completions_nonstream.json", ctype: "application/json; charset=utf-8"},
		{name: "T2 llama /v1/models", models: []string{"tiny"}, method: "GET", path: "/v1/models",
			capture: "llama_v1_models.json", ctype: "application/json; charset=utf-8"},
		{name: "issue6 /v1 bad JSON", method: "POST", path: "/v1/chat/completions",
			body: `{no json`, capture: "ollama_v1_chat_error_bad_json.http", ctype: "application/json; charset=utf-8", isHTTP: true},
		{name: "issue6 /v1 unknown model", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"no-such-model",` + hiMessages + `}`, capture: "ollama_v1_chat_error_unknown_model.http",
			ctype: "application/json; charset=utf-8", isHTTP: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{Models: tt.models})
			if tt.setup != "" {
				if code, _, _ := h.do(t, "POST", "/api/chat", tt.setup); code != http.StatusOK {
					t.Fatalf("setup: got status %d, want 200", code)
				}
			}
			code, hdr, got := h.do(t, tt.method, tt.path, tt.body)
			want := readCapture(t, tt.capture)
			wantCode := http.StatusOK
			if tt.isHTTP {
				wantCode, want = splitHTTP(t, want)
			}
			if tt.fixWant != nil {
				want = tt.fixWant(want)
			}
			if code != wantCode {
				t.Errorf("status: got %d, want %d", code, wantCode)
			}
			if ct := hdr.Get("Content-Type"); ct != tt.ctype {
				t.Errorf("Content-Type: got %q, want %q", ct, tt.ctype)
			}
			if g, w := normalize(got), normalize(want); !bytes.Equal(g, w) {
				t.Errorf("body differs from %s after normalizing: %s\nfull body:\n%s", tt.capture, diffLines(g, w), got)
			}
		})
	}
}

// TestNormalizeCanFail proves the golden comparison is not vacuous: a body
// with another id shape, text or token count does not match its capture.
func TestNormalizeCanFail(t *testing.T) {
	want := readCapture(t, "llama_v1_chat_tool_nonstream.json")
	for _, tt := range []struct{ name, from, to string }{
		{"issue6 shorter tool-call id", `"id":"lz2D3mJ1Sd2X18tAI52BYAh19tDB37w8"`, `"id":"lz2D3mJ1"`},
		{"issue6 other argument spacing", `{\"city\": \"Paris\"}`, `{\"city\":\"Paris\"}`},
		{"issue6 other completion count", `"completion_tokens":4`, `"completion_tokens":5`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := []byte(strings.Replace(string(want), tt.from, tt.to, 1))
			if bytes.Equal(got, want) {
				t.Fatalf("replacement %q not found in the capture", tt.from)
			}
			if bytes.Equal(normalize(got), normalize(want)) {
				t.Errorf("normalize hides the change %q → %q", tt.from, tt.to)
			}
		})
	}
}
