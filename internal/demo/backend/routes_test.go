package backend

import (
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestModelResolution: names resolve with or without ":latest"; other tags,
// unknown names and a missing model are errors in each route's shape.
func TestModelResolution(t *testing.T) {
	h := newHarness(t, Options{})
	tests := []struct {
		name, path, model string
		wantCode          int
		wantBody          string // regexp
	}{
		{"E1 ollama bare name", "/api/chat", "tiny", 200, `"model":"tiny"`},
		{"E1 ollama tagged name echoed", "/api/chat", "tiny:latest", 200, `^\{"model":"tiny:latest"`},
		{"E1 ollama other tag unknown", "/api/chat", "tiny:7b", 404, `^\{"error":"model 'tiny:7b' not found"\}$`},
		{"E1 ollama missing model", "/api/chat", "", 400, `^\{"error":"model is required"\}$`},
		{"E1 v1 tagged name", "/v1/chat/completions", "tiny-loop:latest", 200, `"model":"tiny-loop:latest"`},
		{"E1 v1 unknown", "/v1/chat/completions", "gpt-4", 404, `^\{"error":\{"message":"model 'gpt-4' not found","type":"api_error","param":null,"code":null\}\}\n$`},
		{"E1 v1 missing model", "/v1/chat/completions", "", 400, `"type":"invalid_request_error"`},
		{"E1 messages unknown", "/v1/messages", "nope", 404, `^\{"type":"error","error":\{"type":"not_found_error","message":"model 'nope' not found"\}\}$`},
		{"E1 count_tokens unknown", "/v1/messages/count_tokens", "nope", 404, `"not_found_error"`},
		{"E1 fault suffix is not echoed", "/v1/chat/completions", "tiny+slowheaders=0s", 200, `"model":"tiny",`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"` + tt.model + `","stream":false,` + hiMessages + `}`
			code, _, got := h.do(t, "POST", tt.path, body)
			if code != tt.wantCode {
				t.Errorf("status: got %d, want %d (body %s)", code, tt.wantCode, got)
			}
			if !regexp.MustCompile(tt.wantBody).Match(got) {
				t.Errorf("body: got %s, want match of %s", got, tt.wantBody)
			}
			e := h.nextEnd(t, 5e9)
			if tt.wantCode == 404 && !errors.Is(e.Err, ErrUnknownModel) {
				t.Errorf("RequestEnd.Err: got %v, want ErrUnknownModel", e.Err)
			}
		})
	}
}

// TestBadRequests: malformed JSON, fault suffixes, methods and paths.
func TestBadRequests(t *testing.T) {
	h := newHarness(t, Options{})
	tests := []struct {
		name, method, path, body string
		wantCode                 int
		wantBody                 string // regexp
		wantErr                  error
	}{
		{"issue6 ollama bad JSON", "POST", "/api/chat", `{no`, 400,
			`^\{"error":"invalid character 'n' looking for beginning of object key string"\}$`, ErrBadRequest},
		{"issue6 messages bad JSON", "POST", "/v1/messages", `{no`, 400,
			`^\{"type":"error","error":\{"type":"invalid_request_error","message":"invalid character`, ErrBadRequest},
		{"issue6 v1 empty body", "POST", "/v1/chat/completions", ``, 400, `unexpected end of JSON input`, ErrBadRequest},
		{"issue6 v1 wrong field type", "POST", "/v1/chat/completions", `{"model":"tiny","max_tokens":"x"}`, 400,
			`cannot unmarshal string`, ErrBadRequest},
		{"issue6 unknown fault", "POST", "/v1/chat/completions", `{"model":"tiny+explode=1"}`, 400,
			`fault \\"explode=1\\": unknown kind`, ErrBadFault},
		{"issue6 bad stall count", "POST", "/api/chat", `{"model":"tiny+stall=x"}`, 400, `fault \\"stall=x\\"`, ErrBadFault},
		{"issue6 status out of range", "POST", "/v1/messages", `{"model":"tiny+status=200"}`, 400, `HTTP status 400-599`, ErrBadFault},
		{"issue6 slowheaders not a duration", "POST", "/v1/messages", `{"model":"tiny+slowheaders=soon"}`, 400, `want a duration`, ErrBadFault},
		{"issue6 GET on a POST route", "GET", "/v1/chat/completions", ``, 405, `"message":"method GET not allowed`, nil},
		{"issue6 unknown path", "GET", "/v2/nothing", ``, 404, `"message":"path /v2/nothing not found"`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, got := h.do(t, tt.method, tt.path, tt.body)
			if code != tt.wantCode {
				t.Errorf("status: got %d, want %d (body %s)", code, tt.wantCode, got)
			}
			if !regexp.MustCompile(tt.wantBody).Match(got) {
				t.Errorf("body: got %s, want match of %s", got, tt.wantBody)
			}
			if !json.Valid(got) {
				t.Errorf("body is not JSON: %s", got)
			}
			e := h.nextEnd(t, 5e9)
			if tt.wantErr != nil && !errors.Is(e.Err, tt.wantErr) {
				t.Errorf("RequestEnd.Err: got %v, want %v", e.Err, tt.wantErr)
			}
			if e.Outcome != OutcomeError {
				t.Errorf("outcome: got %q, want %q", e.Outcome, OutcomeError)
			}
		})
	}
}

// ollamaLine is the part of an /api/chat line the tests read.
type ollamaLine struct {
	Message struct {
		Content   string            `json:"content"`
		ToolCalls []json.RawMessage `json:"tool_calls"`
	} `json:"message"`
	Done            bool   `json:"done"`
	DoneReason      string `json:"done_reason"`
	PromptEvalCount int    `json:"prompt_eval_count"`
	EvalCount       int    `json:"eval_count"`
}

// answer reduces any route's response to text, finish reason and usage.
type answer struct {
	text       string
	finish     string
	prompt     int
	completion int
	chunks     int // content chunks of a stream
}

func parseAnswer(t *testing.T, path string, stream bool, body []byte) answer {
	t.Helper()
	var a answer
	switch {
	case path == "/api/chat":
		lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
		for _, l := range lines {
			var o ollamaLine
			if err := json.Unmarshal([]byte(l), &o); err != nil {
				t.Fatalf("ndjson line %q: %v", l, err)
			}
			a.text += o.Message.Content
			if o.Done {
				a.finish, a.prompt, a.completion = o.DoneReason, o.PromptEvalCount, o.EvalCount
			} else {
				a.chunks++
			}
		}
	case path == "/v1/chat/completions" && stream:
		for _, ev := range strings.Split(string(body), "\n\n") {
			data, ok := strings.CutPrefix(ev, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var c struct {
				Choices []struct {
					Delta struct {
						Content *string `json:"content"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
				Usage *struct {
					PromptTokens     int `json:"prompt_tokens"`
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(data), &c); err != nil {
				t.Fatalf("sse data %q: %v", data, err)
			}
			if c.Usage != nil {
				a.prompt, a.completion = c.Usage.PromptTokens, c.Usage.CompletionTokens
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != nil {
					a.text += *ch.Delta.Content
					a.chunks++
				}
				if ch.FinishReason != nil {
					a.finish = *ch.FinishReason
				}
			}
		}
	case path == "/v1/chat/completions":
		var r struct {
			Choices []struct {
				Message      struct{ Content string } `json:"message"`
				FinishReason string                   `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("chat completion %s: %v", body, err)
		}
		a.text, a.finish = r.Choices[0].Message.Content, r.Choices[0].FinishReason
		a.prompt, a.completion = r.Usage.PromptTokens, r.Usage.CompletionTokens
	case stream: // /v1/messages
		for _, ev := range strings.Split(string(body), "\n\n") {
			_, data, ok := strings.Cut(ev, "\ndata: ")
			if !ok {
				continue
			}
			var e struct {
				Type    string `json:"type"`
				Message struct {
					Usage struct {
						InputTokens int `json:"input_tokens"`
					} `json:"usage"`
				} `json:"message"`
				Delta struct {
					Text       string `json:"text"`
					StopReason string `json:"stop_reason"`
				} `json:"delta"`
				Usage struct {
					OutputTokens int `json:"output_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(data), &e); err != nil {
				t.Fatalf("sse data %q: %v", data, err)
			}
			switch e.Type {
			case "message_start":
				a.prompt = e.Message.Usage.InputTokens
			case "content_block_delta":
				a.text += e.Delta.Text
				a.chunks++
			case "message_delta":
				a.finish, a.completion = e.Delta.StopReason, e.Usage.OutputTokens
			}
		}
	default: // /v1/messages
		var m struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
			StopReason string `json:"stop_reason"`
			Usage      struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &m); err != nil || len(m.Content) != 1 {
			t.Fatalf("message %s: %v", body, err)
		}
		a.text, a.finish = m.Content[0].Text, m.StopReason
		a.prompt, a.completion = m.Usage.InputTokens, m.Usage.OutputTokens
	}
	return a
}

// TestTokenLimits: tiny-loop stops at the limit with a "length" reason on
// every route; tiny honours a limit below its answer and stops normally above.
func TestTokenLimits(t *testing.T) {
	loop6 := " lorem ipsum dolor sit amet, lorem" // ollama_v1_chat_loop_nonstream.json's content
	var capture struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(readCapture(t, "ollama_v1_chat_loop_nonstream.json"), &capture); err != nil || capture.Choices[0].Message.Content != loop6 {
		t.Fatalf("loop capture: %v %+v", err, capture)
	}
	full := "Hello from tiny-gguf! This reply is deterministic."
	h := newHarness(t, Options{LoopTokens: 10})
	tests := []struct {
		name, path, body string
		stream           bool
		want             answer
	}{
		{"issue6 loop v1 max_tokens", "/v1/chat/completions", `{"model":"tiny-loop","max_tokens":6,` + hiMessages + `}`, false,
			answer{text: loop6, finish: "length", prompt: 21, completion: 6}},
		{"issue6 loop v1 max_completion_tokens stream", "/v1/chat/completions",
			`{"model":"tiny-loop","max_completion_tokens":100,"stream":true,"stream_options":{"include_usage":true},` + hiMessages + `}`, true,
			answer{text: strings.Repeat(" lorem ipsum dolor sit amet,", 20), finish: "length", prompt: 21, completion: 100, chunks: 100}},
		{"E8 loop ollama num_predict", "/api/chat", `{"model":"tiny-loop","options":{"num_predict":5},` + hiMessages + `}`, true,
			answer{text: " lorem ipsum dolor sit amet,", finish: "length", prompt: 21, completion: 5, chunks: 5}},
		{"E8 loop ollama default limit", "/api/chat", `{"model":"tiny-loop","stream":false,` + hiMessages + `}`, false,
			answer{text: strings.Repeat(" lorem ipsum dolor sit amet,", 2), finish: "length", prompt: 21, completion: 10}},
		{"issue6 loop messages stream", "/v1/messages", `{"model":"tiny-loop","max_tokens":3,"stream":true,` + hiMessages + `}`, true,
			answer{text: " lorem ipsum dolor", finish: "max_tokens", prompt: 21, completion: 3, chunks: 3}},
		{"issue6 tiny below its answer", "/v1/messages", `{"model":"tiny","max_tokens":4,` + hiMessages + `}`, false,
			answer{text: "Hello from tiny-gguf! This", finish: "max_tokens", prompt: 21, completion: 4}},
		{"issue6 tiny above its answer", "/v1/messages", `{"model":"tiny","max_tokens":8,` + hiMessages + `}`, false,
			answer{text: full, finish: "end_turn", prompt: 21, completion: 8}},
		{"issue6 tiny-tool without tools answers text", "/v1/chat/completions", `{"model":"tiny-tool","tools":[],` + hiMessages + `}`, false,
			answer{text: full, finish: "stop", prompt: 21, completion: 8}},
		{"issue6 prompt grows with the prompt", "/api/chat",
			`{"model":"tiny","stream":false,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}]}`, false,
			answer{text: full, finish: "stop", prompt: 16 + 4 + 4 + 4 + 1, completion: 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, body := h.do(t, "POST", tt.path, tt.body)
			if code != http.StatusOK {
				t.Fatalf("status: got %d, want 200 (%s)", code, body)
			}
			if got := parseAnswer(t, tt.path, tt.stream, body); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if e := h.nextEnd(t, 5e9); e.Tokens != tt.want.completion && tt.want.finish != "stop" && tt.want.finish != "end_turn" {
				t.Errorf("RequestEnd.Tokens: got %d, want %d", e.Tokens, tt.want.completion)
			}
		})
	}
}

// TestCountTokens: count_tokens agrees with the input_tokens of /v1/messages.
func TestCountTokens(t *testing.T) {
	h := newHarness(t, Options{})
	body := `{"model":"tiny","max_tokens":16,"system":"Be brief.",` + hiMessages + `,` + weatherTools + `}`
	code, _, got := h.do(t, "POST", "/v1/messages/count_tokens", body)
	if code != 200 {
		t.Fatalf("status: got %d, want 200", code)
	}
	_, _, msg := h.do(t, "POST", "/v1/messages", body)
	a := parseAnswer(t, "/v1/messages", false, msg)
	want := `{"input_tokens":` + itoa(a.prompt) + `}`
	if string(got) != want || a.prompt <= 21 {
		t.Errorf("count_tokens: got %s, want %s (> 21 with system and tools)", got, want)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestPadBytes: non-stream text bodies are padded to exactly PadBytes;
// streams and tool calls are not.
func TestPadBytes(t *testing.T) {
	h := newHarness(t, Options{PadBytes: 1024})
	tests := []struct {
		name, path, body string
		wantLen          int // 0 = unpadded
	}{
		{"issue6 ollama", "/api/chat", `{"model":"tiny","stream":false,` + hiMessages + `}`, 1024},
		{"issue6 v1", "/v1/chat/completions", `{"model":"tiny",` + hiMessages + `}`, 1024},
		{"issue6 messages", "/v1/messages", `{"model":"tiny-loop","max_tokens":4,` + hiMessages + `}`, 1024},
		{"issue6 stream unpadded", "/api/chat", `{"model":"tiny",` + hiMessages + `}`, 0},
		{"issue6 tool unpadded", "/v1/chat/completions", `{"model":"tiny-tool",` + hiMessages + `,` + weatherTools + `}`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, got := h.do(t, "POST", tt.path, tt.body)
			h.nextEnd(t, 5e9)
			if tt.wantLen == 0 {
				if strings.Contains(string(got), "amet,") {
					t.Errorf("got filler in %s, want an unpadded body", got)
				}
				return
			}
			if len(got) != tt.wantLen || !json.Valid(got) {
				t.Errorf("body: got %d bytes (valid JSON %v), want %d", len(got), json.Valid(got), tt.wantLen)
			}
			if !strings.Contains(string(got), "lorem ipsum dolor sit amet,") {
				t.Errorf("body has no filler: %s", got)
			}
		})
	}
}

// TestIDs: ids have the captured shapes and are a function of seed and
// request number.
func TestIDs(t *testing.T) {
	ids := func(seed uint64) []string {
		h := newHarness(t, Options{Seed: seed})
		_, _, a := h.do(t, "POST", "/v1/chat/completions", `{"model":"tiny-tool",`+hiMessages+`,`+weatherTools+`}`)
		_, _, b := h.do(t, "POST", "/api/chat", `{"model":"tiny-tool","stream":false,`+hiMessages+`,`+weatherTools+`}`)
		re := regexp.MustCompile(`"id":"(chatcmpl-[A-Za-z0-9]{32}|[A-Za-z0-9]{32}|call_[a-z0-9]{8})"`)
		var out []string
		for _, m := range re.FindAllSubmatch(append(a, b...), -1) {
			out = append(out, string(m[1]))
		}
		if len(out) != 3 {
			t.Fatalf("ids: got %q, want a chatcmpl id, a 32-character tool id and a call_ id", out)
		}
		return out
	}
	a, b, c := ids(7), ids(7), ids(8)
	if strings.Join(a, ",") != strings.Join(b, ",") {
		t.Errorf("same seed: got %q and %q, want equal", a, b)
	}
	if a[0] == c[0] || a[1] == c[1] {
		t.Errorf("other seed: got %q and %q, want different ids", a, c)
	}
}

// TestNewOptions: New reports every bad option at once.
func TestNewOptions(t *testing.T) {
	_, err := New(Options{TokenDelay: -1, PadBytes: -1, LoopTokens: -1, Models: []string{"tiny", "llama3"}})
	if !errors.Is(err, ErrBadOption) {
		t.Fatalf("got %v, want ErrBadOption", err)
	}
	for _, part := range []string{"TokenDelay", "PadBytes", "LoopTokens", `"llama3"`} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not name %s", err, part)
		}
	}
	if b, err := New(Options{Models: []string{"tiny-loop"}}); err != nil || len(b.models) != 1 {
		t.Errorf("New(tiny-loop): got %v, want one model", err)
	}
}

// TestInfoRoutes: version, health, root and stats.
func TestInfoRoutes(t *testing.T) {
	h := newHarness(t, Options{})
	for _, tt := range []struct{ name, path, want string }{
		{"issue6 version", "/api/version", `{"version":"0.17.4"}`},
		{"issue6 health", "/health", `{"status":"ok"}`},
		{"issue6 root says stand-in", "/", "iop demo-backend: a deterministic stand-in for a model server, not a model\n"},
		{"issue6 issue16 stats", "/_demo/stats", `{"active":0,"started":4,"ended":3,"prompt_tokens":0,"cached_tokens":0}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, got := h.do(t, "GET", tt.path, "")
			if code != 200 || string(got) != tt.want {
				t.Errorf("got %d %q, want 200 %q", code, got, tt.want)
			}
			h.nextEnd(t, 5e9)
		})
	}
}
