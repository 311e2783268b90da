package openaicompat

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"testing/iotest"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// FuzzReadChatStream: any bytes an OpenAI-compatible backend sends as a
// chat completions SSE stream (peer input), cut anywhere, never panic the
// reader; the Result's content is exactly what the deltas reported and it
// encodes as a frame.
func FuzzReadChatStream(f *testing.F) {
	for _, name := range []string{"llama_v1_chat_stream.sse", "llama_v1_chat_tool_stream.sse", "ollama_v1_chat_tool_stream.sse"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "testdata", "samples", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint16(11), false)
	}
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":3,\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{\"}}]}}]}\n\n"+
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n"), uint16(5), true)
	f.Add([]byte("event: error\ndata: {\"error\":{\"message\":\"x\"}}\n\n"), uint16(0), false)
	f.Fuzz(func(t *testing.T, data []byte, split uint16, oneByte bool) {
		k := int(split) % (len(data) + 1)
		var r io.Reader = io.MultiReader(bytes.NewReader(data[:k]), bytes.NewReader(data[k:]))
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		var deltas bytes.Buffer
		res, err := ReadChatStream(r, upstream.Hooks{OnDelta: func(s string, _ []*iop.TokenLogprob) { deltas.WriteString(s) }})
		if err != nil {
			if !errors.Is(err, upstream.ErrProtocol) {
				t.Fatalf("a stream from memory failed with %v, want ErrProtocol", err)
			}
			return
		}
		if deltas.String() != res.Content {
			t.Fatalf("deltas %q, content %q", deltas.String(), res.Content)
		}
		ev := &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_COMPLETE, Content: res.Content, FinishReason: res.FinishReason,
			Usage: res.Usage, Metadata: res.Metadata}
		if _, err := proto.Marshal(ev); err != nil {
			t.Fatalf("the COMPLETE event does not encode: %v", err)
		}
		if calls := res.Metadata[protocol.MetaToolCalls]; calls != "" && !json.Valid([]byte(calls)) {
			t.Fatalf("tool calls metadata is not JSON: %q", calls)
		}
	})
}

// FuzzBuildChatRequest: any RunInput an Edge sends (peer input), native or
// in text tool mode, never panics the conversion; it becomes a JSON chat
// completions body or an ErrInvalidInput.
func FuzzBuildChatRequest(f *testing.F) {
	for _, in := range []*iop.RunInput{
		{Messages: []*iop.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}, MaxTokens: 16},
		{Messages: []*iop.ChatMessage{{Role: "user", Content: "w?"}, {Role: "assistant", ToolCallsJson: []byte(`[{"id":"c","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`)},
			{Role: "tool", ToolCallId: "c", Content: "sunny"}}, ToolsJson: []byte(tools), ToolChoiceJson: []byte(`"required"`)},
	} {
		b, _ := proto.Marshal(in)
		f.Add(b, false)
		f.Add(b, true)
	}
	f.Fuzz(func(t *testing.T, wire []byte, textTools bool) {
		var in iop.RunInput
		if proto.Unmarshal(wire, &in) != nil {
			return
		}
		body, err := BuildChatRequest("llamacpp", "tiny", &in, textTools)
		if err != nil {
			if !errors.Is(err, upstream.ErrInvalidInput) {
				t.Fatalf("got %v, want ErrInvalidInput", err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("request body is not JSON: %q", body)
		}
	})
}
