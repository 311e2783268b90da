package exchange

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	"iop/internal/edge/routing"
)

// Fallbacks to other model groups (SPEC V1–V3). On arrival, before the
// first Acquire, a request for a group with fallbacks is decided by
// routing.DecideFallback over each group's state as the pool tells it for
// this request (its key, class, local-only mark, size): nothing waits for
// the decision. A request that falls back is the fallback group's from
// then on — its queue, providers, health, fair share and key limits —
// within the same attempt bound and deadline as the group the client
// named; the run path's response names the requested group unless the
// entry's rename_model says otherwise (the tunnel relays the provider's
// body as it is, SPEC Q3). The fallback is counted (FallbackSamples), in
// the access record (served_model, fallback) and the request's log line.
//
// After admission (SPEC V1), a request whose group can no longer serve it
// before any byte reached the client — the pool finds no live provider it
// may still use (it asked with pool.Request.LeaveUnavailable: a fence, a
// drain, an ejection took the last one while it waited, or the untried
// ones are down), or every provider failed it (pool.ErrAllTried) — is
// decided again by the attempt machine's leave (effects.fallback): from
// the group the client named, the groups it left unavailable and never its
// end (routing.FallbackRequest.Left), so the chain, its 3 hops, the key's
// scope and local-only mark hold as on arrival. Moved, it is the new
// group's within the attempts and deadline left; the reason is
// unavailable.

// HeaderServedModel names the model group that served a request (SPEC V1):
// the one the client named, or the fallback that took it.
const HeaderServedModel = "Iop-Served-Model"

// fallbackKey is one series of iop_edge_fallbacks_total.
type fallbackKey struct {
	from, to string
	reason   routing.FallbackReason
}

// decideFallback moves x to the group the fallback decision picks, if
// another than the one it names (SPEC V1, V2, V3: the key's scope on every
// group reached, its local-only mark in every state asked); on arrival
// (x.left empty) or, after admission, from the group named with the groups
// x left. It reports whether x moved.
func (h *Engine) decideFallback(x *Exchange) bool {
	named := x.named()
	if len(x.Fallbacks[named].Rules) == 0 {
		return false
	}
	gs, ok := h.o.Pool.(groupStates)
	if !ok {
		return false
	}
	r := x.poolRequest()
	d := routing.DecideFallback(x.Fallbacks, func(g string) routing.GroupState {
		r.Model = g
		return gs.GroupState(r)
	}, routing.FallbackRequest{Model: named, PromptTokens: r.PromptTokens, InScope: x.InScope, Left: x.left})
	if d.Group == named || d.Group == x.Model {
		return false
	}
	reason := d.Reason
	if len(x.left) > 0 {
		reason = routing.ReasonUnavailable // SPEC V1: what moved it now is the group it left
	}
	from := x.Model
	x.requested, x.responseModel, x.Model = named, d.ResponseModel, d.Group
	x.Acc.Rec.ServedModel, x.Acc.Rec.Fallback = d.Group, string(reason)
	k := fallbackKey{from: from, to: d.Group, reason: reason}
	c, ok := h.fallbacks.Load(k)
	if !ok {
		c, _ = h.fallbacks.LoadOrStore(k, new(atomic.Uint64))
	}
	c.(*atomic.Uint64).Add(1)
	h.log.LogAttrs(x.Ctx, slog.LevelInfo, "request falls back", slog.String("request_id", x.Acc.Rec.RequestID),
		slog.String("model", named), slog.String("from", from), slog.String("served_model", d.Group), slog.String("reason", string(reason)),
		slog.Int("hops", d.Hops), slog.Int("attempts", x.att.spent+len(x.att.tried)))
	return true
}

// named is the group x's client named.
func (x *Exchange) named() string {
	if x.requested != "" {
		return x.requested
	}
	return x.Model
}

