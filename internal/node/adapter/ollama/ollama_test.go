package ollama

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	"iop/internal/samples"
	iop "iop/proto/gen/iop"
)

func f64(v float64) *float64 { return &v }
func i64(v int64) *int64     { return &v }

// E8: OpenAI-shaped input becomes Ollama's /api/chat request.
func TestBuildChatRequest(t *testing.T) {
	cases := []struct {
		name string
		in   *iop.RunInput
		want string // JSON, compared semantically
	}{
		{"E8 plain chat with options", &iop.RunInput{
			Messages:  []*iop.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi", Name: "ann"}},
			MaxTokens: 16, Temperature: f64(0.2), TopP: f64(0.9), Stop: []string{"\n"}, Seed: i64(7),
		}, `{"model":"tiny","stream":true,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],
			"options":{"num_predict":16,"temperature":0.2,"top_p":0.9,"stop":["\n"],"seed":7}}`},
		{"E8 assistant tool-call arguments string becomes an object; tool message gets tool_name", &iop.RunInput{
			Messages: []*iop.ChatMessage{
				{Role: "user", Content: "Weather?"},
				{Role: "assistant", ToolCallsJson: []byte(`[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},{"id":"c2","type":"function","function":{"name":"noargs","arguments":""}}]`)},
				{Role: "tool", ToolCallId: "c1", Content: "sunny"},
			},
			ToolsJson: []byte(`[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`),
		}, `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"Weather?"},
			{"role":"assistant","content":"","tool_calls":[{"id":"c1","function":{"name":"get_weather","arguments":{"city":"Paris"}}},{"id":"c2","function":{"name":"noargs","arguments":{}}}]},
			{"role":"tool","content":"sunny","tool_name":"get_weather","tool_call_id":"c1"}],
			"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`},
		{"E8 tool_choice none leaves tools out", &iop.RunInput{
			Messages:  []*iop.ChatMessage{{Role: "user", Content: "Hi"}},
			ToolsJson: []byte(`[{"type":"function","function":{"name":"f"}}]`), ToolChoiceJson: []byte(`"none"`),
		}, `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"Hi"}]}`},
		{"E8 empty tools array is no tools", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "user", Content: "Hi"}}, ToolsJson: []byte(`[]`)},
			`{"model":"tiny","stream":true,"messages":[{"role":"user","content":"Hi"}]}`},
		{"F2 images, json_object, logprobs, penalties, top_k, truncate", &iop.RunInput{
			Messages:           []*iop.ChatMessage{{Role: "user", Content: "What is it?", Images: []*iop.ChatImage{{MediaType: "image/png", Data: []byte("\x89PNG")}}}},
			ResponseFormatJson: []byte(`{"type":"json_object"}`), Logprobs: true, TopLogprobs: 2,
			FrequencyPenalty: f64(0.5), PresencePenalty: f64(-0.5), TopK: i64(40), Truncate: new(bool), ToolChoiceJson: []byte(`"auto"`),
		}, `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"What is it?","images":["iVBORw=="]}],"format":"json",
			"logprobs":true,"top_logprobs":2,"truncate":false,"options":{"top_k":40,"frequency_penalty":0.5,"presence_penalty":-0.5}}`},
		{"F2 json_schema becomes format <schema>", &iop.RunInput{
			Messages:           []*iop.ChatMessage{{Role: "user", Content: "Hi"}},
			ResponseFormatJson: []byte(`{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"a":{"type":"string"}}},"strict":true}}`),
		}, `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"Hi"}],"format":{"type":"object","properties":{"a":{"type":"string"}}}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BuildChatRequest("tiny", tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !samples.JSONEqual(t, got, []byte(tc.want)) {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestBuildChatRequestErrors(t *testing.T) {
	cases := []struct {
		name string
		in   *iop.RunInput
	}{
		{"E8 nil input", nil},
		{"E8 no messages", &iop.RunInput{}},
		{"E8 unknown role", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "robot"}}}},
		{"E8 arguments not a JSON object", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "assistant", ToolCallsJson: []byte(`[{"function":{"name":"f","arguments":"[1]"}}]`)}}}},
		{"E8 tool_calls not an array", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "assistant", ToolCallsJson: []byte(`{"x":1}`)}}}},
		{"E8 tools not an array", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "user"}}, ToolsJson: []byte(`{"type":"function"}`)}},
		{"F2 tool_choice required cannot be enforced", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "user"}},
			ToolsJson: []byte(`[{"type":"function","function":{"name":"f"}}]`), ToolChoiceJson: []byte(`"required"`)}},
		{"F2 a named tool_choice cannot be enforced", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "user"}},
			ToolsJson: []byte(`[{"type":"function","function":{"name":"f"}}]`), ToolChoiceJson: []byte(`{"type":"function","function":{"name":"f"}}`)}},
		{"F2 unknown response_format", &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "user"}}, ResponseFormatJson: []byte(`{"type":"xml"}`)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := BuildChatRequest("tiny", tc.in)
			if !errors.Is(err, upstream.ErrInvalidInput) {
				t.Fatalf("got %v, want ErrInvalidInput", err)
			}
			// A tool_choice Ollama cannot enforce names its field for the
			// client's 400 "param" (RunEvent.param).
			var fe *upstream.FieldError
			if isToolChoice := len(tc.in.GetToolChoiceJson()) > 0; isToolChoice != (errors.As(err, &fe) && fe.Field == "tool_choice") {
				t.Errorf("got %#v, want a FieldError for tool_choice exactly when tool_choice is refused", err)
			}
		})
	}
}

// E8: the captured streams give the same result however the bytes arrive.
func TestReadChatStreamSplits(t *testing.T) {
	for _, tc := range []struct {
		file, content, finish, calls string
	}{
		{"ollama_api_chat_stream.ndjson", "Hello from tiny-gguf! This reply is deterministic.", "stop", ""},
		{"ollama_api_chat_tool_stream.ndjson", "", "tool_calls",
			`[{"id":"call_mixofqgs","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`},
	} {
		t.Run("E8 "+tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "testdata", "samples", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			for k := 0; k <= len(b); k++ {
				var deltas strings.Builder
				res, err := readChatStream(io.MultiReader(bytes.NewReader(b[:k]), bytes.NewReader(b[k:])), upstream.Hooks{OnDelta: func(s string, _ []*iop.TokenLogprob) { deltas.WriteString(s) }})
				if err != nil {
					t.Fatalf("split %d: %v", k, err)
				}
				if res.Content != tc.content || deltas.String() != tc.content || res.FinishReason != tc.finish || res.Metadata[protocol.MetaToolCalls] != tc.calls {
					t.Fatalf("split %d: got %+v", k, res)
				}
			}
		})
	}
}

