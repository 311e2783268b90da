package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

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

// schedule is x's place in the queue, decided once at admission.
type schedule struct {
	key    string
	weight int
	prio   pool.Priority
	// localOnly: the key never reaches a remote adapter (SPEC V3).
	localOnly bool
}

// apply copies s into the pool request r.
func (s *schedule) apply(r *pool.Request) {
	r.Key, r.Weight, r.Priority, r.LocalOnly = s.key, s.weight, s.prio, s.localOnly
}

// decideSchedule sets x.sched from x's key, its context, its Iop-Priority
// header and its body's service_tier (x.head); a bad header is a 400.
func decideSchedule(x *exchange) *reply.Error {
	ks := keystore.Sched{}.Effective()
	s := &x.sched
	s.weight = 1
	if t := ticketOf(x.ctx); t != nil {
		p := t.Principal()
		ks, s.key, s.weight, s.localOnly = p.Sched, p.Name, p.Sched.Weight, p.LocalOnly
	}
	asked, _ := pool.ParsePriority(ks.Class)
	ceiling, _ := pool.ParsePriority(ks.MaxClass)
	if p, ok := x.ctx.Value(priorityKey{}).(pool.Priority); ok {
		asked = p
	} else if v := x.r.Header.Get(HeaderPriority); v != "" {
		p, ok := pool.ParsePriority(v)
		if !ok {
			return apisurface.BadRequest("", "header %s: want batch, interactive or critical, got %q", HeaderPriority, reply.Truncate(v, 64))
		}
		asked = p
	} else if p, ok := tierPriority(x.ep.surface, x.head.serviceTier); ok {
		asked = p
	}
	s.prio = min(asked, ceiling)
	x.acc.Rec.Class = s.prio.String() // G6: the queue wait by class
	return nil
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

// keyShareError is the 429 of a request refused for its key's share of
// the queue (SPEC G3), nil for any other error.
func keyShareError(model string, err error) *reply.Error {
	var ks *pool.KeyShareError
	if !errors.As(err, &ks) {
		return nil
	}
	ra := ks.RetryAfter
	if ra <= 0 {
		ra = time.Second
	}
	return &reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", RetryAfter: ra,
		Message: fmt.Sprintf("model %q: this key's share of the queue is full (%d of its requests wait while other keys wait too); retry later",
			model, ks.Waiting)}
}
