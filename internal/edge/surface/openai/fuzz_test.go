package openai

import (
	"bytes"
	"encoding/json"
	"testing"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"

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
		for _, name := range tools {
			if name == "" {
				t.Fatalf("a declared tool without a name from %q", body)
			}
		}
	})
}

// FuzzChatEvents: whatever run events a node sends (peer input: any order
// the transport lets through, any text, any tool-call metadata), the chat
// encoder never panics and writes only well-formed output: a stream is a
// sequence of `data: <JSON>` events (or `data: [DONE]`), a non-stream
// answer one JSON document.
func FuzzChatEvents(f *testing.F) {
	f.Add([]byte("\x01\x02Hello\x00\x02 world\x00\x03Hello world"), true, false, "", false)
	f.Add([]byte("\x01\x02{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{}}]}\x00\x03"), true, true, "", true)
	f.Add([]byte("\x01\x03"), false, false, `[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`, false)
	f.Add([]byte("\x02late\x00\x03\x02after"), true, true, "[", false)
	f.Fuzz(func(t *testing.T, script []byte, stream, tools bool, meta string, fallback bool) {
		var c Chat
		o := ChatOptions{Model: "m\"odel", ID: "chatcmpl-1", Created: 1, Stream: stream, IncludeUsage: true, NewID: func() string { return "x" }}
		if tools {
			o.Tools = []string{"f", "get_weather"}
		}
		c.Init(o)
		var out []byte
		for _, ev := range scriptEvents(script, meta, fallback) {
			var done bool
			var e *surface.Error
			out, done, e = c.Event(out, ev)
			if e != nil {
				if !stream {
					return // the caller answers with an HTTP error instead
				}
				out = c.AppendError(out, e)
				done = true
			}
			if done {
				break
			}
		}
		if !stream {
			if len(out) > 0 && !json.Valid(out) {
				t.Fatalf("non-stream body is not JSON: %q", out)
			}
			return
		}
		for _, ev := range bytes.Split(out, []byte("\n\n")) {
			if len(ev) == 0 {
				continue
			}
			data, ok := bytes.CutPrefix(ev, []byte("data: "))
			if !ok || (string(data) != "[DONE]" && !json.Valid(data)) {
				t.Fatalf("malformed stream event %q in %q", ev, out)
			}
		}
	})
}

// scriptEvents turns fuzz bytes into run events: 0x01 START, 0x02 DELTA
// (text up to the next 0x00), 0x03 COMPLETE (its content up to the next
// 0x00, meta as openai_tool_calls when set); other bytes are skipped.
func scriptEvents(script []byte, meta string, fallback bool) []*iop.RunEvent {
	var evs []*iop.RunEvent
	text := func() string {
		i := bytes.IndexByte(script, 0)
		if i < 0 {
			i = len(script)
		}
		s := string(script[:i])
		script = script[min(i+1, len(script)):]
		return s
	}
	for seq := uint64(1); len(script) > 0; {
		op := script[0]
		script = script[1:]
		switch op {
		case 1:
			evs = append(evs, &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_START})
		case 2:
			evs = append(evs, &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: text()})
		case 3:
			ev := &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_COMPLETE, Content: text(), FinishReason: "stop",
				Usage: &iop.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}, Metadata: map[string]string{}}
			if meta != "" {
				ev.Metadata[surface.MetaToolCalls] = meta
			}
			if fallback {
				ev.Metadata[surface.MetaTextToolFallback] = "true"
			}
			evs = append(evs, ev)
		default:
			continue
		}
		seq++
	}
	return evs
}
