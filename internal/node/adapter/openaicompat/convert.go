package openaicompat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"iop/internal/node/adapter/upstream"
	iop "iop/proto/gen/iop"
)

// TextToolCallFormat is the reply the text tool-call instruction of SPEC E9
// asks the model for when it wants to call tools: this JSON object alone, as
// the whole assistant content. The Edge may restore OpenAI tool_calls from
// content in this shape, and only for runs whose COMPLETE event carries
// metadata["openai_text_tool_fallback"]="true"; the node never does.
const TextToolCallFormat = `{"tool_calls":[{"name":"<tool name>","arguments":{<arguments as a JSON object>}}]}`

// chatRequest is the body of POST chat_completions_path (OpenAI API
// reference, "Create chat completion").
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options,omitempty"`
	MaxTokens           int64           `json:"max_tokens,omitempty"`
	MaxCompletionTokens int64           `json:"max_completion_tokens,omitempty"`
	Temperature         *float64        `json:"temperature,omitempty"`
	TopP                *float64        `json:"top_p,omitempty"`
	Stop                []string        `json:"stop,omitempty"`
	Seed                *int64          `json:"seed,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	ToolChoice          json.RawMessage `json:"tool_choice,omitempty"`
	ResponseFormat      json.RawMessage `json:"response_format,omitempty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty,omitempty"`
	PresencePenalty     *float64        `json:"presence_penalty,omitempty"`
	TopK                *int64          `json:"top_k,omitempty"` // llama-server and vLLM extension
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    *string         `json:"content"`
	Name       string          `json:"name,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
}

