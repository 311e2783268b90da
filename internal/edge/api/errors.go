package api

import (
	"errors"
	"fmt"
	"iop/internal/edge/reply"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	apisurface "iop/internal/edge/surface"
)

// Errors the surface reports through Options.Logger and uses as context
// causes; test with errors.Is.
var (
	// ErrFenced: the lease's node generation was fenced mid-request (SPEC L8).
	ErrFenced = errors.New("api: provider lease fenced")
	// ErrResponseWait: no frame or event arrived within the response-wait
	// timeout (the lease's stall timeout plus Options.ResponseWaitGrace).
	ErrResponseWait = errors.New("api: response wait timeout")
	// ErrClientGone: the client went away or a write to it failed (SPEC T3).
	ErrClientGone = errors.New("api: client gone")
)

// jsonFieldError turns an encoding/json error into a 400 naming the field.
func jsonFieldError(err error) *reply.Error { return apisurface.JSONFieldError(err) }

// poolError maps an Acquire error to the client-visible one (SPEC Q4):
// unknown model 404, no candidate for the operation 400, queue full 429
// with Retry-After, wait timeout 503 naming the model and the reason.
func poolError(model string, err error) *reply.Error {
	var qf *pool.QueueFullError
	var wt *pool.WaitTimeoutError
	var nc *pool.NoCandidateError
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
	case errors.Is(err, pool.ErrWaitTimeout):
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
