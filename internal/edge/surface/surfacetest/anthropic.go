package surfacetest

import (
	"bytes"
	"encoding/json"
	"testing"

	"iop/internal/sse"
)

// AnthropicMessage is a Messages response as a client assembles it.
type AnthropicMessage struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Role       string `json:"role"`
	Model      string `json:"model"`
	Content    []AnthropicBlock
	StopReason string `json:"stop_reason"`
	Usage      struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
}

// AnthropicBlock is one content block: text, or tool_use with its input.
type AnthropicBlock struct {
	Type  string          `json:"type"`
	Text  string          `json:"text"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// CheckAnthropicMessage parses a non-stream Messages body and checks its
// shape (Anthropic API reference, "Messages").
func CheckAnthropicMessage(t testing.TB, body []byte) AnthropicMessage {
	t.Helper()
	var m struct {
		AnthropicMessage
		Content      []AnthropicBlock `json:"content"`
		StopSequence *string          `json:"stop_sequence"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	m.AnthropicMessage.Content = m.Content
	checkMessage(t, &m.AnthropicMessage, body)
	return m.AnthropicMessage
}

func checkMessage(t testing.TB, m *AnthropicMessage, raw []byte) {
	t.Helper()
	if m.Type != "message" || m.Role != "assistant" || m.Model != "tiny" || m.ID == "" {
		t.Errorf("message type/role/model/id = %q/%q/%q/%q: %s", m.Type, m.Role, m.Model, m.ID, raw)
	}
	switch m.StopReason {
	case "end_turn", "max_tokens", "tool_use", "stop_sequence":
	default:
		t.Errorf("stop_reason %q", m.StopReason)
	}
	tools := 0
	for i, b := range m.Content {
		switch b.Type {
		case "text":
		case "tool_use":
			tools++
			var in map[string]any
			if b.ID == "" || b.Name == "" || json.Unmarshal(b.Input, &in) != nil {
				t.Errorf("block %d: bad tool_use %+v", i, b)
			}
		default:
			t.Errorf("block %d: type %q", i, b.Type)
		}
	}
	if (tools > 0) != (m.StopReason == "tool_use") {
		t.Errorf("%d tool_use blocks with stop_reason %q", tools, m.StopReason)
	}
}

// CheckAnthropicStream parses a Messages event stream as the SDKs do and
// checks its rules: every event's name is its data's type; message_start
// first; content blocks started in index order, each delta and stop
// addressing the open block; message_delta then message_stop last, or an
// error event last when wantError. It returns the assembled message.
func CheckAnthropicStream(t testing.TB, body []byte, wantError bool) AnthropicMessage {
	t.Helper()
	r := sse.NewReader(bytes.NewReader(body), sse.DefaultMaxLine)
	var m AnthropicMessage
	var names []string
	open := -1
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		name := string(ev.Type)
		names = append(names, name)
		var d struct {
			Type    string          `json:"type"`
			Index   *int            `json:"index"`
			Message json.RawMessage `json:"message"`
			Block   AnthropicBlock  `json:"content_block"`
			Delta   struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
			Usage *struct {
				InputTokens  int64 `json:"input_tokens"`
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatalf("event %q: data is not JSON: %s", name, ev.Data)
		}
		if d.Type != name {
			t.Errorf("event name %q, data type %q", name, d.Type)
		}
		if len(names) == 1 && name != "message_start" {
			t.Fatalf("first event %q, want message_start", name)
		}
		switch name {
		case "message_start":
			if err := json.Unmarshal(d.Message, &m); err != nil {
				t.Fatalf("message_start: %v", err)
			}
		case "content_block_start":
			if open >= 0 || d.Index == nil || *d.Index != len(m.Content) {
				t.Fatalf("content_block_start index %v with block %d open, %d blocks", d.Index, open, len(m.Content))
			}
			open = *d.Index
			b := d.Block
			if b.Type == "tool_use" {
				b.Input = nil
			}
			m.Content = append(m.Content, b)
		case "content_block_delta":
			if d.Index == nil || *d.Index != open {
				t.Fatalf("content_block_delta index %v, open %d", d.Index, open)
			}
			b := &m.Content[open]
			switch d.Delta.Type {
			case "text_delta":
				b.Text += d.Delta.Text
			case "input_json_delta":
				b.Input = append(b.Input, d.Delta.PartialJSON...)
			default:
				t.Errorf("delta type %q", d.Delta.Type)
			}
		case "content_block_stop":
			if d.Index == nil || *d.Index != open {
				t.Fatalf("content_block_stop index %v, open %d", d.Index, open)
			}
			open = -1
		case "message_delta":
			m.StopReason = d.Delta.StopReason
			if d.Usage != nil {
				m.Usage.InputTokens, m.Usage.OutputTokens = d.Usage.InputTokens, d.Usage.OutputTokens
			}
		case "message_stop", "error", "ping":
		default:
			t.Errorf("unknown event %q", name)
		}
	}
	last := ""
	if len(names) > 0 {
		last = names[len(names)-1]
	}
	if wantError {
		if last != "error" {
			t.Fatalf("stream ends with %q, want error", last)
		}
		return m
	}
	if last != "message_stop" || len(names) < 2 || names[len(names)-2] != "message_delta" || open >= 0 {
		t.Fatalf("stream ends %v (block %d open), want message_delta, message_stop", names, open)
	}
	checkMessage(t, &m, body)
	return m
}
