package adapter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

const weatherTools = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},` +
	`{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}]`

// sseStream joins data payloads into an SSE body with the given line ending.
func sseStream(eol string, datas ...string) []byte {
	var b strings.Builder
	for _, d := range datas {
		b.WriteString("data: " + d + eol + eol)
	}
	return []byte(b.String())
}

func toolDelta(calls string) string {
	return `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":` + calls + `},"finish_reason":null}]}`
}

func finishChunk(reason string) string {
	return `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"` + reason + `"}]}`
}

const usageChunk = `{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`

// fragmented splits a tool call's arguments into one-byte fragments, the way
// vLLM and OpenAI stream them.
func fragmented(index int, id, name, args string) []string {
	out := []string{toolDelta(fmt.Sprintf(`[{"index":%d,"id":%q,"type":"function","function":{"name":%q,"arguments":""}}]`, index, id, name))}
	for _, c := range args {
		frag, _ := json.Marshal(string(c))
		out = append(out, toolDelta(fmt.Sprintf(`[{"index":%d,"function":{"arguments":%s}}]`, index, frag)))
	}
	return out
}

// interleave alternates the elements of a and b.
func interleave(a, b []string) []string {
	var out []string
	for i := 0; i < len(a) || i < len(b); i++ {
		if i < len(a) {
			out = append(out, a[i])
		}
		if i < len(b) {
			out = append(out, b[i])
		}
	}
	return out
}

func decodeCalls(t testing.TB, s string) []map[string]any {
	t.Helper()
	var calls []map[string]any
	if err := json.Unmarshal([]byte(s), &calls); err != nil {
		t.Fatalf("openai_tool_calls %q is not a JSON array: %v", s, err)
	}
	return calls
}

// E9: the OpenAI-compatible adapter on real captures and synthetic streams.
func TestRunOpenAICompat(t *testing.T) {
	frags := append(fragmented(0, "call_w", "get_weather", `{"city": "Paris"}`), finishChunk("tool_calls"), usageChunk, "[DONE]")
	parallel := append(interleave(fragmented(0, "call_a", "get_weather", `{"city":"Paris"}`), fragmented(1, "call_b", "get_time", `{"tz":"CET"}`)),
		finishChunk("tool_calls"), "[DONE]")
	cases := []struct {
		name    string
		body    []byte
		tools   string
		content string
		finish  string
		usage   [3]int64
		calls   [][3]string // id, name, arguments
	}{
		{"E9 llama-server text stream", sample(t, "llama_v1_chat_stream.sse"), "", tinyReply, "stop", [3]int64{55, 8, 63}, nil},
		{"E9 ollama /v1 text stream", sample(t, "ollama_v1_chat_stream.sse"), "", tinyReply, "stop", [3]int64{21, 8, 29}, nil},
		{"E9 llama-server whole tool call in one chunk", sample(t, "llama_v1_chat_tool_stream.sse"), weatherTools, "", "tool_calls", [3]int64{531, 4, 535},
			[][3]string{{"wBzFbnefVqrAEdl4FkAeuoe4C9yI8vZF", "get_weather", `{"city": "Paris"}`}}},
		{"E9 ollama /v1 whole tool call in one chunk", sample(t, "ollama_v1_chat_tool_stream.sse"), weatherTools, "", "tool_calls", [3]int64{439, 4, 443},
			[][3]string{{"call_jiwz790p", "get_weather", `{"city":"Paris"}`}}},
		{"E9 arguments split across many chunks", sseStream("\n", frags...), weatherTools, "", "tool_calls", [3]int64{10, 5, 15},
			[][3]string{{"call_w", "get_weather", `{"city": "Paris"}`}}},
		{"E9 two parallel tool calls index 0 and 1 interleaved", sseStream("\n", parallel...), weatherTools, "", "tool_calls", [3]int64{},
			[][3]string{{"call_a", "get_weather", `{"city":"Paris"}`}, {"call_b", "get_time", `{"tz":"CET"}`}}},
		{"E9 CRLF line endings", bytes.ReplaceAll(sample(t, "llama_v1_chat_stream.sse"), []byte("\n"), []byte("\r\n")), "", tinyReply, "stop", [3]int64{55, 8, 63}, nil},
		{"E9 [DONE] missing after finish_reason", bytes.TrimSuffix(sample(t, "ollama_v1_chat_stream.sse"), []byte("data: [DONE]\n\n")), "", tinyReply, "stop", [3]int64{21, 8, 29}, nil},
		{"E9 assistant text shaped like a tool call stays text", sseStream("\n",
			`{"choices":[{"index":0,"delta":{"content":"{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{}}]}"}}]}`, finishChunk("stop"), "[DONE]"),
			weatherTools, `{"tool_calls":[{"name":"get_weather","arguments":{}}]}`, "stop", [3]int64{}, nil},
		{"E9 tool call without id gets one", sseStream("\n", toolDelta(`[{"index":0,"type":"function","function":{"name":"get_time","arguments":"{}"}}]`), finishChunk("stop"), "[DONE]"),
			weatherTools, "", "tool_calls", [3]int64{}, [][3]string{{"", "get_time", `{}`}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, replay(200, "text/event-stream", tc.body))
			s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 2))
			in := userInput("Hi")
			in.ToolsJson = []byte(tc.tools)
			last, deltas := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "llama", Target: "tiny", Input: in}))
			if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
				t.Fatalf("got %v %q, want COMPLETE", last.GetType(), last.GetError())
			}
			if last.GetContent() != tc.content || deltas != tc.content || last.GetFinishReason() != tc.finish {
				t.Fatalf("content %q deltas %q finish %q; want %q, %q", last.GetContent(), deltas, last.GetFinishReason(), tc.content, tc.finish)
			}
			u := last.GetUsage()
			if got := [3]int64{u.GetPromptTokens(), u.GetCompletionTokens(), u.GetTotalTokens()}; got != tc.usage {
				t.Fatalf("usage %v, want %v", got, tc.usage)
			}
			if _, ok := last.GetMetadata()["openai_text_tool_fallback"]; ok {
				t.Fatalf("E9: fallback flag on a native run")
			}
			raw, ok := last.GetMetadata()["openai_tool_calls"]
			if ok != (tc.calls != nil) {
				t.Fatalf("openai_tool_calls present=%v (%s), want %v", ok, raw, tc.calls != nil)
			}
			if ok {
				calls := decodeCalls(t, raw)
				if len(calls) != len(tc.calls) {
					t.Fatalf("got %d calls, want %d: %s", len(calls), len(tc.calls), raw)
				}
				for i, want := range tc.calls {
					fn, _ := calls[i]["function"].(map[string]any)
					id, _ := calls[i]["id"].(string)
					if calls[i]["type"] != "function" || fn["name"] != want[1] || fn["arguments"] != want[2] ||
						(want[0] != "" && id != want[0]) || !strings.HasPrefix(id, want[0]) || id == "" {
						t.Fatalf("call %d = %v, want id %q name %q arguments %q", i, calls[i], want[0], want[1], want[2])
					}
				}
			}
			reqs := up.requests()
			if len(reqs) != 1 || reqs[0].Path != "/v1/chat/completions" {
				t.Fatalf("requests %+v, want one to /v1/chat/completions", reqs)
			}
			var body struct {
				Model         string          `json:"model"`
				Stream        bool            `json:"stream"`
				StreamOptions map[string]bool `json:"stream_options"`
				Tools         json.RawMessage `json:"tools"`
			}
			if err := json.Unmarshal(reqs[0].Body, &body); err != nil || body.Model != "tiny" || !body.Stream || !body.StreamOptions["include_usage"] {
				t.Fatalf("request %s: want model tiny, stream, stream_options.include_usage", reqs[0].Body)
			}
			if (len(body.Tools) > 0) != (tc.tools != "") {
				t.Fatalf("E9: tools sent = %v, want %v", len(body.Tools) > 0, tc.tools != "")
			}
		})
	}
}

