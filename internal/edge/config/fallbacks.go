package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"iop/internal/edge/routing"
)

// Fallbacks to other model groups and where a request's data may go
// (docs/config.md "Fallbacks", SPEC V1–V3): models[].fallbacks and
// context_tokens, adapters' location, api_keys[].local_only.

// Fallback conditions (models[].fallbacks[].on).
const (
	// OnUnavailable: the group has no live provider (for the key: none it
	// may use).
	OnUnavailable = "unavailable"
	// OnQueueFull: the group's queue has no room for the request.
	OnQueueFull = "queue_full"
	// OnContext: the request's estimated prompt tokens exceed the group's
	// context_tokens.
	OnContext = "context"
)

// Adapter locations (adapters[].location).
const (
	LocationLocal  = "local"
	LocationRemote = "remote"
)

// MaxFallbackDepth bounds a chain of fallbacks: at most this many hops from
// the group a client named (SPEC V1).
const MaxFallbackDepth = 3

// Fallback is one entry of models[].fallbacks: the group Model a request
// goes to when one of On holds, or when its predicted wait in this group's
// queue exceeds WaitMs (> 0).
type Fallback struct {
	Model string   `json:"model"`
	On    []string `json:"on"`
	// WaitMs: fall back when the wait this group's queue and measured
	// service times predict exceeds this many ms; 0 = never on wait.
	WaitMs int64 `json:"wait_ms"`
	// RenameModel is the response's model when this fallback served it;
	// empty = the name the client asked for.
	RenameModel string `json:"rename_model"`
	// InheritScope lets a key scoped to this group reach Model through
	// this entry without Model in its scope.
	InheritScope bool `json:"inherit_scope"`
}

// Remote reports whether the adapter sends data off site (location
// "remote"); a nil adapter is not.
func (a *Adapter) Remote() bool { return a != nil && a.Location == LocationRemote }

// RouteRemote reports whether route mp sends a request's data off site
// (SPEC V3): its adapter's location is remote, or the config does not know
// its node or adapter (a local-only key fails closed).
func (c *Config) RouteRemote(mp ModelProvider) bool {
	n := c.NodeByID(mp.Node)
	if n == nil || n.Adapter(mp.Provider) == nil {
		return true
	}
	return n.Adapter(mp.Provider).Remote()
}

// ServesLocally reports whether group m has a route that is not remote:
// the groups a local-only key can reach (SPEC V3; its /v1/models list).
func (c *Config) ServesLocally(m *Model) bool {
	for _, mp := range m.Providers {
		if !c.RouteRemote(mp) {
			return true
		}
	}
	return false
}

// validateFallbacks checks adapters' location and every group's fallbacks:
// known groups, conditions, wait_ms, no cycle, depth at most
// MaxFallbackDepth, each error naming its key path.
func (c *Config) validateFallbacks(add func(string, string, ...any)) {
	checkLoc := func(p string, as []Adapter) {
		for j, a := range as {
			if a.Location != "" && a.Location != LocationLocal && a.Location != LocationRemote {
				add(fmt.Sprintf("%s.adapters[%d].location", p, j), "want %q or %q, got %q", LocationLocal, LocationRemote, a.Location)
			}
		}
	}
	for i, n := range c.Nodes {
		checkLoc(fmt.Sprintf("nodes[%d]", i), n.Adapters)
	}
	for i, n := range c.NodeTemplates {
		checkLoc(fmt.Sprintf("node_templates[%d]", i), n.Adapters)
	}
	index := map[string]int{}
	for i, m := range c.Models {
		if _, dup := index[m.Name]; !dup {
			index[m.Name] = i
		}
	}
	for i, m := range c.Models {
		p := fmt.Sprintf("models[%d]", i)
		if m.ContextTokens < 0 {
			add(p+".context_tokens", "must be ≥ 0 (0 = not known), got %d", m.ContextTokens)
		}
		seen := map[string]bool{}
		for j, f := range m.Fallbacks {
			fp := fmt.Sprintf("%s.fallbacks[%d]", p, j)
			switch _, known := index[f.Model]; {
			case f.Model == "":
				add(fp+".model", "required (the name of another models[] group)")
			case f.Model == m.Name:
				add(fp+".model", "%q is this group itself", f.Model)
			case !known:
				add(fp+".model", "unknown model group %q (fallbacks name groups of models[])", f.Model)
			case seen[f.Model]:
				add(fp+".model", "%q listed twice", f.Model)
			}
			seen[f.Model] = true
			for k, on := range f.On {
				switch on {
				case OnUnavailable, OnQueueFull:
				case OnContext:
					if m.ContextTokens == 0 {
						add(fmt.Sprintf("%s.on[%d]", fp, k), "%q needs %s.context_tokens", on, p)
					}
				default:
					add(fmt.Sprintf("%s.on[%d]", fp, k), "want %q, %q or %q, got %q", OnUnavailable, OnQueueFull, OnContext, on)
				}
			}
			if f.WaitMs < 0 || (c.Queue.WaitTimeoutMs > 0 && f.WaitMs > c.Queue.WaitTimeoutMs) {
				add(fp+".wait_ms", "must be between 0 (never on wait) and queue.wait_timeout_ms (%d), got %d", c.Queue.WaitTimeoutMs, f.WaitMs)
			}
			if len(f.On) == 0 && f.WaitMs == 0 {
				add(fp+".on", "at least one condition (%q, %q, %q) or wait_ms is required", OnUnavailable, OnQueueFull, OnContext)
			}
			if f.RenameModel != "" && !validModelName(f.RenameModel) {
				add(fp+".rename_model", "without surrounding spaces, got %q", f.RenameModel)
			}
		}
	}
	// Cycles and depth, over the known edges only (the unknown ones are
	// reported above).
	memo := map[string][]string{}
	for i, m := range c.Models {
		if path := c.fallbackCycle(index, m.Name); path != nil {
			if path[0] == m.Name { // report each cycle once, at its first group
				add(fmt.Sprintf("models[%d].fallbacks", i), "cycle %s", strings.Join(path, " → "))
			}
			continue
		}
		if d, path := c.fallbackDepth(index, m.Name, memo); d > MaxFallbackDepth {
			add(fmt.Sprintf("models[%d].fallbacks", i), "chain %s is %d deep, at most %d", strings.Join(path, " → "), d, MaxFallbackDepth)
		}
	}
}

