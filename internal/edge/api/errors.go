package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	apisurface "iop/internal/edge/surface"
	"iop/internal/protocol"
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

// surface is the API shape a request's errors take.
type surface uint8

const (
	surfaceOpenAI    surface = iota // {"error":{"message","type","param","code"}}
	surfaceAnthropic                // {"type":"error","error":{"type","message"}}
)

// apiError is one client-visible failure. typ and code are the OpenAI
// error type and code; the Anthropic type derives from status.
type apiError struct {
	status     int
	typ        string
	code       string
	param      string
	msg        string
	retryAfter time.Duration
	// detail is for the operator's log only: upstream addresses, adapter
	// names and transport errors never reach the client.
	detail string
	// clientGone: the client closed the connection before the request
	// was read (its body ended short of Content-Length, or the connection
	// was reset); nobody is left to answer (client_cancelled, 499).
	clientGone bool
}

func (e *apiError) Error() string { return strconv.Itoa(e.status) + " " + e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

func badGateway(code, msg string) *apiError {
	return &apiError{status: http.StatusBadGateway, typ: "server_error", code: code, msg: msg}
}

// appendErrorBody appends e as a JSON error object in the surface's shape.
func appendErrorBody(dst []byte, s surface, e *apiError) []byte {
	se := e.surface()
	if s == surfaceAnthropic {
		return apisurface.AppendAnthropicError(dst, &se)
	}
	return apisurface.AppendOpenAIError(dst, &se)
}

// surface is e as the surface converters see it (no retry or log detail).
func (e *apiError) surface() apisurface.Error {
	return apisurface.Error{Status: e.status, Type: e.typ, Code: e.code, Param: e.param, Message: e.msg}
}

// fromSurface is the client-visible error for a converter's e.
func fromSurface(e *apisurface.Error) *apiError {
	return &apiError{status: e.Status, typ: e.Type, code: e.Code, param: e.Param, msg: e.Message}
}

// jsonFieldError turns an encoding/json error into a 400 naming the field.
func jsonFieldError(err error) *apiError { return fromSurface(apisurface.JSONFieldError(err)) }

// writeError writes e as a complete HTTP error response in the surface's
// shape, with Retry-After in whole seconds (RFC 9110 §10.2.3) when set.
func writeError(w http.ResponseWriter, s surface, e *apiError) {
	noteError(w, e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		secs := int64((e.retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	w.WriteHeader(e.status)
	var buf [256]byte
	_, _ = w.Write(appendErrorBody(buf[:0], s, e))
}

// appendErrorEvent appends the SSE event that ends a stream which already
// sent bytes: OpenAI `data: {"error":{...}}`, Anthropic `event: error` with
// the error object as data.
//
// On the Responses API (ep is /v1/responses) it is the stream's `error`
// event: `event: error`, data {"type":"error","code","message","param"}
// as the API reference documents it, with the same error object under
// "error" as well, as the API itself sends it and as the official SDKs
// detect a failed stream (a top-level "error" member). Its
// sequence_number is left out: a tunnelled stream's numbers are the
// upstream's, which the Edge does not parse.
func appendErrorEvent(dst []byte, ep *endpoint, e *apiError) []byte {
	switch {
	case ep.surface == surfaceAnthropic:
		dst = append(dst, "event: error\n"...)
	case ep.operation == protocol.OpResponses:
		se := e.surface()
		dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"code\":"...)
		dst = apisurface.AppendNullable(dst, se.Code)
		dst = append(dst, `,"message":`...)
		dst = apisurface.AppendString(dst, se.Message)
		dst = append(dst, `,"param":`...)
		dst = apisurface.AppendNullable(dst, se.Param)
		dst = append(dst, ',')
		body := apisurface.AppendOpenAIError(dst[len(dst):], &se) // {"error":{…}}
		dst = append(dst, body[1:]...)
		return append(dst, '\n', '\n')
	}
	dst = append(dst, "data: "...)
	dst = appendErrorBody(dst, ep.surface, e)
	return append(dst, '\n', '\n')
}

// poolError maps an Acquire error to the client-visible one (SPEC Q4):
// unknown model 404, no candidate for the operation 400, queue full 429
// with Retry-After, wait timeout 503 naming the model and the reason.
func poolError(model string, err error) *apiError {
	var qf *pool.QueueFullError
	var wt *pool.WaitTimeoutError
	var nc *pool.NoCandidateError
	switch {
	case errors.Is(err, pool.ErrUnknownModel):
		return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found", param: "model",
			msg: fmt.Sprintf("the model %q does not exist", truncate(model, access.MaxModelLen))}
	case errors.As(err, &qf):
		ra := qf.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full", retryAfter: ra,
			msg: fmt.Sprintf("model %q: too many requests waiting; retry later", model)}
	case errors.Is(err, pool.ErrQueueFull):
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full", retryAfter: time.Second,
			msg: fmt.Sprintf("model %q: too many requests waiting; retry later", model)}
	case errors.As(err, &wt):
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_provider_available",
			msg: fmt.Sprintf("model %q: no live provider within %s: %s", wt.Model, wt.Waited, wt.Reason)}
	case errors.Is(err, pool.ErrWaitTimeout):
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_provider_available",
			msg: fmt.Sprintf("model %q: no live provider in time", model)}
	case errors.As(err, &nc):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "operation_not_supported", param: "model",
			msg: nc.Error()}
	case errors.Is(err, pool.ErrNoCandidate):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "operation_not_supported", param: "model",
			msg: fmt.Sprintf("model %q has no provider for this endpoint", model)}
	default:
		return &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: "internal error while selecting a provider"}
	}
}