// mayLeave reports whether a fallback decision may move x off its group
// when that group has no live provider left for it (SPEC V1): the group
// has a fallback on unavailable, or x is already a fallback group's (the
// named group's chain may go on elsewhere).
func (x *Exchange) mayLeave() bool {
	if x.requested != "" {
		return true
	}
	for _, r := range x.Fallbacks[x.Model].Rules {
		if r.Unavailable {
			return true
		}
	}
	return false
}

// take asks the pool for x's next lease, waiting as wait says, and steps
// x's attempt machine with the answer (evLeased, evNoLease); when the
// machine asks (effects.fallback: its group has no live provider left for
// x, or x tried them all) it decides the fallback (SPEC V1), steps
// evFallback and asks again as the machine says: in the group x moved
// to, or in its own, waiting as without a fallback. It returns the lease,
// or the pool's last error, with the effects of the last step; a lease
// sets Iop-Served-Model (unless the machine refuses it, SPEC C6).
func (h *Engine) take(x *Exchange, wait leaseWait) (*pool.Lease, error, effects) {
	for {
		l, err := h.ask(x, wait)
		if err == nil {
			e := h.event(x, evLeased, false)
			e.lease = l
			fx := h.step(x, &e)
			if !fx.refuse {
				x.arrival = l.Arrival
				x.Acc.Header().Set(HeaderServedModel, l.Model) // SPEC V1: the group that serves it
			}
			return l, nil, fx
		}
		var ue *pool.UnavailableError
		if errors.As(err, &ue) {
			x.arrival = ue.Arrival // G5: its place, should it wait again
		}
		e := h.event(x, evNoLease, false)
		e.why = noLeaseOf(err)
		fx := h.step(x, &e)
		if !fx.fallback {
			return nil, err, fx
		}
		x.left = append(x.left, x.Model)
		e = h.event(x, evFallback, false)
		if e.moved = h.decideFallback(x); e.moved {
			e.fallback = x.mayLeave()
		}
		if fx = h.step(x, &e); !fx.redispatch {
			return nil, err, fx
		}
		wait = fx.wait
	}
}

// ask is one Acquire of x's pool request, waiting as wait says; the wait
// goes to x's access record and trace.
func (h *Engine) ask(x *Exchange, wait leaseWait) (*pool.Lease, error) {
	ctx, cancel := x.Ctx, context.CancelFunc(nil)
	switch {
	case wait == waitRedispatch:
		ctx, cancel = context.WithTimeout(x.Ctx, h.o.RedispatchWait)
	case wait == waitDeadline && !x.att.deadline.IsZero():
		ctx, cancel = context.WithDeadline(x.Ctx, x.att.deadline)
	}
	queued := h.o.Now()
	l, err := h.o.Pool.Acquire(ctx, x.poolRequest())
	x.Acc.SetLease(l, h.o.Now().Sub(queued), err)
	if cancel != nil {
		cancel()
	}
	return l, err
}

// FallbackSamples is iop_edge_fallbacks_total{from,to,reason}: moves of
// requests to another model group, by the group they left (the one named,
// on arrival; the one they were admitted to, after admission), the group
// that took them and the condition that moved them (unavailable,
// queue_full, context, wait_ms; after admission always unavailable). A
// series appears with its first fallback; at most one move per group a
// request leaves.
func (h *Engine) FallbackSamples() map[string]float64 {
	out := map[string]float64{}
	h.fallbacks.Range(func(k, v any) bool {
		fk := k.(fallbackKey)
		out[`from="`+access.EscapeLabel(fk.from)+`",to="`+access.EscapeLabel(fk.to)+`",reason="`+string(fk.reason)+`"`] = float64(v.(*atomic.Uint64).Load())
		return true
	})
	return out
}

// responseName is the model x's run-path response names: the requested
// group's name, or a fallback's rename_model.
func (x *Exchange) responseName() string {
	if x.responseModel != "" {
		return x.responseModel
	}
	return x.Model
}
