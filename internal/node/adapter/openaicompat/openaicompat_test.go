package openaicompat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

const tools = `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

func i64(v int64) *int64 { return &v }

// E9: native requests carry tools, tool_choice and the include_usage option.
func TestBuildChatRequestNative(t *testing.T) {
	in := &iop.RunInput{
		Messages: []*iop.ChatMessage{
			{Role: "user", Content: "Weather?"},
			{Role: "assistant", ToolCallsJson: []byte(`[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`)},
			{Role: "tool", ToolCallId: "c1", Content: "sunny"},
		},
		ToolsJson: []byte(tools), ToolChoiceJson: []byte(`"auto"`), MaxTokens: 32, Seed: i64(1),
	}
	cases := []struct {
		name, profile, want string
	}{
		{"E9 llamacpp uses max_tokens", "llamacpp", `{"model":"tiny","stream":true,"stream_options":{"include_usage":true},"max_tokens":32,"seed":1,
			"messages":[{"role":"user","content":"Weather?"},
			{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			{"role":"tool","content":"sunny","tool_call_id":"c1"}],
			"tools":` + tools + `,"tool_choice":"auto"}`},
		{"E9 openai uses max_completion_tokens", "openai", `{"model":"tiny","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":32,"seed":1,
			"messages":[{"role":"user","content":"Weather?"},
			{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			{"role":"tool","content":"sunny","tool_call_id":"c1"}],
			"tools":` + tools + `,"tool_choice":"auto"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BuildChatRequest(tc.profile, "tiny", in, false)
			if err != nil {
				t.Fatal(err)
			}
			if !samples.JSONEqual(t, got, []byte(tc.want)) {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// E9: the text tool-call mode: no tools, instruction merged into the leading
// system message (created when absent), history rewritten without tool
// roles.
func TestBuildChatRequestTextMode(t *testing.T) {
	history := []*iop.ChatMessage{
		{Role: "user", Content: "Weather?"},
		{Role: "assistant", Content: "Let me check.", ToolCallsJson: []byte(`[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`)},
		{Role: "tool", ToolCallId: "c1", Content: "sunny"},
	}
	cases := []struct {
		name     string
		system   []*iop.ChatMessage
		choice   string
		wantSys  string // prefix of the system content
		wantMore string // contained in the system content
	}{
		{"E9 merged into the existing system message", []*iop.ChatMessage{{Role: "system", Content: "Be brief."}}, `"auto"`, "Be brief.\n\nYou can call tools.", ""},
		{"E9 system message created when absent", nil, "", "You can call tools.", ""},
		{"E9 required tool_choice", nil, `"required"`, "You can call tools.", "You must call at least one tool."},
		{"E9 named tool_choice", nil, `{"type":"function","function":{"name":"get_weather"}}`, "You can call tools.", `You must call the tool "get_weather".`},
		{"E9 none tool_choice", nil, `"none"`, "You can call tools.", "Do not call any tool"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := &iop.RunInput{Messages: append(append([]*iop.ChatMessage{}, tc.system...), history...), ToolsJson: []byte(tools), ToolChoiceJson: []byte(tc.choice)}
			b, err := BuildChatRequest("llamacpp", "tiny", in, true)
			if err != nil {
				t.Fatal(err)
			}
			var req struct {
				Messages []struct {
					Role, Content string
					ToolCalls     json.RawMessage `json:"tool_calls"`
					ToolCallID    string          `json:"tool_call_id"`
				}
				Tools      json.RawMessage
				ToolChoice json.RawMessage `json:"tool_choice"`
			}
			if err := json.Unmarshal(b, &req); err != nil {
				t.Fatal(err)
			}
			if req.Tools != nil || req.ToolChoice != nil {
				t.Fatalf("E9: text mode sends tools/tool_choice: %s", b)
			}
			if len(req.Messages) != 4 {
				t.Fatalf("got %d messages, want system + 3", len(req.Messages))
			}
			sys := req.Messages[0]
			if sys.Role != "system" || !strings.HasPrefix(sys.Content, tc.wantSys) || !strings.Contains(sys.Content, tc.wantMore) ||
				!strings.Contains(sys.Content, TextToolCallFormat) || !strings.Contains(sys.Content, `"name":"get_weather"`) {
				t.Fatalf("E9: system message %q", sys.Content)
			}
			if a := req.Messages[2]; a.Role != "assistant" || a.ToolCalls != nil || a.Content != `Let me check.`+"\n"+`{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}` {
				t.Fatalf("E9: assistant history %+v", a)
			}
			if r := req.Messages[3]; r.Role != "user" || r.ToolCallID != "" || !strings.Contains(r.Content, "sunny") || !strings.Contains(r.Content, "get_weather") {
				t.Fatalf("E9: tool result %+v", r)
			}
		})
	}
	if _, err := BuildChatRequest("llamacpp", "tiny", &iop.RunInput{Messages: history, ToolsJson: []byte(tools), ToolChoiceJson: []byte(`{"x":1}`)}, true); !errors.Is(err, upstream.ErrInvalidInput) {
		t.Fatalf("E9: bad tool_choice: got %v, want ErrInvalidInput", err)
	}
}

func TestRejectsTools(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"E9 400", &upstream.StatusError{Status: 400, Message: "bad"}, true},
		{"E9 422", fmt.Errorf("wrapped: %w", &upstream.StatusError{Status: 422}), true},
		{"E9 500 naming tools", &upstream.StatusError{Status: 500, Message: "tools param requires --jinja flag"}, true},
		{"E9 500 other", &upstream.StatusError{Status: 500, Message: "out of memory"}, false},
		{"E9 404", &upstream.StatusError{Status: 404, Message: "tool model not found"}, false},
		{"E9 transport error", io.ErrUnexpectedEOF, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := RejectsTools(tc.err); got != tc.want {
				t.Fatalf("RejectsTools(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// E9: the captured streams give the same result however the bytes arrive.
func TestReadChatStreamSplits(t *testing.T) {
	for _, file := range []string{"llama_v1_chat_stream.sse", "ollama_v1_chat_stream.sse", "llama_v1_chat_tool_stream.sse", "ollama_v1_chat_tool_stream.sse"} {
		t.Run("E9 "+file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "testdata", "samples", file))
			if err != nil {
				t.Fatal(err)
			}
			want, err := ReadChatStream(bytes.NewReader(b), upstream.Hooks{})
			if err != nil {
				t.Fatal(err)
			}
			for k := 1; k <= len(b); k++ {
				got, err := ReadChatStream(io.MultiReader(bytes.NewReader(b[:k]), bytes.NewReader(b[k:])), upstream.Hooks{})
				if err != nil || got.Content != want.Content || got.FinishReason != want.FinishReason ||
					got.Usage.String() != want.Usage.String() || got.Metadata[protocol.MetaToolCalls] != want.Metadata[protocol.MetaToolCalls] {
					t.Fatalf("split %d: got %+v, %v; want %+v", k, got, err, want)
				}
			}
		})
	}
}

// E9: fragment assembly without index: by id, then continuing the last
// call; arguments never parsed.
func TestToolCallAssembly(t *testing.T) {
	cases := []struct {
		name   string
		deltas []string
		want   string
	}{
		{"E9 no index, distinct ids are distinct calls", []string{
			`[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]`,
			`[{"id":"b","type":"function","function":{"name":"g","arguments":"{\"x\""}}]`,
			`[{"function":{"arguments":":1}"}}]`,
		}, `[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"g","arguments":"{\"x\":1}"}}]`},
		{"E9 index order wins over arrival order", []string{
			`[{"index":1,"id":"b","function":{"name":"g","arguments":"{}"}}]`,
			`[{"index":0,"id":"a","function":{"name":"f","arguments":"{}"}}]`,
		}, `[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]`},
		{"E9 invalid JSON arguments pass through untouched", []string{
			`[{"index":0,"id":"a","function":{"name":"f","arguments":"{not json"}}]`,
		}, `[{"id":"a","type":"function","function":{"name":"f","arguments":"{not json"}}]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			for _, d := range tc.deltas {
				fmt.Fprintf(&b, "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":%s}}]}\n\n", d)
			}
			b.WriteString("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n")
			res, err := ReadChatStream(strings.NewReader(b.String()), upstream.Hooks{})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Metadata[protocol.MetaToolCalls]; got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// E9: choices other than 0 and role-only chunks add nothing; a bare [DONE]
// ends a stream without finish_reason as "stop".
func TestReadChatStreamEdges(t *testing.T) {
	in := "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n" +
		"data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other\"}}]}\n\n" +
		": keep-alive\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"mine\"}}]}\n\n" +
		"data: [DONE]\n\ndata: {\"after\":\"done is ignored\"\n\n"
	res, err := ReadChatStream(strings.NewReader(in), upstream.Hooks{})
	if err != nil || res.Content != "mine" || res.FinishReason != "stop" || res.Usage != nil {
		t.Fatalf("got %+v, %v", res, err)
	}
}

// endless repeats chunk forever: a backend that never stops.
type endless struct {
	chunk []byte
	off   int
}

func (e *endless) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], e.chunk[e.off:])
		n += c
		e.off = (e.off + c) % len(e.chunk)
	}
	return n, nil
}

// B1: a backend that streams without end fails the run with
// ErrResultTooLarge once the answer passes upstream.MaxResultBytes or
// upstream.MaxToolCalls, instead of growing the node's memory.
func TestReadChatStreamBounded(t *testing.T) {
	text := strings.Repeat("x", 60<<10)
	rows := []struct {
		name  string
		chunk string
	}{
		{"content without end", "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + text + "\"}}]}\n\n"},
		{"tool-call arguments without end", "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"" + text + "\"}}]}}]}\n\n"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, err := ReadChatStream(&endless{chunk: []byte(row.chunk)}, upstream.Hooks{})
			if !errors.Is(err, upstream.ErrResultTooLarge) || !errors.Is(err, upstream.ErrProtocol) {
				t.Fatalf("got %v, want ErrResultTooLarge", err)
			}
		})
	}
	t.Run("tool calls without end", func(t *testing.T) {
		var b strings.Builder
		for i := range upstream.MaxToolCalls + 1 {
			fmt.Fprintf(&b, "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":%d,\"function\":{\"name\":\"f\"}}]}}]}\n\n", i)
		}
		b.WriteString("data: [DONE]\n\n")
		if _, err := ReadChatStream(strings.NewReader(b.String()), upstream.Hooks{}); !errors.Is(err, upstream.ErrResultTooLarge) {
			t.Fatalf("got %v, want ErrResultTooLarge", err)
		}
	})
}
