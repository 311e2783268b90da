package adapter

import (
	"bytes"
	"encoding/json"
	"strings"

	iop "iop/proto/gen/iop"
)

// Bounds of the usage scanner, in bytes.
const (
	maxUsageLine = 256 << 10 // longer lines are skipped
	maxUsageBody = 1 << 20   // larger JSON bodies are not inspected
)

type scanMode uint8

const (
	scanNone  scanMode = iota
	scanLines          // SSE or NDJSON: one JSON document per line
	scanJSON           // one JSON document for the whole body
)

// usageScanner observes token usage in a tunnel's body without touching it
// (SPEC T2): it is fed the same bytes the BODY frames carry. It understands
//   - OpenAI chat completions: a "usage" object (the include_usage chunk of
//     a stream, or the non-stream body);
//   - OpenAI responses: "response.usage" of response.completed;
//   - Anthropic messages: input tokens of message_start, completed by
//     message_delta's usage (input tokens = input_tokens plus
//     cache_read_input_tokens plus cache_creation_input_tokens), or the
//     non-stream body's "usage";
//   - Ollama native: prompt_eval_count / eval_count of the done line.
//
// Lines are split at "\n" (a stream using bare "\r" line endings shows no
// usage). Lines without a "usage" object or "eval_count" number are skipped
// without decoding, so a plain stream costs no allocations.
type usageScanner struct {
	mode    scanMode
	carry   []byte // incomplete line, or the JSON body so far
	skip    bool   // the current line or body is over its bound
	inToken int64  // Anthropic message_start input tokens
	haveIn  bool
}

// newUsageScanner picks a mode from the response's status and Content-Type;
// non-2xx answers are not inspected.
func newUsageScanner(status int, contentType string) usageScanner {
	if status < 200 || status > 299 {
		return usageScanner{}
	}
	ct := strings.ToLower(strings.TrimSpace(contentType))
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = strings.TrimSpace(ct[:i])
	}
	switch {
	case ct == "text/event-stream", ct == "application/x-ndjson", ct == "application/jsonl",
		ct == "application/x-jsonlines", ct == "application/json-seq":
		return usageScanner{mode: scanLines}
	case ct == "application/json", strings.HasSuffix(ct, "+json"):
		return usageScanner{mode: scanJSON}
	}
	return usageScanner{}
}

// feed observes b, the next bytes of the body, and returns the last usage
// completed by them, or nil.
func (u *usageScanner) feed(b []byte) *iop.Usage {
	switch u.mode {
	case scanJSON:
		if !u.skip {
			if len(u.carry)+len(b) > maxUsageBody {
				u.skip, u.carry = true, nil
			} else {
				u.carry = append(u.carry, b...)
			}
		}
		return nil
	case scanLines:
	default:
		return nil
	}
	var last *iop.Usage
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !u.skip {
				if len(u.carry)+len(b) > maxUsageLine {
					u.skip, u.carry = true, u.carry[:0]
				} else {
					u.carry = append(u.carry, b...)
				}
			}
			return last
		}
		seg := b[:i]
		b = b[i+1:]
		if u.skip {
			u.skip = false
			continue
		}
		line := seg
		if len(u.carry) > 0 {
			u.carry = append(u.carry, seg...)
			line = u.carry
		}
		if x := u.line(line); x != nil {
			last = x
		}
		u.carry = u.carry[:0]
	}
	return last
}

// finish observes what is left at the end of the body.
func (u *usageScanner) finish() *iop.Usage {
	defer func() { u.carry = nil }()
	switch {
	case u.skip || len(u.carry) == 0:
		return nil
	case u.mode == scanJSON:
		if !hasUsage(u.carry) {
			return nil
		}
		return u.doc(u.carry)
	case u.mode == scanLines:
		return u.line(u.carry)
	}
	return nil
}

// line observes one SSE or NDJSON line.
func (u *usageScanner) line(l []byte) *iop.Usage {
	l = bytes.TrimSpace(l)
	if bytes.HasPrefix(l, []byte("data:")) {
		l = bytes.TrimSpace(l[5:])
	}
	if len(l) == 0 || l[0] != '{' || !hasUsage(l) {
		return nil
	}
	return u.doc(l)
}