// E8: tool calls without ids get generated ones; string arguments pass.
func TestToolCallConversion(t *testing.T) {
	stream := `{"message":{"content":"","tool_calls":[{"function":{"name":"a","arguments":{"x":1}}},{"function":{"name":"b","arguments":"{\"y\":2}"}}]},"done":false}` + "\n" +
		`{"message":{"content":""},"done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":2}` + "\n"
	res, err := readChatStream(strings.NewReader(stream), upstream.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	var calls []upstream.ToolCall
	if err := json.Unmarshal([]byte(res.Metadata[protocol.MetaToolCalls]), &calls); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !strings.HasPrefix(calls[0].ID, "call_") || calls[0].ID == calls[1].ID ||
		calls[0].Function.Arguments != `{"x":1}` || calls[1].Function.Arguments != `{"y":2}` {
		t.Fatalf("calls %+v", calls)
	}
	if res.FinishReason != "tool_calls" || res.Usage.GetTotalTokens() != 5 {
		t.Fatalf("E8: finish %q usage %v, want tool_calls and 5 tokens", res.FinishReason, res.Usage)
	}
	if _, err := readChatStream(strings.NewReader(`{"message":{"tool_calls":[{"function":{"arguments":{}}}]},"done":true}`), upstream.Hooks{}); !errors.Is(err, upstream.ErrProtocol) {
		t.Fatalf("tool call without name: got %v, want ErrProtocol", err)
	}
}

func TestFinishReason(t *testing.T) {
	for in, want := range map[string]string{"stop": "stop", "length": "length", "load": "stop", "": "stop"} {
		if got := finishReason(in); got != want {
			t.Errorf("E8: finishReason(%q) = %q, want %q", in, got, want)
		}
	}
}

// pieces returns its chunks one Read at a time, as a socket delivers bursts.
type pieces struct{ chunks []string }

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(b, p.chunks[0])
	p.chunks[0] = p.chunks[0][n:]
	if p.chunks[0] == "" {
		p.chunks = p.chunks[1:]
	}
	return n, nil
}

// E8, T2: lines that arrived in one read are passed on as one delta; a line
// that arrives in a later read gets a delta of its own (nothing waits for
// bytes not yet read), and text read before a broken line still goes out.
func TestDeltasFollowArrival(t *testing.T) {
	line := func(s string) string {
		return `{"message":{"role":"assistant","content":"` + s + `"},"done":false}` + "\n"
	}
	done := `{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}` + "\n"
	for _, tc := range []struct {
		name    string
		chunks  []string
		want    []string
		wantErr bool
	}{
		{"E8 one burst, one delta", []string{line("a") + line("b") + line("c") + done}, []string{"abc"}, false},
		{"T2 each read its own delta", []string{line("a"), line("b"), line("c") + done}, []string{"a", "b", "c"}, false},
		{"T2 a split line waits only for its own end", []string{line("a") + line("b")[:5], line("b")[5:] + done}, []string{"a", "b"}, false},
		{"E8 text before a broken line is not lost", []string{line("a") + line("b") + "{broken\n"}, []string{"ab"}, true},
	} {
		var got []string
		_, err := readChatStream(&pieces{chunks: append([]string(nil), tc.chunks...)},
			upstream.Hooks{OnDelta: func(s string, _ []*iop.TokenLogprob) { got = append(got, s) }})
		if (err != nil) != tc.wantErr || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%s: deltas %q err %v; want %q (error %v)", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

// endless repeats line forever: a backend that never sends its done line.
type endless struct {
	line []byte
	off  int
}

func (e *endless) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], e.line[e.off:])
		n += c
		e.off = (e.off + c) % len(e.line)
	}
	return n, nil
}

// B1: a backend that streams without end fails the run with
// ErrResultTooLarge once the answer passes upstream.MaxResultBytes or
// upstream.MaxToolCalls; the text read before still went out as deltas.
func TestReadChatStreamBounded(t *testing.T) {
	text := strings.Repeat("x", 60<<10)
	rows := []struct {
		name string
		line string
	}{
		{"content without end", `{"message":{"role":"assistant","content":"` + text + `"},"done":false}` + "\n"},
		{"tool calls without end", `{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{}}}]},"done":false}` + "\n"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var deltas int
			_, err := readChatStream(&endless{line: []byte(row.line)}, upstream.Hooks{OnDelta: func(s string, _ []*iop.TokenLogprob) { deltas += len(s) }})
			if !errors.Is(err, upstream.ErrResultTooLarge) || !errors.Is(err, upstream.ErrProtocol) {
				t.Fatalf("got %v, want ErrResultTooLarge", err)
			}
			if deltas > upstream.MaxResultBytes {
				t.Errorf("%d bytes of deltas, over the bound", deltas)
			}
		})
	}
}
