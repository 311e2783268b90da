package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// The types of the Messages request's members (messages and their content
// blocks, sources, tools, thinking, output and context settings), and the
// system prompt and messages converted to chat messages (SPEC Q3).

// thinking is the request's extended-thinking control (Anthropic API
// reference, "Extended thinking"; "adaptive" and "display" as Claude Code
// 2.1 sends them).
type thinking struct {
	Type         string `json:"type"`
	BudgetTokens *int64 `json:"budget_tokens"`
	Display      string `json:"display"`
}

// outputConfig is the request's output_config: effort (low, medium, high,
// max) and format (structured output: {"type":"json_schema","schema"}).
type outputConfig struct {
	Effort *string       `json:"effort"`
	Format *outputFormat `json:"format"`
}

type outputFormat struct {
	Type   string          `json:"type"`
	Schema json.RawMessage `json:"schema"`
}

// contextManagement is the request's server-side context editing
// (Anthropic API reference, "Context editing").
type contextManagement struct {
	Edits []contextEdit `json:"edits"`
}

type contextEdit struct {
	Type string          `json:"type"`
	Keep json.RawMessage `json:"keep"`
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// block is any content block a request may carry.
type block struct {
	Type         string          `json:"type"`
	Text         *string         `json:"text"`
	CacheControl json.RawMessage `json:"cache_control"`
	Citations    json.RawMessage `json:"citations"`
	Source       *source         `json:"source"`
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Input        json.RawMessage `json:"input"`
	ToolUseID    string          `json:"tool_use_id"`
	Content      json.RawMessage `json:"content"`
	IsError      *bool           `json:"is_error"`
	Thinking     json.RawMessage `json:"thinking"`
	Signature    json.RawMessage `json:"signature"`
	Data         json.RawMessage `json:"data"`
	Title        json.RawMessage `json:"title"`
	Context      json.RawMessage `json:"context"`
}

type source struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
	URL       string `json:"url"`
	FileID    string `json:"file_id"`
}

type tool struct {
	Type         string          `json:"type"`
	Name         string          `json:"name"`
	Description  *string         `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control"`
	DeferLoading *bool           `json:"defer_loading"`
}

type toolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name"`
	DisableParallelToolUse *bool  `json:"disable_parallel_tool_use"`
}

// systemText reads "system": a string or an array of text blocks (joined
// with "\n").
func systemText(raw json.RawMessage) (string, *surface.Error) {
	if !surface.Present(raw) {
		return "", nil
	}
	if raw[0] == '"' {
		s, _ := surface.StringValue(raw)
		return s, nil
	}
	var blocks []block
	if raw[0] != '[' {
		return "", surface.BadRequest("system", "field \"system\" must be a string or an array of text blocks")
	}
	if e := surface.Decode(raw, &blocks); e != nil {
		e.Message = "system: " + e.Message
		return "", e
	}
	var b strings.Builder
	for j, bl := range blocks {
		if bl.Type != "text" {
			return "", surface.BadRequest("system", "system[%d]: block type %q is not supported in system (text)", j, bl.Type)
		}
		if bl.Text == nil {
			return "", surface.BadRequest("system", "system[%d].text is required", j)
		}
		if j > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*bl.Text)
	}
	return b.String(), nil
}

// checkNonEmpty refuses an empty content (""  or []) as Anthropic does:
// every message needs content except a final assistant message (a prefill
// of nothing).
func checkNonEmpty(i int, m *message, last bool) *surface.Error {
	c := bytes.TrimSpace(m.Content)
	empty := string(c) == `""` || (len(c) > 1 && c[0] == '[' && len(bytes.TrimSpace(c[1:len(c)-1])) == 0)
	if empty && !(last && m.Role == "assistant") {
		return surface.BadRequest("messages", "messages[%d].content must not be empty (only a final assistant message may be)", i)
	}
	return nil
}

