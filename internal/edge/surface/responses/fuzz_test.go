package responses

import (
	"testing"

	"iop/internal/edge/surface/surfacetest"

	"google.golang.org/protobuf/proto"
)

// FuzzInput: any Responses body (client input) never panics Input; a
// refusal is a 400 with a message, an accepted body a RunInput with
// messages that encodes as a frame (SPEC W1) and an Echo that is JSON
// members.
func FuzzInput(f *testing.F) {
	for _, s := range []string{
		`{"model":"tiny","input":"hi"}`,
		`{"model":"t","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"w?"}]},` +
			`{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"c1","output":"sunny"}],` +
			`"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"parallel_tool_calls":false,"max_output_tokens":16,"temperature":0.3,"user":"u"}`,
		`{"model":"t","input":[]}`, `{"model":"t","previous_response_id":"r"}`, `{"input":{"x":1}}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in, p, e := Input(body)
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
		if len(p.Echo) > 0 {
			surfacetest.CheckWellFormed(t, append(append([]byte("{"), p.Echo...), '}'), false)
		}
	})
}

// FuzzEvents: whatever run events a node sends (peer input), the
// Responses encoder never panics and writes only well-formed output: SSE
// events with JSON data, or one JSON document.
func FuzzEvents(f *testing.F) {
	f.Add([]byte("\x01\x02Hello\x00\x02 world\x00\x03Hello world"), true, false, "", false)
	f.Add([]byte("\x01\x02{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{}}]}\x00\x03"), true, true, "", true)
	f.Add([]byte("\x01\x03"), false, true, `[{"id":"c","type":"function","function":{"name":"get_weather","arguments":"{\"a\":1}"}}]`, false)
	f.Add([]byte("\x02late\x00\x03\x02after"), true, true, "[", false)
	f.Fuzz(func(t *testing.T, script []byte, stream, tools bool, meta string, fallback bool) {
		o := Options{Model: "m\"odel", ID: "resp_1", Created: 1, Stream: stream, NewID: func() string { return "x" },
			MaxToolCalls: len(meta) % 3, Echo: []byte(`"instructions":null,"user":"u\""`)}
		if tools {
			o.Tools, o.Hold = []string{"get_weather", "f"}, true
		}
		var enc Encoder
		enc.Init(o)
		if out, httpErr := surfacetest.RunScript(&enc, surfacetest.Script(script, meta, fallback), stream); !httpErr {
			surfacetest.CheckWellFormed(t, out, stream)
		}
	})
}
