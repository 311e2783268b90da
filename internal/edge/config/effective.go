package config

import (
	"slices"
	"sort"
	"strings"

	"iop/internal/edge/routing"
)

// EnrolledNode is one node the enrollment store admits (SPEC J2, J7): its
// name and the lease recipient key it sent when it joined.
type EnrolledNode struct {
	ID                      string
	LeaseRecipientPublicKey string // base64 of 32 bytes, as in nodes[]
}

// Discovered is what the nodes' backends serve now (SPEC D1): node id →
// adapter name → model names (sorted, without duplicates).
type Discovered map[string]map[string][]string

// Effective returns the config the edge runs with: c with the enrolled
// nodes added, templates and globs expanded and discovered groups made
// (SPEC J7, D2). c is not changed; the result shares nothing mutable with
// it except adapter profile overrides (read-only). It is a pure function:
//
//   - Nodes: c's nodes whose names are not in revoked, then each enrolled
//     node, by name, that c does not list and a node template matches,
//     with that template's adapters and Enrolled set.
//   - Each model's providers: an entry whose node is a glob stands for
//     every node matching it (in the order above) that has the adapter;
//     one whose target is a glob takes, on each such node, the first
//     discovered model of that adapter matching it (by name), and stands
//     for nothing where none matches. A (node, provider) pair counts once
//     (the first entry wins). max_attempts is capped at the providers
//     left; a model left without providers is dropped.
//   - model_discovery: per rule, every model a matching (node, provider)
//     reports that the rule's glob matches becomes a provider of the group
//     named by the rule's alias for it, else the model's name without an
//     Ollama ":latest" tag. A name a configured model already has, or an
//     earlier rule made, is not made again (the first wins; later rules
//     add providers to their own groups only); one models[].name could
//     not have (empty, surrounding spaces) is not made at all. A (node,
//     provider) pair counts once per group (the first model by name).
//     Discovered groups follow the configured ones, by name.
func (c *Config) Effective(enrolled []EnrolledNode, revoked map[string]bool, disc Discovered) *Config {
	e := *c
	e.file = c
	e.Nodes = make([]Node, 0, len(c.Nodes)+len(enrolled))
	for _, n := range c.Nodes {
		if !revoked[n.ID] {
			e.Nodes = append(e.Nodes, n)
		}
	}
	sorted := append([]EnrolledNode(nil), enrolled...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for _, en := range sorted {
		t := c.TemplateFor(en.ID)
		if t == nil || c.NodeByID(en.ID) != nil || revoked[en.ID] {
			continue
		}
		e.Nodes = append(e.Nodes, Node{ID: en.ID, LeaseRecipientPublicKey: en.LeaseRecipientPublicKey,
			Adapters: append([]Adapter(nil), t.Adapters...), Enrolled: true})
	}

	e.Models = make([]Model, 0, len(c.Models))
	names := map[string]bool{}
	for _, m := range c.Models {
		names[m.Name] = true
		m.Providers = e.expandProviders(m.Providers, disc)
		if len(m.Providers) == 0 {
			continue
		}
		if m.MaxAttempts > len(m.Providers) {
			m.MaxAttempts = len(m.Providers)
		}
		e.Models = append(e.Models, m)
	}
	e.Models = append(e.Models, e.discoveredModels(names, disc)...)
	return &e
}

// expandProviders expands node and target globs (see Effective).
func (e *Config) expandProviders(in []ModelProvider, disc Discovered) []ModelProvider {
	out := make([]ModelProvider, 0, len(in))
	seen := map[[2]string]bool{}
	add := func(mp ModelProvider) {
		k := [2]string{mp.Node, mp.Provider}
		if !seen[k] {
			seen[k] = true
			out = append(out, mp)
		}
	}
	for _, mp := range in {
		for i := range e.Nodes {
			n := &e.Nodes[i]
			if !Matches(mp.Node, n.ID) || n.Adapter(mp.Provider) == nil {
				continue
			}
			one := mp
			one.Node = n.ID
			if IsPattern(mp.Target) {
				one.Target = firstMatch(mp.Target, disc[n.ID][mp.Provider])
				if one.Target == "" {
					continue
				}
			}
			add(one)
		}
	}
	return out
}

func firstMatch(glob string, models []string) string {
	for _, m := range models {
		if Matches(glob, m) {
			return m
		}
	}
	return ""
}

// discoveredModels makes model_discovery's groups (see Effective).
func (e *Config) discoveredModels(configured map[string]bool, disc Discovered) []Model {
	groups := map[string]*Model{}
	owner := map[string]int{} // group name → the rule that made it
	for ri, r := range e.ModelDiscovery {
		for i := range e.Nodes {
			n := &e.Nodes[i]
			if !Matches(r.Node, n.ID) || n.Adapter(r.Provider) == nil {
				continue
			}
			for _, model := range disc[n.ID][r.Provider] {
				if !Matches(r.Match, model) {
					continue
				}
				name := groupName(model, r.Aliases)
				if configured[name] || !validModelName(name) {
					continue
				}
				g := groups[name]
				if g == nil {
					eps := routing.DefaultEpsilon
					g = &Model{Name: name, Routing: r.Routing, AffinityEpsilon: &eps}
					groups[name] = g
					owner[name] = ri
				} else if owner[name] != ri || slices.ContainsFunc(g.Providers, func(p ModelProvider) bool {
					return p.Node == n.ID && p.Provider == r.Provider
				}) {
					continue // another rule's group, or a second name of this provider for it ("x", "x:latest")
				}
				g.Providers = append(g.Providers, ModelProvider{Node: n.ID, Provider: r.Provider, Target: model})
			}
		}
	}
	out := make([]Model, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// validModelName reports whether name may name a model group (models[].name,
// an alias, a discovered group): not empty, no surrounding white space.
func validModelName(name string) bool { return name != "" && strings.TrimSpace(name) == name }

// groupName is a discovered model's group name: its alias (by the model's
// own name, then without ":latest"), else the name without ":latest"
// (Ollama's default tag: a client asking for "llama3" means
// "llama3:latest" to Ollama too).
func groupName(model string, aliases map[string]string) string {
	bare := strings.TrimSuffix(model, ":latest")
	if a, ok := aliases[model]; ok {
		return a
	}
	if a, ok := aliases[bare]; ok {
		return a
	}
	return bare
}

// Discovers reports whether the edge wants discovery reports from adapter
// on node (SPEC D1): a model_discovery rule or a provider entry with a
// target glob names them.
func (c *Config) Discovers(node, adapter string) bool {
	if c.file != nil {
		c = c.file // the globs, before Effective expanded them
	}
	for _, r := range c.ModelDiscovery {
		if r.Provider == adapter && Matches(r.Node, node) {
			return true
		}
	}
	for _, m := range c.Models {
		for _, mp := range m.Providers {
			if mp.Provider == adapter && IsPattern(mp.Target) && Matches(mp.Node, node) {
				return true
			}
		}
	}
	return false
}
