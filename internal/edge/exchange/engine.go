package exchange

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
)

// Engine serves admitted requests (Serve), one Exchange each, and keeps
// what they share: the run path's encoding buffers and the re-dispatch
// counters. Safe for concurrent use.
type Engine struct {
	o       Deps
	log     *slog.Logger
	bufs    sync.Pool // *[]byte: encoding buffers of run-path responses (runSink)
	retries [nRetryReasons]atomic.Uint64
	// fallbacks counts the fallbacks taken by from, to and reason
	// (fallback.go): bounded by the configured groups.
	fallbacks sync.Map // fallbackKey → *atomic.Uint64
}

// New returns the Engine for d.
func New(d Deps) *Engine {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Detach == nil {
		d.Detach = func() func() { return func() {} }
	}
	if d.OpenMode == nil {
		d.OpenMode = func() bool { return true }
	}
	return &Engine{o: d, log: d.Logger}
}

// RetrySamples is iop_edge_request_retries_total{reason}: requests sent to
// another provider after a failure before the first byte, every reason
// present.
func (h *Engine) RetrySamples() map[string]float64 {
	out := make(map[string]float64, nRetryReasons)
	for r := range nRetryReasons {
		out[`reason="`+r.String()+`"`] = float64(h.retries[r].Load())
	}
	return out
}

// Errors an exchange uses as context causes; test with errors.Is.
var (
	// ErrFenced: the lease's node generation was fenced mid-request (SPEC L8).
	ErrFenced = errors.New("api: provider lease fenced")
	// ErrResponseWait: no frame or event arrived within the response-wait
	// timeout (the lease's stall timeout plus Deps.ResponseWaitGrace).
	ErrResponseWait = errors.New("api: response wait timeout")
	// ErrShutdown is the cause of a request context the drain timeout
	// ended: the node work is cancelled and the client gets a 503, or an
	// error event in its surface's shape when bytes were already sent.
	ErrShutdown = errors.New("api: edge shutting down")
)

// DrainRetryAfter is the Retry-After of a request refused or ended while
// the Edge drains.
const DrainRetryAfter = 5 * time.Second

// shuttingDown reports whether ctx was ended with ErrShutdown.
func shuttingDown(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrShutdown)
}

func shutdownError() *reply.Error {
	return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: access.CodeShutdown,
		RetryAfter: DrainRetryAfter, Message: "the edge shut down before the response was complete"}
}

// Schedule is a request's place in the queue (SPEC G1, G4), decided once
// at admission and asked with on every Acquire: its key, the key's weight,
// its priority class and whether it may reach a remote adapter.
type Schedule struct {
	Key      string
	Weight   int
	Priority pool.Priority
	// LocalOnly: the key never reaches a remote adapter (SPEC V3).
	LocalOnly bool
}

// apply copies s into the pool request r.
func (s *Schedule) apply(r *pool.Request) {
	r.Key, r.Weight, r.Priority, r.LocalOnly = s.Key, s.Weight, s.Priority, s.LocalOnly
}

// PoolError maps an Acquire error to the client-visible one (SPEC Q4):
// unknown model 404, no candidate for the operation 400, queue full (the
// group's or the key's share, G3) 429 with Retry-After, wait timeout (or
// no live provider for a request a fallback could have moved, V1) 503
// naming the model and the reason.
func PoolError(model string, err error) *reply.Error {
	var qf *pool.QueueFullError
	var wt *pool.WaitTimeoutError
	var nc *pool.NoCandidateError
	var ue *pool.UnavailableError
	if e := keyShareError(model, err); e != nil { // G3
		return e
	}
	switch {
	case errors.Is(err, pool.ErrUnknownModel):
		return &reply.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("the model %q does not exist", reply.Truncate(model, access.MaxModelLen))}
	case errors.As(err, &qf):
		ra := qf.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		return &reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", RetryAfter: ra,
			Message: fmt.Sprintf("model %q: too many requests waiting; retry later", model)}
	case errors.Is(err, pool.ErrQueueFull):
		return &reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", RetryAfter: time.Second,
			Message: fmt.Sprintf("model %q: too many requests waiting; retry later", model)}
	case errors.As(err, &wt):
		return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_provider_available",
			Message: fmt.Sprintf("model %q: no live provider within %s: %s", wt.Model, wt.Waited, wt.Reason)}
	case errors.As(err, &ue):
		return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_provider_available",
			Message: fmt.Sprintf("model %q: %s", ue.Model, ue.Reason)}
	case errors.Is(err, pool.ErrWaitTimeout), errors.Is(err, pool.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		// DeadlineExceeded: a wait bounded by the request's deadline after a fallback (SPEC V1)
		return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_provider_available",
			Message: fmt.Sprintf("model %q: no live provider in time", model)}
	case errors.As(err, &nc):
		return &reply.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "operation_not_supported", Param: "model",
			Message: nc.Error()}
	case errors.Is(err, pool.ErrNoCandidate):
		return &reply.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "operation_not_supported", Param: "model",
			Message: fmt.Sprintf("model %q has no provider for this endpoint", model)}
	default:
		return &reply.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "internal error while selecting a provider"}
	}
}

// keyShareError is the 429 of a request refused for its key's share of
// the queue (SPEC G3), nil for any other error.
func keyShareError(model string, err error) *reply.Error {
	var ks *pool.KeyShareError
	if !errors.As(err, &ks) {
		return nil
	}
	ra := ks.RetryAfter
	if ra <= 0 {
		ra = time.Second
	}
	return &reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", RetryAfter: ra,
		Message: fmt.Sprintf("model %q: this key's share of the queue is full (%d of its requests wait while other keys wait too); retry later",
			model, ks.Waiting)}
}

// MaxRefusals is how many over-capacity refusals (SPEC E4) a request is
// re-queued after before it is answered 503 over_capacity (the attempt
// machine's bound, for the tests that meet it from outside).
const MaxRefusals = maxRefusals