// convertMessage turns one Messages message into chat messages: a user
// message's tool_result blocks become tool messages, in order, around its
// text and images; an assistant message's tool_use blocks become
// tool_calls and its thinking blocks its thinking; a system message (a
// mid-conversation system turn) its text.
func convertMessage(i int, m *message, ig *surface.Ignored) ([]*iop.ChatMessage, *surface.Error) {
	if m.Role != "user" && m.Role != "assistant" && m.Role != "system" {
		return nil, surface.BadRequest("messages", "messages[%d].role %q is not one of user, assistant, system", i, m.Role)
	}
	if !surface.Present(m.Content) {
		return nil, surface.BadRequest("messages", "messages[%d].content is required", i)
	}
	if m.Content[0] == '"' {
		s, _ := surface.StringValue(m.Content)
		return []*iop.ChatMessage{{Role: m.Role, Content: s}}, nil
	}
	if m.Content[0] != '[' {
		return nil, surface.BadRequest("messages", "messages[%d].content must be a string or an array of content blocks", i)
	}
	var blocks []block
	if e := surface.Decode(m.Content, &blocks); e != nil {
		e.Message = fmt.Sprintf("messages[%d].content: %s", i, e.Message)
		return nil, e
	}
	if m.Role == "system" {
		var b strings.Builder
		for j := range blocks {
			if blocks[j].Type != "text" || blocks[j].Text == nil {
				return nil, surface.BadRequest("messages", "messages[%d].content[%d]: block type %q is not supported on a system message (text)", i, j, blocks[j].Type)
			}
			if j > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(*blocks[j].Text)
		}
		return []*iop.ChatMessage{{Role: "system", Content: b.String()}}, nil
	}
	if m.Role == "assistant" {
		am, e := assistantMessage(i, blocks, ig)
		if e != nil {
			return nil, e
		}
		return []*iop.ChatMessage{am}, nil
	}
	var out []*iop.ChatMessage
	var cur *iop.ChatMessage // the user message being filled
	for j := range blocks {
		bl := &blocks[j]
		at := fmt.Sprintf("messages[%d].content[%d]", i, j)
		switch bl.Type {
		case "text":
			if bl.Text == nil {
				return nil, surface.BadRequest("messages", "%s.text is required", at)
			}
			if cur == nil {
				cur = &iop.ChatMessage{Role: "user"}
				out = append(out, cur)
			} else if cur.Content != "" {
				cur.Content += "\n"
			}
			cur.Content += *bl.Text
		case "image":
			img, e := image(at, bl.Source)
			if e != nil {
				return nil, e
			}
			if cur == nil {
				cur = &iop.ChatMessage{Role: "user"}
				out = append(out, cur)
			}
			cur.Images = append(cur.Images, img)
		case "tool_result":
			tm, e := toolResult(at, bl)
			if e != nil {
				return nil, e
			}
			out = append(out, tm)
			cur = nil
		default:
			return nil, surface.BadRequest("messages", "%s: block type %q is not supported by this model's provider on a user message (text, image, tool_result)", at, bl.Type)
		}
	}
	if len(out) == 0 {
		out = append(out, &iop.ChatMessage{Role: "user"})
	}
	return out, nil
}

