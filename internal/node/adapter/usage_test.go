package adapter

import (
	"iop/internal/samples"
	"net/url"
	"path"
	"strings"
	"testing"

	"iop/internal/node/adapter/upstream"

	iop "iop/proto/gen/iop"
)

// scanAll feeds b in pieces of the given size and returns every usage seen.
func scanAll(ct string, b []byte, piece int) []*iop.Usage {
	u := newUsageScanner(200, ct)
	var out []*iop.Usage
	for len(b) > 0 {
		n := min(piece, len(b))
		if x := u.feed(b[:n]); x != nil {
			out = append(out, x)
		}
		b = b[n:]
	}
	if x := u.finish(); x != nil {
		out = append(out, x)
	}
	return out
}

// T2: usage is observed in every captured format, whatever the read sizes.
func TestUsageScannerSamples(t *testing.T) {
	cases := []struct {
		file, ct string
		want     *iop.Usage
	}{
		{"llama_v1_chat_stream.sse", "text/event-stream", &iop.Usage{PromptTokens: 55, CompletionTokens: 8, TotalTokens: 63}},
		{"ollama_v1_chat_tool_stream.sse", "text/event-stream; charset=utf-8", &iop.Usage{PromptTokens: 439, CompletionTokens: 4, TotalTokens: 443}},
		{"llama_v1_messages_stream.sse", "text/event-stream", &iop.Usage{PromptTokens: 55, CompletionTokens: 8, TotalTokens: 63}},
		{"ollama_v1_messages_stream.sse", "text/event-stream", &iop.Usage{PromptTokens: 21, CompletionTokens: 8, TotalTokens: 29}},
		{"llama_v1_chat_tool_nonstream.json", "application/json", &iop.Usage{PromptTokens: 531, CompletionTokens: 4, TotalTokens: 535}},
		{"llama_v1_chat_nonstream.json", "application/json", &iop.Usage{PromptTokens: 55, CompletionTokens: 8, TotalTokens: 63}},
		{"ollama_v1_chat_loop_nonstream.json", "application/json", &iop.Usage{PromptTokens: 21, CompletionTokens: 6, TotalTokens: 27}},
		{"llama_completion.json", "application/json", nil},
		{"ollama_api_chat_tool_stream.ndjson", "application/x-ndjson", &iop.Usage{PromptTokens: 439, CompletionTokens: 4, TotalTokens: 443}},
		{"llama_completion_stream.sse", "text/event-stream", nil},
		{"ollama_v1_models.json", "application/json", nil},
	}
	for _, tc := range cases {
		t.Run("T2 "+tc.file, func(t *testing.T) {
			b := samples.Read(t, tc.file)
			for piece := 1; piece <= len(b); piece += 1 + piece/4 {
				got := scanAll(tc.ct, b, piece)
				if tc.want == nil {
					if len(got) != 0 {
						t.Fatalf("piece %d: got usage %v, want none", piece, got)
					}
					continue
				}
				if len(got) != 1 || got[0].String() != tc.want.String() {
					t.Fatalf("piece %d: got %v, want one %v", piece, got, tc.want)
				}
			}
		})
	}
}

