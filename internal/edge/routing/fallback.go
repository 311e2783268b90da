package routing

import (
	"slices"
	"time"
)

// Fallbacks to other model groups (SPEC V1–V3): the pure decision of which
// group serves a request the group it names cannot serve. The caller
// (the edge's exchange) supplies each group's state as the pool sees it
// at the moment of the decision; nothing here waits.

// FallbackReason is why a request left a group: the condition of the
// fallback entry that matched (models[].fallbacks[].on, or wait_ms).
type FallbackReason string

// The reasons, in the order a group's state is checked against an entry.
const (
	ReasonUnavailable FallbackReason = "unavailable"
	ReasonQueueFull   FallbackReason = "queue_full"
	ReasonContext     FallbackReason = "context"
	ReasonWait        FallbackReason = "wait_ms"
)

// MaxFallbackHops bounds a chain: at most this many hops from the group
// the client named (config.MaxFallbackDepth; the config refuses deeper
// chains at load, and the decision never goes further either).
const MaxFallbackHops = 3

// FallbackRule is one entry of a group's models[].fallbacks.
type FallbackRule struct {
	Model        string
	Unavailable  bool // on: unavailable
	QueueFull    bool // on: queue_full
	Context      bool // on: context
	Wait         time.Duration
	RenameModel  string
	InheritScope bool
}

// FallbackGroup is one group's fallback configuration.
type FallbackGroup struct {
	// ContextTokens is the group's context window (0 = not known: the
	// context condition never holds).
	ContextTokens int
	Rules         []FallbackRule
}

// GroupState is one group at the moment of a decision, for the asking key.
type GroupState struct {
	// Unavailable: no live provider the key may use (for a local-only key,
	// no live local one: SPEC V3).
	Unavailable bool
	// QueueFull: the group's queue has no room for the request.
	QueueFull bool
	// PredictedWait is how long the request would wait for a slot, from
	// the group's queue and its measured service times (0 = a slot is
	// free).
	PredictedWait time.Duration
}

// FallbackRequest is what the decision needs of a request.
type FallbackRequest struct {
	// Model is the group the client named.
	Model string
	// PromptTokens is the request's estimated prompt tokens.
	PromptTokens int
	// InScope reports whether the key's model scope admits a group; nil
	// admits every group.
	InScope func(group string) bool
	// Left lists the groups the request was admitted to and can no longer
	// be served by (SPEC V1: after its admission none of the providers it
	// may still use is live, or it tried them all): their state is
	// unavailable whatever state says (state is not asked), so the
	// decision never takes the request to one of them again but may go
	// on through its chain. Empty on arrival.
	Left []string
}

// FallbackDecision is where a request goes.
type FallbackDecision struct {
	// Group serves the request; Group == the request's Model when no
	// fallback is taken.
	Group string
	// Reason is why the request left the group it named (empty when it
	// did not).
	Reason FallbackReason
	// ResponseModel is the response's model: the name the client asked for
	// unless a rename_model on the path says otherwise (the last one set
	// wins).
	ResponseModel string
	// Hops is the number of fallbacks taken (0–MaxFallbackHops).
	Hops int
}

// usable reports whether a group in state s can take the request at all
// (a long predicted wait still serves it).
func usable(g FallbackGroup, s GroupState, promptTokens int) bool {
	return !s.Unavailable && !s.QueueFull && !(g.ContextTokens > 0 && promptTokens > g.ContextTokens)
}

// match is the reason rule r applies to a group in state s, or "".
func match(r FallbackRule, g FallbackGroup, s GroupState, promptTokens int) FallbackReason {
	switch {
	case r.Unavailable && s.Unavailable:
		return ReasonUnavailable
	case r.QueueFull && s.QueueFull:
		return ReasonQueueFull
	case r.Context && g.ContextTokens > 0 && promptTokens > g.ContextTokens:
		return ReasonContext
	case r.Wait > 0 && !s.Unavailable && s.PredictedWait > r.Wait:
		return ReasonWait
	}
	return ""
}

// DecideFallback picks the group that serves req (SPEC V1, V2): starting
// at the group the client named, the first of its fallbacks, in order,
// whose condition holds and whose target is reachable (in the key's scope,
// or every entry on the way has inherit_scope; never a group already on
// the way; at most MaxFallbackHops); a target that cannot take the
// request itself goes on through its own fallbacks, depth first. With no
// fallback that leads to a group that can take it, the decision is the
// named group (its normal error or wait). groups lacks a group = no
// fallbacks; state is asked only about groups the decision visits. A
// request that can no longer be served where it was admitted is decided
// again from the group it named, with req.Left: the same walk, those
// groups unavailable and never its end.
func DecideFallback(groups map[string]FallbackGroup, state func(group string) GroupState, req FallbackRequest) FallbackDecision {
	visited := map[string]bool{req.Model: true}
	var walk func(from string, hops int, inherit bool) (FallbackDecision, bool)
	walk = func(from string, hops int, inherit bool) (FallbackDecision, bool) {
		g := groups[from]
		s := GroupState{Unavailable: true}
		if !slices.Contains(req.Left, from) {
			s = state(from)
		}
		for _, r := range g.Rules {
			reason := match(r, g, s, req.PromptTokens)
			if reason == "" || visited[r.Model] || hops+1 > MaxFallbackHops {
				continue
			}
			inh := inherit && r.InheritScope
			if !inh && req.InScope != nil && !req.InScope(r.Model) {
				continue
			}
			visited[r.Model] = true
			if d, ok := walk(r.Model, hops+1, inh); ok {
				if hops == 0 {
					d.Reason = reason
				}
				if d.ResponseModel == "" {
					d.ResponseModel = r.RenameModel
				}
				d.Hops++
				return d, true
			}
		}
		if hops > 0 && usable(g, s, req.PromptTokens) {
			return FallbackDecision{Group: from}, true
		}
		return FallbackDecision{}, false
	}
	d, ok := walk(req.Model, 0, true)
	if !ok {
		return FallbackDecision{Group: req.Model, ResponseModel: req.Model}
	}
	if d.ResponseModel == "" {
		d.ResponseModel = req.Model
	}
	return d
}