// E9: failures of the OpenAI-compatible run path end in one ERROR terminal.
func TestRunOpenAICompatFailures(t *testing.T) {
	s500, b500 := httpSample(t, "llama_error_bad_json.http")
	s400, b400 := httpSample(t, "llama_error_context_exceeded.http")
	s404, b404 := httpSample(t, "ollama_v1_chat_error_unknown_model.http")
	stream := sample(t, "llama_v1_chat_stream.sse")
	cases := []struct {
		name    string
		h       func(http.ResponseWriter, *http.Request, []byte)
		code    string
		status  int32
		message string
		deltas  bool
	}{
		{"E9 upstream 500 with JSON body", replay(s500, "application/json", b500), protocol.CodeUpstreamStatus.String(), 500, "syntax error while parsing object key", false},
		{"E9 400 without tools is not retried", replay(s400, "application/json", b400), protocol.CodeUpstreamStatus.String(), 400, "exceeds the available context size", false},
		{"E9 404 unknown model", replay(s404, "application/json", b404), protocol.CodeUpstreamStatus.String(), 404, "model 'no-such-model' not found", false},
		{"E9 malformed SSE line", replay(200, "text/event-stream", sseStream("\n", `{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`, `{"choices":[{"index":0,`)),
			protocol.CodeUpstreamError.String(), 0, "not JSON", true},
		{"E9 [DONE] and finish_reason both missing", replay(200, "text/event-stream", sseStream("\n", `{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`)),
			protocol.CodeUpstreamError.String(), 0, "without finish_reason", true},
		{"E9 error object mid-stream", replay(200, "text/event-stream", sseStream("\n", `{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`, `{"error":{"message":"slot unavailable"}}`)),
			protocol.CodeUpstreamError.String(), 0, "slot unavailable", true},
		{"E9 upstream reset mid-stream", resetAfter("text/event-stream", stream[:700]), protocol.CodeUpstreamError.String(), 0, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, tc.h)
			s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
			last, deltas := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "llama", Target: "tiny", Input: userInput("Hi")}))
			if last.GetType() != iop.RunEventType_RUN_EVENT_ERROR || last.GetFailureCode() != tc.code || last.GetUpstreamStatus() != tc.status {
				t.Fatalf("got %v %q status %d (%q), want ERROR %q status %d", last.GetType(), last.GetFailureCode(), last.GetUpstreamStatus(), last.GetError(), tc.code, tc.status)
			}
			if !strings.Contains(last.GetError(), tc.message) {
				t.Fatalf("error %q does not contain %q", last.GetError(), tc.message)
			}
			if (deltas != "") != tc.deltas {
				t.Fatalf("deltas %q, want some = %v", deltas, tc.deltas)
			}
			if n := len(up.requests()); n != 1 {
				t.Fatalf("%d upstream requests, want 1 (no retry)", n)
			}
		})
	}
}

