package backend

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// kind is what a model does with a request.
type kind uint8

const (
	kindText kind = iota // fixed answer
	kindTool             // fixed tool call when the request has tools, else the fixed answer
	kindLoop             // repeats words until the token limit
)

// model is one served model with the metadata /api/tags, /api/ps and
// /v1/models report (values follow the capture models).
type model struct {
	name      string // without tag, e.g. "tiny"
	kind      kind
	size      int64 // bytes on disk (/api/tags)
	psSize    int64 // bytes in memory (/api/ps)
	digest    string
	paramSize string
	modified  string // RFC 3339, /api/tags modified_at
}

// catalogue lists every model the stand-in knows, sorted by tagged name as
// /api/tags sorts them ("tiny-loop:latest" < "tiny-tool:latest" < "tiny:latest").
func catalogue() []model {
	return []model{
		{name: "tiny-loop", kind: kindLoop, size: 1814265, psSize: 5748704,
			digest:    "39c74706490fbe4c55ca66f8a7f8acfc6f6417d4ca10d92f99fe3b726844d1e2",
			paramSize: "449K", modified: "2026-11-29T11:21:46.563462647Z"},
		{name: "tiny-tool", kind: kindTool, size: 1810137, psSize: 5744576,
			digest:    "9a3fb2d380df67042c5513741af62240d2061d4745d2650294e5c004c4ee14ef",
			paramSize: "448K", modified: "2026-11-29T11:21:46.273486967Z"},
		{name: "tiny", kind: kindText, size: 1816345, psSize: 5750784,
			digest:    "e757dc4049fae658dfdf927088bc17403fddf343f3eb17e20644935f7d6f6312",
			paramSize: "450K", modified: "2026-11-29T11:21:45.974751058Z"},
	}
}

// The fixed answers, one entry per token, as the captures split them.
func answerTokens() []string {
	return []string{"Hello", " from", " tiny-gguf!", " This", " reply", " is", " deterministic."}
}

func loopTokens() []string { return []string{" lorem", " ipsum", " dolor", " sit", " amet,"} }

// The fixed tool call of tiny-tool. Argument spacing follows each server:
// llama-server's arguments string is {"city": "Paris"}; Ollama's native API
// and Anthropic's tool_use "input" carry the object, written compactly.
const (
	toolName           = "get_weather"
	toolArgsLlama      = `{"city": "Paris"}`
	toolArgsOllamaJSON = `{"city":"Paris"}`
	toolCallTokens     = 4 // completion tokens of the tool call, as captured
)

// DefaultLoopTokens is tiny-loop's token limit when the request sets none.
const DefaultLoopTokens = 64

// maxTokenLimit caps any requested limit (tokens).
const maxTokenLimit = 1 << 20

// finish is why generation ended.
type finish uint8

const (
	finishStop finish = iota
	finishLength
	finishTool
)

// plan is what one request will generate.
type plan struct {
	kind       kind     // kindTool only when the request carries tools
	tokens     []string // the text or loop tokens (shared, read-only)
	n          int      // content chunks to send (a tool call is one chunk)
	finish     finish
	completion int // completion tokens reported in usage
}

// script holds the read-only token tables a Backend plans from.
type script struct {
	answer      []string
	loop        []string
	loopDefault int // tiny-loop's limit when the request sets none (tokens)
}

// planFor decides the generation for model m; limit is the request's token
// limit (0 = none), tools whether it carries a non-empty tools array.
func (s *script) planFor(m *model, limit int, tools bool) plan {
	limit = min(limit, maxTokenLimit)
	switch {
	case m.kind == kindTool && tools:
		return plan{kind: kindTool, n: 1, finish: finishTool, completion: toolCallTokens}
	case m.kind == kindLoop:
		if limit <= 0 {
			limit = s.loopDefault
		}
		return plan{kind: kindLoop, tokens: s.loop, n: limit, finish: finishLength, completion: limit}
	case limit > 0 && limit <= len(s.answer):
		return plan{kind: kindText, tokens: s.answer, n: limit, finish: finishLength, completion: limit}
	default:
		// The answer plus its end-of-sequence token.
		return plan{kind: kindText, tokens: s.answer, n: len(s.answer), finish: finishStop, completion: len(s.answer) + 1}
	}
}

// token returns content token i of a text or loop plan.
func (p *plan) token(i int) string { return p.tokens[i%len(p.tokens)] }

// fault is the fault-injection suffix of a model name (see the package doc).
type fault struct {
	suffix      string        // as given, without the leading '+'; "" = none
	stall       int           // content tokens before the stall; -1 = none
	reset       int           // content tokens before the reset; -1 = none
	slowHeaders time.Duration // delay before the status line
	status      int           // forced HTTP status; 0 = none
}

// maxSlowHeaders bounds the slowheaders fault.
const maxSlowHeaders = 10 * time.Minute

// parseModelName splits "tiny:latest+stall=3" into the echoed base name
// "tiny:latest", the catalogue name "tiny" and the fault. It returns an error
// wrapping ErrBadFault when the suffix is malformed; the base is not looked
// up here.
func parseModelName(s string) (echo, name string, f fault, err error) {
	f = fault{stall: -1, reset: -1}
	echo, suffix, hasSuffix := strings.Cut(s, "+")
	f.suffix = suffix
	name = echo // a tag other than ":latest" stays on and never resolves
	if base, tag, ok := strings.Cut(echo, ":"); ok && tag == "latest" {
		name = base
	}
	for rest := suffix; hasSuffix; {
		var part string
		part, rest, hasSuffix = strings.Cut(rest, "+")
		key, val, ok := strings.Cut(part, "=")
		if !ok {
			return echo, name, f, fmt.Errorf("fault %q: want key=value: %w", part, ErrBadFault)
		}
		switch key {
		case "stall", "reset":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || n > maxTokenLimit {
				return echo, name, f, fmt.Errorf("fault %q: want a token count 0-%d: %w", part, maxTokenLimit, ErrBadFault)
			}
			if key == "stall" {
				f.stall = n
			} else {
				f.reset = n
			}
		case "slowheaders":
			d, err := time.ParseDuration(val)
			if err != nil || d < 0 || d > maxSlowHeaders {
				return echo, name, f, fmt.Errorf("fault %q: want a duration 0-%s: %w", part, maxSlowHeaders, ErrBadFault)
			}
			f.slowHeaders = d
		case "status":
			n, err := strconv.Atoi(val)
			if err != nil || n < 400 || n > 599 {
				return echo, name, f, fmt.Errorf("fault %q: want an HTTP status 400-599: %w", part, ErrBadFault)
			}
			f.status = n
		default:
			return echo, name, f, fmt.Errorf("fault %q: unknown kind (stall, reset, slowheaders, status): %w", part, ErrBadFault)
		}
	}
	return echo, name, f, nil
}
