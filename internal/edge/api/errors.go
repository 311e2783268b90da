package api

import (
	"errors"
	"net/http"
	"time"

	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
)

// Errors the surface reports through Options.Logger and uses as context
// causes (exchange's); test with errors.Is.
var (
	// ErrFenced: the lease's node generation was fenced mid-request (SPEC L8).
	ErrFenced = exchange.ErrFenced
	// ErrResponseWait: no frame or event arrived within the response-wait
	// timeout (the lease's stall timeout plus Options.ResponseWaitGrace).
	ErrResponseWait = exchange.ErrResponseWait
	// ErrClientGone: the client went away or a write to it failed (SPEC T3).
	ErrClientGone = errors.New("api: client gone")
)

// jsonFieldError turns an encoding/json error into a 400 naming the field.
func jsonFieldError(err error) *reply.Error { return apisurface.JSONFieldError(err) }

// reject answers a request refused before its body was read. An unread
// body would make the server drain it before answering, so a client that
// declared a body and never sends it could hold the connection: the
// connection is closed after the answer instead.
func reject(w http.ResponseWriter, r *http.Request, s reply.Surface, e *reply.Error) {
	closeUnread(w, r)
	reply.WriteError(w, s, e)
}

func closeUnread(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func methodNotAllowed(w http.ResponseWriter, s reply.Surface, allow string) {
	w.Header().Set("Allow", allow)
	reply.WriteError(w, s, &reply.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: "method not allowed; use " + allow})
}
