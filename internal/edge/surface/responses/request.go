package responses

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// The Responses request as the run path parses it: the types of every
// documented member (the request, its tools, input items and their parts),
// and the input items converted to chat messages (SPEC Q3).

// request is an OpenAI Responses request as the run path parses it (OpenAI
// API reference, "Create a model response"): every documented field, so
// that none is dropped unseen; Fields says what happens to each. A member
// not listed here is a 400 naming it, as OpenAI answers.
type request struct {
	Model              surface.Skip    `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	MaxToolCalls       *int64          `json:"max_tool_calls"`
	Background         *bool           `json:"background"`
	ClientMetadata     json.RawMessage `json:"client_metadata"`
	Conversation       surface.Seen    `json:"conversation"`
	Include            []string        `json:"include"`
	Metadata           json.RawMessage `json:"metadata"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	PreviousResponseID surface.Seen    `json:"previous_response_id"`
	Prompt             surface.Seen    `json:"prompt"`
	PromptCacheKey     *string         `json:"prompt_cache_key"`
	PromptCacheRetain  *string         `json:"prompt_cache_retention"`
	Reasoning          *reasoning      `json:"reasoning"`
	SafetyIdentifier   *string         `json:"safety_identifier"`
	ServiceTier        *string         `json:"service_tier"`
	Store              *bool           `json:"store"`
	Stream             surface.Skip    `json:"stream"`
	StreamOptions      *streamOptions  `json:"stream_options"`
	Temperature        *float64        `json:"temperature"`
	Text               *textConfig     `json:"text"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              []tool          `json:"tools"`
	TopLogprobs        *int64          `json:"top_logprobs"`
	TopP               *float64        `json:"top_p"`
	Truncation         *string         `json:"truncation"`
	User               *string         `json:"user"`
}

type streamOptions struct {
	IncludeObfuscation *bool `json:"include_obfuscation"`
}

type reasoning struct {
	Effort          json.RawMessage `json:"effort"`
	Summary         json.RawMessage `json:"summary"`
	GenerateSummary json.RawMessage `json:"generate_summary"`
}

type textConfig struct {
	Format    json.RawMessage `json:"format"`
	Verbosity json.RawMessage `json:"verbosity"`
}

type tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description *string         `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
	Tools       []tool          `json:"tools"` // type "namespace": its function tools
}

// builtinTools are the Responses API's hosted and built-in tool types: the
// service runs them (or, for local_shell, computer use and custom
// tools, needs a grammar or a protocol Ollama has no place for). Such a
// tool is not offered to the model and is reported; the model answers
// without it, as if the client had not offered it. Any other type is a
// 400 naming it.
var builtinTools = []string{"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
	"file_search", "code_interpreter", "image_generation", "computer_use_preview", "computer_use", "mcp", "local_shell",
	"shell", "apply_patch", "custom", "tool_search"}

