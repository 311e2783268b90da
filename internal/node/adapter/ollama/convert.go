package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"

	"iop/internal/node/adapter/upstream"
	iop "iop/proto/gen/iop"
)

// chatRequest is the body of POST /api/chat (Ollama docs/api.md; the
// fields of Ollama 0.17.4's api.ChatRequest this adapter uses).
type chatRequest struct {
	Model       string          `json:"model"`
	Messages    []message       `json:"messages"`
	Stream      bool            `json:"stream"`
	Format      json.RawMessage `json:"format,omitempty"`
	Options     *options        `json:"options,omitempty"`
	Tools       json.RawMessage `json:"tools,omitempty"`
	Truncate    *bool           `json:"truncate,omitempty"`
	Logprobs    bool            `json:"logprobs,omitempty"`
	TopLogprobs int32           `json:"top_logprobs,omitempty"`
	Think       json.RawMessage `json:"think,omitempty"`
	KeepAlive   json.RawMessage `json:"keep_alive,omitempty"`
}

type message struct {
	Role       string        `json:"role"`
	Content    string        `json:"content"`
	Thinking   string        `json:"thinking,omitempty"`
	Images     [][]byte      `json:"images,omitempty"` // base64 in JSON, as Ollama's ImageData
	ToolCalls  []reqToolCall `json:"tool_calls,omitempty"`
	ToolName   string        `json:"tool_name,omitempty"`
	ToolCallID string        `json:"tool_call_id,omitempty"`
}

