package sdk

import (
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
)

func messageParams(model string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: 512,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello in one short sentence."))},
	}
}

// skipWithoutMessages skips the tunnel path when the configured
// OpenAI-compatible profile has no /v1/messages (vllm, openai). The run
// path (an ollama provider) always has it.
func skipWithoutMessages(t *testing.T, s *stack, suffix string) {
	if p := s.env.openaiProfile; suffix != "" && s.env.realServer() && p != "llamacpp" && p != "ollama" {
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

// testMessages: T1/T2, F1 — messages.create on both paths (the run
// path converts to and from Ollama's /api/chat; the tunnel relays the
// server's own /v1/messages), with the key in x-api-key and, as
// anthropic-sdk-go's WithAPIKey sends it, as a Bearer token.
func testMessages(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			skipWithoutMessages(t, s, p.suffix)
			rows := []struct {
				name string
				opts []aoption.RequestOption
			}{
				{"x-api-key", nil},
				{"WithAPIKey bearer", []aoption.RequestOption{aoption.WithHeaderDel("x-api-key"), aoption.WithAPIKey(demoKey)}},
			}
			for _, r := range rows {
				t.Run(r.name, func(t *testing.T) {
					m, err := s.anthropic(r.opts...).Messages.New(reqCtx(t), messageParams("tiny"+p.suffix))
					if err != nil {
						t.Fatalf("Messages.New: %v", err)
					}
					checkMessage(t, s, m)
				})
			}
		})
	}
}

// testMessagesStream: the same, streamed: message_start first, text
// deltas, message_stop last; the SDK's accumulator rebuilds the message.
func testMessagesStream(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			skipWithoutMessages(t, s, p.suffix)
			m, types := streamMessage(t, s, messageParams("tiny"+p.suffix))
			textDeltas := 0
			for _, ty := range types {
				if ty == "content_block_delta" {
					textDeltas++
				}
			}
			if textDeltas == 0 {
				t.Errorf("no content_block_delta events in %q", types)
			}
			checkMessage(t, s, m)
		})
	}
}

// streamMessage streams params and returns the accumulated message and the
// event types; it fails t unless message_start comes first and
// message_stop last.
func streamMessage(t *testing.T, s *stack, params anthropic.MessageNewParams) (*anthropic.Message, []string) {
	t.Helper()
	stream := s.anthropic().Messages.NewStreaming(reqCtx(t), params)
	defer stream.Close()
	var m anthropic.Message
	var types []string
	for stream.Next() {
		ev := stream.Current()
		if err := m.Accumulate(ev); err != nil {
			t.Fatalf("Accumulate(%s): %v", ev.Type, err)
		}
		types = append(types, ev.Type)
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(types) < 2 || types[0] != "message_start" || types[len(types)-1] != "message_stop" {
		t.Fatalf("event types %q; want message_start … message_stop", types)
	}
	return &m, types
}

// testMessagesTools: F1 — a tool round trip on both paths, streamed:
// the model answers get_weather as a tool_use block, the client sends the
// tool_result back (without tools, so the answer is text) and gets a final
// text answer.
func testMessagesTools(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			skipWithoutMessages(t, s, p.suffix)
			model := "tiny-tool" + p.suffix
			ask := anthropic.NewUserMessage(anthropic.NewTextBlock("What is the weather in Paris right now? Use the get_weather tool."))
			params := anthropic.MessageNewParams{
				Model: anthropic.Model(model), MaxTokens: 512, Messages: []anthropic.MessageParam{ask},
				Tools: []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{
					Name:        "get_weather",
					Description: anthropic.String("Get the current weather in a city"),
					InputSchema: anthropic.ToolInputSchemaParam{
						Properties: map[string]any{"city": map[string]any{"type": "string", "description": "city name"}},
						Required:   []string{"city"},
					},
				}}},
			}
			m, _ := streamMessage(t, s, params)
			var use *anthropic.ToolUseBlock
			for _, c := range m.Content {
				if c.Type == "tool_use" {
					u := c.AsToolUse()
					use = &u
				}
			}
			if use == nil || use.Name != "get_weather" || use.ID == "" || m.StopReason != anthropic.StopReasonToolUse {
				t.Fatalf("content %+v stop_reason %q: want a get_weather tool_use", m.Content, m.StopReason)
			}
			checkWeatherArgs(t, string(use.Input))
			final, err := s.anthropic().Messages.New(reqCtx(t), anthropic.MessageNewParams{
				Model: anthropic.Model(model), MaxTokens: 512,
				Messages: []anthropic.MessageParam{ask, m.ToParam(),
					anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, `{"temperature_c": 21, "sky": "clear"}`, false))},
			})
			if err != nil {
				t.Fatalf("Messages.New with the tool_result: %v", err)
			}
			checkMessage(t, s, final)
		})
	}
}

// testCountTokens: F1 — count_tokens on the run path answers the
// backend's own prompt count (a one-token Ollama generation); on the tunnel
// it is the server's (llama-server has it, Ollama 0.17.4 does not).
func testCountTokens(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			if p.suffix != "" && s.env.realServer() && s.env.openaiProfile != "llamacpp" {
				t.Skipf("profile %s has no count_tokens", s.env.openaiProfile)
			}
			if p.suffix == "" && s.env.ollamaURL == "" && s.env.realServer() {
				t.Skip("no native Ollama: the native group uses the OpenAI-compatible provider")
			}
			n, err := s.anthropic().Messages.CountTokens(reqCtx(t), anthropic.MessageCountTokensParams{
				Model:    anthropic.Model("tiny" + p.suffix),
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello in one short sentence."))},
			})
			if err != nil {
				t.Fatalf("CountTokens: %v", err)
			}
			if n.InputTokens <= 0 {
				t.Errorf("input_tokens = %d, want > 0", n.InputTokens)
			}
		})
	}
}