// E9: a backend that rejects native tools gets one retry in text mode.
func TestRunTextToolFallback(t *testing.T) {
	cases := []struct {
		name       string
		native     bool
		rejectCode int
		system     string // leading system message of the input; "" = none
		requests   int
	}{
		{"E9 400 on tools → one retry, instruction merged into system", true, 400, "You are terse.", 2},
		{"E9 422 on tools → one retry, system message created", true, 422, "", 2},
		{"E9 500 naming tools → one retry", true, 500, "", 2},
		{"E9 profile without native tools → text mode at once", false, 0, "Be brief.", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			stream := sample(t, "llama_v1_chat_stream.sse")
			up := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if bytes.Contains(body, []byte(`"tools"`)) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(tc.rejectCode)
					fmt.Fprintf(w, `{"error":{"code":%d,"message":"tools param requires --jinja flag","type":"invalid_request_error"}}`, tc.rejectCode)
					return
				}
				replay(200, "text/event-stream", stream)(w, r, body)
			})
			p := llamaProfile(up.URL)
			p.NativeTools = tc.native
			s := newSet(t, adapter.Options{}, compatAdapter("llama", p, 1))
			in := &iop.RunInput{ToolsJson: []byte(weatherTools), ToolChoiceJson: []byte(`"auto"`)}
			if tc.system != "" {
				in.Messages = append(in.Messages, &iop.ChatMessage{Role: "system", Content: tc.system})
			}
			in.Messages = append(in.Messages,
				&iop.ChatMessage{Role: "user", Content: "Weather in Paris?"},
				&iop.ChatMessage{Role: "assistant", ToolCallsJson: []byte(`[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`)},
				&iop.ChatMessage{Role: "tool", ToolCallId: "c1", Content: "sunny"})
			last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Stream: true, Adapter: "llama", Target: "tiny", Input: in}))
			if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE || last.GetContent() != tinyReply {
				t.Fatalf("got %v %q %q, want COMPLETE with the reply", last.GetType(), last.GetContent(), last.GetError())
			}
			if last.GetMetadata()["openai_text_tool_fallback"] != "true" {
				t.Fatalf("E9: metadata %v, want openai_text_tool_fallback=true", last.GetMetadata())
			}
			if _, ok := last.GetMetadata()["openai_tool_calls"]; ok {
				t.Fatalf("E9: the node parsed assistant text into tool calls")
			}
			reqs := up.requests()
			if len(reqs) != tc.requests {
				t.Fatalf("%d upstream requests, want %d", len(reqs), tc.requests)
			}
			var retry struct {
				Messages []struct {
					Role    string          `json:"role"`
					Content string          `json:"content"`
					Calls   json.RawMessage `json:"tool_calls"`
				} `json:"messages"`
				Tools      json.RawMessage `json:"tools"`
				ToolChoice json.RawMessage `json:"tool_choice"`
			}
			if err := json.Unmarshal(reqs[len(reqs)-1].Body, &retry); err != nil {
				t.Fatal(err)
			}
			if retry.Tools != nil || retry.ToolChoice != nil {
				t.Fatalf("E9: text-mode request still has tools/tool_choice: %s", reqs[len(reqs)-1].Body)
			}
			sys := retry.Messages[0]
			if sys.Role != "system" || !strings.HasPrefix(sys.Content, tc.system) || !strings.Contains(sys.Content, `{"tool_calls":[{"name":`) ||
				!strings.Contains(sys.Content, "get_weather") {
				t.Fatalf("E9: leading system message %q lacks the original text or the instruction", sys.Content)
			}
			for i, m := range retry.Messages[1:] {
				if m.Role == "system" || m.Role == "tool" || m.Calls != nil {
					t.Fatalf("E9: text-mode message %d keeps role %q / tool_calls %s", i+1, m.Role, m.Calls)
				}
			}
		})
	}
}
