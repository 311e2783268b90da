package ollama

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"iop/internal/node/adapter/upstream"
)

// ShowPath is Ollama's model-information endpoint: POST {"model"} → its
// "capabilities" ("completion", "tools", "thinking", …; Ollama docs/api.md
// "Show Model Information").
const ShowPath = "/api/show"

// thinkTTL is how long a target's thinking capability is trusted before it
// is asked again (a model can be re-pulled under the same name).
const thinkTTL = 10 * time.Minute

// maxThinkEntries bounds the cache: targets are the operator's config, but
// a bound costs nothing.
const maxThinkEntries = 256

// Capabilities caches, per target, whether an Ollama model can think. The
// node learns it from /api/show the first time a run asks for thinking,
// and again after thinkTTL; Ollama 0.17.4 answers "think" on a model that
// cannot think with a 400 ("%q does not support thinking",
// server/routes.go ChatHandler), and clients (Claude Code, Codex CLI)
// ask for thinking by default, so a run on such a model goes without
// think instead: the answer is the model's, without thinking, never a 400.
// One Capabilities serves every runner of an adapter instance;
// safe for concurrent use. The zero value is ready.
type Capabilities struct {
	mu      sync.Mutex
	entries map[string]thinkEntry
	now     func() time.Time // nil = time.Now
}

type thinkEntry struct {
	can    bool // the model thinks ("thinking" in its capabilities)
	levels bool // it takes "low", "medium", "high" besides true and false
	at     time.Time
}

func (c *Capabilities) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// known returns the cached capability of target; ok is false when there
// is none or it is older than thinkTTL.
func (c *Capabilities) known(target string) (e thinkEntry, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok = c.entries[target]
	if !ok || c.clock().Sub(e.at) > thinkTTL {
		return thinkEntry{}, false
	}
	return e, true
}

// set records target's capability: whether it thinks, and whether it
// takes levels.
func (c *Capabilities) set(target string, can, levels bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]thinkEntry{}
	}
	if _, ok := c.entries[target]; !ok && len(c.entries) >= maxThinkEntries {
		for k := range c.entries { // drop one: a bound, not a policy
			delete(c.entries, k)
			break
		}
	}
	c.entries[target] = thinkEntry{can: can, levels: levels, at: c.clock()}
}

// CanThink reports whether target can think and whether it takes a
// level ("low", "medium", "high") for think: the cached answer, else
// /api/show's capabilities and details.family (cached). Ollama 0.17.4
// takes a level only on a model its harmony parser reads — the gpt-oss
// family (server/routes.go ChatHandler, shouldUseHarmony) — and answers a
// level on any other model with a 400 (noLevels). ok is false when
// neither is known (Ollama unreachable, an older Ollama without
// "capabilities"): the caller then sends think and falls back on the 400s.
func (c *Capabilities) CanThink(ctx context.Context, ep *upstream.Endpoint, target string) (can, levels, ok bool) {
	if e, ok := c.known(target); ok {
		return e.can, e.levels, true
	}
	body, _ := json.Marshal(struct {
		Model string `json:"model"`
	}{target})
	resp, err := ep.PostJSON(ctx, ShowPath, body, "application/json")
	if err != nil {
		return false, false, false
	}
	defer resp.Body.Close()
	var show struct {
		Capabilities *[]string `json:"capabilities"`
		Details      struct {
			Family string `json:"family"`
		} `json:"details"`
	}
	// /api/show carries the model's template and license: bound the read.
	if json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&show) != nil || show.Capabilities == nil {
		return false, false, false
	}
	can = slices.Contains(*show.Capabilities, "thinking")
	levels = can && (show.Details.Family == "gptoss" || show.Details.Family == "gpt-oss")
	c.set(target, can, levels)
	return can, levels, true
}

// learnNoLevels records that target thinks but takes no level (Ollama
// refused one: noLevels).
func (c *Capabilities) learnNoLevels(target string) {
	c.set(target, true, false)
}

// noThinking reports whether err is Ollama's refusal of think on a model
// that cannot think (a 400 "… does not support thinking").
func noThinking(err error) bool {
	se, ok := err.(*upstream.StatusError)
	return ok && se.Status == http.StatusBadRequest && strings.Contains(se.Message, "does not support thinking")
}

// noLevels reports whether err is Ollama's refusal of a think level on a
// model that takes only true and false (a 400 `think value "high" is not
// supported for this model`, Ollama 0.17.4 server/routes.go ChatHandler).
func noLevels(err error) bool {
	se, ok := err.(*upstream.StatusError)
	return ok && se.Status == http.StatusBadRequest && strings.HasPrefix(se.Message, "think value ") &&
		strings.HasSuffix(se.Message, "is not supported for this model")
}

// isLevel reports whether think is a level rather than true or false.
func isLevel(think string) bool {
	return think == "low" || think == "medium" || think == "high"
}

// thinkJSON is RunInput.think as Ollama's "think" value (api.ThinkValue:
// a boolean or "low", "medium", "high"); nil for "" (the model's default).
// ok is false for any other value.
func thinkJSON(think string) (json.RawMessage, bool) {
	switch think {
	case "":
		return nil, true
	case "true", "false":
		return json.RawMessage(think), true
	case "low", "medium", "high":
		return json.RawMessage(`"` + think + `"`), true
	}
	return nil, false
}
