// Package surfacetest holds what the tests of the client surfaces share:
// RunEvent constructors, golden-file comparison and checkers that parse a
// response the way the official SDKs do. Test code only; the product never
// imports it.
package surfacetest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"iop/internal/edge/surface"

	iop "iop/proto/gen/iop"
)

// Start is a RUN_EVENT_START with seq 1.
func Start() *iop.RunEvent { return &iop.RunEvent{Seq: 1, Type: iop.RunEventType_RUN_EVENT_START} }

// Delta is a RUN_EVENT_DELTA carrying s.
func Delta(seq uint64, s string) *iop.RunEvent {
	return &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: s}
}

// Complete is a RUN_EVENT_COMPLETE.
func Complete(seq uint64, content, finish string, u *iop.Usage, meta map[string]string) *iop.RunEvent {
	return &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_COMPLETE, Content: content, FinishReason: finish, Usage: u, Metadata: meta}
}

// Error is a RUN_EVENT_ERROR with a failure code and message.
func Error(seq uint64, code, msg string) *iop.RunEvent {
	return &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_ERROR, FailureCode: code, Error: msg}
}

// Usage is prompt p, completion c, total p+c tokens.
func Usage(p, c int64) *iop.Usage {
	return &iop.Usage{PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}
}

// Tool calls in metadata["openai_tool_calls"] form (SPEC E8).
const (
	OneCall  = `[{"id":"call_a1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]`
	TwoCalls = `[{"id":"call_a1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},` +
		`{"id":"call_b2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"Europe/Paris\"}"}}]`
)

// SeqIDs returns a deterministic id source: "id1", "id2", …
func SeqIDs() func() string {
	var n atomic.Int64
	return func() string { return fmt.Sprintf("id%d", n.Add(1)) }
}

// Golden compares got with testdata/<name>, or writes it there when update
// is set.
func Golden(t testing.TB, name string, got []byte, update bool) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run with -update to create)", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("golden %s mismatch:\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// Drive feeds events to enc as the Edge's HTTP layer does and returns what
// a client would read: the status and the body. An ERROR or CANCELLED
// event ends the response with fail(ev): before any byte as status
// fail(ev).Status with errBody's body, after bytes with enc.AppendError; so
// does an error from Event. Drive fails t when an event after the terminal
// is left or when done comes early.
func Drive(t testing.TB, enc surface.Encoder, events []*iop.RunEvent, fail func(*iop.RunEvent) *surface.Error,
	errBody func([]byte, *surface.Error) []byte) (status int, body []byte) {
	t.Helper()
	for i, ev := range events {
		last := i == len(events)-1
		var e *surface.Error
		switch ev.Type {
		case iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
			e = fail(ev)
		default:
			out, done, err := enc.Event(body, ev)
			if err == nil {
				if len(out) > 0 {
					status = 200
				}
				body = out
				if done != last {
					t.Fatalf("event %d: done = %v, want %v", i, done, last)
				}
				continue
			}
			e = err
		}
		if !last {
			t.Fatalf("event %d ended the response; %d left", i, len(events)-1-i)
		}
		if status == 0 {
			return e.Status, errBody(nil, e)
		}
		return status, enc.AppendError(body, e)
	}
	return status, body
}

// RunInputJSON renders in as indented JSON with sorted keys and its
// *_json fields shown as the JSON they hold (deterministic, unlike
// protojson): the golden form of a request conversion.
func RunInputJSON(t testing.TB, in *iop.RunInput) []byte {
	t.Helper()
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(expandJSONFields(v), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// expandJSONFields replaces every base64 string under a "*_json" key with
// the JSON it encodes.
func expandJSONFields(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && strings.HasSuffix(k, "_json") {
				if raw, err := base64.StdEncoding.DecodeString(s); err == nil {
					var inner any
					if json.Unmarshal(raw, &inner) == nil {
						x[k] = inner
						continue
					}
				}
			}
			x[k] = expandJSONFields(e)
		}
	case []any:
		for i, e := range x {
			x[i] = expandJSONFields(e)
		}
	}
	return v
}
