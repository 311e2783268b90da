package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// thinkText is tiny-think's fixed reasoning (demo backend thinkTokens).
const thinkText = "The user wants a greeting. I will say hello."

// reasoningSSE returns the data: payloads of an SSE body, decoded.
func reasoningSSE(t testing.TB, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("SSE data %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func str(doc any, path string) string {
	v, _ := jsonAt(doc, path)
	s, _ := v.(string)
	return s
}

// thinkOf returns an Ollama request's "think" as JSON ("" when absent).
// tiny-think, like every Ollama 0.17.4 thinking model but gpt-oss, takes
// true and false only: a client's level reaches it as true.
func thinkOf(doc any) string {
	v, ok := jsonAt(doc, "think")
	if !ok {
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// reasoningStack is a demo backend serving tiny-think behind a captor, an
// Edge and a node, with the groups tiny-think and tiny (which cannot
// think).
func reasoningStack(t *testing.T) (*captor, *apiClient) {
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{Models: []string{"tiny", "tiny-think"}})
	capt := &captor{next: bp.b}
	url := bp.serve(t, capt)
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}}},
		[]config.Model{modelGroup("tiny-think", provider("gpu-1", "ollama", "tiny-think")), modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
	_, _, api := startReady(t, p, cfg, logs)
	return capt, api
}

// upstream returns the last Ollama request, decoded.
func upstream(t testing.TB, c *captor) any {
	t.Helper()
	var doc any
	if err := json.Unmarshal(c.take(), &doc); err != nil {
		t.Fatalf("upstream body: %v", err)
	}
	return doc
}