func TestUsageScannerCases(t *testing.T) {
	cases := []struct {
		name, ct string
		status   int
		body     string
		want     string // Usage.String(); "" = none
	}{
		{"T2 usage null on every chunk costs nothing and yields nothing", "text/event-stream", 200,
			"data: {\"choices\":[],\"usage\":null}\n\ndata: {\"usage\" : null}\n\n", ""},
		{"T2 responses API response.completed", "text/event-stream", 200,
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":2,\"total_tokens\":7}}}\n\n",
			(&iop.Usage{PromptTokens: 5, CompletionTokens: 2, TotalTokens: 7}).String()},
		{"T2 Anthropic non-stream message", "application/json", 200,
			`{"type":"message","usage":{"input_tokens":3,"cache_read_input_tokens":4,"output_tokens":2}}`,
			(&iop.Usage{PromptTokens: 7, CompletionTokens: 2, TotalTokens: 9}).String()},
		{"T2 error status not inspected", "application/json", 400, `{"usage":{"prompt_tokens":1}}`, ""},
		{"T2 unknown content type not inspected", "text/plain", 200, `{"usage":{"prompt_tokens":1}}`, ""},
		{"T2 last line without newline", "text/event-stream", 200, `data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}`,
			(&iop.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2}).String()},
		{"T2 malformed usage line ignored", "text/event-stream", 200, "data: {\"usage\":{\"prompt_tokens\":\"x\"\n\n", ""},
		{"T2 Ollama non-stream /api/chat body", "application/json", 200,
			`{"model":"tiny","message":{"role":"assistant","content":"hi"},"done":true,"prompt_eval_count":7,"eval_count":3}`,
			(&iop.Usage{PromptTokens: 7, CompletionTokens: 3, TotalTokens: 10}).String()},
		{"T2 Ollama body not done yet", "application/json", 200, `{"done":false,"prompt_eval_count":7,"eval_count":3}`, ""},
		{"T2 Ollama done line with usage null", "application/x-ndjson", 200, "{\"usage\":null,\"done\":true,\"eval_count\":3}\n",
			(&iop.Usage{PromptTokens: 0, CompletionTokens: 3, TotalTokens: 3}).String()},
		{"T2 responses API non-stream body", "application/json", 200,
			`{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}`,
			(&iop.Usage{PromptTokens: 5, CompletionTokens: 2, TotalTokens: 7}).String()},
		{"T2 usage below the top level is not the answer's", "application/json", 200,
			`{"choices":[{"index":0,"usage":{"prompt_tokens":9,"completion_tokens":9}}],"meta":{"usage":{"prompt_tokens":9}}}`, ""},
		{"T2 usage inside a string is not usage", "application/json", 200,
			`{"choices":[{"message":{"content":"say \"usage\":{\"prompt_tokens\":9}"}}],"x":"\"usage\": {"}`, ""},
		{"T2 a count that is not an integer shows no usage", "application/json", 200,
			`{"usage":{"prompt_tokens":1.5,"completion_tokens":1}}`, ""},
		{"T2 a member of another type shows no usage", "application/json", 200,
			`{"usage":{"prompt_tokens":1,"completion_tokens":1},"done":"yes"}`, ""},
		{"T2 a usage count of another type shows no usage", "application/json", 200,
			`{"usage":{"prompt_tokens":"1","completion_tokens":1}}`, ""},
		{"T2 of a key given twice the last counts", "application/json", 200,
			`{"usage":{"prompt_tokens":1,"completion_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":1}}`,
			(&iop.Usage{PromptTokens: 2, CompletionTokens: 1, TotalTokens: 3}).String()},
		{"T2 null counts are absent", "application/json", 200,
			`{"usage":{"prompt_tokens":4,"completion_tokens":null,"output_tokens":2,"total_tokens":null}}`,
			(&iop.Usage{PromptTokens: 4, CompletionTokens: 2, TotalTokens: 6}).String()},
		{"T2 a body that is not an object shows no usage", "application/json", 200, `[{"usage":{"prompt_tokens":1}}]`, ""},
		{"T2 Anthropic stream: message_delta completes message_start's input", "text/event-stream", 200,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":2,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n",
			(&iop.Usage{PromptTokens: 12, CompletionTokens: 5, TotalTokens: 17}).String()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := newUsageScanner(tc.status, tc.ct)
			var got []*iop.Usage
			if x := u.feed([]byte(tc.body)); x != nil {
				got = append(got, x)
			}
			if x := u.finish(); x != nil {
				got = append(got, x)
			}
			switch {
			case tc.want == "" && len(got) != 0:
				t.Fatalf("got %v, want none", got)
			case tc.want != "" && (len(got) != 1 || got[0].String() != tc.want):
				t.Fatalf("got %v, want %s", got, tc.want)
			}
		})
	}
}

// T2: lines beyond the scanner's bound are skipped, and the scanner keeps
// working after them without holding the bytes.
func TestUsageScannerLongLine(t *testing.T) {
	u := newUsageScanner(200, "text/event-stream")
	long := make([]byte, maxUsageLine+10)
	for i := range long {
		long[i] = 'x'
	}
	for i := 0; i < len(long); i += 1000 {
		u.feed(long[i:min(i+1000, len(long))])
	}
	if len(u.carry) > maxUsageLine {
		t.Fatalf("carry grew to %d bytes", len(u.carry))
	}
	x := u.feed([]byte("\ndata: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3}}\n"))
	if x == nil || x.GetTotalTokens() != 5 {
		t.Fatalf("got %v after a long line, want usage 2+3", x)
	}
}

// T2: a plain stream costs the scanner no allocations.
func TestUsageScannerAllocs(t *testing.T) {
	u := newUsageScanner(200, "text/event-stream")
	chunk := []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
	u.feed(chunk)
	if a := testing.AllocsPerRun(100, func() { u.feed(chunk[:30]); u.feed(chunk[30:]) }); a != 0 {
		t.Fatalf("got %.1f allocs per chunk, want 0", a)
	}
}

