package surface

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"iop/internal/protocol"
)

// FuzzCompleteToolCalls: the tool-call metadata and the content of a
// node's COMPLETE event (peer input, SPEC E8, E9) never panic the
// restoration; what it returns is well formed: every call has an id and a
// name, native arguments are the JSON text the node sent, a text call's
// name is a declared tool (when any are), and the rest of the content is a part of it.
func FuzzCompleteToolCalls(f *testing.F) {
	f.Add(`[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`, "", false, "get_weather")
	f.Add(`[{"function":{"name":"f","arguments":{"a":1}}}]`, "hi", false, "f")
	f.Add("", `{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}`, true, "get_weather")
	f.Add("", "Sure.\n```json\n{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{}}]}\n```\nDone", true, "f,g")
	f.Add(`[{"function":{"name":""}}]`, "", false, "")
	f.Add(`{`, "", true, "")
	f.Fuzz(func(t *testing.T, meta, content string, fallback bool, tools string) {
		m := map[string]string{}
		if meta != "" {
			m[protocol.MetaToolCalls] = meta
		}
		if fallback {
			m[protocol.MetaTextToolFallback] = "true"
		}
		var declared []string
		if tools != "" {
			declared = strings.Split(tools, ",")
		}
		n := 0
		newID := func() string { n++; return "x" }
		calls, rest, err := CompleteToolCalls(m, content, declared, newID)
		if err != nil {
			if meta == "" {
				t.Fatalf("error without metadata: %v", err)
			}
			return
		}
		for i, c := range calls {
			if c.ID == "" || c.Name == "" {
				t.Fatalf("call %d without id or name: %+v", i, c)
			}
			if meta == "" && len(declared) > 0 && !contains(declared, c.Name) {
				t.Fatalf("text call %d names %q, not a declared tool %v", i, c.Name, declared)
			}
		}
		if meta != "" && rest != content {
			t.Fatalf("native calls changed the content: %q → %q", content, rest)
		}
		if len(rest) > len(content) {
			t.Fatalf("rest %q is longer than the content %q", rest, content)
		}
		if utf8.ValidString(content) && !utf8.ValidString(rest) {
			t.Fatalf("rest %q of valid UTF-8 content is not", rest)
		}
		// The calls must encode as the JSON the surfaces write.
		for _, c := range calls {
			b := AppendString(nil, c.Arguments)
			if !json.Valid(b) {
				t.Fatalf("arguments %q do not encode as a JSON string", c.Arguments)
			}
		}
	})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
