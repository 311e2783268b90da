package exchange

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// relay reads st until its terminal and hands each envelope to s. It
// watches, concurrently with Recv, the client (r.Context: a disconnect
// while a long prefill produces nothing is noticed at once), the lease's
// fence and the response-wait timer; any of them, or a failed write, sends
// Cancel to the node at once (SPEC T3) and ends the response with exactly
// one outcome. st is closed before relay returns.
//
// The request's goroutine waits in Recv for the stream's whole life: relay
// keeps its own frame small and does the work per envelope in deliver,
// whose frame is gone while it waits.
func (h *Engine) relay(x *Exchange, st dispatch.Stream, s sink) {
	ctx := h.watch(x)
	defer h.unwatch(x, st)
	for {
		env, err := st.Recv(ctx)
		if err != nil {
			x.out.Batch = false
			if h.recvFailed(x, st, s, ctx, err) {
				h.handOff(x, st)
			}
			return
		}
		if h.deliver(x, st, s, env) {
			return
		}
	}
}

// watch starts the watchers of one attempt's relay and returns the context
// Recv waits on: it ends when the client's request context does, with
// ErrFenced when the lease's fence context does (a callback, not a
// goroutine per request: the fence context is shared by the generation's
// leases) and with ErrResponseWait when no envelope came for the
// response-wait timeout.
func (h *Engine) watch(x *Exchange) context.Context {
	ctx, cancel := context.WithCancelCause(x.Ctx)
	x.cancel, x.stopFence = cancel, nil
	if fc := x.lease.FenceContext(); fc != nil {
		x.stopFence = context.AfterFunc(fc, func() { cancel(ErrFenced) })
	}
	x.timer = time.AfterFunc(h.responseWait(x.lease), func() { cancel(ErrResponseWait) })
	return ctx
}

// unwatch closes st (unless handed off to drain) and stops the watchers.
func (h *Engine) unwatch(x *Exchange, st dispatch.Stream) {
	if !x.handoff {
		st.Close()
	}
	x.timer.Stop()
	if x.stopFence != nil {
		x.stopFence()
	}
	x.cancel(nil)
	x.cancel, x.stopFence, x.timer = nil, nil, nil
}

// deliver hands one envelope to the attempt machine and carries out what
// it decides; it reports whether relay is done: a terminal was written,
// the client is gone, or the attempt failed before any byte and is kept for
// re-dispatch (x.kept). env is classified once (classify); a stall's
// evidence goes to Deps.Health when the machine asks (SPEC H8). Once s
// wrote, the body can never be resent and is dropped.
func (h *Engine) deliver(x *Exchange, st dispatch.Stream, s sink, env *iop.Envelope) bool {
	act, stop := h.decide(x, s, env)
	switch act {
	case envHold:
		x.kept.sink, x.kept.envs = s, append(x.kept.envs, env)
	case envFail:
		x.kept = kept{sink: s, envs: []*iop.Envelope{env}}
	case envFlush: // held too much: everything held goes to s, in order, and relay goes on
		envs := append(x.kept.envs, env)
		x.kept = kept{}
		for _, env := range envs {
			if h.pass(x, st, s, env) {
				return true
			}
		}
		return false
	case envPass:
		return h.pass(x, st, s, env)
	}
	return stop
}

// decide steps x's attempt machine with env (and, when it asks, with the
// stall verdict of Deps.Health) and returns what becomes of env and
// whether relay stops. It is a frame of its own, never inlined, so that
// its event and effects (~650 bytes) are off the stack when deliver calls
// pass: the deepest point of a held stream's handler goroutine is its
// first write (pass → the surface encoder → the response's first flush,
// which writes the header and drains the request body), and every held
// stream keeps the stack that point grew until a collection finds it
// mostly unused (BENCHMARKS.md "Concurrent slow streams": ≤ 32 KiB of
// Edge RSS per stream).
//
//go:noinline
func (h *Engine) decide(x *Exchange, s sink, env *iop.Envelope) (envAction, bool) {
	x.timer.Reset(h.responseWait(x.lease))
	e := event{kind: evEnvelope, class: classify(env, x.Statuses, h.o.Now), wrote: s.wrote() || x.Body == nil}
	if e.class.retryable || e.class.stall { // only a failure that may be kept reads the clock and the client's context
		e.gone, e.now = x.Ctx.Err() != nil, h.o.Now()
	}
	fx := h.step(x, &e)
	if fx.checkStall {
		e.kind, e.valid = evStallChecked, h.o.Health.ObserveStall(x.lease, e.class.failure)
		fx = h.step(x, &e)
	}
	return fx.env, fx.stop
}

