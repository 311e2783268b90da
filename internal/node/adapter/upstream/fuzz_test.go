package upstream

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	iop "iop/proto/gen/iop"
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

// F2 (found by FuzzBuildChatRequest): sampling numbers JSON cannot
// carry are refused with ErrInvalidInput naming the field.
func TestCheckNumbers(t *testing.T) {
	nan, inf, ok := math.NaN(), math.Inf(-1), 0.5
	rows := []struct {
		name string
		in   *iop.RunInput
		want string // "" = accepted
	}{
		{"nil input", nil, ""},
		{"finite numbers", &iop.RunInput{Temperature: &ok, TopP: &ok, FrequencyPenalty: &ok, PresencePenalty: &ok}, ""},
		{"NaN temperature", &iop.RunInput{Temperature: &nan}, "temperature"},
		{"-Inf top_p", &iop.RunInput{TopP: &inf}, "top_p"},
		{"NaN frequency_penalty", &iop.RunInput{FrequencyPenalty: &nan}, "frequency_penalty"},
		{"Inf presence_penalty", &iop.RunInput{PresencePenalty: &inf}, "presence_penalty"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			err := CheckNumbers(row.in)
			if row.want == "" {
				if err != nil {
					t.Fatalf("got %v, want accepted", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), row.want) {
				t.Fatalf("got %v, want ErrInvalidInput naming %s", err, row.want)
			}
		})
	}
}
