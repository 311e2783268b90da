package api

import (
	"context"
	"log/slog"
	"time"

	"iop/internal/edge/health"
	"iop/internal/edge/pool"
	iop "iop/proto/gen/iop"
)

// Health is the Edge's provider-health owner as the surface uses it (SPEC
// H8, H11, H12); *health.Tracker satisfies it.
//
// ObserveStall takes the ExecutionFailure of a response_stalled terminal
// (nil when the node sent none) of a stream on lease l, validates it
// against l (the transport identity and the lease binding, never the
// payload's) and, when valid, adds provider_id, the validated
// provider_health and recovery_handoff="confirmed" to it; it reports
// whether it did. It never returns l. RecoveryEligibility and
// RecoveryOutcome record the surface's re-dispatch decision and its
// outcome (second is nil when no second lease came).
type Health interface {
	ObserveStall(l *pool.Lease, f *iop.ExecutionFailure) bool
	RecoveryEligibility(l *pool.Lease, model string, e health.Eligibility)
	RecoveryOutcome(first, second *pool.Lease, model string, r health.RecoveryResult)
}

// DefaultRedispatchWait bounds the wait for a second lease when a stalled
// request is re-dispatched (SPEC H11). The client has already waited the
// stall timeout; a re-dispatch that would queue longer gives up and answers
// the stall (504).
const DefaultRedispatchWait = 2 * time.Second

// stallOf returns the ExecutionFailure and message of env when env is a
// response_stalled terminal (RunEvent ERROR or ProviderTunnelFrame ERROR,
// SPEC H1); f is nil when the node sent no evidence.
func stallOf(env *iop.Envelope) (f *iop.ExecutionFailure, msg string, ok bool) {
	switch k := env.GetKind().(type) {
	case *iop.Envelope_RunEvent:
		ev := k.RunEvent
		if ev.GetType() == iop.RunEventType_RUN_EVENT_ERROR && ev.GetFailureCode() == failureStalled {
			return ev.GetFailure(), ev.GetError(), true
		}
	case *iop.Envelope_TunnelFrame:
		fr := k.TunnelFrame
		if fr.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_ERROR && fr.GetFailureCode() == failureStalled {
			return fr.GetFailure(), fr.GetError(), true
		}
	}
	return nil, "", false
}

// stalled runs before the sink sees env. For a response_stalled terminal
// it hands the evidence to Options.Health (SPEC H8: the failure is
// validated and decorated before the response is decided) and decides
// whether the request may be re-dispatched (H11): only with a confirmed
// handoff, on the first attempt, while nothing was written to the client
// and the client is still there. It reports true when it chose to
// re-dispatch: env is then not written and x.redispatch holds the stall's
// error for the case that no second lease comes. The lease goes back
// exactly once either way (serveModel).
func (h *Handler) stalled(x *exchange, s sink, env *iop.Envelope) bool {
	f, msg, ok := stallOf(env)
	if !ok || h.o.Health == nil {
		return false
	}
	validated := h.o.Health.ObserveStall(x.lease, f)
	var e health.Eligibility
	switch {
	case h.o.RedispatchWait < 0:
		e = health.IneligibleDisabled
	case !validated:
		e = health.IneligibleEvidence
	case x.attempt > 0:
		e = health.IneligibleAttempted
	case s.wrote():
		e = health.IneligibleStarted
	case x.ctx.Err() != nil:
		e = health.IneligibleClientGone
	default:
		e = health.Eligible
	}
	h.o.Health.RecoveryEligibility(x.lease, x.model, e)
	if e != health.Eligible {
		return false
	}
	x.redispatch = nodeFailure(failureStalled, msg, 0, f)
	return true
}

// releaseLease returns x.lease exactly once (SPEC Q2), unless relay handed
// it to the drain goroutine (which returns it).
func (h *Handler) releaseLease(x *exchange) {
	if x.handoff || x.released {
		return
	}
	x.released = true
	h.o.Pool.Release(x.lease)
}

// reacquire prepares the re-dispatch of a request whose first attempt
// stalled before any byte (SPEC H11): the stalled lease goes back first,
// then the pool picks again (an overlaid provider is no candidate; the
// stalled one may be picked again when it is still live), waiting at most
// RedispatchWait. It returns the first lease with x on the second one; with
// no lease in time the client gets the stall's own error (504) and it
// returns nil. There is never a third attempt.
func (h *Handler) reacquire(x *exchange) (first *pool.Lease) {
	stall := x.redispatch
	x.redispatch = nil
	first = x.lease
	h.releaseLease(x)
	ctx, cancel := context.WithTimeout(x.ctx, h.o.RedispatchWait)
	queued := time.Now()
	l, err := h.o.Pool.Acquire(ctx, x.poolRequest())
	setLease(x.acc, l, time.Since(queued))
	cancel()
	if err != nil {
		h.o.Health.RecoveryOutcome(first, nil, x.model, health.RecoveryNoLease)
		if x.ctx.Err() != nil {
			if shuttingDown(x.ctx) {
				writeError(x.out.w, x.ep.surface, shutdownError())
				return nil
			}
			x.acc.leave()
			h.log.Debug("client left during re-dispatch", "model", x.model, "request_id", x.acc.rec.RequestID)
			return nil
		}
		h.log.LogAttrs(x.ctx, slog.LevelWarn, "request failed", slog.String("request_id", x.acc.rec.RequestID),
			slog.String("model", x.model), slog.String("node", first.Node), slog.String("provider", first.Provider),
			slog.Int("status", stall.status), slog.String("code", stall.code), slog.String("error", stall.msg),
			slog.String("detail", "no second lease for a re-dispatch: "+err.Error()))
		writeError(x.out.w, x.ep.surface, stall)
		return nil
	}
	x.lease, x.released, x.attempt = l, false, 1
	x.acc.rec.Retries = x.attempt
	return first
}

// recovered records the outcome of the re-dispatch from first to x.lease
// (SPEC H12).
func (h *Handler) recovered(x *exchange, first *pool.Lease) {
	r := health.RecoveryFailed
	if x.ok {
		r = health.RecoveryRecovered
	}
	h.o.Health.RecoveryOutcome(first, x.lease, x.model, r)
}
