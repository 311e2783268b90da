package config

import (
	"strings"
	"testing"
)

// attackConfig: gpu-a serves the configured groups (tiny by name, llama
// by a target glob, quiet by a glob nothing matches, so it is left without
// providers); discovery makes team-* groups of gpu-c (the first rule) and
// any group of gpu-b (the second rule, by "*", with an alias).
const attackConfig = `{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "nodes": [{"id": "gpu-a", "adapters": [{"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434"}]},
            {"id": "gpu-b", "adapters": [{"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434"},
                                         {"name": "other", "type": "ollama", "base_url": "http://127.0.0.1:11435"}]},
            {"id": "gpu-c", "adapters": [{"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434"}]}],
  "models": [
    {"name": "tiny", "providers": [{"node": "gpu-a", "provider": "ollama", "target": "tiny"}]},
    {"name": "llama", "providers": [{"node": "gpu-a", "provider": "ollama", "target": "llama3*"}]},
    {"name": "quiet", "providers": [{"node": "gpu-a", "provider": "ollama", "target": "quiet-*"}]}
  ],
  "model_discovery": [{"node": "gpu-c", "provider": "ollama", "match": "team-*"},
                      {"node": "gpu-b", "provider": "ollama", "match": "*", "aliases": {"mine": "b-mine"}}]
}`

// SPEC D2, attacked: gpu-b (its node or its backend, whatever they list)
// tries to join groups it is not configured for: a configured group's
// name in other spellings (":latest", case, spaces are dropped by the
// report's cleaning), a target glob's match ("llama3-evil" for llama,
// whose glob names only gpu-a), the name of a configured group left
// without providers (quiet), an alias's target ("b-mine", which its rule
// makes from "mine" only), a group an earlier rule makes for gpu-c
// (team-x), glob syntax ("*", "ti*") and another adapter's list. It makes
// its own groups only (a discovered group is named after the model, so a
// name that is not a configured group's is its own), and never becomes a
// provider of tiny, llama, quiet or team-x.
func TestD2DiscoveryJoinsNoGroupItIsNotConfiguredFor(t *testing.T) {
	c := mustParse(t, attackConfig)
	hostile := []string{"tiny", "tiny:latest", "Tiny", "TINY:latest", "llama", "llama:latest", "llama3-evil", "llama3:latest",
		"quiet", "quiet:latest", "quiet-1", "b-mine", "b-mine:latest", "team-x", "team-x:latest", "*", "ti*", "?iny", "tiny:latest:latest",
		"mine"}
	e := c.Effective(nil, nil, Discovered{
		"gpu-a": {"ollama": {"llama3-8b", "tiny"}},
		"gpu-b": {"ollama": hostile, "other": {"tiny", "team-x", "free"}},
		"gpu-c": {"ollama": {"team-x"}},
	})
	want := map[string][]route{
		"tiny":   {{"gpu-a", "ollama", "tiny"}},
		"llama":  {{"gpu-a", "ollama", "llama3-8b"}},
		"team-x": {{"gpu-c", "ollama", "team-x"}},
		// gpu-b's own groups: each named after its model (":latest"
		// dropped, "mine" by its alias), served by gpu-b alone.
		"Tiny": {{"gpu-b", "ollama", "Tiny"}}, "TINY": {{"gpu-b", "ollama", "TINY:latest"}},
		"llama3-evil": {{"gpu-b", "ollama", "llama3-evil"}}, "llama3": {{"gpu-b", "ollama", "llama3:latest"}},
		"quiet-1": {{"gpu-b", "ollama", "quiet-1"}}, "b-mine": {{"gpu-b", "ollama", "b-mine"}},
		"*": {{"gpu-b", "ollama", "*"}}, "ti*": {{"gpu-b", "ollama", "ti*"}}, "?iny": {{"gpu-b", "ollama", "?iny"}},
		"tiny:latest": {{"gpu-b", "ollama", "tiny:latest:latest"}},
	}
	got := map[string][]route{}
	for i := range e.Models {
		got[e.Models[i].Name] = routes(&e.Models[i])
	}
	for name, rs := range want {
		if g := got[name]; len(g) != len(rs) || len(g) > 0 && g[0] != rs[0] {
			t.Errorf("group %q: providers %v, want %v", name, g, rs)
		}
	}
	for name, rs := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("group %q made with %v", name, rs)
		}
	}
	if e.ModelByName("quiet") != nil {
		t.Error("quiet (configured, no provider left) was made by discovery")
	}
	// b-mine is the alias of "mine": the group holds one provider for gpu-b
	// whichever of "mine" and "b-mine" comes first.
	for _, m := range e.Models {
		for _, p := range m.Providers {
			if p.Node == "gpu-b" && (p.Provider != "ollama" || !strings.HasPrefix(m.Name, "") ||
				m.Name == "tiny" || m.Name == "llama" || m.Name == "team-x" || m.Name == "quiet") {
				t.Errorf("gpu-b/%s serves %q as %q", p.Provider, m.Name, p.Target)
			}
		}
	}
	t.Logf("D2: %d names from gpu-b's ollama, 3 from its other adapter", len(hostile))
}
