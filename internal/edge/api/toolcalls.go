package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// RunEvent metadata keys the surface reads (SPEC E8, E9).
const (
	MetaToolCalls        = "openai_tool_calls"
	MetaTextToolFallback = "openai_text_tool_fallback"
)

// ErrBadToolCalls: metadata["openai_tool_calls"] is not a JSON array of
// OpenAI-shaped tool calls.
var ErrBadToolCalls = errors.New("api: malformed openai_tool_calls metadata")

// toolCall is one assistant tool call in OpenAI shape: arguments is the JSON
// text of the arguments exactly as the provider wrote it.
type toolCall struct {
	id, name, arguments string
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// nativeToolCalls parses metadata["openai_tool_calls"] (SPEC E8, E9): a JSON
// array of {id, type, function:{name, arguments}}. arguments is normally a
// JSON string holding JSON; an object is tolerated and kept as written. A
// missing id gets a fresh "call_<id>".
func nativeToolCalls(meta string, newID func() string) ([]toolCall, error) {
	var in []wireToolCall
	if err := json.Unmarshal([]byte(meta), &in); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadToolCalls, err)
	}
	out := make([]toolCall, 0, len(in))
	for i, c := range in {
		if c.Function.Name == "" {
			return nil, fmt.Errorf("%w: call %d has no function.name", ErrBadToolCalls, i)
		}
		tc := toolCall{id: c.ID, name: c.Function.Name, arguments: argumentsText(c.Function.Arguments)}
		if tc.id == "" {
			tc.id = "call_" + newID()
		}
		out = append(out, tc)
	}
	return out, nil
}

// argumentsText returns the arguments JSON text: a JSON string's contents,
// any other JSON value as written, "{}" when absent.
func argumentsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if !present(raw) {
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

// textToolCalls finds a text tool call in content (see the format above).
// It returns the calls and the content with the tool-call object (and its
// code fence) removed and trimmed; ok is false when none was found.
func textToolCalls(content string, allowed []string, newID func() string) (calls []toolCall, rest string, ok bool) {
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

func textEntries(obj textToolObject, allowed []string, newID func() string) []toolCall {
	entries := obj.ToolCalls
	if len(entries) == 0 && (obj.Name != "" || obj.Function != nil) {
		entries = []textToolEntry{obj.textToolEntry}
	}
	var out []toolCall
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
		out = append(out, toolCall{id: id, name: name, arguments: argumentsText(args)})
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
