package api

import (
	"context"
	"net/http"
	"time"

	"iop/internal/edge/exchange"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
)

// admission is one model request between its body and its exchange: the
// head the body was read into and the exchange that serves it, one
// allocation (the exchange's model spans and prefix point into head).
type admission struct {
	head head
	x    exchange.Exchange
}

// admit reads and validates the body of a model request, decides its
// schedule and reserves its key's token estimate (SPEC Q4, K4, K5, G1,
// G4), and returns the request's exchange, which internal/edge/exchange
// serves (lease, dispatch, relay, every lease released once). It returns
// nil when it answered the request itself (a bad body, a model outside
// the key's scope, a refused reservation) or the client left while its
// body was read.
func (h *Handler) admit(ctx context.Context, w *reply.Recorder, r *http.Request, v *view, ep *endpoint) *exchange.Exchange {
	body, e := h.takeBody(w, r, v.maxBody)
	if e != nil {
		closeUnread(w, r)
		if e.ClientGone {
			w.Leave() // nothing is written: 499, client_cancelled
			h.log.Debug("client left before its request body arrived", "request_id", w.Rec.RequestID, "err", e.Message)
			return nil
		}
		reply.WriteError(w, ep.Surface, e)
		return nil
	}
	// The body is in: lift the read deadline so that nothing later on this
	// connection (its disconnect detector's read) ever runs into it.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	a := &admission{}
	x := &a.x
	*x = exchange.Exchange{Ctx: ctx, Header: r.Header, Acc: w, Endpoint: &ep.Endpoint, Body: body, Held: int64(cap(body)),
		Statuses: v.statuses, Unknown: v.unknown}
	x.Principal, _ = PrincipalFromContext(ctx)
	if ms := v.cfg.Queue.WaitTimeoutMs; ms > 0 {
		x.Deadline = h.o.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	hd := &a.head
	if e := parseHead(body, ep, hd); e != nil {
		h.dropBody(x)
		reply.WriteError(w, ep.Surface, e)
		return nil
	}
	if v.affinity[hd.model] {
		hd.prefix = prefixOf(h.hasher, body, ep, hd.model, hd.prefixBuf[:0])
	}
	x.Model, x.ModelSpans, x.Stream, x.IncludeUsage, x.MaxTokens, x.Prefix =
		hd.model, hd.modelSpans, hd.stream, hd.includeUsage, hd.maxTokens, hd.prefix
	x.AttemptBound = v.attemptBound(hd.model)
	w.SetModel(hd.model, v.cfg != nil && v.cfg.ModelByName(hd.model) != nil, h.o.Metrics)
	if t := ticketOf(ctx); t != nil && !t.Principal().Allows(hd.model) {
		h.dropBody(x)
		reply.WriteError(w, ep.Surface, exchange.PoolError(hd.model, pool.ErrUnknownModel)) // K4: the same 404 as a model that does not exist
		return nil
	} else if x.Fallbacks = v.fallbacks; t != nil && t.Principal().Scoped() {
		x.InScope = t.Principal().Allows // SPEC V2: every group a fallback reaches
	}
	if x.Sched, e = decideSchedule(ctx, r, ep, hd.serviceTier, w); e != nil {
		h.dropBody(x)
		reply.WriteError(w, ep.Surface, e)
		return nil
	}
	if !h.reserveKey(x, w) {
		h.dropBody(x)
		return nil
	}
	return x
}
