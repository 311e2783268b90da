package routing

import (
	"testing"
	"time"
)

// TestDecideFallback: each condition sends a request down its group's
// chain, in order, only when it holds; a target that cannot take the
// request goes on through its own chain; never more than 3 hops, never a
// group twice; a local-only key's state (no live local provider) never
// reaches a group served only remotely; a key's scope is checked on every
// group a fallback reaches unless each entry on the way inherits it
// (SPEC V1, V2, V3); decided again after admission (Left), the groups the
// request left are unavailable and never its end, within the same hops
// and scope from the group named.
func TestDecideFallback(t *testing.T) {
	ms := time.Millisecond
	groups := map[string]FallbackGroup{
		"big": {ContextTokens: 8000, Rules: []FallbackRule{
			{Model: "small", Unavailable: true, QueueFull: true, Wait: 200 * ms},
			{Model: "long", Context: true},
			{Model: "hosted", Unavailable: true, QueueFull: true},
		}},
		"small":  {Rules: []FallbackRule{{Model: "hosted", Unavailable: true, RenameModel: "gpt"}}},
		"long":   {},
		"hosted": {},
		// A chain of four hops (the config refuses it; the decision stops
		// at three anyway) and a cycle.
		"c0": {Rules: []FallbackRule{{Model: "c1", Unavailable: true}}},
		"c1": {Rules: []FallbackRule{{Model: "c2", Unavailable: true}}},
		"c2": {Rules: []FallbackRule{{Model: "c3", Unavailable: true}}},
		"c3": {Rules: []FallbackRule{{Model: "c4", Unavailable: true}}},
		"c4": {},
		"x":  {Rules: []FallbackRule{{Model: "y", Unavailable: true}}},
		"y":  {Rules: []FallbackRule{{Model: "x", Unavailable: true}, {Model: "z", Unavailable: true}}},
		"z":  {},
		// Scope: big2 → small2 inherits, small2 → hosted2 does not.
		"big2":    {Rules: []FallbackRule{{Model: "small2", Unavailable: true, InheritScope: true}}},
		"small2":  {Rules: []FallbackRule{{Model: "hosted2", Unavailable: true, InheritScope: false}}},
		"hosted2": {},
	}
	down := GroupState{Unavailable: true}
	full := GroupState{QueueFull: true}
	only := func(names ...string) func(string) bool {
		return func(g string) bool {
			for _, n := range names {
				if n == g {
					return true
				}
			}
			return false
		}
	}
	rows := []struct {
		name   string
		req    FallbackRequest
		states map[string]GroupState
		want   FallbackDecision
	}{
		{"V1 a group that can serve keeps its request", FallbackRequest{Model: "big"}, nil,
			FallbackDecision{Group: "big", ResponseModel: "big"}},
		{"V1 unavailable", FallbackRequest{Model: "big"}, map[string]GroupState{"big": down},
			FallbackDecision{Group: "small", Reason: ReasonUnavailable, ResponseModel: "big", Hops: 1}},
		{"V1 queue_full", FallbackRequest{Model: "big"}, map[string]GroupState{"big": full},
			FallbackDecision{Group: "small", Reason: ReasonQueueFull, ResponseModel: "big", Hops: 1}},
		{"V1 predicted wait above wait_ms", FallbackRequest{Model: "big"}, map[string]GroupState{"big": {PredictedWait: 201 * ms}},
			FallbackDecision{Group: "small", Reason: ReasonWait, ResponseModel: "big", Hops: 1}},
		{"V1 predicted wait at wait_ms stays", FallbackRequest{Model: "big"}, map[string]GroupState{"big": {PredictedWait: 200 * ms}},
			FallbackDecision{Group: "big", ResponseModel: "big"}},
		{"V1 context above context_tokens", FallbackRequest{Model: "big", PromptTokens: 8001}, nil,
			FallbackDecision{Group: "long", Reason: ReasonContext, ResponseModel: "big", Hops: 1}},
		{"V1 context at context_tokens stays", FallbackRequest{Model: "big", PromptTokens: 8000}, nil,
			FallbackDecision{Group: "big", ResponseModel: "big"}},
		{"V1 the first entry's target cannot take it: the next entry", FallbackRequest{Model: "big"}, map[string]GroupState{"big": full, "small": full},
			FallbackDecision{Group: "hosted", Reason: ReasonQueueFull, ResponseModel: "big", Hops: 1}},
		{"V1 through the target's own chain, rename_model of the last hop", FallbackRequest{Model: "big"}, map[string]GroupState{"big": down, "small": down},
			FallbackDecision{Group: "hosted", Reason: ReasonUnavailable, ResponseModel: "gpt", Hops: 2}},
		{"V1 nothing can take it: the named group's own error", FallbackRequest{Model: "big"}, map[string]GroupState{"big": down, "small": down, "hosted": down},
			FallbackDecision{Group: "big", ResponseModel: "big"}},
		{"V1 at most 3 hops", FallbackRequest{Model: "c0"}, map[string]GroupState{"c0": down, "c1": down, "c2": down, "c3": down},
			FallbackDecision{Group: "c0", ResponseModel: "c0"}},
		{"V1 3 hops", FallbackRequest{Model: "c0"}, map[string]GroupState{"c0": down, "c1": down, "c2": down},
			FallbackDecision{Group: "c3", Reason: ReasonUnavailable, ResponseModel: "c0", Hops: 3}},
		{"V1 no group twice", FallbackRequest{Model: "x"}, map[string]GroupState{"x": down, "y": down},
			FallbackDecision{Group: "z", Reason: ReasonUnavailable, ResponseModel: "x", Hops: 2}},
		// A local-only key: the caller reports hosted (remote providers
		// only) unavailable for it.
		{"V3 local-only key never reaches a remote-only group", FallbackRequest{Model: "big"}, map[string]GroupState{"big": full, "small": full, "hosted": down},
			FallbackDecision{Group: "big", ResponseModel: "big"}},
		{"V2 out of scope is skipped", FallbackRequest{Model: "big", InScope: only("big", "hosted")}, map[string]GroupState{"big": down},
			FallbackDecision{Group: "hosted", Reason: ReasonUnavailable, ResponseModel: "big", Hops: 1}},
		{"V2 out of scope everywhere: no fallback", FallbackRequest{Model: "big", InScope: only("big")}, map[string]GroupState{"big": down},
			FallbackDecision{Group: "big", ResponseModel: "big"}},
		{"V2 inherit_scope reaches the target", FallbackRequest{Model: "big2", InScope: only("big2")}, map[string]GroupState{"big2": down},
			FallbackDecision{Group: "small2", Reason: ReasonUnavailable, ResponseModel: "big2", Hops: 1}},
		{"V2 inherit_scope stops at an entry without it", FallbackRequest{Model: "big2", InScope: only("big2")}, map[string]GroupState{"big2": down, "small2": down},
			FallbackDecision{Group: "big2", ResponseModel: "big2"}},
		{"V2 without inheriting, the target in scope", FallbackRequest{Model: "big2", InScope: only("big2", "hosted2")}, map[string]GroupState{"big2": down, "small2": down},
			FallbackDecision{Group: "hosted2", Reason: ReasonUnavailable, ResponseModel: "big2", Hops: 2}},
		{"V1 a group without fallbacks", FallbackRequest{Model: "other"}, map[string]GroupState{"other": down},
			FallbackDecision{Group: "other", ResponseModel: "other"}},
		// After admission (Left): the groups the request could no longer
		// be served by are unavailable whatever their state, never its end.
		{"V1 left after admission: down the chain though its state says available", FallbackRequest{Model: "big", Left: []string{"big"}}, nil,
			FallbackDecision{Group: "small", Reason: ReasonUnavailable, ResponseModel: "big", Hops: 1}},
		{"V1 left a fallback group too: through its own chain", FallbackRequest{Model: "big", Left: []string{"big", "small"}}, nil,
			FallbackDecision{Group: "hosted", Reason: ReasonUnavailable, ResponseModel: "gpt", Hops: 2}},
		{"V1 moved on arrival (big full), left small whose chain is down: big's next entry", FallbackRequest{Model: "big", PromptTokens: 9000, Left: []string{"small"}},
			map[string]GroupState{"big": full, "hosted": down},
			FallbackDecision{Group: "long", Reason: ReasonContext, ResponseModel: "big", Hops: 1}},
		{"V1 left every group of the chain: none", FallbackRequest{Model: "big", Left: []string{"big", "small", "hosted"}}, nil,
			FallbackDecision{Group: "big", ResponseModel: "big"}},
		{"V1 left after admission: still at most 3 hops from the group named", FallbackRequest{Model: "c0", Left: []string{"c0", "c1", "c2"}}, nil,
			FallbackDecision{Group: "c3", Reason: ReasonUnavailable, ResponseModel: "c0", Hops: 3}},
		{"V1 left c3 too: the fourth hop is never taken", FallbackRequest{Model: "c0", Left: []string{"c0", "c1", "c2", "c3"}}, nil,
			FallbackDecision{Group: "c0", ResponseModel: "c0"}},
		{"V2 left after admission: the scope still holds", FallbackRequest{Model: "big2", InScope: only("big2"), Left: []string{"big2", "small2"}}, nil,
			FallbackDecision{Group: "big2", ResponseModel: "big2"}},
		{"V2 left after admission: inherit_scope still reaches", FallbackRequest{Model: "big2", InScope: only("big2"), Left: []string{"big2"}}, nil,
			FallbackDecision{Group: "small2", Reason: ReasonUnavailable, ResponseModel: "big2", Hops: 1}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			got := DecideFallback(groups, func(g string) GroupState { return r.states[g] }, r.req)
			if got != r.want {
				t.Fatalf("got %+v, want %+v", got, r.want)
			}
		})
	}
}
