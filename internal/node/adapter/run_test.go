package adapter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

const tinyReply = "Hello from tiny-gguf! This reply is deterministic."

// E8: the Ollama adapter replays the real /api/chat captures into events.
func TestRunOllamaSamples(t *testing.T) {
	cases := []struct {
		name      string
		file      string
		content   string
		finish    string
		usage     [3]int64
		toolCalls string
	}{
		{"E8 text stream", "ollama_api_chat_stream.ndjson", tinyReply, "stop", [3]int64{21, 8, 29}, ""},
		{"E8 native tool call in OpenAI shape, finish tool_calls", "ollama_api_chat_tool_stream.ndjson", "", "tool_calls", [3]int64{439, 4, 443},
			`[{"id":"call_mixofqgs","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, replay(200, "application/x-ndjson", sample(t, tc.file)))
			s := newSet(t, adapter.Options{}, ollamaAdapter("", up.URL, 2))
			evs := runAll(context.Background(), s, &iop.RunRequest{Stream: true, Target: "tiny", Input: userInput("Hi")})
			last, deltas := checkRun(t, evs)
			if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
				t.Fatalf("got %v %q, want COMPLETE", last.GetType(), last.GetError())
			}
			if last.GetContent() != tc.content || deltas != tc.content {
				t.Fatalf("content %q, deltas %q; want %q", last.GetContent(), deltas, tc.content)
			}
			if last.GetFinishReason() != tc.finish {
				t.Fatalf("finish_reason %q, want %q", last.GetFinishReason(), tc.finish)
			}
			u := last.GetUsage()
			if got := [3]int64{u.GetPromptTokens(), u.GetCompletionTokens(), u.GetTotalTokens()}; got != tc.usage {
				t.Fatalf("usage %v, want %v", got, tc.usage)
			}
			if got := last.GetMetadata()["openai_tool_calls"]; got != tc.toolCalls {
				t.Fatalf("openai_tool_calls %s, want %s", got, tc.toolCalls)
			}
			if last.GetAdapter() != "ollama" || last.GetTarget() != "tiny" {
				t.Fatalf("H8: adapter/target %q/%q, want ollama/tiny", last.GetAdapter(), last.GetTarget())
			}
			reqs := up.requests()
			if len(reqs) != 1 || reqs[0].Path != "/api/chat" || reqs[0].Method != http.MethodPost {
				t.Fatalf("upstream requests %+v, want one POST /api/chat", reqs)
			}
			var body map[string]any
			if err := json.Unmarshal(reqs[0].Body, &body); err != nil || body["model"] != "tiny" || body["stream"] != true {
				t.Fatalf("request body %s: want model tiny, stream true", reqs[0].Body)
			}
		})
	}
}

// E8: Ollama errors and broken streams end in one ERROR terminal.
func TestRunOllamaFailures(t *testing.T) {
	status404, body404 := httpSample(t, "ollama_api_chat_error_unknown_model.http")
	chat := sample(t, "ollama_api_chat_stream.ndjson")
	cut := chat[:strings.Index(string(chat), `"done":true`)-200]
	cut = cut[:strings.LastIndexByte(string(cut), '\n')+1]
	cases := []struct {
		name    string
		h       func(http.ResponseWriter, *http.Request, []byte)
		code    string
		status  int32
		message string
	}{
		{"E8 unknown model 404 carries status and message", replay(status404, "application/json", body404),
			protocol.CodeUpstreamStatus.String(), 404, "model 'no-such-model' not found"},
		{"E8 stream ends before done", replay(200, "application/x-ndjson", cut), protocol.CodeUpstreamError.String(), 0, "before its done line"},
		{"E8 malformed line", replay(200, "application/x-ndjson", []byte("{\"message\":{\"content\":\"a\"},\"done\":false}\n{oops\n")),
			protocol.CodeUpstreamError.String(), 0, "not JSON"},
		{"E8 error line mid-stream", replay(200, "application/x-ndjson", []byte("{\"error\":\"out of memory\"}\n")),
			protocol.CodeUpstreamError.String(), 0, "out of memory"},
		{"E8 reset mid-stream", resetAfter("application/x-ndjson", chat[:200]), protocol.CodeUpstreamError.String(), 0, ""},
		{"E8 upstream 500 with JSON body", replay(500, "application/json", []byte(`{"error":"llama runner process has terminated"}`)),
			protocol.CodeUpstreamStatus.String(), 500, "llama runner process has terminated"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, tc.h)
			s := newSet(t, adapter.Options{}, ollamaAdapter("ollama", up.URL, 1))
			last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "ollama", Target: "no-such-model", Input: userInput("Hi")}))
			if last.GetType() != iop.RunEventType_RUN_EVENT_ERROR || last.GetFailureCode() != tc.code || last.GetUpstreamStatus() != tc.status {
				t.Fatalf("got %v %q status %d (%q), want ERROR %q status %d", last.GetType(), last.GetFailureCode(), last.GetUpstreamStatus(), last.GetError(), tc.code, tc.status)
			}
			if !strings.Contains(last.GetError(), tc.message) {
				t.Fatalf("error %q does not contain %q", last.GetError(), tc.message)
			}
			if last.GetFailure() != nil {
				t.Fatalf("H4: non-stall failure carries ExecutionFailure %v", last.GetFailure())
			}
		})
	}
}

// E1, E2, E7, C4: boundary checks end the run before any provider call.
func TestRunBoundary(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, replay(200, "application/x-ndjson", sample(t, "ollama_api_chat_stream.ndjson")))
	two := []*iop.AdapterConfig{ollamaAdapter("gpu-ollama", up.URL, 1), compatAdapter("llama", llamaProfile(up.URL), 1)}
	cases := []struct {
		name string
		req  *iop.RunRequest
		code string
	}{
		{"E1 unknown adapter", &iop.RunRequest{Stream: true, Adapter: "nope", Target: "tiny", Input: userInput("Hi")}, protocol.CodeUnknownAdapter.String()},
		{"E1 empty adapter with two instances and none named ollama", &iop.RunRequest{Stream: true, Target: "tiny", Input: userInput("Hi")}, protocol.CodeUnknownAdapter.String()},
		{"E2 negative stall timeout", &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Target: "tiny", Input: userInput("Hi"), ResponseStallTimeoutMs: -1}, protocol.CodeInvalidRequest.String()},
		{"E2 stall timeout too large for a duration", &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Target: "tiny", Input: userInput("Hi"), ResponseStallTimeoutMs: math.MaxInt64}, protocol.CodeInvalidRequest.String()},
		{"E2 negative timeout_sec", &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Target: "tiny", Input: userInput("Hi"), TimeoutSec: -5}, protocol.CodeInvalidRequest.String()},
		{"E1 empty target", &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Input: userInput("Hi")}, protocol.CodeInvalidRequest.String()},
		{"E1 no input", &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Target: "tiny"}, protocol.CodeInvalidRequest.String()},
		{"E8 bad tool-call arguments", &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Target: "tiny", Input: &iop.RunInput{Messages: []*iop.ChatMessage{
			{Role: "assistant", ToolCallsJson: []byte(`[{"id":"c1","type":"function","function":{"name":"f","arguments":"not json"}}]`)}}}}, protocol.CodeInvalidRequest.String()},
		{"C4 lease without binding", &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Target: "tiny", Input: userInput("Hi"), CredentialLease: &iop.CredentialLease{LeaseId: "l"}}, protocol.CodeCredentialInvalid.String()},
	}
	s := newSet(t, adapter.Options{}, two...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			last, _ := checkRun(t, runAll(context.Background(), s, tc.req))
			if last.GetType() != iop.RunEventType_RUN_EVENT_ERROR || last.GetFailureCode() != tc.code {
				t.Fatalf("got %v %q (%q), want ERROR %q", last.GetType(), last.GetFailureCode(), last.GetError(), tc.code)
			}
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("E2: %d upstream calls after rejected runs, want 0", n)
	}

	t.Run("C4 credential plane on and no lease", func(t *testing.T) {
		cs := newLeaseKit(t).planeSet(t, two...)
		last, _ := checkRun(t, runAll(context.Background(), cs, &iop.RunRequest{Stream: true, Adapter: "gpu-ollama", Target: "tiny", Input: userInput("Hi")}))
		if last.GetFailureCode() != protocol.CodeCredentialRequired.String() {
			t.Fatalf("got %q, want %q", last.GetFailureCode(), protocol.CodeCredentialRequired)
		}
		if n := len(up.requests()); n != 0 {
			t.Fatalf("C4: %d upstream calls, want 0", n)
		}
	})

	t.Run("E1 empty adapter is the single instance; E7 metadata is not control input", func(t *testing.T) {
		one := newSet(t, adapter.Options{}, ollamaAdapter("", up.URL, 1))
		req := &iop.RunRequest{Stream: true, Target: "tiny", Input: userInput("Hi"), ResponseStallTimeoutMs: 0,
			Metadata: map[string]string{"work_dir": "/etc", "session": "other", "adapter": "nope"}}
		last, _ := checkRun(t, runAll(context.Background(), one, req))
		if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE || last.GetAdapter() != "ollama" {
			t.Fatalf("got %v on %q (%q), want COMPLETE on ollama", last.GetType(), last.GetAdapter(), last.GetError())
		}
		if _, ok := last.GetMetadata()["work_dir"]; ok {
			t.Fatalf("E7: request metadata echoed into the terminal: %v", last.GetMetadata())
		}
		body := string(up.requests()[0].Body)
		if strings.Contains(body, "work_dir") || strings.Contains(body, "/etc") {
			t.Fatalf("E7: request metadata reached the provider: %s", body)
		}
	})
}

// E2: a negative or overflowing response_stall_timeout_ms is refused at the
// Node boundary before any router or adapter lookup: with an adapter name
// the set does not know, the answer is still invalid_request, never
// unknown_adapter — on the run path and on the tunnel path.
func TestE2StallTimeoutBeforeAdapterLookup(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, replay(200, "application/json", []byte(`{}`)))
	s := newSet(t, adapter.Options{}, ollamaAdapter("gpu-ollama", up.URL, 1))
	for _, ms := range []int64{-1, math.MaxInt64} {
		t.Run(fmt.Sprintf("E2 run %d ms", ms), func(t *testing.T) {
			last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "nope", Target: "tiny",
				Input: userInput("Hi"), ResponseStallTimeoutMs: ms}))
			if last.GetFailureCode() != protocol.CodeInvalidRequest.String() || !strings.Contains(last.GetMessage(), "response_stall_timeout_ms") {
				t.Fatalf("got %q (%q, message %q), want invalid_request naming response_stall_timeout_ms",
					last.GetFailureCode(), last.GetError(), last.GetMessage())
			}
		})
		t.Run(fmt.Sprintf("E2 tunnel %d ms", ms), func(t *testing.T) {
			last, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "nope",
				Target: "tiny", Operation: protocol.OpModels, Method: "GET", ResponseStallTimeoutMs: ms}))
			if last.GetFailureCode() != protocol.CodeInvalidRequest.String() {
				t.Fatalf("got %q (%q), want invalid_request", last.GetFailureCode(), last.GetError())
			}
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("E2: %d upstream calls, want 0", n)
	}
}

// E1: NewSet names the bad adapter.
func TestNewSetErrors(t *testing.T) {
	good := llamaProfile("http://127.0.0.1:1")
	cases := []struct {
		name string
		ac   []*iop.AdapterConfig
		env  map[string]string
		want error
	}{
		{"E1 unknown type", []*iop.AdapterConfig{{Name: "x", Type: "vllm"}}, nil, adapter.ErrUnknownType},
		{"E1 duplicate name", []*iop.AdapterConfig{ollamaAdapter("a", "http://h:1", 1), compatAdapter("a", good, 1)}, nil, adapter.ErrDuplicateName},
		{"E1 empty names of one type collide", []*iop.AdapterConfig{ollamaAdapter("", "http://h:1", 1), ollamaAdapter("", "http://h:2", 1)}, nil, adapter.ErrDuplicateName},
		{"E1 bad base_url scheme", []*iop.AdapterConfig{ollamaAdapter("a", "ftp://h", 1)}, nil, adapter.ErrBadBaseURL},
		{"E1 base_url with user info", []*iop.AdapterConfig{ollamaAdapter("a", "http://u:p@h:1", 1)}, nil, adapter.ErrBadBaseURL},
		{"E1 openai_compat without profile", []*iop.AdapterConfig{{Name: "a", Type: protocol.TypeOpenAICompat}}, nil, adapter.ErrNoProfile},
		{"T1 profile path escaping the base", []*iop.AdapterConfig{compatAdapter("a", &iop.ConcreteProtocolProfile{BaseUrl: "http://h:1", ModelsPath: "/v1/../../admin"}, 1)}, nil, adapter.ErrBadProfile},
		{"T1 profile path with a host", []*iop.AdapterConfig{compatAdapter("a", &iop.ConcreteProtocolProfile{BaseUrl: "http://h:1", ChatCompletionsPath: "http://evil/v1"}, 1)}, nil, adapter.ErrBadProfile},
		{"E4 negative capacity", []*iop.AdapterConfig{ollamaAdapter("a", "http://h:1", -1)}, nil, adapter.ErrBadCapacity},
		{"T4 api_key_env unset", []*iop.AdapterConfig{{Name: "a", Type: "ollama", ApiKeyEnv: "NOPE"}}, nil, adapter.ErrMissingAPIKey},
		// T4 C5: the edge config names the variable, the node decides
		// whether it offers it; one it does not offer is never read.
		{"T4 api_key_env the node does not offer", []*iop.AdapterConfig{{Name: "a", Type: "ollama", ApiKeyEnv: "NODE_UNRELATED_SECRET"}},
			map[string]string{"NODE_UNRELATED_SECRET": "secret"}, adapter.ErrAPIKeyEnvNotAllowed},
		{"T4 api_key_env without auth header", []*iop.AdapterConfig{{Name: "a", Type: protocol.TypeOpenAICompat, ApiKeyEnv: "K",
			OpenaiCompat: &iop.OpenAICompatAdapterConfig{ProtocolProfile: &iop.ConcreteProtocolProfile{BaseUrl: "http://h:1"}}}}, map[string]string{"K": "secret"}, adapter.ErrBadAuthHeader},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var read []string
			lookup := func(k string) (string, bool) { read = append(read, k); v, ok := tc.env[k]; return v, ok }
			allow := func(k string) bool { return k != "NODE_UNRELATED_SECRET" }
			_, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: tc.ac}, adapter.Options{LookupEnv: lookup, AllowEnv: allow})
			if slices.Contains(read, "NODE_UNRELATED_SECRET") {
				t.Errorf("T4: a variable the node does not offer was read")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), `"a"`) && !strings.Contains(err.Error(), `"ollama"`) {
				t.Fatalf("error %q does not name the adapter", err)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("P4: error %q shows the key", err)
			}
		})
	}
	if _, err := adapter.NewSet(nil, adapter.Options{}); !errors.Is(err, adapter.ErrNoConfig) {
		t.Fatalf("nil config: got %v", err)
	}
	s, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{
		{Type: "ollama"}, compatAdapter("llama", good, 0)}}, adapter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := strings.Join(s.Names(), ","); got != "ollama,llama" {
		t.Fatalf("E1 names %q, want ollama,llama", got)
	}
}

// E2: the effective stall timeout.
func TestStallTimeout(t *testing.T) {
	cases := []struct {
		name string
		ms   int64
		want int64 // ms; -1 = error
	}{
		{"E2 zero is the default", 0, 300000},
		{"E2 positive", 1500, 1500},
		{"E2 negative rejected", -1, -1},
		{"E2 overflow rejected", math.MaxInt64 / 1000, -1},
		{"E2 largest duration accepted", math.MaxInt64 / 1000000, math.MaxInt64 / 1000000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := adapter.StallTimeout(tc.ms)
			if tc.want < 0 {
				if !errors.Is(err, adapter.ErrBadStallTimeout) {
					t.Fatalf("got %v, %v; want ErrBadStallTimeout", d, err)
				}
				return
			}
			if err != nil || d.Milliseconds() != tc.want {
				t.Fatalf("got %v, %v; want %d ms", d, err, tc.want)
			}
		})
	}
}

// E3: a non-stream run carries no DELTA events: START, then the terminal
// with the whole content (one frame per token would be discarded anyway).
func TestRunNonStreamHasNoDeltas(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, replay(200, "application/x-ndjson", sample(t, "ollama_api_chat_stream.ndjson")))
	s := newSet(t, adapter.Options{}, ollamaAdapter("ollama", up.URL, 1))
	evs := runAll(context.Background(), s, &iop.RunRequest{Adapter: "ollama", Target: "tiny", Input: userInput("Hi")})
	if len(evs) != 2 || evs[0].GetType() != iop.RunEventType_RUN_EVENT_START || evs[1].GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
		t.Fatalf("E3: got %d events %v, want START then COMPLETE", len(evs), evs)
	}
	if got := evs[1].GetContent(); got != "Hello from tiny-gguf! This reply is deterministic." {
		t.Errorf("content %q", got)
	}
}
