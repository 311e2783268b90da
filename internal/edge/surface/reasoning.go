package surface

import (
	"encoding/base64"
	"strings"
	"unicode/utf8"
)

// reasoningPrefix marks a reasoning carrier this Edge wrote (version 1).
const reasoningPrefix = "iop1."

// MaxReasoningBytes bounds the reasoning text one run may stream: an
// encoder holds all of it (a non-stream answer, the done events of a
// stream), so a node that sends without end fails the run (502) instead of
// growing the Edge's memory, as the answer's text is bounded.
const MaxReasoningBytes = 8 << 20

// EncodeReasoning returns the carrier of a run's reasoning text that the
// run path puts where clients keep opaque reasoning state and send it back
// on the next turn: a Messages thinking block's "signature" and a
// Responses reasoning item's "encrypted_content". It is "iop1." + the
// text in base64 (RFC 4648 §4, padded): not a signature and not
// encrypted — it proves nothing and hides nothing; the text is already in
// the same answer — but a client that keeps only that field (Claude Code
// with thinking.display "omitted", Codex CLI, which sends back only
// encrypted_content) round-trips its reasoning with it.
func EncodeReasoning(text string) string {
	return reasoningPrefix + base64.StdEncoding.EncodeToString([]byte(text))
}

// DecodeReasoning returns the text of a carrier EncodeReasoning wrote; ok
// is false for anything else (another provider's signature, a truncated or
// edited value), which the run path then ignores. A client-sent carrier is
// harmless by construction: it only ever yields text the client could have
// sent as the thinking itself, is bounded by the request body, and is
// never checked or trusted for anything.
func DecodeReasoning(s string) (string, bool) {
	rest, ok := strings.CutPrefix(s, reasoningPrefix)
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}