// BuildChatRequest returns the JSON body of a streaming chat-completions
// request for target with stream_options.include_usage. max_tokens is sent
// as max_completion_tokens for the "openai" profile (the hosted API's
// current name) and as max_tokens otherwise. With textTools, tools and
// tool_choice are left out, the text tool-call instruction is merged into the
// leading system message (one is created when the conversation has none),
// earlier assistant tool calls become content in TextToolCallFormat and tool
// results become user messages (SPEC E9). response_format, the penalties
// and top_k pass through; images, logprobs and truncate true (which this
// driver cannot send or read back) are refused, never dropped (F2).
// Errors wrap upstream.ErrInvalidInput and name the bad field or message.
func BuildChatRequest(profile, target string, in *iop.RunInput, textTools bool) ([]byte, error) {
	if err := refuseUnsent(in); err != nil {
		return nil, err
	}
	if err := upstream.CheckNumbers(in); err != nil {
		return nil, err
	}
	tools, err := upstream.Tools(in.GetToolsJson())
	if err != nil {
		return nil, err
	}
	req := chatRequest{
		Model:         target,
		Stream:        true,
		StreamOptions: &streamOptions{IncludeUsage: true},
		Temperature:   in.Temperature,
		TopP:          in.TopP,
		Stop:          in.GetStop(),
		Seed:          in.Seed,

		FrequencyPenalty: in.FrequencyPenalty,
		PresencePenalty:  in.PresencePenalty,
		TopK:             in.TopK,
	}
	if rf := bytes.TrimSpace(in.GetResponseFormatJson()); len(rf) > 0 {
		if !json.Valid(rf) {
			return nil, fmt.Errorf("%w: response_format is not JSON", upstream.ErrInvalidInput)
		}
		req.ResponseFormat = json.RawMessage(rf)
	}
	if profile == "openai" {
		req.MaxCompletionTokens = in.GetMaxTokens()
	} else {
		req.MaxTokens = in.GetMaxTokens()
	}
	if req.MaxTokens < 0 || req.MaxCompletionTokens < 0 {
		return nil, fmt.Errorf("%w: max_tokens %d is negative", upstream.ErrInvalidInput, in.GetMaxTokens())
	}
	if textTools {
		req.Messages, err = textModeMessages(in, tools)
	} else {
		req.Messages, err = nativeMessages(in)
		req.Tools = tools
		if tools != nil {
			if tc := bytes.TrimSpace(in.GetToolChoiceJson()); len(tc) > 0 {
				if !json.Valid(tc) {
					return nil, fmt.Errorf("%w: tool_choice is not JSON", upstream.ErrInvalidInput)
				}
				req.ToolChoice = json.RawMessage(tc)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("%w: no messages", upstream.ErrInvalidInput)
	}
	return json.Marshal(req)
}

func nativeMessages(in *iop.RunInput) ([]chatMessage, error) {
	out := make([]chatMessage, 0, len(in.GetMessages()))
	for i, m := range in.GetMessages() {
		if err := checkRole(i, m.GetRole()); err != nil {
			return nil, err
		}
		content := m.GetContent()
		msg := chatMessage{Role: m.GetRole(), Content: &content, Name: m.GetName(), ToolCallID: m.GetToolCallId()}
		if raw := bytes.TrimSpace(m.GetToolCallsJson()); len(raw) > 0 && string(raw) != "null" {
			calls, err := upstream.DecodeToolCalls(raw)
			if err != nil {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
			if len(calls) > 0 {
				msg.ToolCalls = json.RawMessage(raw)
				if content == "" {
					msg.Content = nil // OpenAI: content null beside tool_calls
				}
			}
		}
		out = append(out, msg)
	}
	return out, nil
}

func checkRole(i int, role string) error {
	switch role {
	case "system", "user", "assistant", "tool", "developer":
		return nil
	}
	return fmt.Errorf("%w: message %d: unknown role %q", upstream.ErrInvalidInput, i, role)
}

// textModeMessages rewrites the conversation for a backend without native
// tools (SPEC E9).
func textModeMessages(in *iop.RunInput, tools json.RawMessage) ([]chatMessage, error) {
	instruction, err := TextToolInstruction(tools, in.GetToolChoiceJson())
	if err != nil {
		return nil, err
	}
	msgs := in.GetMessages()
	out := make([]chatMessage, 0, len(msgs)+1)
	if len(msgs) == 0 || msgs[0].GetRole() != "system" {
		out = append(out, chatMessage{Role: "system", Content: &instruction})
	}
	callNames := map[string]string{}
	for i, m := range msgs {
		if err := checkRole(i, m.GetRole()); err != nil {
			return nil, err
		}
		content := m.GetContent()
		msg := chatMessage{Role: m.GetRole(), Name: m.GetName()}
		switch m.GetRole() {
		case "system":
			if i == 0 {
				if content != "" {
					content += "\n\n"
				}
				content += instruction
			}
		case "assistant":
			calls, err := upstream.DecodeToolCalls(m.GetToolCallsJson())
			if err != nil {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
			if len(calls) > 0 {
				text, err := textToolCalls(calls)
				if err != nil {
					return nil, fmt.Errorf("message %d: %w", i, err)
				}
				if content != "" {
					content += "\n"
				}
				content += text
				for _, c := range calls {
					callNames[c.ID] = c.Function.Name
				}
			}
		case "tool":
			name := m.GetName()
			if name == "" {
				name = callNames[m.GetToolCallId()]
			}
			msg.Role, msg.Name = "user", ""
			content = fmt.Sprintf("Result of tool call %s (%s):\n%s", m.GetToolCallId(), name, content)
		}
		msg.Content = &content
		out = append(out, msg)
	}
	return out, nil
}

// textToolCalls renders earlier tool calls in TextToolCallFormat.
func textToolCalls(calls []upstream.ToolCall) (string, error) {
	type textCall struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	doc := struct {
		ToolCalls []textCall `json:"tool_calls"`
	}{}
	for _, c := range calls {
		args := json.RawMessage(strings.TrimSpace(c.Function.Arguments))
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		if !json.Valid(args) {
			return "", fmt.Errorf("%w: tool call %q arguments are not JSON", upstream.ErrInvalidInput, c.Function.Name)
		}
		doc.ToolCalls = append(doc.ToolCalls, textCall{Name: c.Function.Name, Arguments: args})
	}
	b, err := json.Marshal(doc)
	return string(b), err
}

// TextToolInstruction returns the system-message text of the text tool-call
// mode (SPEC E9): the tools as JSON, the reply format TextToolCallFormat, and
// what tool_choice demands ("none", "required" or one named function).
func TextToolInstruction(tools json.RawMessage, toolChoice []byte) (string, error) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, tools); err != nil {
		return "", fmt.Errorf("%w: tools: %v", upstream.ErrInvalidInput, err)
	}
	var b strings.Builder
	b.WriteString("You can call tools. They are described by this JSON (OpenAI \"tools\" format):\n")
	b.Write(compact.Bytes())
	b.WriteString("\n\nTo call one or more tools, reply with only this JSON object and nothing else:\n")
	b.WriteString(TextToolCallFormat)
	b.WriteString("\nWhen no tool is needed, answer normally in plain text.")
	switch choice := bytes.TrimSpace(toolChoice); {
	case len(choice) == 0, string(choice) == `"auto"`:
	case string(choice) == `"none"`:
		b.WriteString("\nDo not call any tool in this reply.")
	case string(choice) == `"required"`:
		b.WriteString("\nYou must call at least one tool.")
	default:
		var named struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(choice, &named); err != nil || named.Function.Name == "" {
			return "", fmt.Errorf("%w: tool_choice %.64q is not auto, none, required or a named function", upstream.ErrInvalidInput, choice)
		}
		fmt.Fprintf(&b, "\nYou must call the tool %q.", named.Function.Name)
	}
	return b.String(), nil
}

// refuseUnsent refuses the RunInput fields this driver cannot carry.
func refuseUnsent(in *iop.RunInput) error {
	switch {
	case in.GetLogprobs() || in.GetTopLogprobs() > 0:
		return fmt.Errorf("%w: logprobs are not read back on the run path of an openai_compat adapter", upstream.ErrInvalidInput)
	case in.Truncate != nil && *in.Truncate:
		return fmt.Errorf("%w: truncate: an OpenAI-compatible chat request cannot ask the server to drop history", upstream.ErrInvalidInput)
	}
	for i, m := range in.GetMessages() {
		if len(m.GetImages()) > 0 {
			return fmt.Errorf("%w: message %d: images are not sent on the run path of an openai_compat adapter", upstream.ErrInvalidInput, i)
		}
	}
	return nil
}