// event is an event of kind at the injected clock's reading, with what the
// request's state says: wrote (nothing may be resent: a byte reached the
// client or the body was dropped) and whether the client is gone.
func (h *Engine) event(x *Exchange, kind eventKind, wrote bool) event {
	return event{kind: kind, wrote: wrote, gone: x.Ctx.Err() != nil, now: h.o.Now()}
}

// step applies e to x's attempt machine and carries out the effects that
// only report: passive health's verdicts (Deps.Outlier: the failures
// another provider's answer corroborated, then the attempt's own, a
// failure the input may have caused as a suspicion of the request's
// principal) and the stall records (Deps.Health: the re-dispatch
// decision and its outcome, SPEC H12) and, for a sampled request, the
// attempt's span (reply.Trace: its first envelope, the node's spans on its
// terminal, its end). The effects that steer the request are returned.
func (h *Engine) step(x *Exchange, e *event) effects {
	fx := x.att.step(e)
	if x.Acc.Trace.Sampled() {
		switch e.kind {
		case evEnvelope:
			x.Acc.Trace.Envelope(e.class.terminal, e.class.spans, x.lease, h.o.Tracer)
		case evRelayEnded:
			x.attemptEnded(&fx)
		}
	}
	if v := fx.verdict; v.kind != verdictOpen && h.o.Outlier != nil {
		for _, s := range fx.corroborated {
			h.o.Outlier.Failure(s.key, s.reason, 0)
		}
		switch {
		case v.kind == verdictFailure && v.input:
			h.o.Outlier.Suspect(x.lease.Key, v.reason, x.Principal)
		case v.kind == verdictFailure:
			h.o.Outlier.Failure(x.lease.Key, v.reason, v.retryAfter)
		default:
			h.o.Outlier.Success(x.lease.Key)
		}
	}
	if fx.recordEligibility {
		h.o.Health.RecoveryEligibility(x.lease, x.Model, fx.eligibility)
	}
	if fx.recordRecovery {
		second := x.lease
		if e.kind == evNoLease || e.kind == evFallback || fx.refuse {
			second = nil
		}
		h.o.Health.RecoveryOutcome(x.stalled, second, x.Model, fx.recovery)
	}
	return fx
}

// lost keeps a lost node connection (fence, session loss, a drained node)
// before any byte as the attempt's failure e, when the machine says another
// candidate may take the request; it reports whether it did.
func (h *Engine) lost(x *Exchange, s sink, e *reply.Error) bool {
	if ev := h.event(x, evLost, s.wrote() || x.Body == nil); h.step(x, &ev).stop {
		x.kept = kept{sink: s, err: e}
		return true
	}
	return false
}

// pass is deliver's plain path: s writes env.
func (h *Engine) pass(x *Exchange, st dispatch.Stream, s sink, env *iop.Envelope) bool {
	x.out.Batch = st.Pending() // flush once per burst of frames (SPEC T2)
	done, err := s.handle(env)
	if err == nil && !done {
		err = x.out.EndBurst()
	}
	if x.Body != nil && s.wrote() {
		h.dropBody(x)
	}
	if err != nil {
		st.Cancel("write_failed")
		x.Acc.Leave()
		h.log.Debug("client write failed", "model", x.Model, "run_id", st.RunID(), "request_id", x.Acc.Rec.RequestID, "err", err)
		if !terminal(env) {
			h.handOff(x, st)
		}
		return true
	}
	if done {
		if e := s.failure(); e != nil {
			x.Acc.Fail(e)
			h.logFailure(x, st, e)
		} else {
			x.ok = true
		}
	}
	return done
}

