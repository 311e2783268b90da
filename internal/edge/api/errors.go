package api

import (
	"errors"
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
