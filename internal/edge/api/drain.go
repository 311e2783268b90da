package api

import (
	"context"
	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	"net/http"
	"sync"
	"sync/atomic"

	"iop/internal/edge/access"
)

// ErrShutdown is the cause of a request context the drain timeout ended
// (Handler.Stop): the node work is cancelled and the client gets a 503, or
// an error event in its surface's shape when bytes were already sent.
var ErrShutdown = exchange.ErrShutdown

// DrainRetryAfter is the Retry-After of a request refused while draining.
const DrainRetryAfter = exchange.DrainRetryAfter

// drainer counts the requests in flight and carries the graceful drain:
// after Drain every new request is refused; Stop ends those still in flight
// through their contexts. The zero value is not ready; see newDrainer.
type drainer struct {
	active   atomic.Int64  // requests inside ServeHTTP
	draining atomic.Bool   // Drain was called
	idle     chan struct{} // cap 1: a request ended with active 0 while draining
	// detached counts the cancel-confirmation goroutines (handOff) still
	// holding a lease; detachedIdle (cap 1) is signalled when it drops to 0.
	detached     atomic.Int64
	detachedIdle chan struct{}
	stop         context.Context
	stopFn       context.CancelFunc
	once         sync.Once
}

func newDrainer() *drainer {
	ctx, cancel := context.WithCancel(context.Background())
	return &drainer{idle: make(chan struct{}, 1), detachedIdle: make(chan struct{}, 1), stop: ctx, stopFn: cancel}
}

// detach counts one cancel-confirmation goroutine in; its done must be
// called when it has released its lease.
func (d *drainer) detach() (done func()) {
	d.detached.Add(1)
	return func() {
		if d.detached.Add(-1) == 0 {
			select {
			case d.detachedIdle <- struct{}{}:
			default:
			}
		}
	}
}

// enter counts one request in; false when the Edge drains (the request is
// counted all the same and must exit).
func (d *drainer) enter() bool {
	d.active.Add(1)
	return !d.draining.Load()
}

func (d *drainer) exit() {
	if d.active.Add(-1) == 0 && d.draining.Load() {
		select {
		case d.idle <- struct{}{}:
		default:
		}
	}
}

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
// first. edge.Run calls it after closing the node sessions, so that it
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
