package adapter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	"iop/internal/sse"
	iop "iop/proto/gen/iop"
)

// Real-server runs of the adapter tests against real backends: set
// IOP_TEST_OLLAMA_URL (e.g. http://127.0.0.1:11434) and/or
// IOP_TEST_OPENAI_URL (e.g. http://127.0.0.1:8081 for llama-server).
// Targets default to the tiny test models: IOP_TEST_OLLAMA_TARGET /
// IOP_TEST_OPENAI_TARGET ("tiny") and IOP_TEST_OLLAMA_TOOL_TARGET /
// IOP_TEST_OPENAI_TOOL_TARGET ("tiny-tool"); IOP_TEST_OPENAI_PROFILE names
// the profile shape ("llamacpp" by default, or "ollama" for Ollama's /v1).

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func realURL(t *testing.T, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		t.Skipf("%s not set: no real backend to test against", env)
	}
	return u
}

// E8 against a real Ollama.
func TestRealOllama(t *testing.T) {
	base := realURL(t, "IOP_TEST_OLLAMA_URL")
	leakcheck.Check(t)
	target, toolTarget := envOr("IOP_TEST_OLLAMA_TARGET", "tiny"), envOr("IOP_TEST_OLLAMA_TOOL_TARGET", "tiny-tool")
	s := newSet(t, adapter.Options{}, ollamaAdapter("ollama", base, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	realRunChecks(ctx, t, s, "ollama", target, toolTarget)
	t.Run("H10 probe", func(t *testing.T) {
		if got := s.Probe(ctx, "ollama", target, nil, nil); got != protocol.HealthAvailable {
			t.Fatalf("probe %q = %q, want available", target, got)
		}
		if got := s.Probe(ctx, "ollama", "no-such-model", nil, nil); got != protocol.HealthUnavailable {
			t.Fatalf("probe no-such-model = %q, want unavailable", got)
		}
	})
	t.Run("E8 unknown model", func(t *testing.T) {
		last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Stream: true, Adapter: "ollama", Target: "no-such-model", Input: userInput("Hi")}))
		if last.GetFailureCode() != protocol.CodeUpstreamStatus.String() || last.GetUpstreamStatus() != 404 {
			t.Fatalf("got %q status %d (%q), want upstream_status 404", last.GetFailureCode(), last.GetUpstreamStatus(), last.GetError())
		}
	})
	realTunnelChecks(ctx, t, s, "ollama", target)
	t.Run("logprobs per delta and on a non-stream COMPLETE", func(t *testing.T) {
		in := userInput("Hi")
		in.Logprobs, in.TopLogprobs, in.MaxTokens = true, 2, 3
		evs := runAll(ctx, s, &iop.RunRequest{Stream: true, Adapter: "ollama", Target: target, Input: in})
		last, text := checkRun(t, evs)
		var lps []*iop.TokenLogprob
		for _, ev := range evs {
			lps = append(lps, ev.GetLogprobs()...)
		}
		var joined strings.Builder
		for _, lp := range lps {
			joined.WriteString(lp.GetToken())
			if len(lp.GetTopLogprobs()) != 2 || len(lp.GetBytes()) == 0 {
				t.Errorf("logprob %v: want 2 alternatives and the token's bytes", lp)
			}
		}
		if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE || len(last.GetLogprobs()) != 0 || len(lps) != 3 || joined.String() != text {
			t.Fatalf("stream: %d logprobs %q for text %q (COMPLETE carries %d)", len(lps), joined.String(), text, len(last.GetLogprobs()))
		}
		last, _ = checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "ollama", Target: target, Input: in}))
		if len(last.GetLogprobs()) != 3 {
			t.Fatalf("non-stream COMPLETE carries %d logprobs, want 3", len(last.GetLogprobs()))
		}
	})
	t.Run("count from a one-token run", func(t *testing.T) {
		in := userInput("Say hello in one short sentence.")
		in.MaxTokens = 1
		last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "ollama", Target: target, Input: in}))
		again, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "ollama", Target: target, Input: in}))
		n := last.GetUsage().GetPromptTokens()
		if n <= 0 || again.GetUsage().GetPromptTokens() != n || last.GetUsage().GetCompletionTokens() != 1 {
			t.Fatalf("prompt tokens %d then %d (completion %d): want the same positive count with the prompt cached",
				n, again.GetUsage().GetPromptTokens(), last.GetUsage().GetCompletionTokens())
		}
	})
	t.Run("embeddings through /api/embed", func(t *testing.T) {
		in := &iop.RunInput{EmbedInput: []string{"a", "b"}, Dimensions: 4}
		last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "ollama", Target: target, Operation: protocol.RunEmbeddings, Input: in}))
		if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE || len(last.GetEmbeddings()) != 2 || len(last.GetEmbeddings()[0].GetValues()) != 4 {
			t.Fatalf("got %v (%q), want 2 vectors of 4", last.GetEmbeddings(), last.GetError())
		}
	})
	t.Run("json format is honoured", func(t *testing.T) {
		in := userInput("Hi")
		in.ResponseFormatJson, in.MaxTokens = []byte(`{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}}`), 12
		last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "ollama", Target: target, Input: in}))
		if text := last.GetContent(); !strings.HasPrefix(strings.TrimSpace(text), "{") {
			t.Fatalf("text %q: want JSON output under the schema", text)
		}
	})
}

