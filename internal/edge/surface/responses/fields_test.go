package responses

import (
	"encoding/json"
	"strings"
	"testing"

	"iop/internal/edge/surface"
	st "iop/internal/edge/surface/surfacetest"
)

// F2: the shapes of the Responses request's objects allow exactly
// what the parser reads: nothing nested is accepted and ignored.
func TestShapesMatchParser(t *testing.T) {
	st.CheckShape(t, "input[]", itemShape, surface.JSONNames(item{}))
	st.CheckShape(t, "content part", partShape, surface.JSONNames(part{}))
	st.CheckShape(t, "tools[]", toolShape, surface.JSONNames(tool{}))
	st.CheckShape(t, "text", textShape, surface.JSONNames(textConfig{}))
	st.CheckShape(t, "reasoning", reasoningShape, surface.JSONNames(reasoning{}))
}

// F2: an unknown member nested anywhere in a Responses request, or
// a member of another item or part type, is a 400 naming its path.
func TestNestedUnknown(t *testing.T) {
	rows := []struct{ name, body, param string }{
		{"message item", `{"input":[{"role":"user","content":"hi","foo":1}]}`, "input[0].foo"},
		{"message with a call's output", `{"input":[{"role":"user","content":"hi","output":"x"}]}`, "input[0].output"},
		{"function_call with content", `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}","content":"x"}]}`, "input[0].content"},
		{"text part with an image", `{"input":[{"role":"user","content":[{"type":"input_text","text":"hi","image_url":"x"}]}]}`, "input[0].content[0].image_url"},
		{"function_call_output part", `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"x","y":1}]}]}`, "input[0].output[0].y"},
		{"tool", `{"input":"hi","tools":[{"type":"function","name":"f","parameters":{},"foo":1}]}`, "tools[0].foo"},
		{"tool_choice", `{"input":"hi","tool_choice":{"type":"function","name":"f","x":1}}`, "tool_choice.x"},
		{"text", `{"input":"hi","text":{"foo":1}}`, "text.foo"},
		{"text.format", `{"input":"hi","text":{"format":{"type":"json_object","foo":1}}}`, "text.format.foo"},
		{"reasoning", `{"input":"hi","reasoning":{"foo":1}}`, "reasoning.foo"},
		{"stream_options", `{"input":"hi","stream_options":{"foo":1}}`, "stream_options.foo"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(row.body), surface.RejectUnknown)
			if e == nil || e.Param != row.param || !strings.Contains(e.Message, "unknown field") {
				t.Fatalf("got %v, want a 400 naming %q", e, row.param)
			}
			in, p, e := InputPolicy([]byte(row.body), surface.ReportUnknown)
			st.CheckReported(t, in, p.Ignored, e, row.param)
		})
	}
}

// F2: the advisory fields change nothing, but a value the API would
// refuse is a 400 naming the field; user and metadata are echoed on the
// response object only as valid JSON of their types.
func TestAdvisoryChecked(t *testing.T) {
	rows := []struct{ name, extra, param string }{
		{"user", `"user":"u1"`, ""},
		{"user an object", `"user":{"a":1}`, "user"},
		{"metadata", `"metadata":{"a":"b"}`, ""},
		{"metadata a string", `"metadata":"x"`, "metadata"},
		{"metadata nested", `"metadata":{"a":{"b":1}}`, "metadata"},
		{"max_tool_calls", `"max_tool_calls":3`, ""},
		{"max_tool_calls a string", `"max_tool_calls":"x"`, "max_tool_calls"},
		{"max_tool_calls negative", `"max_tool_calls":-1`, "max_tool_calls"},
		{"service_tier unknown", `"service_tier":"gold"`, "service_tier"},
		{"prompt_cache_key a number", `"prompt_cache_key":5`, "prompt_cache_key"},
		{"stream_options a string", `"stream_options":"x"`, "stream_options"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, p, e := InputPolicy([]byte(`{"input":"hi",`+row.extra+`}`), surface.RejectUnknown)
			switch {
			case row.param == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.param != "" && (e == nil || e.Param != row.param):
				t.Fatalf("got %v, want a 400 naming %q", e, row.param)
			case e == nil && !json.Valid(append(append([]byte{'{'}, p.Echo...), '}')):
				t.Fatalf("echo is not JSON: %s", p.Echo)
			}
		})
	}
}

// F2: a function_call_output for an unknown call, or a function_call
// without its output, is a 400 as OpenAI answers.
func TestToolPairing(t *testing.T) {
	const fc = `{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}`
	rows := []struct{ name, items, want string }{
		{"round trip", `{"role":"user","content":"hi"},` + fc + `,{"type":"function_call_output","call_id":"c1","output":"x"}`, ""},
		{"output for an unknown call", `{"role":"user","content":"hi"},{"type":"function_call_output","call_id":"nope","output":"x"}`, `"nope"`},
		{"call without output", `{"role":"user","content":"hi"},` + fc + `,{"role":"user","content":"go"}`, `"c1"`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(`{"input":[`+row.items+`]}`), surface.RejectUnknown)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || e.Param != "input" || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 naming %s", e, row.want)
			}
		})
	}
}

// F2: temperature 0–2 and top_p 0–1 as OpenAI's reference gives them.
func TestSamplingRanges(t *testing.T) {
	rows := []struct{ extra, param string }{{`"temperature":0`, ""}, {`"temperature":9`, "temperature"}, {`"top_p":2`, "top_p"}}
	for _, row := range rows {
		t.Run(row.extra, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(`{"input":"hi",`+row.extra+`}`), surface.RejectUnknown)
			switch {
			case row.param == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.param != "" && (e == nil || e.Param != row.param):
				t.Fatalf("got %v, want a 400 naming %q", e, row.param)
			}
		})
	}
}

// F2: a tool's parameters must be a schema object and a
// function_call's arguments a JSON object, checked at the Edge.
func TestToolShapes(t *testing.T) {
	rows := []struct{ name, body, want string }{
		{"parameters a string", `{"input":"hi","tools":[{"type":"function","name":"f","parameters":"x"}]}`, "tools[0].parameters"},
		{"arguments not JSON", `{"input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{x"},{"type":"function_call_output","call_id":"c","output":"o"}]}`, "input[1].arguments"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(row.body), surface.RejectUnknown)
			if e == nil || !strings.Contains(e.Message, row.want) {
				t.Fatalf("got %v, want a 400 with %q", e, row.want)
			}
		})
	}
}
