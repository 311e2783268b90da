package sdk

import "testing"

// TestSDK runs the non-disruptive cases against one stack (demo backend or
// the real server named by IOP_OLLAMA_URL / IOP_OPENAI_URL), in order.
func TestSDK(t *testing.T) {
	s := newStack(t)
	cases := []struct {
		name string
		run  func(*testing.T, *stack)
	}{
		{"Q1 models.list", testModelsList},
		{"T5 chat", testChat},
		{"T2 chat stream include_usage", testChatStreamUsage},
		{"E8 E9 tools", testTools},
		{"E8 E9 T2 tools stream", testToolsStream},
		{"tiny-loop max_tokens length", testLoopLength},
		{"T1 messages", testMessages},
		{"T1 T2 messages stream", testMessagesStream},
		{"issue 14 messages tool round trip", testMessagesTools},
		{"issue 14 count_tokens", testCountTokens},
		{"issue 14 responses", testResponses},
		{"issue 14 responses stream", testResponsesStream},
		{"issue 14 responses function tool round trip", testResponsesTools},
		{"T5 errors", testErrors},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}
