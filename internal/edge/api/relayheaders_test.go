package api

import "testing"

// T2: the tunnel's response header allow-list, name by name: what clients
// read about the answer and their limits is relayed; what could set
// policy on the edge's origin, redirect, or shadow the edge's own headers
// is not (any case; a prefix match must still be a header name).
func TestRelayedHeaderAllowList(t *testing.T) {
	relayed := []string{
		"openai-processing-ms", "openai-version", "openai-organization", "openai-project",
		"OpenAI-Version", "Openai-Organization", "OPENAI-PROJECT",
		"request-id", "Request-Id", "retry-after-ms", "x-should-retry",
		"x-ratelimit-limit-requests", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-requests", "X-RateLimit-Limit-Tokens",
		"anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-tokens-reset",
	}
	notRelayed := []string{
		"Set-Cookie", "Set-Cookie2", "Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Location",
		"Content-Location", "Refresh", "Link", "Cache-Control", "Expires", "Vary", "ETag", "Age",
		"Strict-Transport-Security", "Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
		"Content-Length", "Content-Encoding", "Transfer-Encoding", "Connection", "Keep-Alive", "Trailer",
		"X-Request-Id", "Iop-Ignored-Fields", "Server", "Date", "Alt-Svc",
		"openai-beta", "openai-organization-x", "x-openai-project", "OpenAI-Processing", "openai",
		"x-ratelimit-", "x-ratelimit-a b", "x-ratelimit-a:b", "anthropic-ratelimit-\x00", "anthropic-beta",
		"", "request-id ", "x-iop-node",
	}
	for _, name := range relayed {
		if !relayedHeader(name) {
			t.Errorf("T2: %q is not relayed", name)
		}
	}
	for _, name := range notRelayed {
		if relayedHeader(name) {
			t.Errorf("T2: %q is relayed", name)
		}
	}
}
