package ollama

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"testing/iotest"

	"iop/internal/ndjson"
	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// FuzzReadChatStream: any bytes an Ollama backend sends on /api/chat
// (peer input), cut anywhere, never panic the reader; it ends with a
// Result or an error (ErrProtocol for a broken stream), gives every byte of
// content to the deltas it reports, and the Result encodes as a frame.
func FuzzReadChatStream(f *testing.F) {
	for _, name := range []string{"ollama_api_chat_stream.ndjson", "ollama_api_chat_tool_stream.ndjson"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "testdata", "samples", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint16(7), false)
	}
	f.Add([]byte(`{"message":{"content":"a"},"done":false}`+"\n"+`{"error":"boom"}`+"\n"), uint16(0), true)
	f.Add([]byte(`{"message":{"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]},"done":true}`), uint16(3), false)
	f.Fuzz(func(t *testing.T, data []byte, split uint16, oneByte bool) {
		k := int(split) % (len(data) + 1)
		var r io.Reader = io.MultiReader(bytes.NewReader(data[:k]), bytes.NewReader(data[k:]))
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		var deltas bytes.Buffer
		res, err := readChatStream(r, upstream.Hooks{OnDelta: func(s string, _ []*iop.TokenLogprob) { deltas.WriteString(s) }})
		if err != nil {
			if !errors.Is(err, upstream.ErrProtocol) && !errors.Is(err, ndjson.ErrLineTooLong) {
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

// FuzzBuildChatRequest: any RunInput an Edge sends (peer input) never
// panics the conversion; it becomes a JSON /api/chat body or an
// ErrInvalidInput.
func FuzzBuildChatRequest(f *testing.F) {
	for _, in := range []*iop.RunInput{
		{Messages: []*iop.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}, MaxTokens: 16},
		{Messages: []*iop.ChatMessage{{Role: "assistant", ToolCallsJson: []byte(`[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`)},
			{Role: "tool", ToolCallId: "c", Content: "r"}}, ToolsJson: []byte(`[{"type":"function","function":{"name":"f"}}]`)},
	} {
		b, _ := proto.Marshal(in)
		f.Add(b, "tiny")
	}
	f.Fuzz(func(t *testing.T, wire []byte, target string) {
		var in iop.RunInput
		if proto.Unmarshal(wire, &in) != nil {
			return
		}
		body, err := BuildChatRequest(target, &in)
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