// T5, E8: reasoning round trips on every surface, stream and not: the client's
// reasoning control becomes Ollama's think; Ollama's message.thinking
// comes back as Messages thinking blocks (with a signature), chat
// reasoning_content, Responses reasoning items (with encrypted_content);
// sent back as the next turn's history, each reaches Ollama as that
// assistant message's thinking. A target that cannot think answers the
// same request without thinking (think left out), never a 400.
func TestReasoningRoundTrip(t *testing.T) {
	leakcheck.Check(t)
	capt, api := reasoningStack(t)
	post := func(t *testing.T, path, body string) string {
		t.Helper()
		capt.take()
		status, out := api.postRaw(t, path, body)
		if status != http.StatusOK {
			t.Fatalf("POST %s: %d %.300s", path, status, out)
		}
		return out
	}
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "non-stream", true: "stream"}[stream]
		st := map[bool]string{false: "false", true: "true"}[stream]

		t.Run("messages "+name, func(t *testing.T) {
			out := post(t, "/v1/messages", `{"model":"tiny-think","max_tokens":4096,"stream":`+st+`,"thinking":{"type":"enabled","budget_tokens":1024},"output_config":{"effort":"low"},"messages":[{"role":"user","content":"Say hello."}]}`)
			if got := thinkOf(upstream(t, capt)); got != "true" {
				t.Errorf("think %s, want true (the effort's level, to a model that takes none)", got)
			}
			var thinking, sig, text string
			if stream {
				for _, ev := range reasoningSSE(t, out) {
					switch str(ev, "delta.type") {
					case "thinking_delta":
						thinking += str(ev, "delta.thinking")
					case "signature_delta":
						sig = str(ev, "delta.signature")
					case "text_delta":
						text += str(ev, "delta.text")
					}
				}
			} else {
				var doc any
				_ = json.Unmarshal([]byte(out), &doc)
				if str(doc, "content.0.type") != "thinking" || str(doc, "content.1.type") != "text" {
					t.Fatalf("content %s: want a thinking block, then the text", out)
				}
				thinking, sig, text = str(doc, "content.0.thinking"), str(doc, "content.0.signature"), str(doc, "content.1.text")
			}
			if thinking != thinkText || sig == "" || !strings.Contains(text, "Hello") {
				t.Fatalf("thinking %q signature %q text %q; want the model's reasoning, a signature and the answer", thinking, sig, text)
			}
			// The next turn sends the block back: once with its text, once
			// with only the signature (display "omitted" keeps "").
			for _, th := range []string{thinking, ""} {
				blk, _ := json.Marshal(map[string]string{"type": "thinking", "thinking": th, "signature": sig})
				post(t, "/v1/messages", `{"model":"tiny-think","max_tokens":64,"messages":[{"role":"user","content":"Say hello."},`+
					`{"role":"assistant","content":[`+string(blk)+`,{"type":"text","text":"Hello"}]},{"role":"user","content":"Again."}]}`)
				if got := str(upstream(t, capt), "messages.1.thinking"); got != thinkText {
					t.Errorf("history thinking %q (block text %q), want %q", got, th, thinkText)
				}
			}
		})

		t.Run("chat "+name, func(t *testing.T) {
			out := post(t, "/v1/chat/completions", `{"model":"tiny-think","stream":`+st+`,"reasoning_effort":"high","messages":[{"role":"user","content":"Say hello."}]}`)
			if got := thinkOf(upstream(t, capt)); got != "true" {
				t.Errorf("think %s, want true (the level, to a model that takes none)", got)
			}
			var reasoning, content string
			if stream {
				for _, ev := range reasoningSSE(t, out) {
					reasoning += str(ev, "choices.0.delta.reasoning_content")
					content += str(ev, "choices.0.delta.content")
				}
			} else {
				var doc any
				_ = json.Unmarshal([]byte(out), &doc)
				reasoning, content = str(doc, "choices.0.message.reasoning_content"), str(doc, "choices.0.message.content")
			}
			if reasoning != thinkText || !strings.Contains(content, "Hello") {
				t.Fatalf("reasoning_content %q content %q", reasoning, content)
			}
			msg, _ := json.Marshal(map[string]string{"role": "assistant", "content": content, "reasoning_content": reasoning})
			post(t, "/v1/chat/completions", `{"model":"tiny-think","messages":[{"role":"user","content":"Say hello."},`+string(msg)+`,{"role":"user","content":"Again."}]}`)
			if got := str(upstream(t, capt), "messages.1.thinking"); got != thinkText {
				t.Errorf("history thinking %q, want %q", got, thinkText)
			}
		})

		t.Run("responses "+name, func(t *testing.T) {
			out := post(t, "/v1/responses", `{"model":"tiny-think","stream":`+st+`,"reasoning":{"effort":"medium","summary":"auto"},"include":["reasoning.encrypted_content"],"input":"Say hello."}`)
			if got := thinkOf(upstream(t, capt)); got != "true" {
				t.Errorf("think %s, want true (the level, to a model that takes none)", got)
			}
			var output []any
			var deltas string
			if stream {
				for _, ev := range reasoningSSE(t, out) {
					if str(ev, "type") == "response.reasoning_text.delta" {
						deltas += str(ev, "delta")
					}
					if str(ev, "type") == "response.completed" {
						v, _ := jsonAt(ev, "response.output")
						output, _ = v.([]any)
					}
				}
				if deltas != thinkText {
					t.Errorf("reasoning_text deltas %q, want %q", deltas, thinkText)
				}
			} else {
				var doc any
				_ = json.Unmarshal([]byte(out), &doc)
				v, _ := jsonAt(doc, "output")
				output, _ = v.([]any)
			}
			if len(output) != 2 || str(output[0], "type") != "reasoning" || str(output[0], "content.0.text") != thinkText ||
				str(output[0], "encrypted_content") == "" || str(output[1], "type") != "message" {
				t.Fatalf("output %v: want a reasoning item with its text and encrypted_content, then the message", output)
			}
			// Codex sends back the item without its content: the
			// encrypted_content carries the text.
			rs := output[0].(map[string]any)
			delete(rs, "content")
			hist, _ := json.Marshal(append([]any{map[string]any{"role": "user", "content": "Say hello."}}, rs, output[1],
				map[string]any{"role": "user", "content": "Again."}))
			post(t, "/v1/responses", `{"model":"tiny-think","input":`+string(hist)+`}`)
			if got := str(upstream(t, capt), "messages.1.thinking"); got != thinkText {
				t.Errorf("history thinking %q, want %q", got, thinkText)
			}
		})
	}

	// tiny cannot think: the thinking the clients ask for by default is
	// left out and the answer is the model's.
	for _, c := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"tiny","max_tokens":64,"thinking":{"type":"adaptive"},"messages":[{"role":"user","content":"Say hello."}]}`},
		{"/v1/chat/completions", `{"model":"tiny","reasoning_effort":"low","messages":[{"role":"user","content":"Say hello."}]}`},
		{"/v1/responses", `{"model":"tiny","reasoning":{"effort":"high"},"input":"Say hello."}`},
	} {
		t.Run("non-thinking target "+c.path, func(t *testing.T) {
			out := post(t, c.path, c.body)
			if _, ok := jsonAt(upstream(t, capt), "think"); ok {
				t.Errorf("think sent to a model that cannot think")
			}
			if !strings.Contains(out, "Hello from tiny") || strings.Contains(out, "reasoning_content") || strings.Contains(out, `"thinking"`) {
				t.Errorf("answer %.300s: want the plain answer", out)
			}
		})
	}
}
