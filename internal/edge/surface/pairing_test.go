package surface_test

import (
	"strings"
	"testing"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// F2: a tool result without its call, or a call without its result,
// is a 400 naming the call id (OpenAI and Anthropic refuse both); a proper
// round trip passes.
func TestCheckToolPairing(t *testing.T) {
	user := &iop.ChatMessage{Role: "user", Content: "hi"}
	calls := func(ids ...string) *iop.ChatMessage {
		b := "["
		for i, id := range ids {
			if i > 0 {
				b += ","
			}
			b += `{"id":"` + id + `","type":"function","function":{"name":"f","arguments":"{}"}}`
		}
		return &iop.ChatMessage{Role: "assistant", ToolCallsJson: []byte(b + "]")}
	}
	result := func(id string) *iop.ChatMessage { return &iop.ChatMessage{Role: "tool", ToolCallId: id} }
	rows := []struct {
		name string
		msgs []*iop.ChatMessage
		want string // substring of the error, "" = none
	}{
		{"no tools", []*iop.ChatMessage{user, {Role: "assistant", Content: "a"}, user}, ""},
		{"round trip", []*iop.ChatMessage{user, calls("a"), result("a"), {Role: "assistant", Content: "done"}, user}, ""},
		{"two calls answered in any order", []*iop.ChatMessage{user, calls("a", "b"), result("b"), result("a"), user}, ""},
		{"result without a call", []*iop.ChatMessage{user, result("x")}, `"x" answers no`},
		{"result for an older call", []*iop.ChatMessage{user, calls("a"), result("a"), {Role: "assistant", Content: "ok"}, result("a")}, `"a" answers no`},
		{"result twice", []*iop.ChatMessage{user, calls("a"), result("a"), result("a")}, `"a" answers no`},
		{"call without result", []*iop.ChatMessage{user, calls("a", "b"), result("a"), user}, `"b" has no`},
		{"call last", []*iop.ChatMessage{user, calls("a")}, `"a" has no`},
		{"call without id", []*iop.ChatMessage{user, calls(""), result("")}, "needs an id"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			e := surface.CheckToolPairing("messages", surface.Terms{Call: "tool call", Result: "tool message"}, row.msgs)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.want != "" && (e == nil || e.Param != "messages" || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 on messages with %q", e, row.want)
			}
		})
	}
}
