package openai

import (
	"strings"
	"testing"

	"iop/internal/edge/surface"
	st "iop/internal/edge/surface/surfacetest"
)

// F2: every field the chat parser knows has exactly one row in
// ChatFields; a field added to chatRequest without a row fails here.
func TestChatFieldTableComplete(t *testing.T) {
	st.CheckFieldTable(t, ChatRequestFields(), ChatFields)
}

// F2: the shapes of the chat request's objects allow exactly what
// the parser reads: nothing nested is accepted and ignored.
func TestChatShapesMatchParser(t *testing.T) {
	st.CheckShape(t, "messages[]", chatMessageShape, surface.JSONNames(chatMessage{}))
	st.CheckShape(t, "messages[].content[]", chatPartShape, surface.JSONNames(contentPart{}))
	st.CheckShape(t, "image_url", chatPartShape.Types[1].Members[0].Shape, surface.JSONNames(imageURL{}))
	st.CheckShape(t, "stream_options", chatStreamOptionsShape, surface.JSONNames(streamOptions{}))
}

// F2: an unknown member nested anywhere in a chat request is a 400
// naming its path, never accepted and ignored.
func TestChatNestedUnknown(t *testing.T) {
	rows := []struct{ name, body, param string }{
		{"message", `{"messages":[{"role":"user","content":"hi","foo":1}]}`, "messages[0].foo"},
		{"text part", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{}}]}]}`, "messages[0].content[0].cache_control"},
		{"image_url", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","x":1}}]}]}`, "messages[0].content[0].image_url.x"},
		{"tool call", `{"messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}","x":1}}]}]}`, "messages[0].tool_calls[0].function.x"},
		{"tool", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"},"bar":2}]}`, "tools[0].bar"},
		{"tool function", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","foo":1}}]}`, "tools[0].function.foo"},
		{"tool_choice", `{"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"function","function":{"name":"f"},"x":1}}`, "tool_choice.x"},
		{"stream_options", `{"messages":[{"role":"user","content":"hi"}],"stream_options":{"foo":true}}`, "stream_options.foo"},
		{"response_format", `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{},"y":1}}}`, "response_format.json_schema.y"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := ChatInputPolicy([]byte(row.body), surface.RejectUnknown)
			if e == nil || e.Param != row.param || !strings.Contains(e.Message, "unknown field") {
				t.Fatalf("got %v, want a 400 naming %q", e, row.param)
			}
			in, p, e := ChatInputPolicy([]byte(row.body), surface.ReportUnknown)
			st.CheckReported(t, in, p.Ignored, e, row.param)
		})
	}
}

// F2: the advisory fields change nothing on the run path, but a
// value the API would refuse is a 400 naming the field, never accepted and
// ignored; a valid one passes.
func TestChatAdvisoryChecked(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	long := strings.Repeat("k", 65)
	rows := []struct{ name, extra, param string }{
		{"user a string", `"user":"u1"`, ""},
		{"user a number", `"user":5`, "user"},
		{"metadata string pairs", `"metadata":{"a":"b"}`, ""},
		{"metadata a string", `"metadata":"x"`, "metadata"},
		{"metadata nested", `"metadata":{"a":{"b":1}}`, "metadata"},
		{"metadata key too long", `"metadata":{"` + long + `":"v"}`, "metadata"},
		{"metadata 17 pairs", `"metadata":{"a":"","b":"","c":"","d":"","e":"","f":"","g":"","h":"","i":"","j":"","k":"","l":"","m":"","n":"","o":"","p":"","q":""}`, "metadata"},
		{"service_tier known", `"service_tier":"flex"`, ""},
		{"service_tier unknown", `"service_tier":"gold"`, "service_tier"},
		{"service_tier a number", `"service_tier":42`, "service_tier"},
		{"prompt_cache_key an object", `"prompt_cache_key":{"x":1}`, "prompt_cache_key"},
		{"prompt_cache_retention unknown", `"prompt_cache_retention":"forever"`, "prompt_cache_retention"},
		{"safety_identifier a bool", `"safety_identifier":true`, "safety_identifier"},
		{"include_obfuscation a string", `"stream_options":{"include_obfuscation":"no"}`, "stream_options.include_obfuscation"},
		{"null is absent", `"user":null,"metadata":null,"service_tier":null`, ""},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := ChatInputPolicy([]byte(`{`+msgs+`,`+row.extra+`}`), surface.RejectUnknown)
			switch {
			case row.param == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.param != "" && (e == nil || e.Param != row.param):
				t.Fatalf("got %v, want a 400 naming %q", e, row.param)
			}
		})
	}
}

