package exchange

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
)

// Serve runs one admitted request: acquire a lease (waiting in the queue),
// dispatch by lease type (SPEC Q3) and relay the result. Every lease is
// released exactly once, after its stream closed. A failure or stall before
// any byte may be re-dispatched to a provider not tried yet (H11): the
// attempt machine decides (attempt.go), Serve, relay and reacquire carry
// its effects out. It answers the request in every case, and panics with
// http.ErrAbortHandler (after the lease went back) when the response must
// end by aborting the connection.
//
// Its goroutine is parked in relay for the stream's whole life, so the
// frames below relay are kept small: the queueing and the stream's start
// run in functions that have returned before relay waits (a parked stack
// of under 3 KiB lets the runtime shrink the goroutine's stack to 8 KiB).
func (h *Engine) Serve(x *Exchange) {
	x.out = reply.Output{W: x.Acc}
	defer h.dropBody(x)
	if !h.acquire(x) {
		return
	}
	defer func() {
		if x.abort {
			x.Acc.Cut()
			panic(http.ErrAbortHandler) // after the lease went back
		}
	}()
	defer h.releaseLease(x)
	for {
		if st, s := h.start(x); st != nil {
			h.relay(x, st, s)
		}
		if !h.relayEnded(x) {
			return
		}
	}
}

// relayEnded steps x's attempt machine with the relay's end and, when it
// says so, takes the next lease (reacquire); false: the request is over.
// Never inlined, like decide: its effects stay off Serve's frame,
// which lies under every held stream's relay.
//
//go:noinline
func (h *Engine) relayEnded(x *Exchange) bool {
	fx := h.step(x, &event{kind: evRelayEnded, ok: x.ok})
	return fx.redispatch && h.reacquire(x, fx)
}

// acquire takes x's first lease, waiting in the queue (SPEC Q4), after
// the fallback decision on arrival (SPEC V1) and through the fallbacks
// after admission the attempt machine decides (take). It reports false
// when it answered the request itself (no admission) or the client left
// while queued.
func (h *Engine) acquire(x *Exchange) bool {
	w := x.Acc
	h.decideFallback(x) // fallback.go (SPEC V1)
	x.att = queuedAttempt(max(x.AttemptBound, 1), x.Deadline, h.o.RedispatchWait >= 0, h.o.Health != nil, x.mayLeave())
	lease, err, _ := h.take(x, waitQueue) // as any first Acquire: the pool's queue.wait_timeout_ms
	if err != nil {
		h.dropBody(x)
		if x.Ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			if shuttingDown(x.Ctx) {
				reply.WriteError(w, x.Endpoint.Surface, shutdownError())
				return false
			}
			w.Leave()
			h.log.Debug("client left while queued", "model", x.Model, "request_id", w.Rec.RequestID) // SPEC Q4, T3: the pool removed the waiter
			return false
		}
		e := PoolError(x.Model, err)
		level := slog.LevelDebug // the client's mistake
		if e.Status >= 429 {
			level = slog.LevelInfo // load or liveness: operators want to see it
		}
		model, logErr := x.Model, err
		if errors.Is(err, pool.ErrUnknownModel) { // O3: a name no group has is the caller's word, not a label (the access line keeps it, cut)
			model, logErr = access.OtherModel, pool.ErrUnknownModel
		}
		h.log.Log(x.Ctx, level, "request not admitted", "model", model, "operation", x.Endpoint.Operation, "status", e.Status,
			"request_id", w.Rec.RequestID, "err", logErr)
		reply.WriteError(w, x.Endpoint.Surface, e)
		return false
	}
	x.lease = lease
	return true
}
