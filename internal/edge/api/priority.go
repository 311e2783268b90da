package api

import (
	"context"
	"net/http"

	"iop/internal/edge/exchange"
	"iop/internal/edge/keystore"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
)

// A request's place in the queue (SPEC G1, G4): its key, the key's weight
// and the request's priority class.
//
// The class starts as the key's default class (api_keys[].class, `edge
// keys -class`; interactive in open mode) and may be changed by the
// request, in this order of precedence:
//
//   - WithPriority on the request's context: the edge's own callers (the
//     batch runner submits its lines as PriorityBatch this way);
//   - the Iop-Priority header: batch, interactive or critical (anything
//     else is a 400 naming the header);
//   - service_tier in the body: on the OpenAI surfaces "flex" is batch and
//     "priority" critical; on the Anthropic surface "standard_only" is
//     batch; any other value ("auto", "default") keeps the key's class.
//
// Whatever is asked, the class is never above the key's max_class
// (interactive in open mode): a higher ask is served at the ceiling.

// HeaderPriority is the request header that asks for a priority class.
const HeaderPriority = "Iop-Priority"

type priorityKey struct{}

// WithPriority returns ctx asking that the requests served under it get
// class p (SPEC G4), as the Iop-Priority header would: capped by the key's
// max class, and ahead of the header and service_tier.
func WithPriority(ctx context.Context, p pool.Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// decideSchedule is the request's place in the queue (SPEC G1, G4, V3),
// from its key (the ticket in ctx), ctx's WithPriority, its Iop-Priority
// header and its body's service_tier; a bad header is a 400. The class
// goes on the access record too (G6: the queue wait by class).
func decideSchedule(ctx context.Context, r *http.Request, ep *endpoint, tier string, acc *reply.Recorder) (exchange.Schedule, *reply.Error) {
	ks := keystore.Sched{}.Effective()
	s := exchange.Schedule{Weight: 1}
	if t := ticketOf(ctx); t != nil {
		p := t.Principal()
		ks, s.Key, s.Weight, s.LocalOnly = p.Sched, p.Name, p.Sched.Weight, p.LocalOnly
	}
	asked, _ := pool.ParsePriority(ks.Class)
	ceiling, _ := pool.ParsePriority(ks.MaxClass)
	if p, ok := ctx.Value(priorityKey{}).(pool.Priority); ok {
		asked = p
	} else if v := r.Header.Get(HeaderPriority); v != "" {
		p, ok := pool.ParsePriority(v)
		if !ok {
			return s, apisurface.BadRequest("", "header %s: want batch, interactive or critical, got %q", HeaderPriority, reply.Truncate(v, 64))
		}
		asked = p
	} else if p, ok := tierPriority(ep.Surface, tier); ok {
		asked = p
	}
	s.Priority = min(asked, ceiling)
	acc.Rec.Class = s.Priority.String() // G6: the queue wait by class
	return s, nil
}

// tierPriority maps a body's service_tier to a class (see above); ok is
// false for a value that keeps the key's class.
func tierPriority(s reply.Surface, tier string) (pool.Priority, bool) {
	switch {
	case tier == "":
		return 0, false
	case s == reply.Anthropic && tier == "standard_only":
		return pool.PriorityBatch, true
	case s == reply.OpenAI && tier == "flex":
		return pool.PriorityBatch, true
	case s == reply.OpenAI && tier == "priority":
		return pool.PriorityCritical, true
	}
	return 0, false
}