// hasUsage is a cheap pre-check: does b hold a "usage" key with an object
// value, or an "eval_count" key with a number? ("usage": null is common in
// every chunk of an include_usage stream and must not cost a decode.)
func hasUsage(b []byte) bool {
	return keyThen(b, []byte(`"usage"`), func(c byte) bool { return c == '{' }) ||
		keyThen(b, []byte(`"eval_count"`), func(c byte) bool { return c >= '0' && c <= '9' })
}

// keyThen reports whether some occurrence of key in b is followed by
// optional spaces, ':', optional spaces and a byte accepted by first.
func keyThen(b, key []byte, first func(byte) bool) bool {
	for {
		i := bytes.Index(b, key)
		if i < 0 {
			return false
		}
		b = b[i+len(key):]
		j := skipSpace(b, 0)
		if j < len(b) && b[j] == ':' {
			j = skipSpace(b, j+1)
			if j < len(b) && first(b[j]) {
				return true
			}
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

type usageJSON struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	TotalTokens      *int64 `json:"total_tokens"`
	InputTokens      *int64 `json:"input_tokens"`
	OutputTokens     *int64 `json:"output_tokens"`
	CacheRead        *int64 `json:"cache_read_input_tokens"`
	CacheCreation    *int64 `json:"cache_creation_input_tokens"`
}

type usageDoc struct {
	Type    string     `json:"type"`
	Usage   *usageJSON `json:"usage"`
	Message *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
	Response *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"response"`
	Done            bool   `json:"done"`
	PromptEvalCount *int64 `json:"prompt_eval_count"`
	EvalCount       *int64 `json:"eval_count"`
}

// doc observes one JSON document.
func (u *usageScanner) doc(b []byte) *iop.Usage {
	var d usageDoc
	if json.Unmarshal(b, &d) != nil {
		return nil
	}
	switch {
	case d.Type == "message_start":
		if d.Message != nil && d.Message.Usage != nil {
			if in, ok := anthropicInput(d.Message.Usage); ok {
				u.inToken, u.haveIn = in, true
			}
		}
		return nil
	case d.Type == "message_delta" && d.Usage != nil:
		return normalizeUsage(d.Usage, u.inToken)
	case d.Response != nil && d.Response.Usage != nil:
		return normalizeUsage(d.Response.Usage, 0)
	case d.Usage != nil:
		return normalizeUsage(d.Usage, 0)
	case d.Done && d.EvalCount != nil:
		p := int64(0)
		if d.PromptEvalCount != nil {
			p = *d.PromptEvalCount
		}
		return &iop.Usage{PromptTokens: p, CompletionTokens: *d.EvalCount, TotalTokens: p + *d.EvalCount}
	}
	return nil
}

// anthropicInput sums Anthropic's input token fields; ok is false when none
// is present.
func anthropicInput(x *usageJSON) (int64, bool) {
	var n int64
	ok := false
	for _, p := range []*int64{x.InputTokens, x.CacheRead, x.CacheCreation} {
		if p != nil {
			n += *p
			ok = true
		}
	}
	return n, ok
}

// normalizeUsage maps OpenAI (prompt/completion) or Anthropic/responses
// (input/output) names to Usage; prompt falls back to inFallback when the
// document has no input count.
func normalizeUsage(x *usageJSON, inFallback int64) *iop.Usage {
	var u iop.Usage
	switch in, ok := anthropicInput(x); {
	case x.PromptTokens != nil:
		u.PromptTokens = *x.PromptTokens
	case ok:
		u.PromptTokens = in
	default:
		u.PromptTokens = inFallback
	}
	switch {
	case x.CompletionTokens != nil:
		u.CompletionTokens = *x.CompletionTokens
	case x.OutputTokens != nil:
		u.CompletionTokens = *x.OutputTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if x.TotalTokens != nil {
		u.TotalTokens = *x.TotalTokens
	}
	return &u
}