// item is any input item.
type item struct {
	Type             string          `json:"type"`
	ID               string          `json:"id"`
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Status           string          `json:"status"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Namespace        string          `json:"namespace"`
	Arguments        *string         `json:"arguments"`
	Output           json.RawMessage `json:"output"`
	Summary          []reasoningPart `json:"summary"`
	EncryptedContent *string         `json:"encrypted_content"`
}

// reasoningPart is one part of a reasoning item's summary (summary_text)
// or content (reasoning_text).
type reasoningPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type part struct {
	Type        string          `json:"type"`
	Text        *string         `json:"text"`
	Annotations json.RawMessage `json:"annotations"`
	Logprobs    json.RawMessage `json:"logprobs"`
	ImageURL    *string         `json:"image_url"`
	FileID      json.RawMessage `json:"file_id"`
	Detail      json.RawMessage `json:"detail"`
}

// convertInput reads "input": a string (one user message) or an array of
// items; a reasoning item the run path cannot read goes to ig.
func convertInput(raw json.RawMessage, ig *surface.Ignored) ([]*iop.ChatMessage, *surface.Error) {
	if !surface.Present(raw) {
		return nil, surface.BadRequest("input", "missing required field \"input\"")
	}
	if raw[0] == '"' {
		s, _ := surface.StringValue(raw)
		return []*iop.ChatMessage{{Role: "user", Content: s}}, nil
	}
	if raw[0] != '[' {
		return nil, surface.BadRequest("input", "field \"input\" must be a string or an array of items")
	}
	var items []item
	if e := surface.Decode(raw, &items); e != nil {
		e.Message = "input: " + e.Message
		return nil, e
	}
	if len(items) == 0 {
		return nil, surface.BadRequest("input", "field \"input\" must hold at least one item")
	}
	var out []*iop.ChatMessage
	thinking := "" // a reasoning item's text, for the next assistant message
	for i := range items {
		it := &items[i]
		at := "input[" + strconv.Itoa(i) + "]"
		if thinking != "" && !(it.Type == "function_call" || it.Type == "reasoning" || (it.Type != "function_call_output" && it.Role == "assistant")) {
			out = append(out, &iop.ChatMessage{Role: "assistant", Thinking: thinking}) // reasoning that led to no message
			thinking = ""
		}
		switch it.Type {
		case "reasoning":
			text, e := reasoningText(at, it, ig)
			if e != nil {
				return nil, e
			}
			if text != "" && thinking != "" {
				thinking += "\n"
			}
			thinking += text
		case "", "message":
			m, e := message(at, it)
			if e != nil {
				return nil, e
			}
			if m.Role == "assistant" && thinking != "" {
				m.Thinking, thinking = thinking, ""
			}
			out = append(out, m)
		case "function_call":
			if it.CallID == "" || it.Name == "" {
				return nil, surface.BadRequest("input", "%s: a function_call needs \"call_id\" and \"name\"", at)
			}
			args := "{}"
			if it.Arguments != nil && *it.Arguments != "" {
				args = *it.Arguments
			}
			if !surface.IsJSONObject(args) {
				return nil, surface.BadRequest("input", "%s.arguments must be a string holding a JSON object", at)
			}
			var last *iop.ChatMessage
			if n := len(out); n > 0 && out[n-1].Role == "assistant" && thinking == "" {
				last = out[n-1]
			} else {
				last = &iop.ChatMessage{Role: "assistant", Thinking: thinking}
				out = append(out, last)
				thinking = ""
			}
			last.ToolCallsJson = appendCall(last.ToolCallsJson, it.CallID, it.Name, args)
		case "function_call_output":
			if it.CallID == "" {
				return nil, surface.BadRequest("input", "%s: a function_call_output needs \"call_id\"", at)
			}
			text, e := outputText(at, it.Output)
			if e != nil {
				return nil, e
			}
			out = append(out, &iop.ChatMessage{Role: "tool", ToolCallId: it.CallID, Content: text})
		default:
			return nil, surface.BadRequest("input", "%s: item type %q is not supported by this model's provider (message, function_call, function_call_output, reasoning)", at, it.Type)
		}
	}
	if thinking != "" {
		out = append(out, &iop.ChatMessage{Role: "assistant", Thinking: thinking})
	}
	return out, nil
}

// reasoningText is the text of a reasoning input item at: its
// reasoning_text content, else its summary_text parts, else the text of an
// iop encrypted_content (surface.DecodeReasoning). An item with none the
// run path can read (another provider's encrypted_content) is reported in
// ig; content that is not an array of reasoning_text parts, or a summary
// part of another type, is a 400 naming it (OpenAI API reference,
// "Reasoning" input item): the model would read it, so it is never dropped
// in silence.
func reasoningText(at string, it *item, ig *surface.Ignored) (string, *surface.Error) {
	var b strings.Builder
	if surface.Present(it.Content) {
		var parts []reasoningPart
		if it.Content[0] != '[' {
			return "", surface.BadRequest("input", "%s.content must be an array of reasoning_text parts", at)
		}
		if e := surface.Decode(it.Content, &parts); e != nil {
			e.Message = at + ".content: " + e.Message
			return "", e
		}
		for j, p := range parts {
			if p.Type != "reasoning_text" {
				return "", surface.BadRequest("input", "%s.content[%d]: part type %q is not supported in a reasoning item (reasoning_text)", at, j, p.Type)
			}
			if p.Text != "" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(p.Text)
			}
		}
	}
	for j, p := range it.Summary {
		if p.Type != "summary_text" {
			return "", surface.BadRequest("input", "%s.summary[%d]: part type %q is not supported in a reasoning item's summary (summary_text)", at, j, p.Type)
		}
	}
	if b.Len() == 0 {
		for _, p := range it.Summary {
			if p.Text != "" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(p.Text)
			}
		}
	}
	if b.Len() == 0 && it.EncryptedContent != nil && *it.EncryptedContent != "" {
		text, ok := surface.DecodeReasoning(*it.EncryptedContent)
		if !ok {
			ig.Add(at, "input") // another provider's: no backend can read it
		}
		return text, nil
	}
	return b.String(), nil
}

// appendCall adds one OpenAI-shaped tool call to a tool_calls JSON array.
func appendCall(calls []byte, id, name, args string) []byte {
	if len(calls) == 0 {
		calls = append(calls, '[')
	} else {
		calls = calls[:len(calls)-1]
		calls = append(calls, ',')
	}
	calls = append(calls, `{"id":`...)
	calls = surface.AppendString(calls, id)
	calls = append(calls, `,"type":"function","function":{"name":`...)
	calls = surface.AppendString(calls, name)
	calls = append(calls, `,"arguments":`...)
	calls = surface.AppendString(calls, args)
	return append(calls, "}}]"...)
}

func message(at string, it *item) (*iop.ChatMessage, *surface.Error) {
	m := &iop.ChatMessage{Role: it.Role}
	switch it.Role {
	case "user", "assistant", "system":
	case "developer":
		m.Role = "system"
	default:
		return nil, surface.BadRequest("input", "%s.role %q is not one of user, assistant, system, developer", at, it.Role)
	}
	raw := it.Content
	switch {
	case !surface.Present(raw):
		return nil, surface.BadRequest("input", "%s.content is required", at)
	case raw[0] == '"':
		_ = json.Unmarshal(raw, &m.Content)
		return m, nil
	case raw[0] != '[':
		return nil, surface.BadRequest("input", "%s.content must be a string or an array of content parts", at)
	}
	var parts []part
	if e := surface.Decode(raw, &parts); e != nil {
		e.Message = at + ".content: " + e.Message
		return nil, e
	}
	var b strings.Builder
	texts := 0
	for j, p := range parts {
		pat := fmt.Sprintf("%s.content[%d]", at, j)
		switch {
		case p.Type == "input_text" || p.Type == "output_text":
			if p.Text == nil {
				return nil, surface.BadRequest("input", "%s.text is required", pat)
			}
			if texts > 0 {
				b.WriteByte('\n')
			}
			texts++
			b.WriteString(*p.Text)
		case p.Type == "input_image" && m.Role == "user":
			if surface.Present(p.FileID) || p.ImageURL == nil {
				return nil, surface.BadRequest("input", "%s: only image_url with a data: URL is supported by this model's provider", pat)
			}
			img, e := surface.DataURLImage(pat+".image_url", *p.ImageURL)
			if e != nil {
				e.Param = "input"
				return nil, e
			}
			m.Images = append(m.Images, img)
		default:
			return nil, surface.BadRequest("input", "%s: part type %q is not supported by this model's provider on a %s message", pat, p.Type, it.Role)
		}
	}
	m.Content = b.String()
	return m, nil
}

// outputText reads a function_call_output's output: a string or an array
// of input_text parts.
func outputText(at string, raw json.RawMessage) (string, *surface.Error) {
	switch {
	case !surface.Present(raw):
		return "", nil
	case raw[0] == '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		return s, nil
	case raw[0] == '[':
		var parts []part
		if e := surface.Decode(raw, &parts); e != nil {
			e.Message = at + ".output: " + e.Message
			return "", e
		}
		var b strings.Builder
		for j, p := range parts {
			if p.Type != "input_text" || p.Text == nil {
				return "", surface.BadRequest("input", "%s.output[%d]: part type %q is not supported by this model's provider (input_text only)", at, j, p.Type)
			}
			if j > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(*p.Text)
		}
		return b.String(), nil
	}
	return "", surface.BadRequest("input", "%s.output must be a string or an array of input_text parts", at)
}
