package anthropic

import (
	"strings"
	"testing"

	"iop/internal/edge/surface"
	st "iop/internal/edge/surface/surfacetest"
)

// F2: every field the Messages parser knows has exactly one row in
// Fields; a field added to request without a row fails here.
func TestFieldTableComplete(t *testing.T) {
	st.CheckFieldTable(t, RequestFields(), Fields)
}

// F2: the shapes of the Messages request's objects allow exactly
// what the parser reads: nothing nested is accepted and ignored.
func TestShapesMatchParser(t *testing.T) {
	st.CheckShape(t, "messages[]", messageShape, surface.JSONNames(message{}))
	st.CheckShape(t, "content block", blockShape, surface.JSONNames(block{}))
	st.CheckShape(t, "source", sourceShape, surface.JSONNames(source{}))
	st.CheckShape(t, "tools[]", toolShape, surface.JSONNames(tool{}))
	st.CheckShape(t, "tool_choice", toolChoiceShape, surface.JSONNames(toolChoice{}))
}

// F2: an unknown member nested anywhere in a Messages request, or a
// member of another block type, is a 400 naming its path.
func TestNestedUnknown(t *testing.T) {
	const user = `{"role":"user","content":"hi"}`
	rows := []struct{ name, body, param string }{
		{"message", `{"max_tokens":5,"messages":[{"role":"user","content":"hi","foo":1}]}`, "messages[0].foo"},
		{"text block with a document's title", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi","title":"t"}]}]}`, "messages[0].content[0].title"},
		{"text block with a tool_result's id", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi","tool_use_id":"x"}]}]}`, "messages[0].content[0].tool_use_id"},
		{"cache_control", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","x":1}}]}]}`, "messages[0].content[0].cache_control.x"},
		{"image source of another type", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo=","url":"u"}}]}]}`, "messages[0].content[0].source.url"},
		{"tool_result content", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x","id":"y"}]}]}]}`, "messages[0].content[0].content[0].id"},
		{"system block", `{"max_tokens":5,"system":[{"type":"text","text":"s","foo":1}],"messages":[` + user + `]}`, "system[0].foo"},
		{"tool", `{"max_tokens":5,"tools":[{"name":"f","input_schema":{"type":"object"},"foo":1}],"messages":[` + user + `]}`, "tools[0].foo"},
		{"tool_choice", `{"max_tokens":5,"tool_choice":{"type":"auto","x":1},"messages":[` + user + `]}`, "tool_choice.x"},
		{"thinking", `{"max_tokens":5,"thinking":{"type":"disabled","x":1},"messages":[` + user + `]}`, "thinking.x"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(row.body), false, surface.RejectUnknown)
			if e == nil || e.Param != row.param || !strings.Contains(e.Message, "unknown field") {
				t.Fatalf("got %v, want a 400 naming %q", e, row.param)
			}
			in, p, e := InputPolicy([]byte(row.body), false, surface.ReportUnknown)
			st.CheckReported(t, in, p.Ignored, e, row.param)
		})
	}
}

// F2: metadata (user_id only) and service_tier are advisory, but a
// value Anthropic would refuse is a 400 naming the field.
func TestAdvisoryChecked(t *testing.T) {
	const msgs = `"max_tokens":5,"messages":[{"role":"user","content":"hi"}]`
	rows := []struct{ name, extra, want string }{
		{"user_id", `"metadata":{"user_id":"u1"}`, ""},
		{"user_id null", `"metadata":{"user_id":null}`, ""},
		{"metadata a string", `"metadata":"x"`, "metadata"},
		{"metadata another member", `"metadata":{"foo":"x"}`, "metadata.foo"},
		{"user_id a number", `"metadata":{"user_id":5}`, "user_id"},
		{"user_id too long", `"metadata":{"user_id":"` + strings.Repeat("u", 257) + `"}`, "metadata.user_id"},
		{"service_tier", `"service_tier":"standard_only"`, ""},
		{"service_tier unknown", `"service_tier":"gold"`, "service_tier"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(`{`+msgs+`,`+row.extra+`}`), false, surface.RejectUnknown)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 naming %q", e, row.want)
			}
		})
	}
}

// F2: a tool_result without its tool_use in the assistant message
// before it, or a tool_use left without its tool_result, is a 400 as
// Anthropic answers.
func TestToolPairing(t *testing.T) {
	const use = `{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]}`
	rows := []struct{ name, msgs, want string }{
		{"round trip", `{"role":"user","content":"hi"},` + use + `,{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"x"}]}`, ""},
		{"tool_result without tool_use", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_nope","content":"x"}]}`, `"toolu_nope"`},
		{"tool_result after a text answer", `{"role":"user","content":"hi"},{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"x"}]}`, `"t1"`},
		{"tool_use without tool_result", `{"role":"user","content":"hi"},` + use + `,{"role":"user","content":"go on"}`, `"t1"`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(`{"max_tokens":5,"messages":[`+row.msgs+`]}`), false, surface.RejectUnknown)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 naming %s", e, row.want)
			}
		})
	}
}

// F2: temperature 0–1, top_p 0–1, top_k ≥ 0 as Anthropic's reference
// gives them; outside is a 400 naming the field.
func TestSamplingRanges(t *testing.T) {
	rows := []struct{ extra, want string }{
		{`"temperature":1`, ""}, {`"temperature":1.5`, "temperature"}, {`"top_p":-1`, "top_p"},
		{`"top_k":0`, ""}, {`"top_k":-1`, "top_k"},
	}
	for _, row := range rows {
		t.Run(row.extra, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(`{"max_tokens":5,"messages":[{"role":"user","content":"hi"}],`+row.extra+`}`), false, surface.RejectUnknown)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 naming %q", e, row.want)
			}
		})
	}
}

// F2: a tool's input_schema must be a schema object (Ollama answered
// a string with a truncated decode error after the queue).
func TestToolSchemaObject(t *testing.T) {
	_, _, e := InputPolicy([]byte(`{"max_tokens":5,"tools":[{"name":"f","input_schema":"x"}],"messages":[{"role":"user","content":"hi"}]}`), false, surface.RejectUnknown)
	if e == nil || !strings.Contains(e.Message, "tools[0].input_schema") {
		t.Fatalf("got %v, want a 400 naming tools[0].input_schema", e)
	}
}

// F2: empty content ("" or []) is a 400 as Anthropic answers, except
// on a final assistant message.
func TestEmptyContent(t *testing.T) {
	rows := []struct{ name, msgs, want string }{
		{"empty string", `{"role":"user","content":""}`, "messages[0].content must not be empty"},
		{"empty array", `{"role":"user","content":[]}`, "messages[0].content must not be empty"},
		{"empty assistant in the middle", `{"role":"user","content":"a"},{"role":"assistant","content":""},{"role":"user","content":"b"}`, "messages[1].content"},
		{"empty final assistant", `{"role":"user","content":"a"},{"role":"assistant","content":""}`, ""},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := InputPolicy([]byte(`{"max_tokens":5,"messages":[`+row.msgs+`]}`), false, surface.RejectUnknown)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 with %q", e, row.want)
			}
		})
	}
}
