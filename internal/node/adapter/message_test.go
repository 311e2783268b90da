package adapter

import (
	"errors"
	"fmt"
	"testing"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
)

// P4, N3: the client words a node sends (RunEvent.message,
// ProviderTunnelFrame.message) carry the upstream's own message or the
// refused input, never the adapter instance, an upstream address or a Go
// type name; codes whose words are the Edge's send none.
func TestMessageHidesInternals(t *testing.T) {
	rows := []struct {
		name string
		code protocol.Code
		err  error
		want string
	}{
		{"T5 an upstream status carries the upstream's message", protocol.CodeUpstreamStatus,
			&upstream.StatusError{Status: 503, Message: "Loading model"}, "Loading model"},
		{"Q3 invalid input without the prefix or Go type names", protocol.CodeInvalidRequest,
			fmt.Errorf("%w: json: cannot unmarshal number into Go struct field ToolFunction.function.arguments of type string", upstream.ErrInvalidInput),
			"json: cannot unmarshal number into"},
		{"Q3 a field the driver cannot honour", protocol.CodeInvalidRequest,
			fmt.Errorf("wrapped: %w", &upstream.FieldError{Field: "tool_choice", Msg: `tool_choice "required" cannot be enforced`}),
			`tool_choice "required" cannot be enforced`},
		{"E2 a boundary refusal is its own words", protocol.CodeInvalidRequest,
			errors.New("bad response_stall_timeout_ms: -1 ms is negative"), "bad response_stall_timeout_ms: -1 ms is negative"},
		{"C4 a refused lease says why", protocol.CodeCredentialInvalid,
			errors.New("credential lease rejected: credential lease expired"), "credential lease rejected: credential lease expired"},
		{"an upstream failure has the Edge's words only", protocol.CodeUpstreamError,
			errors.New(`Post "http://10.1.2.3:11434/api/chat": dial tcp 10.1.2.3:11434: connection refused`), ""},
		{"no error, no words", protocol.CodeOverCapacity, nil, ""},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if got := message(r.code, r.err); got != r.want {
				t.Fatalf("message = %q, want %q", got, r.want)
			}
		})
	}
}
