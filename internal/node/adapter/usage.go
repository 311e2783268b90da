package adapter

import (
	"bytes"
	"strconv"
	"strings"

	"iop/internal/jsonscan"
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

// The counts of a usage object, as bits of usageJSON.has.
const (
	hasPrompt        = 1 << iota // prompt_tokens
	hasCompletion                // completion_tokens
	hasTotal                     // total_tokens
	hasInput                     // input_tokens
	hasOutput                    // output_tokens
	hasCacheRead                 // cache_read_input_tokens
	hasCacheCreation             // cache_creation_input_tokens
)

// usageKeys are the count members of a usage object, in the order of the
// has bits.
var usageKeys = [...]string{"prompt_tokens", "completion_tokens", "total_tokens", "input_tokens",
	"output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}

// usageJSON is one usage object: n[i] is the count named usageKeys[i]
// when bit i of has is set (absent or null otherwise). ok says the
// document had the object.
type usageJSON struct {
	ok  bool
	has uint8
	n   [len(usageKeys)]int64
}

// doc observes one JSON document. Only the members usage needs are read,
// by jsonscan, and nothing but them is decoded: at the top level type,
// usage, message, response, done, prompt_eval_count and eval_count, and
// usage inside message and response; the rest (a non-stream answer's
// choices and content) is stepped over, not decoded or checked (a whole
// encoding/json decode of a non-stream answer, most of it validating the
// body the client gets unchanged, cost several times the walk and 12 more
// allocations: BenchmarkUsageScanJSON). On invalid JSON the walk still ends, within b, and a usage it reads is
// whatever the members say. A member of another JSON type than expected,
// or a count that is not an integer, makes the document show no usage;
// null is absent; of a key given twice the last counts; keys match
// exactly (encoding/json matched them case-insensitively).
func (u *usageScanner) doc(b []byte) *iop.Usage {
	var (
		typ            []byte // raw, escapes intact
		usage, msg, rs usageJSON
		done           bool
		pEval, eval    int64
		hasEval        bool
	)
	ok := members(b, jsonscan.All(b), func(k []byte, v jsonscan.Span, kind byte) bool {
		switch {
		case jsonscan.KeyIs(k, "type"):
			typ = nil
			if kind == '"' {
				typ = b[v.Start+1 : v.End-1]
			}
			return kind == '"' || kind == 'n'
		case jsonscan.KeyIs(k, "usage"):
			return readUsage(b, v, kind, &usage)
		case jsonscan.KeyIs(k, "message"):
			return memberUsage(b, v, kind, &msg)
		case jsonscan.KeyIs(k, "response"):
			return memberUsage(b, v, kind, &rs)
		case jsonscan.KeyIs(k, "done"):
			done = kind == 't'
			return kind == 't' || kind == 'f' || kind == 'n'
		case jsonscan.KeyIs(k, "prompt_eval_count"):
			var ok bool
			pEval, _, ok = intMember(b, v, kind)
			return ok
		case jsonscan.KeyIs(k, "eval_count"):
			var ok bool
			eval, hasEval, ok = intMember(b, v, kind)
			return ok
		}
		return true
	})
	switch {
	case !ok:
		return nil
	case jsonscan.KeyIs(typ, "message_start"):
		if msg.ok {
			if in, ok := anthropicInput(&msg); ok {
				u.inToken, u.haveIn = in, true
			}
		}
		return nil
	case usage.ok && jsonscan.KeyIs(typ, "message_delta"):
		return normalizeUsage(&usage, u.inToken)
	case rs.ok:
		return normalizeUsage(&rs, 0)
	case usage.ok:
		return normalizeUsage(&usage, 0)
	case done && hasEval:
		return &iop.Usage{PromptTokens: pEval, CompletionTokens: eval, TotalTokens: pEval + eval}
	}
	return nil
}

// members calls f for each member of the object at v in b (valid JSON)
// with its raw key, value and jsonscan.Kind; false when v is not an object
// or f returned false.
func members(b []byte, v jsonscan.Span, f func(k []byte, v jsonscan.Span, kind byte) bool) bool {
	m, ok := jsonscan.NewMembers(b, v)
	if !ok {
		return false
	}
	for {
		k, v, ok := m.Next()
		if !ok {
			return true
		}
		if !f(k, v, jsonscan.Kind(b, v)) {
			return false
		}
	}
}

// readUsage reads the usage object at v into x (null: absent); false when
// v is neither an object nor null or a count is not an integer.
func readUsage(b []byte, v jsonscan.Span, kind byte, x *usageJSON) bool {
	*x = usageJSON{}
	if kind == 'n' {
		return true
	}
	x.ok = true
	return members(b, v, func(k []byte, v jsonscan.Span, kind byte) bool {
		for i, name := range usageKeys {
			if jsonscan.KeyIs(k, name) {
				n, set, ok := intMember(b, v, kind)
				x.n[i] = n
				if x.has &^= 1 << i; set {
					x.has |= 1 << i
				}
				return ok
			}
		}
		return true
	})
}

// memberUsage reads the "usage" member of the object at v (message,
// response) into x; null or no usage member: absent. False when v is
// neither an object nor null, or its usage is not a usage object.
func memberUsage(b []byte, v jsonscan.Span, kind byte, x *usageJSON) bool {
	*x = usageJSON{}
	if kind == 'n' {
		return true
	}
	return members(b, v, func(k []byte, v jsonscan.Span, kind byte) bool {
		if jsonscan.KeyIs(k, "usage") {
			return readUsage(b, v, kind, x)
		}
		return true
	})
}

// intMember is a count member's value: set is false for null; ok is false
// for another JSON type or a number that is not an int64.
func intMember(b []byte, v jsonscan.Span, kind byte) (n int64, set, ok bool) {
	switch kind {
	case 'n':
		return 0, false, true
	case '0':
		n, err := strconv.ParseInt(string(b[v.Start:v.End]), 10, 64)
		return n, err == nil, err == nil
	}
	return 0, false, false
}

// anthropicInput sums Anthropic's input token fields; ok is false when none
// is present.
func anthropicInput(x *usageJSON) (int64, bool) {
	var n int64
	ok := false
	for _, i := range [...]int{3, 5, 6} { // input_tokens, cache_read_input_tokens, cache_creation_input_tokens
		if x.has&(1<<i) != 0 {
			n += x.n[i]
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
	case x.has&hasPrompt != 0:
		u.PromptTokens = x.n[0]
	case ok:
		u.PromptTokens = in
	default:
		u.PromptTokens = inFallback
	}
	switch {
	case x.has&hasCompletion != 0:
		u.CompletionTokens = x.n[1]
	case x.has&hasOutput != 0:
		u.CompletionTokens = x.n[4]
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if x.has&hasTotal != 0 {
		u.TotalTokens = x.n[2]
	}
	return &u
}