func assistantMessage(i int, blocks []block, ig *surface.Ignored) (*iop.ChatMessage, *surface.Error) {
	am := &iop.ChatMessage{Role: "assistant"}
	var calls []byte
	texts := 0
	for j := range blocks {
		bl := &blocks[j]
		at := fmt.Sprintf("messages[%d].content[%d]", i, j)
		switch bl.Type {
		case "text":
			if bl.Text == nil {
				return nil, surface.BadRequest("messages", "%s.text is required", at)
			}
			if texts > 0 {
				am.Content += "\n"
			}
			texts++
			am.Content += *bl.Text
		case "tool_use":
			if bl.ID == "" || bl.Name == "" {
				return nil, surface.BadRequest("messages", "%s: tool_use needs \"id\" and \"name\"", at)
			}
			input := strings.TrimSpace(string(bl.Input))
			if input == "" || input == "null" {
				input = "{}"
			}
			if input[0] != '{' {
				return nil, surface.BadRequest("messages", "%s.input must be an object", at)
			}
			if calls == nil {
				calls = append(calls, '[')
			} else {
				calls = append(calls, ',')
			}
			calls = append(calls, `{"id":`...)
			calls = surface.AppendString(calls, bl.ID)
			calls = append(calls, `,"type":"function","function":{"name":`...)
			calls = surface.AppendString(calls, bl.Name)
			calls = append(calls, `,"arguments":`...)
			calls = surface.AppendString(calls, input)
			calls = append(calls, "}}"...)
		case "thinking":
			text, ok := surface.StringValue(bl.Thinking)
			if surface.Present(bl.Thinking) && !ok {
				return nil, surface.BadRequest("messages", "%s.thinking must be a string", at)
			}
			sig, ok := surface.StringValue(bl.Signature)
			if surface.Present(bl.Signature) && !ok {
				return nil, surface.BadRequest("messages", "%s.signature must be a string", at)
			}
			if text == "" && sig != "" {
				if text, ok = surface.DecodeReasoning(sig); !ok {
					ig.Add(at, "messages") // another provider's signature alone: no backend can read it
				}
			}
			if text != "" {
				if am.Thinking != "" {
					am.Thinking += "\n"
				}
				am.Thinking += text
			}
		case "redacted_thinking":
			ig.Add(at, "messages") // encrypted by Anthropic: no backend can read it
		default:
			return nil, surface.BadRequest("messages", "%s: block type %q is not supported by this model's provider on an assistant message (text, tool_use, thinking, redacted_thinking)", at, bl.Type)
		}
	}
	if calls != nil {
		am.ToolCallsJson = append(calls, ']')
	}
	return am, nil
}

// toolResult turns a tool_result block into a tool message: its content
// (a string or text blocks joined with "\n"), prefixed "Error: " when
// is_error.
func toolResult(at string, bl *block) (*iop.ChatMessage, *surface.Error) {
	if bl.ToolUseID == "" {
		return nil, surface.BadRequest("messages", "%s.tool_use_id is required", at)
	}
	tm := &iop.ChatMessage{Role: "tool", ToolCallId: bl.ToolUseID}
	raw := bl.Content
	switch {
	case !surface.Present(raw):
	case raw[0] == '"':
		_ = json.Unmarshal(raw, &tm.Content)
	case raw[0] == '[':
		var parts []block
		if e := surface.Decode(raw, &parts); e != nil {
			e.Message = at + ".content: " + e.Message
			return nil, e
		}
		for k, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return nil, surface.BadRequest("messages", "%s.content[%d]: block type %q is not supported in a tool_result by this model's provider (text only)", at, k, p.Type)
			}
			if k > 0 {
				tm.Content += "\n"
			}
			tm.Content += *p.Text
		}
	default:
		return nil, surface.BadRequest("messages", "%s.content must be a string or an array of text blocks", at)
	}
	if bl.IsError != nil && *bl.IsError {
		tm.Content = "Error: " + tm.Content
	}
	return tm, nil
}

// image reads an image block's source: base64 data only; a URL or a file
// id is refused (the node would have to fetch it).
func image(at string, s *source) (*iop.ChatImage, *surface.Error) {
	if s == nil {
		return nil, surface.BadRequest("messages", "%s.source is required", at)
	}
	switch s.Type {
	case "base64":
		if !slices.Contains(surface.ImageTypes, s.MediaType) {
			return nil, surface.BadRequest("messages", "%s.source.media_type %q is not one of %s", at, s.MediaType, strings.Join(surface.ImageTypes, ", "))
		}
		img, e := surface.Base64Image(at+".source.data", s.MediaType, s.Data)
		if e != nil {
			e.Param = "messages"
		}
		return img, e
	case "url":
		return nil, surface.BadRequest("messages", "%s.source: remote image URLs are not supported by this model's provider; send the image as base64", at)
	default:
		return nil, surface.BadRequest("messages", "%s.source.type %q is not supported by this model's provider (base64 only)", at, s.Type)
	}
}
