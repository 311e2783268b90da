package exchange

import (
	"log/slog"
	"sync/atomic"

	"iop/internal/edge/access"
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
// group reached, its local-only mark in every state asked).
func (h *Engine) decideFallback(x *Exchange) {
	if len(x.Fallbacks[x.Model].Rules) == 0 {
		return
	}
	gs, ok := h.o.Pool.(groupStates)
	if !ok {
		return
	}
	r := x.poolRequest()
	d := routing.DecideFallback(x.Fallbacks, func(g string) routing.GroupState {
		r.Model = g
		return gs.GroupState(r)
	}, routing.FallbackRequest{Model: x.Model, PromptTokens: r.PromptTokens, InScope: x.InScope})
	if d.Group == x.Model {
		return
	}
	x.requested, x.responseModel, x.Model = x.Model, d.ResponseModel, d.Group
	x.Acc.Rec.ServedModel, x.Acc.Rec.Fallback = d.Group, string(d.Reason)
	k := fallbackKey{from: x.requested, to: d.Group, reason: d.Reason}
	c, ok := h.fallbacks.Load(k)
	if !ok {
		c, _ = h.fallbacks.LoadOrStore(k, new(atomic.Uint64))
	}
	c.(*atomic.Uint64).Add(1)
	h.log.LogAttrs(x.Ctx, slog.LevelInfo, "request falls back", slog.String("request_id", x.Acc.Rec.RequestID),
		slog.String("model", x.requested), slog.String("served_model", d.Group), slog.String("reason", string(d.Reason)),
		slog.Int("hops", d.Hops))
}

// FallbackSamples is iop_edge_fallbacks_total{from,to,reason}: requests
// that went to another model group than the one they named, by the group
// named, the group that took them and the condition that moved them
// (unavailable, queue_full, context, wait_ms). A series appears with its
// first fallback.
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
