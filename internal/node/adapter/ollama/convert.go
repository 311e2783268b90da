package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"

	"iop/internal/node/adapter/upstream"
	iop "iop/proto/gen/iop"
)

// chatRequest is the body of POST /api/chat (Ollama docs/api.md).
type chatRequest struct {
	Model    string          `json:"model"`
	Messages []message       `json:"messages"`
	Stream   bool            `json:"stream"`
	Options  *options        `json:"options,omitempty"`
	Tools    json.RawMessage `json:"tools,omitempty"`
}

type message struct {
	Role       string        `json:"role"`
	Content    string        `json:"content"`
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
	NumPredict  *int64   `json:"num_predict,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	Stop        []string `json:"stop,omitempty"`
	Seed        *int64   `json:"seed,omitempty"`
}

// BuildChatRequest returns the JSON body of a streaming /api/chat request for
// target. It converts OpenAI-shaped input: assistant tool_calls get their
// arguments as a JSON object (OpenAI sends a JSON string), tool messages get
// tool_name (from their name, or the call they answer) and tool_call_id;
// tools pass through (same shape in both APIs) unless tool_choice is "none";
// max_tokens becomes options.num_predict. Errors wrap
// upstream.ErrInvalidInput and name the bad message.
func BuildChatRequest(target string, in *iop.RunInput) ([]byte, error) {
	if in == nil {
		return nil, fmt.Errorf("%w: no input", upstream.ErrInvalidInput)
	}
	req := chatRequest{Model: target, Stream: true, Messages: make([]message, 0, len(in.GetMessages()))}
	callNames := map[string]string{} // tool-call id → function name
	for i, m := range in.GetMessages() {
		msg := message{Role: m.GetRole(), Content: m.GetContent()}
		switch m.GetRole() {
		case "system", "user":
		case "assistant":
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
	if !bytes.Equal(bytes.TrimSpace(in.GetToolChoiceJson()), []byte(`"none"`)) {
		req.Tools = tools
	}
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