type reqToolCall struct {
	ID       string `json:"id,omitempty"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type options struct {
	NumPredict       *int64   `json:"num_predict,omitempty"`
	Temperature      *float64 `json:"temperature,omitempty"`
	TopP             *float64 `json:"top_p,omitempty"`
	TopK             *int64   `json:"top_k,omitempty"`
	Stop             []string `json:"stop,omitempty"`
	Seed             *int64   `json:"seed,omitempty"`
	FrequencyPenalty *float64 `json:"frequency_penalty,omitempty"`
	PresencePenalty  *float64 `json:"presence_penalty,omitempty"`
}

// BuildChatRequest returns the JSON body of a streaming /api/chat request for
// target. It converts OpenAI-shaped input to Ollama's native fields, each
// input field either translated or refused (F2): assistant tool_calls
// get their arguments as a JSON object (OpenAI sends a JSON string), tool
// messages get tool_name (from their name, or the call they answer) and
// tool_call_id, images go as base64 "images"; tools pass through (same
// shape in both APIs) unless tool_choice is "none", and tool_choice
// "required" or a named function (which Ollama cannot force) is refused;
// response_format json_object becomes format "json" and json_schema its
// schema; max_tokens, temperature, top_p, top_k, stop, seed and the
// penalties become options; logprobs, top_logprobs and truncate pass as
// they are; think becomes Ollama's "think" (true, false or a level) and an
// assistant message's thinking its "thinking" (Ollama 0.17.4 api.Message
// and api.ThinkValue). Errors wrap upstream.ErrInvalidInput and name the
// bad field.
func BuildChatRequest(target string, in *iop.RunInput) ([]byte, error) {
	return buildChatRequest(target, in, in.GetThink(), nil)
}

// buildChatRequest is BuildChatRequest with think in place of in.think
// and keepAlive (nil = none) as keep_alive.
func buildChatRequest(target string, in *iop.RunInput, think string, keepAlive json.RawMessage) ([]byte, error) {
	if in == nil {
		return nil, fmt.Errorf("%w: no input", upstream.ErrInvalidInput)
	}
	if err := upstream.CheckNumbers(in); err != nil {
		return nil, err
	}
	req := chatRequest{Model: target, Stream: true, Messages: make([]message, 0, len(in.GetMessages())), KeepAlive: keepAlive}
	callNames := map[string]string{} // tool-call id → function name
	for i, m := range in.GetMessages() {
		msg := message{Role: m.GetRole(), Content: m.GetContent()}
		for _, img := range m.GetImages() {
			msg.Images = append(msg.Images, img.GetData())
		}
		switch m.GetRole() {
		case "system", "user":
		case "assistant":
			msg.Thinking = m.GetThinking()
			calls, err := upstream.DecodeToolCalls(m.GetToolCallsJson())
			if err != nil {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
			for _, c := range calls {
				args, err := argumentsObject(c.Function.Arguments)
				if err != nil {
					return nil, fmt.Errorf("%w: message %d: tool call %q: %v", upstream.ErrInvalidInput, i, c.Function.Name, err)
				}
				var rc reqToolCall
				rc.ID = c.ID
				rc.Function.Name = c.Function.Name
				rc.Function.Arguments = args
				msg.ToolCalls = append(msg.ToolCalls, rc)
				if c.ID != "" {
					callNames[c.ID] = c.Function.Name
				}
			}
		case "tool":
			msg.ToolCallID = m.GetToolCallId()
			msg.ToolName = m.GetName()
			if msg.ToolName == "" {
				msg.ToolName = callNames[m.GetToolCallId()]
			}
		default:
			return nil, fmt.Errorf("%w: message %d: unknown role %q", upstream.ErrInvalidInput, i, m.GetRole())
		}
		req.Messages = append(req.Messages, msg)
	}
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("%w: no messages", upstream.ErrInvalidInput)
	}
	tools, err := upstream.Tools(in.GetToolsJson())
	if err != nil {
		return nil, err
	}
	switch choice := string(bytes.TrimSpace(in.GetToolChoiceJson())); choice {
	case `"none"`:
	case "", `"auto"`:
		req.Tools = tools
	default:
		return nil, &upstream.FieldError{Field: "tool_choice",
			Msg: fmt.Sprintf("tool_choice %.64s cannot be enforced by Ollama's /api/chat (only \"auto\" and \"none\")", choice)}
	}
	format, err := nativeFormat(in.GetResponseFormatJson())
	if err != nil {
		return nil, err
	}
	req.Format = format
	tv, ok := thinkJSON(think)
	if !ok {
		return nil, &upstream.FieldError{Field: "think", Msg: fmt.Sprintf("think %.32q is not true, false, low, medium or high", think)}
	}
	req.Think = tv
	req.Logprobs, req.TopLogprobs = in.GetLogprobs(), in.GetTopLogprobs()
	req.Truncate = in.Truncate
	var o options
	set := false
	if in.GetMaxTokens() > 0 {
		n := in.GetMaxTokens()
		o.NumPredict, set = &n, true
	}
	if in.Temperature != nil {
		o.Temperature, set = in.Temperature, true
	}
	if in.TopP != nil {
		o.TopP, set = in.TopP, true
	}
	if len(in.GetStop()) > 0 {
		o.Stop, set = in.GetStop(), true
	}
	if in.Seed != nil {
		o.Seed, set = in.Seed, true
	}
	if in.TopK != nil {
		o.TopK, set = in.TopK, true
	}
	if in.FrequencyPenalty != nil {
		o.FrequencyPenalty, set = in.FrequencyPenalty, true
	}
	if in.PresencePenalty != nil {
		o.PresencePenalty, set = in.PresencePenalty, true
	}
	if set {
		req.Options = &o
	}
	return json.Marshal(req)
}

// argumentsObject turns OpenAI's arguments string into the JSON object
// Ollama expects: "" → {}, otherwise it must be a JSON object.
func argumentsObject(s string) (json.RawMessage, error) {
	b := bytes.TrimSpace([]byte(s))
	if len(b) == 0 || string(b) == "null" {
		return json.RawMessage("{}"), nil
	}
	if b[0] != '{' || !json.Valid(b) {
		return nil, fmt.Errorf("arguments are not a JSON object: %.64q", s)
	}
	return json.RawMessage(b), nil
}

// nativeFormat turns an OpenAI response_format into Ollama's "format":
// json_object → "json", json_schema → its schema object; empty or text →
// none.
func nativeFormat(raw []byte) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	var f struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%w: response_format: %v", upstream.ErrInvalidInput, err)
	}
	switch f.Type {
	case "text":
		return nil, nil
	case "json_object":
		return json.RawMessage(`"json"`), nil
	case "json_schema":
		s := bytes.TrimSpace(f.JSONSchema.Schema)
		if len(s) == 0 || s[0] != '{' {
			return nil, fmt.Errorf("%w: response_format.json_schema.schema must be an object", upstream.ErrInvalidInput)
		}
		return json.RawMessage(s), nil
	}
	return nil, fmt.Errorf("%w: response_format type %q", upstream.ErrInvalidInput, f.Type)
}