// E9, T1, T2 against a real OpenAI-compatible server.
func TestRealOpenAICompat(t *testing.T) {
	base := realURL(t, "IOP_TEST_OPENAI_URL")
	leakcheck.Check(t)
	target, toolTarget := envOr("IOP_TEST_OPENAI_TARGET", "tiny"), envOr("IOP_TEST_OPENAI_TOOL_TARGET", "tiny-tool")
	p := llamaProfile(base)
	p.Name = envOr("IOP_TEST_OPENAI_PROFILE", "llamacpp")
	if p.Name == "ollama" {
		p.HealthPath, p.CountTokensPath, p.ResponsesPath = "/v1/models", "", ""
	}
	s := newSet(t, adapter.Options{}, compatAdapter("compat", p, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	realRunChecks(ctx, t, s, "compat", target, toolTarget)
	t.Run("H10 probe", func(t *testing.T) {
		if got := s.Probe(ctx, "compat", target, nil, nil); got != protocol.HealthAvailable {
			t.Fatalf("probe %q = %q, want available", target, got)
		}
	})
	realTunnelChecks(ctx, t, s, "compat", target)
}

// realRunChecks: the E3 grammar, text and usage, and tool calls in OpenAI
// shape when the model makes them.
func realRunChecks(ctx context.Context, t *testing.T, s *adapter.Set, name, target, toolTarget string) {
	t.Run("E3 text run", func(t *testing.T) {
		in := userInput("Hi")
		in.MaxTokens = 32
		last, deltas := checkRun(t, runAll(ctx, s, &iop.RunRequest{Stream: true, Adapter: name, Target: target, Input: in}))
		if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
			t.Fatalf("got %v %q", last.GetType(), last.GetError())
		}
		if last.GetContent() == "" || deltas != last.GetContent() {
			t.Fatalf("content %q, deltas %q", last.GetContent(), deltas)
		}
		if f := last.GetFinishReason(); f != "stop" && f != "length" {
			t.Fatalf("finish_reason %q", f)
		}
		if last.GetUsage().GetCompletionTokens() <= 0 {
			t.Fatalf("usage %v, want completion tokens", last.GetUsage())
		}
	})
	t.Run("E8 E9 tool run", func(t *testing.T) {
		in := userInput("What is the weather in Paris?")
		in.ToolsJson = []byte(weatherTools)
		last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Stream: true, Adapter: name, Target: toolTarget, Input: in}))
		if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
			t.Fatalf("got %v %q", last.GetType(), last.GetError())
		}
		raw, ok := last.GetMetadata()["openai_tool_calls"]
		if !ok {
			t.Skipf("model %q made no tool call (content %q)", toolTarget, last.GetContent())
		}
		calls := decodeCalls(t, raw)
		for _, c := range calls {
			fn, _ := c["function"].(map[string]any)
			args, _ := fn["arguments"].(string)
			if c["type"] != "function" || c["id"] == "" || fn["name"] == "" || !json.Valid([]byte(args)) {
				t.Fatalf("call %v is not OpenAI-shaped", c)
			}
		}
		if last.GetFinishReason() != "tool_calls" {
			t.Fatalf("finish_reason %q with tool calls", last.GetFinishReason())
		}
	})
}

// realTunnelChecks: T2 frames of a streamed chat and the models list.
func realTunnelChecks(ctx context.Context, t *testing.T, s *adapter.Set, name, target string) {
	t.Run("T2 streamed chat tunnel", func(t *testing.T) {
		body := []byte(`{"model":"` + target + `","stream":true,"stream_options":{"include_usage":true},"max_tokens":16,"messages":[{"role":"user","content":"Hi"}]}`)
		last, status, got, usages := checkTunnel(t, tunnelAll(ctx, s, &iop.ProviderTunnelRequest{Adapter: name, Target: target,
			Operation: protocol.OpChatCompletions, Method: "POST", Body: body, Stream: true,
			Headers: []*iop.Header{{Name: "Content-Type", Value: "application/json"}, {Name: "Authorization", Value: "Bearer client"}}}))
		if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || status != 200 {
			t.Fatalf("got %v %q status %d", last.GetKind(), last.GetError(), status)
		}
		r := sse.NewReader(bytes.NewReader(got), 0)
		var lastData string
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			lastData = string(ev.Data)
		}
		if lastData != "[DONE]" {
			t.Fatalf("stream ends with %q, want [DONE]", lastData)
		}
		if len(usages) != 1 || usages[0].GetCompletionTokens() <= 0 {
			t.Fatalf("USAGE frames %v, want one with completion tokens", usages)
		}
	})
	t.Run("T1 models tunnel", func(t *testing.T) {
		last, status, got, _ := checkTunnel(t, tunnelAll(ctx, s, &iop.ProviderTunnelRequest{Adapter: name, Target: target, Operation: protocol.OpModels, Method: "GET"}))
		if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || status != 200 || !strings.Contains(string(got), `"data"`) {
			t.Fatalf("got %v status %d body %.200s", last.GetKind(), status, got)
		}
	})
}
