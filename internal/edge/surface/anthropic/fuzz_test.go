package anthropic

import (
	"testing"

	"iop/internal/edge/surface/surfacetest"

	"google.golang.org/protobuf/proto"
)

// FuzzInput: any Messages or count_tokens body (client input) never panics
// Input; a refusal is a 400 with a message, an accepted body a RunInput
// with messages that encodes as a frame (SPEC W1).
func FuzzInput(f *testing.F) {
	for _, s := range []string{
		`{"model":"tiny","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"t","max_tokens":9,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"text","text":"w?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}],` +
			`"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto","disable_parallel_tool_use":true},"stop_sequences":["END"],"temperature":0.5}`,
		`{"model":"t","messages":[{"role":"user","content":"hi"}]}`, `{"model":"t","max_tokens":0,"messages":[]}`, `[]`, `{"messages":[{"role":"system"}]}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, count bool) {
		in, p, e := Input(body, count)
		if e != nil {
			if e.Status != 400 || e.Message == "" {
				t.Fatalf("refusal %+v, want a 400 with a message", e)
			}
			return
		}
		if len(in.GetMessages()) == 0 {
			t.Fatalf("accepted %q without messages", body)
		}
		if _, err := proto.Marshal(in); err != nil {
			t.Fatalf("accepted %q into a RunInput that does not encode: %v", body, err)
		}
		for _, name := range p.Tools {
			if name == "" {
				t.Fatalf("a declared tool without a name from %q", body)
			}
		}
	})
}

// FuzzMessagesEvents: whatever run events a node sends (peer input), the
// Messages and Count encoders never panic and write only well-formed
// output: SSE events with JSON data, or one JSON document.
func FuzzMessagesEvents(f *testing.F) {
	f.Add([]byte("\x01\x02Hello\x00\x02 world\x00\x03Hello world"), true, false, "", false)
	f.Add([]byte("\x01\x02{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{}}]}\x00\x03"), true, true, "", true)
	f.Add([]byte("\x01\x03"), false, true, `[{"id":"c","type":"function","function":{"name":"get_weather","arguments":"{\"a\":1}"}}]`, false)
	f.Add([]byte("\x02late\x00\x03\x02after"), true, true, "[", false)
	f.Fuzz(func(t *testing.T, script []byte, stream, tools bool, meta string, fallback bool) {
		o := Options{Model: "m\"odel", ID: "msg_1", Stream: stream, NewID: func() string { return "x" }, MaxToolCalls: len(meta) % 3}
		if tools {
			o.Tools, o.Hold = []string{"get_weather", "f"}, true
		}
		evs := surfacetest.Script(script, meta, fallback)
		var m Messages
		m.Init(o)
		if out, httpErr := surfacetest.RunScript(&m, evs, stream); !httpErr {
			surfacetest.CheckWellFormed(t, out, stream)
		}
		if out, httpErr := surfacetest.RunScript(Count{}, evs, false); !httpErr {
			surfacetest.CheckWellFormed(t, out, false)
		}
	})
}
