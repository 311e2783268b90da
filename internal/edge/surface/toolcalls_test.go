package surface_test

import (
	"errors"
	"fmt"
	"testing"

	"iop/internal/edge/surface"
	"iop/internal/edge/surface/surfacetest"
)

// E9: text tool calls are restored from the documented format only.
func TestTextToolCalls(t *testing.T) {
	weather := []string{"get_weather", "get_time"}
	rows := []struct {
		name    string
		content string
		allowed []string
		want    string // "name(args)|…" or "" for none
		rest    string
	}{
		{"E9 bare object", `{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}`, weather,
			`get_weather({"city":"Paris"})`, ""},
		{"E9 fenced with text around", "Sure.\n```json\n{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\": \"Paris\"}}]}\n```\nDone.", weather,
			`get_weather({"city": "Paris"})`, "Sure.\nDone."},
		{"E9 plain fence", "```\n{\"tool_calls\":[{\"name\":\"get_time\",\"arguments\":{}}]}\n```", weather, `get_time({})`, ""},
		{"E9 OpenAI-shaped entries and string arguments", `{"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"UTC\"}"}}]}`,
			weather, `get_time({"tz":"UTC"})`, ""},
		{"E9 two calls", `{"tool_calls":[{"name":"get_weather","arguments":{"city":"A"}},{"name":"get_time","arguments":{}}]}`, weather,
			`get_weather({"city":"A"})|get_time({})`, ""},
		{"E9 single bare call", `{"name":"get_weather","arguments":{"city":"B"}}`, weather, `get_weather({"city":"B"})`, ""},
		{"E9 missing arguments are {}", `{"tool_calls":[{"name":"get_time"}]}`, weather, `get_time({})`, ""},
		{"E9 unknown tool stays text", `{"tool_calls":[{"name":"rm_rf","arguments":{}}]}`, weather, "", ""},
		{"E9 any name when no tools are known", `{"tool_calls":[{"name":"x","arguments":{}}]}`, nil, `x({})`, ""},
		{"E9 prose with braces stays text", "use {braces} and {\"a\":1}", weather, "", ""},
		{"E9 broken JSON first, valid later", `{"tool_calls": [ oops } then {"tool_calls":[{"name":"get_time","arguments":{}}]}`, weather,
			`get_time({})`, `{"tool_calls": [ oops } then`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			calls, rest, ok := surface.TextToolCalls(row.content, row.allowed, surfacetest.SeqIDs())
			got := ""
			for i, c := range calls {
				if i > 0 {
					got += "|"
				}
				got += fmt.Sprintf("%s(%s)", c.Name, c.Arguments)
				if c.ID == "" {
					t.Errorf("call %d without id", i)
				}
			}
			if got != row.want || ok != (row.want != "") {
				t.Fatalf("calls: got %q (ok %v), want %q", got, ok, row.want)
			}
			if ok && rest != row.rest {
				t.Errorf("rest: got %q, want %q", rest, row.rest)
			}
			if !ok && rest != row.content {
				t.Errorf("rest without calls: got %q, want the content", rest)
			}
		})
	}
}

// E8, E9: metadata["openai_tool_calls"] in OpenAI shape.
func TestNativeToolCalls(t *testing.T) {
	rows := []struct {
		name, meta, want string
		err              error
	}{
		{"E8 one call", surfacetest.OneCall, `call_a1 get_weather {"city": "Paris"}`, nil},
		{"E8 missing id is generated", `[{"type":"function","function":{"name":"f","arguments":"{}"}}]`, `call_id1 f {}`, nil},
		{"E8 object arguments kept as written", `[{"id":"c","function":{"name":"f","arguments":{"a": 1}}}]`, `c f {"a": 1}`, nil},
		{"E8 not an array", `{"id":"c"}`, "", surface.ErrBadToolCalls},
		{"E8 no name", `[{"id":"c","function":{}}]`, "", surface.ErrBadToolCalls},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			calls, err := surface.NativeToolCalls(row.meta, surfacetest.SeqIDs())
			if !errors.Is(err, row.err) {
				t.Fatalf("err: got %v, want %v", err, row.err)
			}
			if err != nil {
				return
			}
			if got := calls[0].ID + " " + calls[0].Name + " " + calls[0].Arguments; got != row.want {
				t.Errorf("got %q, want %q", got, row.want)
			}
		})
	}
}
