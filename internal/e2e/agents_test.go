package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// agentCapture is one request a real client sent, as internal/e2e/sdk/agentcapture
// recorded it (testdata/agents/README.md says how and with which
// versions).
type agentCapture struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body"`
}

// agentCase is one captured request and what the Ollama request the run
// path makes of it must hold: native (a dotted path → its JSON value, or
// absent) and never, JSON member names that must appear nowhere in it
// (the fields the run path accepts and does not send).
type agentCase struct {
	file   string
	native map[string]string
	never  []string
}

var agentCases = []agentCase{
	// Claude Code 2.1.328: adaptive thinking with display "omitted",
	// output_config.effort, context_management's clear_thinking, a
	// deferred tool and a mid-conversation system turn.
	{file: "claude-code/plain.json", native: map[string]string{
		"stream": "true", "options.num_predict": "32000", "think": absent,
		"messages.0.role": `"system"`, "messages.1.role": `"user"`, "messages.2.role": `"system"`,
		"tools.0.function.name": `"Agent"`, "tools.1.function.name": `"Bash"`, "tools.10.function.name": `"Write"`, "tools.11": absent,
	}, never: []string{"defer_loading", "cache_control", "context_management", "output_config", "metadata", "display", "user_id"}},
	{file: "claude-code/tool-call.json", native: map[string]string{"think": absent, "tools.1.function.name": `"Bash"`},
		never: []string{"defer_loading", "cache_control", "output_config"}},
	{file: "claude-code/tool-result.json", native: map[string]string{
		"messages.3.role": `"assistant"`, "messages.3.tool_calls.0.function.name": `"Bash"`,
		"messages.3.tool_calls.0.function.arguments": `{"command":"echo iop-agent-ok","description":"Print a marker line"}`, // the capture run's command
		"messages.4.role": `"tool"`, "messages.4.tool_name": `"Bash"`, "messages.4.content": `"iop-agent-ok"`,
	}, never: []string{"cache_control", "is_error", "tool_use_id"}},
	// Codex CLI 0.169.0: client_metadata, include, reasoning.summary, a
	// namespace of function tools and the hosted web_search tool.
	{file: "codex/plain.json", native: map[string]string{
		"stream": "true", "think": absent, "truncate": absent,
		"messages.0.role": `"system"`, "messages.1.role": `"system"`, "messages.3.content": `"Say hello."`,
		"tools.0.function.name": `"exec_command"`, "tools.4.function.name": `"close_agent"`,
	}, never: []string{"client_metadata", "external_web_access", "prompt_cache_key", "include", "namespace", "summary"}},
	{file: "codex/tool-call.json", native: map[string]string{"tools.0.function.name": `"exec_command"`}, never: []string{"client_metadata"}},
	{file: "codex/tool-result.json", native: map[string]string{
		"messages.4.role": `"assistant"`, "messages.4.tool_calls.0.function.name": `"exec_command"`,
		"messages.4.tool_calls.0.function.arguments": `{"cmd":"echo iop-agent-ok"}`,
		"messages.5.role": `"tool"`, "messages.5.tool_name": `"exec_command"`,
	}, never: []string{"client_metadata", "call_id"}},
	// Vercel AI SDK (ai 7.0.173, @ai-sdk/openai 4.0.118, @ai-sdk/anthropic
	// 4.0.105): generateText with a tool, streamText with a system prompt,
	// and each provider's reasoning option.
	{file: "aisdk/chat-generate.json", native: map[string]string{"options.num_predict": "200", "options.temperature": "0.2",
		"tools.0.function.name": `"weather"`}},
	{file: "aisdk/chat-stream.json", native: map[string]string{"stream": "true", "messages.0.role": `"system"`}},
	{file: "aisdk/chat-reasoning.json", native: map[string]string{"think": absent}},
	{file: "aisdk/responses-generate.json", native: map[string]string{"options.num_predict": "200", "tools.0.function.name": `"weather"`}},
	{file: "aisdk/responses-stream.json", native: map[string]string{"messages.0.role": `"system"`, "messages.1.content": `"Say hello."`}},
	{file: "aisdk/responses-reasoning.json", native: map[string]string{"messages.0.content": `"Say hello."`}},
	{file: "aisdk/messages-generate.json", native: map[string]string{"options.num_predict": "200", "tools.0.function.name": `"weather"`}},
	{file: "aisdk/messages-stream.json", native: map[string]string{"messages.0.role": `"system"`, "messages.0.content": `"Be brief."`}},
	{file: "aisdk/messages-thinking.json", native: map[string]string{"think": absent, "options.num_predict": "3072"}},
}

// withModel returns body with its "model" set to model (the captures name
// the groups of the capture run).
func withModel(t testing.TB, body []byte, model string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("capture body: %v", err)
	}
	m["model"], _ = json.Marshal(model)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Every captured request of Claude Code, Codex CLI and the AI SDK goes
// through the run path (Messages, Responses, chat → Ollama's /api/chat)
// with 200, and the Ollama request holds what the table says: the
// translated fields, and none of the fields the run path accepts without
// sending (T5, E8; the thinking asked for is dropped for a
// target that cannot think). With IOP_TEST_OLLAMA_URL the upstream is that
// real Ollama.
func TestAgentCaptures(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	capt := &captor{next: bp.b}
	if real := os.Getenv("IOP_TEST_OLLAMA_URL"); real != "" {
		u, err := neturl.Parse(real)
		if err != nil {
			t.Fatalf("IOP_TEST_OLLAMA_URL: %v", err)
		}
		capt.next = httputil.NewSingleHostReverseProxy(u)
	}
	url := bp.serve(t, capt)
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
	_, _, api := startReady(t, p, cfg, logs)
	for _, c := range agentCases {
		t.Run(c.file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "agents", c.file))
			if err != nil {
				t.Fatal(err)
			}
			var cp agentCapture
			if err := json.Unmarshal(raw, &cp); err != nil {
				t.Fatalf("%s: %v", c.file, err)
			}
			capt.take()
			status, body := api.postRaw(t, cp.Path, string(withModel(t, cp.Body, "tiny")))
			if status != http.StatusOK {
				t.Fatalf("got %d %.400s, want 200", status, body)
			}
			native := capt.take()
			var doc any
			if err := json.Unmarshal(native, &doc); err != nil {
				t.Fatalf("upstream body %.200q: %v", native, err)
			}
			for path, want := range c.native {
				got, ok := jsonAt(doc, path)
				if want == absent {
					if ok {
						t.Errorf("%s: got %v in the Ollama request, want it absent", path, got)
					}
					continue
				}
				var w any
				if err := json.Unmarshal([]byte(want), &w); err != nil {
					t.Fatalf("bad want %s: %v", want, err)
				}
				gb, _ := json.Marshal(got)
				wb, _ := json.Marshal(w)
				if !ok || !bytes.Equal(gb, wb) {
					t.Errorf("%s: got %.300s (present %v), want %s", path, gb, ok, wb)
				}
			}
			for _, k := range c.never {
				if strings.Contains(string(native), `"`+k+`":`) {
					t.Errorf("the Ollama request carries %q, which the run path must not send", k)
				}
			}
		})
	}
}
