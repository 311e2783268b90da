package openai

import (
	"testing"

	"iop/internal/edge/surface/surfacetest"

	"google.golang.org/protobuf/proto"
)

// FuzzChatInput: any chat completions body (client input) never panics
// ChatInput; a refusal is a 400 naming a field or the body, and an accepted
// body yields a RunInput with at least one message that encodes as a frame
// (valid UTF-8 throughout, SPEC W1).
func FuzzChatInput(f *testing.F) {
	for _, s := range []string{
		`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"t","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"x"}],"max_tokens":9,"max_completion_tokens":7,"temperature":0.2,"stop":"END","seed":4}`,
		`{"model":"t","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto"}`,
		`{"model":"t","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"model":"t","messages":[],"n":2,"stop":["a",1]}`, `{"messages":"no"}`, `null`, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in, tools, e := ChatInput(body)
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
		for _, name := range tools.Tools {
			if name == "" {
				t.Fatalf("a declared tool without a name from %q", body)
			}
		}
	})
}

// FuzzChatEvents: whatever run events a node sends (peer input: any order
// the transport lets through, any text, log probabilities, tool-call
// metadata), the chat encoder never panics and writes only well-formed
// output: a stream of `data: <JSON>` events (or `data: [DONE]`), a
// non-stream answer one JSON document.
func FuzzChatEvents(f *testing.F) {
	f.Add([]byte("\x01\x02Hello\x00\x02 world\x00\x03Hello world"), true, false, "", false)
	f.Add([]byte("\x01\x02{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{}}]}\x00\x03"), true, true, "", true)
	f.Add([]byte("\x01\x03"), false, false, `[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`, false)
	f.Add([]byte("\x02late\x00\x03\x02after"), true, true, "[", false)
	f.Add([]byte("\x01\x04ab\x00\x04\xff\x00\x03ab"), true, false, "", true)
	f.Add([]byte("\x01\x04ab\x00\x03ab"), false, false, "", true)
	f.Add([]byte("\x01\x04\xff\xfe\xfd\x00\x03"), true, false, "", true) // NaN, -Inf, +Inf log probabilities
	f.Add([]byte("\x01\x04\xff\xfe\xfd\x00\x03"), false, false, "", true)
	f.Fuzz(func(t *testing.T, script []byte, stream, tools bool, meta string, fallback bool) {
		var c Chat
		o := ChatOptions{Model: "m\"odel", ID: "chatcmpl-1", Created: 1, Stream: stream, IncludeUsage: true, NewID: func() string { return "x" },
			Logprobs: fallback, MaxToolCalls: len(meta) % 3}
		if tools {
			o.Tools, o.Hold = []string{"f", "get_weather"}, true
		}
		c.Init(o)
		out, httpErr := surfacetest.RunScript(&c, surfacetest.Script(script, meta, fallback), stream)
		if !httpErr {
			surfacetest.CheckWellFormed(t, out, stream)
		}
	})
}

// FuzzEmbeddings: any embeddings body (client input) never panics
// EmbeddingsInput, an accepted one encodes as a frame; any COMPLETE a node
// sends (vectors with any float32, NaN and ±Inf included) encodes as one
// JSON document.
func FuzzEmbeddings(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi"}`), []byte("\x05\x00\x00\x80\x3f\x00\x00\xc0\x7f"), false)
	f.Add([]byte(`{"model":"m","input":["a","b"],"encoding_format":"base64","dimensions":3}`), []byte("\x05\x00\x00\x80\x7f"), true)
	f.Add([]byte(`{"model":"m","input":[1,2]}`), []byte("\x03x"), false)
	f.Fuzz(func(t *testing.T, body, script []byte, base64Out bool) {
		if in, _, e := EmbeddingsInput(body); e == nil {
			if _, err := proto.Marshal(in); err != nil {
				t.Fatalf("accepted %q into a RunInput that does not encode: %v", body, err)
			}
		} else if e.Status != 400 {
			t.Fatalf("refusal %+v, want a 400", e)
		}
		var enc Embeddings
		enc.Init("m", base64Out)
		out, httpErr := surfacetest.RunScript(&enc, surfacetest.Script(script, "", false), false)
		if !httpErr {
			surfacetest.CheckWellFormed(t, out, false)
		}
	})
}
