package api

import (
	"context"
	"net/http"

	"iop/internal/edge/access"
	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
)

// ErrShutdown is the cause of a request context the drain timeout ended
// (Handler.Stop): the node work is cancelled and the client gets a 503, or
// an error event in its surface's shape when bytes were already sent.
var ErrShutdown = exchange.ErrShutdown

// DrainRetryAfter is the Retry-After of a request refused while draining.
const DrainRetryAfter = exchange.DrainRetryAfter

// Drain starts the graceful drain (SIGTERM): from now on every request is
// answered 503 with Retry-After (DrainRetryAfter) and "Connection: close",
// in its surface's shape (code edge_draining), while the requests in flight
// go on. It returns at once; see WaitIdle and Stop. Idempotent.
func (h *Handler) Drain() { h.drain.draining.Store(true) }

// Draining reports whether Drain was called.
func (h *Handler) Draining() bool { return h.drain.draining.Load() }

// InFlight reports how many requests are being served (queued, streaming,
// or being refused).
func (h *Handler) InFlight() int { return int(h.drain.active.Load()) }

// WaitIdle waits, after Drain, until no request is in flight, and returns
// nil; or ctx's error when ctx ends first.
func (h *Handler) WaitIdle(ctx context.Context) error {
	for h.drain.active.Load() > 0 {
		select {
		case <-h.drain.idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// WaitDetached waits until every goroutine that keeps the lease of a
// cancelled stream until the node confirms the cancel (at most
// Options.CancelDrainTimeout each; at once when the node's session is
// gone) has released it, and returns nil; or ctx's error when ctx ends
// first. edge.Serve's daemon calls it after closing the node sessions, so that it
// returns with every lease back (SPEC Q2).
func (h *Handler) WaitDetached(ctx context.Context) error {
	for h.drain.detached.Load() > 0 {
		select {
		case <-h.drain.detachedIdle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Stop ends every request still in flight (the drain timeout passed): a
// queued one gets 503, a streaming one has its node work cancelled and
// ends with a 503 before any byte or with an error event in its surface's
// shape after (code edge_shutdown). Each request still gets exactly one
// terminal outcome and its lease goes back once. Idempotent.
func (h *Handler) Stop() { h.drain.once.Do(h.drain.stopFn) }

// requestContext is the context a model request runs under: the client's,
// ended with ErrShutdown by Stop. release must be called when the request
// is done.
func (h *Handler) requestContext(parent context.Context) (ctx context.Context, release func()) {
	c, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(h.drain.stop, func() { cancel(ErrShutdown) })
	return c, func() {
		stop()
		cancel(nil)
	}
}

func drainingError() *reply.Error {
	return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: access.CodeDraining,
		RetryAfter: DrainRetryAfter, Message: "the edge is shutting down; retry on another instance or later"}
}
