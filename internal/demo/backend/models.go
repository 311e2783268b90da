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
	kindText  kind = iota // fixed answer
	kindTool              // fixed tool call when the request has tools, else the fixed answer
	kindLoop              // repeats words until the token limit
	kindThink             // thinks (fixed reasoning tokens), then the fixed answer (think.go)
	kindAgent             // calls the agent's shell tool, then answers with its output (agent.go)
)

// model is one served model with the metadata /api/tags, /api/ps and
// /v1/models report (values follow the capture models).
type model struct {
	name      string // without tag, e.g. "tiny"
	kind      kind
	think     bool  // /api/show lists the "thinking" capability
	size      int64 // bytes on disk (/api/tags)
	psSize    int64 // bytes in memory (/api/ps)
	digest    string
	paramSize string
	modified  string // RFC 3339, /api/tags modified_at
}

// catalogue lists every model the stand-in knows, sorted by tagged name as
// /api/tags sorts them ("tiny-agent:latest" < "tiny-loop:latest" <
// "tiny-think:latest" < "tiny-tool:latest" < "tiny:latest"). tiny-agent and
// tiny-think are served only when Options.Models names them (defaultModels
// are the three the captures hold).
func catalogue() []model {
	return []model{
		{name: "tiny-agent", kind: kindAgent, size: 1810137, psSize: 5744576,
			digest:    "5d1f0e2a7c3b9f8e6d4c2b1a09f8e7d6c5b4a3928170f6e5d4c3b2a19080f7e6",
			paramSize: "448K", modified: "2026-11-29T11:21:46.273486967Z"},
		{name: "tiny-loop", kind: kindLoop, size: 1814265, psSize: 5748704,
			digest:    "39c74706490fbe4c55ca66f8a7f8acfc6f6417d4ca10d92f99fe3b726844d1e2",
			paramSize: "449K", modified: "2026-11-29T11:21:46.563462647Z"},
		{name: "tiny-think", kind: kindThink, think: true, size: 1816345, psSize: 5750784,
			digest:    "b2c4d6e8f0a1b3c5d7e9f1a2b4c6d8e0f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2",
			paramSize: "450K", modified: "2026-11-29T11:21:45.974751058Z"},
		{name: "tiny-tool", kind: kindTool, size: 1810137, psSize: 5744576,
			digest:    "9a3fb2d380df67042c5513741af62240d2061d4745d2650294e5c004c4ee14ef",
			paramSize: "448K", modified: "2026-11-29T11:21:46.273486967Z"},
		{name: "tiny", kind: kindText, size: 1816345, psSize: 5750784,
			digest:    "e757dc4049fae658dfdf927088bc17403fddf343f3eb17e20644935f7d6f6312",
			paramSize: "450K", modified: "2026-11-29T11:21:45.974751058Z"},
	}
}

// defaultModels are the models served when Options.Models is empty.
var defaultModels = []string{"tiny", "tiny-tool", "tiny-loop"}

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
	tokens     []string // the text or loop tokens (shared, read-only; JSON-escaped)
	n          int      // chunks to send (a tool call is one chunk), thinking ones included
	finish     finish
	completion int // completion tokens reported in usage
	// think is how many of the first chunks are reasoning (thinkTokens;
	// tiny-think), sent before the text.
	think int
	// call, when set, is the tool call to make instead of the fixed
	// get_weather one (tiny-agent).
	call *toolCall
}

// script holds the read-only token tables a Backend plans from.
type script struct {
	answer      []string
	loop        []string
	loopDefault int // tiny-loop's limit when the request sets none (tokens)
	think       []string
}

// planFor decides the generation for model m; limit is the request's token
// limit (0 = none), tools whether it carries a non-empty tools array.
func (s *script) planFor(m *model, limit int, tools bool) plan {
	limit = min(limit, maxTokenLimit)
	switch {
	case m.kind == kindTool && tools:
		return plan{kind: kindTool, n: 1, finish: finishTool, completion: toolCallTokens}
	case m.kind == kindThink:
		think := len(s.think)
		return plan{kind: kindText, tokens: s.answer, n: think + len(s.answer), finish: finishStop,
			completion: think + len(s.answer) + 1, think: think}
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

// token returns the text of chunk i of a text or loop plan: "" for a
// reasoning chunk, else content token i-think.
func (p *plan) token(i int) string {
	if i < p.think {
		return ""
	}
	i -= p.think
	return p.tokens[i%len(p.tokens)]
}

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