// recvFailed ends the response after Recv failed. It reports whether it
// cancelled a stream whose terminal has not arrived yet: the node still
// holds the provider's capacity slot until its upstream call returns.
func (h *Engine) recvFailed(x *Exchange, st dispatch.Stream, s sink, ctx context.Context, err error) (cancelled bool) {
	var e *reply.Error
	switch {
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		cause := context.Cause(ctx)
		switch {
		case errors.Is(cause, ErrFenced):
			st.Cancel("fenced")
			e = reply.BadGateway("provider_lost", "the provider's node connection was lost")
			if h.lost(x, s, e) {
				return false
			}
		case errors.Is(cause, ErrResponseWait):
			st.Cancel("response_wait_timeout")
			cancelled = true
			e = &reply.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: access.CodeResponseTimeout,
				Message: "no response from the provider in time"}
		case errors.Is(cause, ErrShutdown):
			st.Cancel("edge_shutdown")
			cancelled = true
			e = shutdownError()
		default:
			st.Cancel("client_disconnected")
			x.Acc.Leave()
			h.log.Debug("client left", "model", x.Model, "run_id", st.RunID(), "request_id", x.Acc.Rec.RequestID)
			return true
		}
	case errors.Is(err, dispatch.ErrNodeDrained):
		// A dispatch that met a node already closing after its drain: the
		// node never started it. 503 with Retry-After, not 502.
		e = nodeFailure(protocol.CodeNodeShutdown.String(), "", "", 0, nil)
		if h.lost(x, s, e) {
			return false
		}
	case errors.Is(err, dispatch.ErrSessionLost):
		e = reply.BadGateway("provider_lost", "the provider's node connection was lost")
		if h.lost(x, s, e) {
			return false
		}
	case errors.Is(err, io.EOF):
		e = reply.BadGateway("provider_error", "the provider's stream ended without a result")
	case errors.Is(err, dispatch.ErrProtocol):
		// The transport dropped the misordered envelope, cancelled the
		// stream on the node and logged it with node and generation.
		e = reply.BadGateway("provider_protocol_error", "the provider's node broke the stream protocol")
	default:
		st.Cancel("stream_error")
		cancelled = true
		e = reply.BadGateway("provider_error", "the provider's stream failed")
	}
	h.logFailure(x, st, e)
	x.Acc.Fail(e)
	_ = s.fail(e)
	return cancelled
}

// handOff keeps the lease of a cancelled stream until the node confirms the
// cancel with the stream's terminal (or the session is lost, the lease's
// generation is fenced, or CancelDrainTimeout passes), then closes the
// stream and releases the lease exactly once (SPEC Q2). Releasing at once
// would let the next waiter reach a node whose capacity gate (SPEC E4) still
// counts the cancelled call, and be refused. The response is already ended;
// this runs on its own goroutine, counted through Deps.Detach, bounded by the
// timeout, and counted until it released the lease (WaitDetached).
func (h *Engine) handOff(x *Exchange, st dispatch.Stream) {
	x.handoff = true
	lease := x.lease
	done := h.o.Detach()
	go func() {
		defer done()
		defer h.o.Pool.Release(lease)
		defer st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), h.o.CancelDrainTimeout)
		defer cancel()
		fenced := lease.Fenced()
		for {
			if fenced != nil {
				select {
				case <-fenced:
					return
				default:
				}
			}
			env, err := st.Recv(ctx)
			if err != nil || terminal(env) {
				return
			}
		}
	}()
}

// releaseLease returns x.lease exactly once (SPEC Q2), unless relay handed
// it to the drain goroutine (which returns it).
func (h *Engine) releaseLease(x *Exchange) {
	if x.handoff || x.released {
		return
	}
	x.released = true
	h.o.Pool.Release(x.lease)
}

// responseWait is the Edge's response-wait timeout between two envelopes:
// the lease's stall timeout — the one the request carries to the node,
// resolved once by config.EffectiveStallTimeoutMs (SPEC Q6) — plus the
// grace.
func (h *Engine) responseWait(l *pool.Lease) time.Duration {
	ms := l.StallTimeoutMs
	grace := h.o.ResponseWaitGrace
	if ms > (math.MaxInt64-int64(grace))/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms)*time.Millisecond + grace
}

// attemptEnded ends the trace's current attempt after the attempt machine
// stepped evRelayEnded with effects fx.
func (x *Exchange) attemptEnded(fx *effects) {
	t := &x.Acc.Trace
	switch {
	case fx.redispatch:
		t.EndAttempt(fx.reason.String(), true)
	case x.ok || x.Acc.Gone():
		t.EndAttempt("", false)
	default:
		code := x.Acc.Rec.Code
		if code == "" {
			code = "failed"
		}
		t.EndAttempt(code, false)
	}
}

func (h *Engine) logFailure(x *Exchange, st dispatch.Stream, e *reply.Error) {
	h.log.LogAttrs(x.Ctx, slog.LevelWarn, "request failed", slog.String("request_id", x.Acc.Rec.RequestID),
		slog.String("model", x.Model), slog.String("node", x.lease.Node), slog.String("provider", x.lease.Provider),
		slog.String("run_id", st.RunID()), slog.Int("status", e.Status), slog.String("code", e.Code), slog.String("error", e.Message),
		slog.String("detail", e.Detail))
}
