package pool

// EstimatePromptTokens estimates a request's prompt size in tokens from the
// size in bytes of its JSON request body: ceil(bodyBytes / 4), 0 for a
// non-positive size (SPEC Q7).
//
// Four bytes per token is the usual rule of thumb for English text under
// BPE tokenizers (OpenAI's tokenizer guidance: one token ≈ 4 characters).
// Counting the whole body, JSON keys and escaping included, errs on the
// high side, so a borderline request is treated as long and held against
// long capacity rather than overloading a backend's context.
func EstimatePromptTokens(bodyBytes int) int {
	if bodyBytes <= 0 {
		return 0
	}
	return (bodyBytes + 3) / 4
}
