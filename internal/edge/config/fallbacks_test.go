package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/routing"
)

// fallbackConfig is valid with groups a, b, c, d, e (each served by the
// same provider) whose models[] entries carry the given extras, in order.
func fallbackConfig(extra ...string) string {
	var ms []string
	for i, n := range []string{"a", "b", "c", "d", "e"} {
		x := ""
		if i < len(extra) && extra[i] != "" {
			x = ", " + extra[i]
		}
		ms = append(ms, `{"name": "`+n+`"`+x+`, "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"}]}`)
	}
	return `{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "api_keys": [{"principal": "team-a", "key_sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}],
  "nodes": [{"id": "gpu-1", "adapters": [
    {"name": "ollama", "type": "ollama", "capacity": 4, "base_url": "http://127.0.0.1:11434"},
    {"name": "hosted", "type": "openai_compat", "location": "remote", "base_url": "https://api.openai.com", "api_key_env": "K"}
  ]}],
  "models": [` + strings.Join(ms, ",\n") + `]
}`
}

// TestFallbackConfig: models[].fallbacks, context_tokens, adapters'
// location and api_keys[].local_only parse, and a bad chain is refused at
// load naming its key path: an unknown group, the group itself, a bad
// condition, context without context_tokens, a bad wait_ms, no condition,
// a cycle, a chain deeper than 3 (SPEC V1, V3); the attempt bound of
// max_attempts 0 counts the providers of every group the chain reaches.
func TestFallbackConfig(t *testing.T) {
	c := mustParse(t, fallbackConfig(
		`"context_tokens": 4096, "fallbacks": [{"model": "b", "on": ["unavailable", "queue_full", "context"], "wait_ms": 200, "rename_model": "b-small", "inherit_scope": true}, {"model": "c", "on": ["unavailable"]}]`,
		`"fallbacks": [{"model": "c", "on": ["unavailable"]}]`,
		`"fallbacks": [{"model": "d", "on": ["unavailable"]}]`))
	f := c.Models[0].Fallbacks[0]
	if f.Model != "b" || len(f.On) != 3 || f.WaitMs != 200 || f.RenameModel != "b-small" || !f.InheritScope || c.Models[0].ContextTokens != 4096 {
		t.Errorf("V1 parsed %+v context_tokens %d", f, c.Models[0].ContextTokens)
	}
	if !c.Nodes[0].Adapters[1].Remote() || c.Nodes[0].Adapters[0].Remote() {
		t.Errorf("V3 hosted remote %v, ollama remote %v", c.Nodes[0].Adapters[1].Remote(), c.Nodes[0].Adapters[0].Remote())
	}
	if w := strings.Join(c.Warnings(), "\n"); strings.Contains(w, "fallbacks") {
		t.Errorf("V1 the edge acts on fallbacks, yet warns %q", w)
	}
	want := map[string]routing.FallbackGroup{
		"a": {ContextTokens: 4096, Rules: []routing.FallbackRule{
			{Model: "b", Unavailable: true, QueueFull: true, Context: true, Wait: 200 * time.Millisecond, RenameModel: "b-small", InheritScope: true},
			{Model: "c", Unavailable: true}}},
		"b": {Rules: []routing.FallbackRule{{Model: "c", Unavailable: true}}},
		"c": {Rules: []routing.FallbackRule{{Model: "d", Unavailable: true}}},
	}
	if got := c.FallbackGroups(); !reflect.DeepEqual(got, want) {
		t.Errorf("V1 FallbackGroups\n got %+v\nwant %+v", got, want)
	}
	// max_attempts 0: every provider once, of the group and of each group
	// its chain reaches (a → b, c; b → c; c → d), each group once.
	for i, want := range []int{4, 3, 2, 1, 1} {
		if got := c.AttemptBound(&c.Models[i]); got != want {
			t.Errorf("V1 AttemptBound(%s) = %d, want %d", c.Models[i].Name, got, want)
		}
	}
	c.Models[0].MaxAttempts = 2
	if got := c.AttemptBound(&c.Models[0]); got != 2 {
		t.Errorf("V1 AttemptBound with max_attempts 2 = %d", got)
	}
	rows := []struct {
		name  string
		extra []string
		want  string
	}{
		{"V1 unknown group", []string{`"fallbacks": [{"model": "zz", "on": ["unavailable"]}]`},
			`models[0].fallbacks[0].model: unknown model group "zz"`},
		{"V1 the group itself", []string{`"fallbacks": [{"model": "a", "on": ["unavailable"]}]`},
			`models[0].fallbacks[0].model: "a" is this group itself`},
		{"V1 bad condition", []string{`"fallbacks": [{"model": "b", "on": ["unavailable", "slow"]}]`},
			`models[0].fallbacks[0].on[1]: want "unavailable", "queue_full" or "context", got "slow"`},
		{"V1 context without context_tokens", []string{`"fallbacks": [{"model": "b", "on": ["context"]}]`},
			`models[0].fallbacks[0].on[0]: "context" needs models[0].context_tokens`},
		{"V1 negative wait_ms", []string{`"fallbacks": [{"model": "b", "wait_ms": -1}]`},
			`models[0].fallbacks[0].wait_ms: must be between 0 (never on wait) and queue.wait_timeout_ms (30000), got -1`},
		{"V1 no condition", []string{`"fallbacks": [{"model": "b"}]`},
			`models[0].fallbacks[0].on: at least one condition`},
		{"V1 listed twice", []string{`"fallbacks": [{"model": "b", "on": ["unavailable"]}, {"model": "b", "on": ["queue_full"]}]`},
			`models[0].fallbacks[1].model: "b" listed twice`},
		{"V1 negative context_tokens", []string{`"context_tokens": -1`},
			`models[0].context_tokens: must be ≥ 0 (0 = not known), got -1`},
		{"V1 cycle", []string{`"fallbacks": [{"model": "b", "on": ["unavailable"]}]`, `"fallbacks": [{"model": "c", "on": ["unavailable"]}]`, `"fallbacks": [{"model": "a", "on": ["queue_full"]}]`},
			`models[0].fallbacks: cycle a → b → c → a`},
		{"V1 deeper than 3", []string{`"fallbacks": [{"model": "b", "on": ["unavailable"]}]`, `"fallbacks": [{"model": "c", "on": ["unavailable"]}]`, `"fallbacks": [{"model": "d", "on": ["unavailable"]}]`, `"fallbacks": [{"model": "e", "on": ["unavailable"]}]`},
			`models[0].fallbacks: chain a → b → c → d → e is 4 deep, at most 3`},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			_, err := Parse([]byte(fallbackConfig(r.extra...)))
			if err == nil || !strings.Contains(err.Error(), r.want) {
				t.Fatalf("err %v, want it to say %q", err, r.want)
			}
		})
	}
	lo := strings.Replace(fallbackConfig(), `"principal": "team-a",`, `"principal": "team-a", "local_only": true,`, 1)
	if c := mustParse(t, lo); !c.APIKeys[0].LocalOnly {
		t.Errorf("V3 local_only not parsed")
	}
	bad := strings.Replace(fallbackConfig(), `"location": "remote"`, `"location": "cloud"`, 1)
	if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), `nodes[0].adapters[1].location: want "local" or "remote", got "cloud"`) {
		t.Errorf("V3 bad location: %v", err)
	}
}
