package openai

import (
	"strings"
	"testing"

	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/encoding/prototext"
)

// Q3: the normalized RunInput an ollama provider receives.
func TestRunInput(t *testing.T) {
	rows := []struct {
		name  string
		body  string
		check func(t *testing.T, in *iop.RunInput, tools []string)
		err   string // substring of the 400 message
	}{
		{name: "Q3 string and multi-part text content", body: `{"messages":[{"role":"system","content":"s"},` +
			`{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":""}]}`,
			check: func(t *testing.T, in *iop.RunInput, _ []string) {
				if len(in.Messages) != 3 || in.Messages[0].Content != "s" || in.Messages[1].Content != "a\nb" || in.Messages[2].Content != "" {
					t.Errorf("messages: %v", in.Messages)
				}
			}},
		{name: "Q3 tool calls, tool results, tools and tool_choice", body: `{"messages":[{"role":"user","content":"w?"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"sunny"}],` +
			`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],"tool_choice":"auto"}`,
			check: func(t *testing.T, in *iop.RunInput, tools []string) {
				m := in.Messages
				if !strings.Contains(string(m[1].ToolCallsJson), `"c1"`) || m[2].ToolCallId != "c1" || m[2].Role != "tool" {
					t.Errorf("tool messages: %v", m)
				}
				if !strings.HasPrefix(string(in.ToolsJson), `[{"type":"function"`) || string(in.ToolChoiceJson) != `"auto"` {
					t.Errorf("tools %s choice %s", in.ToolsJson, in.ToolChoiceJson)
				}
				if len(tools) != 1 || tools[0] != "get_weather" {
					t.Errorf("tool names: %v", tools)
				}
			}},
		{name: "Q3 sampling fields and stop array", body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":5,"top_p":0.9,` +
			`"temperature":0,"stop":["a","b"],"seed":-1,"tool_choice":null}`,
			check: func(t *testing.T, in *iop.RunInput, _ []string) {
				if in.MaxTokens != 5 || in.GetTopP() != 0.9 || in.Temperature == nil || in.GetTemperature() != 0 ||
					len(in.Stop) != 2 || in.Seed == nil || in.GetSeed() != -1 || in.ToolChoiceJson != nil {
					t.Errorf("input: %s", prototext.Format(in))
				}
			}},
		{name: "Q3 absent sampling fields stay unset", body: `{"messages":[{"role":"user","content":"x"}]}`,
			check: func(t *testing.T, in *iop.RunInput, _ []string) {
				if in.Temperature != nil || in.TopP != nil || in.Seed != nil || in.MaxTokens != 0 || in.Stop != nil {
					t.Errorf("input: %s", prototext.Format(in))
				}
			}},
		{name: "400 wrong content type names the field", body: `{"messages":[{"role":"user","content":5}]}`, err: "messages[0].content"},
		{name: "400 role with a wrong type names the field", body: `{"messages":[{"role":1}]}`, err: "messages.role"},
		{name: "400 tool message without tool_call_id", body: `{"messages":[{"role":"tool","content":"x"}]}`, err: "tool_call_id"},
		{name: "400 tool_calls on a user message", body: `{"messages":[{"role":"user","content":"x","tool_calls":[]}]}`, err: "tool_calls"},
		{name: "400 a user message without content", body: `{"messages":[{"role":"user","content":null}]}`, err: "messages[0].content is required"},
		{name: "400 an assistant message without content or tool_calls", body: `{"messages":[{"role":"user","content":"x"},{"role":"assistant"}]}`, err: "messages[1].content is required unless"},
		{name: "400 an empty content array", body: `{"messages":[{"role":"user","content":[ ]}]}`, err: "messages[0].content must not be an empty array"},
		{name: "400 empty messages", body: `{"messages":[]}`, err: "at least one"},
		{name: "400 stop of the wrong type", body: `{"messages":[{"role":"user","content":"x"}],"stop":3}`, err: `"stop"`},
		{name: "400 max_tokens zero", body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, err: "max_tokens"},
		{name: "400 n above 1", body: `{"messages":[{"role":"user","content":"x"}],"n":2}`, err: `"n"`},
		{name: "400 tool without a name", body: `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]}`, err: "tools[0]"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			in, p, e := ChatInput([]byte(row.body))
			if row.err != "" {
				if e == nil || e.Status != 400 || !strings.Contains(e.Message, row.err) {
					t.Fatalf("got %v, want a 400 naming %s", e, row.err)
				}
				return
			}
			if e != nil {
				t.Fatal(e)
			}
			row.check(t, in, p.Tools)
		})
	}
}