// T2: a non-stream answer's usage costs two allocations (the body's copy
// and the Usage), not a decode of the whole body (14 with encoding/json).
func TestUsageScannerJSONAllocs(t *testing.T) {
	body := samples.Read(t, "llama_v1_chat_nonstream.json")
	if a := testing.AllocsPerRun(100, func() {
		u := newUsageScanner(200, "application/json")
		u.feed(body)
		if u.finish() == nil {
			t.Fatal("no usage")
		}
	}); a > 2 {
		t.Fatalf("got %.1f allocs per answer, want at most 2", a)
	}
}

// BenchmarkUsageScanJSON: the scan of a ~1 KiB non-stream chat completion
// (the demo backend's answer of ./run.sh bench), fed in one read.
func BenchmarkUsageScanJSON(b *testing.B) {
	body := []byte(`{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Hello from tiny-gguf! This reply is deterministic. ` +
		strings.Repeat("lorem ipsum dolor sit amet, ", 25) + `"}}],"created":1796688203,"model":"tiny","system_fingerprint":"b0-unknown",` +
		`"object":"chat.completion","usage":{"completion_tokens":8,"prompt_tokens":23,"total_tokens":31,"prompt_tokens_details":{"cached_tokens":0}},` +
		`"id":"chatcmpl-oxf4SLDbtqotC1FlnOlUFlpOaado6XT2","timings":{"cache_n":0,"prompt_n":23,"prompt_ms":0.001052,"predicted_n":8,"predicted_ms":0.001}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		u := newUsageScanner(200, "application/json")
		u.feed(body)
		if u.finish() == nil {
			b.Fatal("no usage")
		}
	}
}

// T2: the usage scanner never panics and never retains more than its bounds.
func FuzzUsageScanner(f *testing.F) {
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\n\n"), uint8(3), uint8(0))
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n"), uint8(7), uint8(1))
	f.Add([]byte(`{"usage":{"input_tokens":1,"output_tokens":2}}`), uint8(1), uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, piece, mode uint8) {
		ct := []string{"text/event-stream", "application/x-ndjson", "application/json"}[int(mode)%3]
		whole := scanAll(ct, b, len(b)+1)
		split := scanAll(ct, b, int(piece)%16+1)
		if len(b) > 0 && len(whole) > 0 != (len(split) > 0) {
			t.Fatalf("usage seen whole=%v split=%v", whole, split)
		}
	})
}

// T1: checkRelPath accepts relative paths below the base only.
func TestCheckRelPath(t *testing.T) {
	cases := []struct {
		path string
		ok   bool
	}{
		{"/v1/models", true}, {"v1/models", true}, {"/v1/models?x=1&y=..", true}, {"/v1/a..b/c", true},
		{"", false}, {"http://h/v1", false}, {"//h/v1", false}, {"/v1/../x", false}, {"..", false}, {"./v1", false},
		{"/v1/%2e%2e/x", false}, {"/v1/%2E./x", false}, {"/v1\\x", false}, {"/v1#frag", false}, {"/v1/\x00", false},
		{"mailto:a@b", false}, {"/v1/%zz", false}, {"/v1/..%2fx", false},
	}
	for _, tc := range cases {
		t.Run("T1 "+tc.path, func(t *testing.T) {
			if err := checkRelPath(tc.path); (err == nil) != tc.ok {
				t.Fatalf("checkRelPath(%q) = %v, want ok=%v", tc.path, err, tc.ok)
			}
		})
	}
}

// T1: a path checkRelPath accepts never leaves the base path once joined.
func FuzzCheckRelPath(f *testing.F) {
	for _, s := range []string{"/v1/models", "/../x", "//h", "v1/%2e%2e/x", "/a/./b", "/%2f%2e%2e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if checkRelPath(p) != nil {
			return
		}
		base, err := parseBaseURL("http://127.0.0.1:1/base")
		if err != nil {
			t.Fatal(err)
		}
		full, err := url.Parse((&upstream.Endpoint{Base: base}).URL(p))
		if err != nil {
			t.Fatalf("accepted %q but the joined URL does not parse: %v", p, err)
		}
		if full.Host != base.Host || full.Scheme != base.Scheme {
			t.Fatalf("accepted %q, which moves the request to %s://%s", p, full.Scheme, full.Host)
		}
		if clean := path.Clean(full.Path); !strings.HasPrefix(clean+"/", "/base/") {
			t.Fatalf("accepted %q, which resolves to %q outside /base/", p, clean)
		}
	})
}
