package upstream

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzErrorMessage: any error body a backend answers (peer input) gives a
// message of at most 1 KiB, never empty, without panicking.
func FuzzErrorMessage(f *testing.F) {
	for _, s := range []string{`{"error":{"message":"bad","type":"x"}}`, `{"error":"model not found"}`,
		`{"type":"error","error":{"type":"x","message":"m"}}`, `{"message":"m"}`, `<html>502</html>`, ``, `{"error":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		msg := ErrorMessage(body, "502 Bad Gateway")
		if msg == "" || len(msg) > 1024 {
			t.Fatalf("message of %d bytes: %q", len(msg), msg)
		}
		if utf8.Valid(body) && !utf8.ValidString(msg) && len(msg) < 1024 {
			t.Fatalf("message %q of a valid UTF-8 body is not valid UTF-8", msg)
		}
	})
}

// FuzzToolsInput: the tools and tool_calls JSON an Edge sends in a
// RunInput (peer input) are accepted only as arrays, refused with
// ErrInvalidInput otherwise, never with a panic.
func FuzzToolsInput(f *testing.F) {
	for _, s := range []string{`[{"type":"function","function":{"name":"f"}}]`, `[]`, `null`, ``, `{"a":1}`,
		`[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`, `[1,`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		tools, err := Tools(raw)
		if err != nil && !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("Tools: %v, want ErrInvalidInput", err)
		}
		if err == nil && tools != nil {
			var arr []json.RawMessage
			if json.Unmarshal(tools, &arr) != nil || len(arr) == 0 {
				t.Fatalf("Tools accepted %q", raw)
			}
		}
		calls, err := DecodeToolCalls(raw)
		if err != nil && !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("DecodeToolCalls: %v, want ErrInvalidInput", err)
		}
		if err == nil {
			if _, merr := json.Marshal(calls); merr != nil {
				t.Fatalf("decoded calls do not encode: %v", merr)
			}
		}
	})
}
