package api

import (
	"net/http"

	"iop/internal/edge/limit"
	"iop/internal/ratelog"
)

// limits are the Handler's bounds on what clients may hold: connections
// (http.max_connections) and request-body bytes
// (http.max_inflight_body_bytes); each API key's own bounds are the
// keys.Registry's (keys.go). Refusals are logged at most
// ratelog.DefaultBurst lines a second per kind, with the count of
// suppressed lines.
type limits struct {
	conns  connTable    // client connections, bound http.max_connections (conns.go)
	bodies limit.Budget // request-body bytes held, bound http.max_inflight_body_bytes

	connLog, shedLog, bodyLog, keyLog, headerLog ratelog.Limiter
}

// connKey is the context key of a connection's *clientConn.
type connKey struct{}

// connOf is the entry of the connection r arrived on; nil when the server
// was not wired with ConnContext.
func connOf(r *http.Request) *clientConn {
	cc, _ := r.Context().Value(connKey{}).(*clientConn)
	return cc
}