// FallbackGroups are the groups' fallbacks as routing.DecideFallback takes
// them (SPEC V1), by group name; nil when no group has one.
func (c *Config) FallbackGroups() map[string]routing.FallbackGroup {
	var out map[string]routing.FallbackGroup
	for _, m := range c.Models {
		if len(m.Fallbacks) == 0 {
			continue
		}
		g := routing.FallbackGroup{ContextTokens: m.ContextTokens}
		for _, f := range m.Fallbacks {
			r := routing.FallbackRule{Model: f.Model, Wait: time.Duration(f.WaitMs) * time.Millisecond,
				RenameModel: f.RenameModel, InheritScope: f.InheritScope}
			for _, on := range f.On {
				switch on {
				case OnUnavailable:
					r.Unavailable = true
				case OnQueueFull:
					r.QueueFull = true
				case OnContext:
					r.Context = true
				}
			}
			g.Rules = append(g.Rules, r)
		}
		if out == nil {
			out = map[string]routing.FallbackGroup{}
		}
		out[m.Name] = g
	}
	return out
}

// fallbackCycle is a cycle reachable from name through fallbacks, starting
// and ending at its smallest-index group, or nil.
func (c *Config) fallbackCycle(index map[string]int, name string) []string {
	var stack []string
	on := map[string]bool{}
	done := map[string]bool{}
	var walk func(n string) []string
	walk = func(n string) []string {
		if on[n] {
			i := slices.Index(stack, n)
			cyc := append([]string(nil), stack[i:]...)
			// Rotate to the group listed first in models[].
			min := 0
			for k := range cyc {
				if index[cyc[k]] < index[cyc[min]] {
					min = k
				}
			}
			cyc = append(cyc[min:], cyc[:min]...)
			return append(cyc, cyc[0])
		}
		if done[n] {
			return nil
		}
		on[n] = true
		stack = append(stack, n)
		for _, f := range c.Models[index[n]].Fallbacks {
			if _, ok := index[f.Model]; ok && f.Model != n {
				if cyc := walk(f.Model); cyc != nil {
					return cyc
				}
			}
		}
		stack = stack[:len(stack)-1]
		on[n] = false
		done[n] = true
		return nil
	}
	return walk(name)
}

// fallbackDepth is the longest chain of hops from name (acyclic) and its
// path, memoized in memo (each group's chain is computed once).
func (c *Config) fallbackDepth(index map[string]int, name string, memo map[string][]string) (int, []string) {
	if p, ok := memo[name]; ok {
		return len(p) - 1, p
	}
	best := []string{name}
	for _, f := range c.Models[index[name]].Fallbacks {
		if _, ok := index[f.Model]; !ok || f.Model == name {
			continue
		}
		if d, path := c.fallbackDepth(index, f.Model, memo); d+1 > len(best)-1 {
			best = append([]string{name}, path...)
		}
	}
	memo[name] = best
	return len(best) - 1, best
}
