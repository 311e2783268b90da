package openai

import (
	"encoding/json"
	"strings"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// chatRequest is the part of an OpenAI chat completions request the
// normalized run path understands (OpenAI API reference, "Create chat
// completion"). Unknown fields are ignored, as OpenAI-compatible servers do.
type chatRequest struct {
	Messages            []chatMessage   `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"`
	Seed                *int64          `json:"seed"`
	N                   *int64          `json:"n"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// ChatInput turns a chat completions body into the normalized RunInput the
// node's run path takes (SPEC Q3): messages with string or multi-part text
// content (text parts joined with "\n"; "developer" is sent as "system"),
// assistant tool_calls and tool_call_id, tools and tool_choice as raw JSON,
// max_completion_tokens (else max_tokens), temperature, top_p, stop (string
// or array) and seed. It also returns the names of the declared tools (for
// the text tool-call fallback). Errors are 400s naming the field.
func ChatInput(body []byte) (*iop.RunInput, []string, *surface.Error) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, surface.JSONFieldError(err)
	}
	in := &iop.RunInput{Messages: make([]*iop.ChatMessage, 0, len(req.Messages))}
	for i := range req.Messages {
		m, e := runMessage(i, &req.Messages[i])
		if e != nil {
			return nil, nil, e
		}
		in.Messages = append(in.Messages, m)
	}
	if len(in.Messages) == 0 {
		return nil, nil, surface.BadRequest("messages", "field \"messages\" must hold at least one message")
	}
	var names []string
	if surface.Present(req.Tools) {
		var tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(req.Tools, &tools); err != nil {
			return nil, nil, surface.BadRequest("tools", "field \"tools\" must be an array of tool objects")
		}
		for i, t := range tools {
			if t.Function.Name == "" {
				return nil, nil, surface.BadRequest("tools", "tools[%d].function.name is required", i)
			}
			names = append(names, t.Function.Name)
		}
		in.ToolsJson = req.Tools
	}
	if surface.Present(req.ToolChoice) {
		in.ToolChoiceJson = req.ToolChoice
	}
	switch {
	case req.MaxCompletionTokens != nil:
		if *req.MaxCompletionTokens < 1 {
			return nil, nil, surface.BadRequest("max_completion_tokens", "field \"max_completion_tokens\" must be at least 1")
		}
		in.MaxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		if *req.MaxTokens < 1 {
			return nil, nil, surface.BadRequest("max_tokens", "field \"max_tokens\" must be at least 1")
		}
		in.MaxTokens = *req.MaxTokens
	}
	in.Temperature = req.Temperature
	in.TopP = req.TopP
	in.Seed = req.Seed
	if req.N != nil && *req.N != 1 {
		return nil, nil, surface.BadRequest("n", "field \"n\": only 1 choice is supported by this model's provider")
	}
	if surface.Present(req.Stop) {
		switch req.Stop[0] {
		case '"':
			var s string
			_ = json.Unmarshal(req.Stop, &s)
			in.Stop = []string{s}
		case '[':
			if err := json.Unmarshal(req.Stop, &in.Stop); err != nil {
				return nil, nil, surface.BadRequest("stop", "field \"stop\" must be a string or an array of strings")
			}
		default:
			return nil, nil, surface.BadRequest("stop", "field \"stop\" must be a string or an array of strings")
		}
	}
	return in, names, nil
}

func runMessage(i int, m *chatMessage) (*iop.ChatMessage, *surface.Error) {
	out := &iop.ChatMessage{Role: m.Role, Name: m.Name, ToolCallId: m.ToolCallID}
	switch m.Role {
	case "system", "user", "assistant", "tool":
	case "developer":
		out.Role = "system"
	case "":
		return nil, surface.BadRequest("messages", "messages[%d].role is required", i)
	default:
		return nil, surface.BadRequest("messages", "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, m.Role)
	}
	text, e := textContent(i, m.Content)
	if e != nil {
		return nil, e
	}
	out.Content = text
	if surface.Present(m.ToolCalls) {
		if m.Role != "assistant" {
			return nil, surface.BadRequest("messages", "messages[%d].tool_calls is only allowed on assistant messages", i)
		}
		if m.ToolCalls[0] != '[' {
			return nil, surface.BadRequest("messages", "messages[%d].tool_calls must be an array", i)
		}
		out.ToolCallsJson = m.ToolCalls
	}
	if m.Role == "tool" && m.ToolCallID == "" {
		return nil, surface.BadRequest("messages", "messages[%d].tool_call_id is required for role \"tool\"", i)
	}
	return out, nil
}

// textContent accepts a string, null, or an array of text parts.
func textContent(i int, raw json.RawMessage) (string, *surface.Error) {
	if !surface.Present(raw) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		return s, nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", surface.BadRequest("messages", "messages[%d].content must be a string or an array of content parts", i)
		}
		var b strings.Builder
		for j, p := range parts {
			if p.Type != "text" {
				return "", surface.BadRequest("messages", "messages[%d].content[%d]: part type %q is not supported by this model's provider (text only)", i, j, p.Type)
			}
			if p.Text == nil {
				return "", surface.BadRequest("messages", "messages[%d].content[%d].text is required", i, j)
			}
			if j > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(*p.Text)
		}
		return b.String(), nil
	default:
		return "", surface.BadRequest("messages", "messages[%d].content must be a string or an array of content parts", i)
	}
}
