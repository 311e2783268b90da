package sdk

import (
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
)

// anthropicModel is the group whose provider's profile has the messages
// operation (openai_compat with profile llamacpp or ollama).
const anthropicModel = "tiny-oa"

func messageParams() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropicModel,
		MaxTokens: 512,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello in one short sentence."))},
	}
}

// skipWithoutMessages skips when the configured OpenAI-compatible profile
// has no /v1/messages (vllm, openai).
func skipWithoutMessages(t *testing.T, s *stack) {
	if p := s.env.openaiProfile; s.env.realServer() && p != "llamacpp" && p != "ollama" {
		t.Skipf("profile %s has no messages operation", p)
	}
}

// messageText joins the text blocks of m.
func messageText(m *anthropic.Message) string {
	var b strings.Builder
	for _, c := range m.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// checkMessage checks an Anthropic message's shape: assistant, text,
// end_turn, output tokens counted.
func checkMessage(t *testing.T, s *stack, m *anthropic.Message) {
	t.Helper()
	text := messageText(m)
	if m.ID == "" || len(m.Content) == 0 || m.Content[0].Type != "text" || text == "" {
		t.Errorf("message id %q content %+v; want an id and a text block", m.ID, m.Content)
	}
	if m.StopReason != anthropic.StopReasonEndTurn {
		t.Errorf("stop_reason = %q, want end_turn", m.StopReason)
	}
	if m.Usage.OutputTokens <= 0 {
		t.Errorf("usage.output_tokens = %d, want > 0", m.Usage.OutputTokens)
	}
	if !s.env.realServer() && text != demoAnswer {
		t.Errorf("text = %q, want %q", text, demoAnswer)
	}
}

// testMessages: T1/T2 — messages.create through the tunnel to a provider
// whose profile has the messages operation, with the key in x-api-key and,
// as anthropic-sdk-go's WithAPIKey sends it, as a Bearer token.
func testMessages(t *testing.T, s *stack) {
	skipWithoutMessages(t, s)
	rows := []struct {
		name string
		opts []aoption.RequestOption
	}{
		{"x-api-key", nil},
		{"WithAPIKey bearer", []aoption.RequestOption{aoption.WithHeaderDel("x-api-key"), aoption.WithAPIKey(demoKey)}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			m, err := s.anthropic(r.opts...).Messages.New(reqCtx(t), messageParams())
			if err != nil {
				t.Fatalf("Messages.New(%s): %v", anthropicModel, err)
			}
			checkMessage(t, s, m)
		})
	}
}

// testMessagesStream: the same, streamed: message_start first, text
// deltas, message_stop last; the SDK's accumulator rebuilds the message.
func testMessagesStream(t *testing.T, s *stack) {
	skipWithoutMessages(t, s)
	stream := s.anthropic().Messages.NewStreaming(reqCtx(t), messageParams())
	defer stream.Close()
	var m anthropic.Message
	var types []string
	textDeltas := 0
	for stream.Next() {
		ev := stream.Current()
		if err := m.Accumulate(ev); err != nil {
			t.Fatalf("Accumulate(%s): %v", ev.Type, err)
		}
		types = append(types, ev.Type)
		if ev.Type == "content_block_delta" && ev.Delta.Type == "text_delta" {
			textDeltas++
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(types) < 2 || types[0] != "message_start" || types[len(types)-1] != "message_stop" {
		t.Errorf("event types %q; want message_start … message_stop", types)
	}
	if textDeltas == 0 {
		t.Errorf("no text_delta events in %q", types)
	}
	checkMessage(t, s, &m)
}
