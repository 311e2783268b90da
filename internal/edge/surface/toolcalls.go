package surface

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"iop/internal/protocol"
)

// ErrBadToolCalls: metadata["openai_tool_calls"] is not a JSON array of
// OpenAI-shaped tool calls.
var ErrBadToolCalls = errors.New("surface: malformed openai_tool_calls metadata")

// ToolCall is one assistant tool call in OpenAI shape: Arguments is the JSON
// text of the arguments exactly as the provider wrote it.
type ToolCall struct {
	ID, Name, Arguments string
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// NativeToolCalls parses metadata["openai_tool_calls"] (SPEC E8, E9): a JSON
// array of {id, type, function:{name, arguments}}. arguments is normally a
// JSON string holding JSON; an object is tolerated and kept as written. A
// missing id gets a fresh "call_<id>".
func NativeToolCalls(meta string, newID func() string) ([]ToolCall, error) {
	var in []wireToolCall
	if err := json.Unmarshal([]byte(meta), &in); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadToolCalls, err)
	}
	out := make([]ToolCall, 0, len(in))
	for i, c := range in {
		if c.Function.Name == "" {
			return nil, fmt.Errorf("%w: call %d has no function.name", ErrBadToolCalls, i)
		}
		tc := ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: ArgumentsText(c.Function.Arguments)}
		if tc.ID == "" {
			tc.ID = "call_" + newID()
		}
		out = append(out, tc)
	}
	return out, nil
}

// ArgumentsText returns the arguments JSON text: a JSON string's contents,
// any other JSON value as written, "{}" when absent.
func ArgumentsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if !Present(raw) {
		return "{}"
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	return string(raw)
}

// Text tool-call format (SPEC E9 fallback). When a backend rejected the
// native tools API, the node's OpenAI-compatible adapter retries with an
// instruction asking the model to answer a tool call with one JSON object:
//
//	{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}
//
// The surface restores tool calls from the assistant text only when the run
// carries metadata["openai_text_tool_fallback"] == "true". It accepts:
//   - that object anywhere in the text, optionally inside a ``` or ```json
//     code fence, with other text before or after it (kept as content);
//   - entries shaped {"name","arguments"} or OpenAI's
//     {"id","type":"function","function":{"name","arguments"}};
//   - arguments as a JSON object (kept as written) or a JSON string;
//   - a bare {"name":...,"arguments":...} object for a single call.
//
// A call is restored only when its name is one of the request's tools (when
// the request declared any); otherwise the text stays content.
type textToolEntry struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Function  *struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type textToolObject struct {
	ToolCalls []textToolEntry `json:"tool_calls"`
	textToolEntry
}

// maxTextToolScans bounds how many '{' positions textToolCalls tries.
const maxTextToolScans = 64

// TextToolCalls finds a text tool call in content (see the format above).
// It returns the calls and the content with the tool-call object (and its
// code fence) removed and trimmed; ok is false when none was found.
func TextToolCalls(content string, allowed []string, newID func() string) (calls []ToolCall, rest string, ok bool) {
	from := 0
	for tries := 0; tries < maxTextToolScans; tries++ {
		i := strings.IndexByte(content[from:], '{')
		if i < 0 {
			return nil, content, false
		}
		start := from + i
		dec := json.NewDecoder(strings.NewReader(content[start:]))
		var obj textToolObject
		if err := dec.Decode(&obj); err == nil {
			end := start + int(dec.InputOffset())
			if calls = textEntries(obj, allowed, newID); len(calls) > 0 {
				return calls, cutFenced(content, start, end), true
			}
		}
		from = start + 1
	}
	return nil, content, false
}

func textEntries(obj textToolObject, allowed []string, newID func() string) []ToolCall {
	entries := obj.ToolCalls
	if len(entries) == 0 && (obj.Name != "" || obj.Function != nil) {
		entries = []textToolEntry{obj.textToolEntry}
	}
	var out []ToolCall
	for _, e := range entries {
		name, args := e.Name, e.Arguments
		if e.Function != nil {
			name, args = e.Function.Name, e.Function.Arguments
		}
		if name == "" || (len(allowed) > 0 && !slices.Contains(allowed, name)) {
			return nil
		}
		id := e.ID
		if id == "" {
			id = "call_" + newID()
		}
		out = append(out, ToolCall{ID: id, Name: name, Arguments: ArgumentsText(args)})
	}
	return out
}

// cutFenced removes content[start:end] and, when it sits alone inside a
// ``` code fence, the fence too; the rest is trimmed.
func cutFenced(content string, start, end int) string {
	before, after := content[:start], content[end:]
	tb := strings.TrimRight(before, " \t\r\n")
	if j := strings.LastIndex(tb, "```"); j >= 0 && !strings.ContainsAny(tb[j+3:], " \t\r\n") {
		ta := strings.TrimLeft(after, " \t\r\n")
		if strings.HasPrefix(ta, "```") {
			before, after = tb[:j], ta[3:]
		}
	}
	before = strings.TrimSpace(before)
	after = strings.TrimSpace(after)
	switch {
	case before == "":
		return after
	case after == "":
		return before
	default:
		return before + "\n" + after
	}
}

// CompleteToolCalls returns the tool calls a run's COMPLETE event carries
// and the content left once a text tool call is cut out of it: the native
// calls of metadata["openai_tool_calls"] (SPEC E8; content unchanged), else
// — only with metadata["openai_text_tool_fallback"] == "true" — a text tool
// call found in content among the declared tools (SPEC E9), else none.
// err wraps ErrBadToolCalls.
func CompleteToolCalls(meta map[string]string, content string, tools []string, newID func() string) (calls []ToolCall, rest string, err error) {
	if m := meta[protocol.MetaToolCalls]; m != "" {
		calls, err = NativeToolCalls(m, newID)
		return calls, content, err
	}
	if meta[protocol.MetaTextToolFallback] == "true" {
		if tc, r, ok := TextToolCalls(content, tools, newID); ok {
			return tc, r, nil
		}
	}
	return nil, content, nil
}