// F2: a tool message without its assistant tool call, or a tool call
// without its tool message, is a 400 as OpenAI answers, not a conversation
// the backend gets and the client a 200 for.
func TestChatToolPairing(t *testing.T) {
	const call = `{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}`
	rows := []struct{ name, msgs, want string }{
		{"round trip", `{"role":"user","content":"hi"},` + call + `,{"role":"tool","tool_call_id":"c1","content":"x"}`, ""},
		{"unknown tool_call_id", `{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"nope","content":"x"}`, `"nope"`},
		{"call unanswered", `{"role":"user","content":"hi"},` + call + `,{"role":"user","content":"go on"}`, `"c1"`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := ChatInputPolicy([]byte(`{"messages":[`+row.msgs+`]}`), surface.RejectUnknown)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 naming %s", e, row.want)
			}
		})
	}
}

// F2: sampling parameters outside the ranges the API reference gives
// are a 400 naming the field (Ollama would take any number).
func TestSamplingRanges(t *testing.T) {
	rows := []struct {
		name, body, param string
		input             func([]byte) *surface.Error
	}{
		{"chat temperature 2", `{"messages":[{"role":"user","content":"hi"}],"temperature":2}`, "", chat},
		{"chat temperature 2.5", `{"messages":[{"role":"user","content":"hi"}],"temperature":2.5}`, "temperature", chat},
		{"chat temperature negative", `{"messages":[{"role":"user","content":"hi"}],"temperature":-0.1}`, "temperature", chat},
		{"chat top_p 1.5", `{"messages":[{"role":"user","content":"hi"}],"top_p":1.5}`, "top_p", chat},
		{"chat frequency_penalty -2", `{"messages":[{"role":"user","content":"hi"}],"frequency_penalty":-2}`, "", chat},
		{"chat presence_penalty 10", `{"messages":[{"role":"user","content":"hi"}],"presence_penalty":10}`, "presence_penalty", chat},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			e := row.input([]byte(row.body))
			switch {
			case row.param == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.param != "" && (e == nil || e.Param != row.param):
				t.Fatalf("got %v, want a 400 naming %q", e, row.param)
			}
		})
	}
}

func chat(b []byte) *surface.Error { _, _, e := ChatInput(b); return e }

// F2: what the backend cannot take is a 400 naming it at the Edge,
// not a truncated upstream error after the queue: a tool's parameters that
// are not a schema object, an assistant tool call without id, name or
// object arguments, an empty embeddings input (Ollama answers it with a
// 500 that would count against the provider's health).
func TestChatToolShapesAndEmbeddings(t *testing.T) {
	const user = `{"role":"user","content":"hi"}`
	tc := func(call string) string {
		return `{"messages":[` + user + `,{"role":"assistant","tool_calls":[` + call + `]},{"role":"tool","tool_call_id":"a","content":"x"}]}`
	}
	rows := []struct {
		name, body, want string
		input            func([]byte) *surface.Error
	}{
		{"parameters a string", `{"messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]}`, "tools[0].function.parameters", chat},
		{"tool call ok", tc(`{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}`), "", chat},
		{"tool call without id", tc(`{"type":"function","function":{"name":"f","arguments":"{}"}}`), "tool_calls[0].id", chat},
		{"tool call id a number", tc(`{"id":1,"type":"function","function":{"name":"f","arguments":"{}"}}`), "tool_calls must be", chat},
		{"tool call arguments an object", tc(`{"id":"a","type":"function","function":{"name":"f","arguments":{"x":1}}}`), "tool_calls must be", chat},
		{"tool call arguments not JSON", tc(`{"id":"a","type":"function","function":{"name":"f","arguments":"{x"}}`), "function.arguments", chat},
		{"tool call without name", tc(`{"id":"a","type":"function","function":{"arguments":"{}"}}`), "function.name", chat},
		{"embeddings empty string", `{"input":""}`, "empty string", embed},
		{"embeddings an empty string in the list", `{"input":["a",""]}`, "input[1]", embed},
		{"embeddings strings", `{"input":["a","b"]}`, "", embed},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			e := row.input([]byte(row.body))
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 with %q", e, row.want)
			}
		})
	}
}

func embed(b []byte) *surface.Error { _, _, e := EmbeddingsInput(b); return e }
