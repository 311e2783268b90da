package sdk

import "testing"

// sdkCases are the non-disruptive cases, run in order on one stack.
var sdkCases = []struct {
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
	{"F1 messages tool round trip", testMessagesTools},
	{"F1 count_tokens", testCountTokens},
	{"F1 responses", testResponses},
	{"F1 responses stream", testResponsesStream},
	{"F1 responses function tool round trip", testResponsesTools},
	{"F1 embeddings", testEmbeddings},
	{"F1 completions", testCompletions},
	{"T5 errors", testErrors},
}

// TestSDK runs the non-disruptive cases against one stack (demo backend or
// the real server named by IOP_OLLAMA_URL / IOP_OPENAI_URL), in order.
func TestSDK(t *testing.T) {
	s := newStack(t)
	for _, c := range sdkCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}

// TestSDKCredentialPlane runs the same cases with the credential plane on
// (SPEC C1–C6): the upstream key lives only in the edge's secret store and
// reaches the node as a sealed lease per request; the demo backend refuses
// /v1 requests without it. Afterwards no log line, /status or /metrics
// holds the key or a private key (C5, P4).
func TestSDKCredentialPlane(t *testing.T) {
	s := newStack(t, withCredentials)
	for _, c := range sdkCases {
		t.Run("C3 "+c.name, func(t *testing.T) { c.run(t, s) })
	}
	s.scanSecrets(t)
}
