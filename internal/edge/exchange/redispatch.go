package exchange

import (
	"errors"
	"log/slog"

	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
	iop "iop/proto/gen/iop"
)

// reacquire carries out a re-dispatch (fx.redispatch, after a failed
// attempt kept in x.kept): the failed lease goes back first (SPEC Q2), then
// the pool picks again among the providers x has not tried (waiting as
// fx.wait says: RedispatchWait after a stall, else until x's deadline).
// With a lease it returns true and x runs again on it; with none — no
// untried candidate, none in time, the client left — the kept failure is
// answered and it returns false.
func (h *Engine) reacquire(x *Exchange, fx effects) bool {
	k := x.kept
	x.kept = kept{}
	first := x.lease
	if fx.reason == retryStall {
		x.stalled = first
	}
	if rr, ok := h.o.Pool.(refusedReleaser); ok && fx.reason == retryOverCapacity && !x.handoff && !x.released {
		x.released = true
		rr.ReleaseRefused(x.lease, fairShare(k.envs)) // SPEC E4: the node is full with other edges' work: no cooling, the provider admits less for a while
	}
	h.releaseLease(x)
	l, err, lfx := h.take(x, fx.wait) // fallback.go: a fallback after admission on the way (SPEC V1)
	if err != nil {
		if x.Ctx.Err() != nil {
			if shuttingDown(x.Ctx) {
				reply.WriteError(x.out.W, x.Endpoint.Surface, shutdownError())
				return false
			}
			x.Acc.Leave()
			h.log.Debug("client left during re-dispatch", "model", x.Model, "request_id", x.Acc.Rec.RequestID)
			return false
		}
		h.answerRetry(x, k, fx.reason, first, err)
		return false
	}
	if lfx.refuse { // SPEC C6: a lease of another credential slot is never used
		h.o.Pool.Release(l)
		h.log.Warn("re-dispatch lease refused: another credential slot", "model", x.Model, "request_id", x.Acc.Rec.RequestID,
			"node", l.Node, "provider", l.Provider)
		if x.Ctx.Err() == nil {
			h.answerRetry(x, k, fx.reason, first, errOtherSlot)
		}
		return false
	}
	h.retries[fx.reason].Add(1)
	x.Acc.Rec.Retries++
	h.log.LogAttrs(x.Ctx, slog.LevelInfo, "request re-dispatched", slog.String("request_id", x.Acc.Rec.RequestID),
		slog.String("model", x.Model), slog.String("reason", fx.reason.String()),
		slog.String("from_node", first.Node), slog.String("from_provider", first.Provider),
		slog.String("node", l.Node), slog.String("provider", l.Provider), slog.Int("attempt", len(x.att.tried)+1))
	x.lease, x.released = l, false
	return true
}

// errOtherSlot is why a re-dispatch found no candidate when the pool
// offered a lease of another credential slot (SPEC C6).
var errOtherSlot = errors.New("no untried provider within the request's credential slot")

// fairShare is the over_capacity terminal's fair_share (SPEC E4): what
// the node admits from this edge while other edges want the provider; 0
// when it said none.
func fairShare(envs []*iop.Envelope) int {
	if len(envs) == 0 {
		return 0
	}
	env := envs[len(envs)-1]
	return int(min(env.GetRunEvent().GetFairShare()+env.GetTunnelFrame().GetFairShare(), 1<<20))
}

// answerRetry answers x with the failure r of its last attempt (failed for
// reason) on lease last, after no other candidate could take it (why).
func (h *Engine) answerRetry(x *Exchange, r kept, reason retryReason, last *pool.Lease, why error) {
	detail := "no other provider: " + why.Error()
	if errors.Is(why, pool.ErrAllTried) {
		detail = "every provider of the model was tried"
	}
	if len(r.envs) == 0 {
		if r.sink != nil {
			_ = r.sink.fail(r.err)
		} else {
			reply.WriteError(x.out.W, x.Endpoint.Surface, r.err)
		}
	}
	for _, env := range r.envs {
		if done, err := r.sink.handle(env); done || err != nil {
			break
		}
	}
	status := 0
	if e := r.err; e != nil {
		status = e.Status
	}
	if r.sink != nil {
		if e := r.sink.failure(); e != nil {
			status = e.Status
			x.Acc.Fail(e)
		}
	}
	if f := r.envs; len(f) > 0 {
		if fr := f[0].GetTunnelFrame(); fr != nil && fr.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START {
			status = int(fr.GetStatus())
		}
	}
	h.log.LogAttrs(x.Ctx, slog.LevelWarn, "request failed", slog.String("request_id", x.Acc.Rec.RequestID),
		slog.String("model", x.Model), slog.String("node", last.Node), slog.String("provider", last.Provider),
		slog.String("reason", reason.String()), slog.Int("status", status), slog.Int("attempts", len(x.att.tried)),
		slog.String("detail", detail))
}
