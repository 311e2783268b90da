package api

import (
	"time"

	"iop/internal/edge/health"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
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

// DefaultRedispatchWait bounds the wait for the next lease when a stalled
// request is re-dispatched (SPEC H11). The client has already waited the
// stall timeout; a re-dispatch that would queue longer gives up and answers
// the stall (504). Other failures re-dispatch within the request's own
// deadline (retry.go).
const DefaultRedispatchWait = 2 * time.Second

// stallOf returns the ExecutionFailure and message of env when env is a
// response_stalled terminal (RunEvent ERROR or ProviderTunnelFrame ERROR,
// SPEC H1); f is nil when the node sent no evidence.
func stallOf(env *iop.Envelope) (f *iop.ExecutionFailure, msg string, ok bool) {
	switch k := env.GetKind().(type) {
	case *iop.Envelope_RunEvent:
		ev := k.RunEvent
		if ev.GetType() == iop.RunEventType_RUN_EVENT_ERROR && ev.GetFailureCode() == protocol.CodeResponseStalled.String() {
			return ev.GetFailure(), ev.GetError(), true
		}
	case *iop.Envelope_TunnelFrame:
		fr := k.TunnelFrame
		if fr.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_ERROR && fr.GetFailureCode() == protocol.CodeResponseStalled.String() {
			return fr.GetFailure(), fr.GetError(), true
		}
	}
	return nil, "", false
}

// stalled runs before the sink sees env. For a response_stalled terminal
// it hands the evidence to Options.Health (SPEC H8: the failure is
// validated and decorated before the response is decided) and decides
// whether the request may be re-dispatched (H11): only with a confirmed
// handoff, while the request's attempt bound (models[].max_attempts) is not
// used up, nothing was written to the client and the client is still
// there. It reports true when it chose to re-dispatch: env is then not
// written and x.retry holds it, to answer with when no other candidate
// comes. The lease goes back exactly once either way (serveModel).
func (h *Handler) stalled(x *exchange, s sink, env *iop.Envelope) bool {
	f, _, ok := stallOf(env)
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
	case len(x.tried) >= x.bound:
		e = health.IneligibleAttempted
	case s.wrote() || x.body == nil:
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
	x.retry = &retry{reason: retryStall, sink: s, envs: []*iop.Envelope{env}}
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

// recovered records the outcome of the attempt that followed a stall
// re-dispatch (SPEC H12): recovered when it answered, failed otherwise
// (also when it failed in turn and was re-dispatched again).
func (h *Handler) recovered(x *exchange) {
	r := health.RecoveryFailed
	if x.ok {
		r = health.RecoveryRecovered
	}
	h.o.Health.RecoveryOutcome(x.stallFirst, x.lease, x.model, r)
	x.stallFirst = nil
}
