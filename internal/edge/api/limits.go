package api

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"iop/internal/edge/access"
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
	conns  atomic.Int64 // open client connections, bound http.max_connections
	bodies limit.Budget // request-body bytes held, bound http.max_inflight_body_bytes

	connLog, bodyLog, keyLog ratelog.Limiter
}

// connOverKey marks, in a connection's context, a connection accepted
// beyond http.max_connections.
type connOverKey struct{}

// ConnContext is the http.Server hook that counts client connections
// (http.max_connections): a connection beyond the bound is served, but its
// requests get a fast 503 with Retry-After in the surface's shape and
// "Connection: close"; beyond twice the bound it is closed at once, without
// an answer. The accept loop never waits. Wire it with ConnState, which
// uncounts every connection ConnContext counted.
func (h *Handler) ConnContext(ctx context.Context, c net.Conn) context.Context {
	max := int64(h.current().maxConns)
	n := h.lim.conns.Add(1)
	if n <= max {
		return ctx
	}
	if n > 2*max {
		h.logRefusal(&h.lim.connLog, "client connection closed at once: over twice http.max_connections",
			slog.Int64("max_connections", max))
		c.Close()
	}
	return context.WithValue(ctx, connOverKey{}, true)
}

// ConnState is the http.Server hook that uncounts a connection that ended.
func (h *Handler) ConnState(c net.Conn, s http.ConnState) {
	if s == http.StateClosed || s == http.StateHijacked {
		h.lim.conns.Add(-1)
	}
}

// overConnections answers a request on a connection beyond
// http.max_connections; false when the connection is within the bound.
func (h *Handler) overConnections(w http.ResponseWriter, r *http.Request) bool {
	if over, _ := r.Context().Value(connOverKey{}).(bool); !over {
		return false
	}
	h.logRefusal(&h.lim.connLog, "client connection refused: over http.max_connections",
		slog.Int("max_connections", h.current().maxConns))
	w.Header().Set("Connection", "close")
	reject(w, r, surfaceFor(r.URL.Path), &apiError{status: http.StatusServiceUnavailable, typ: "server_error",
		code: access.CodeTooManyConnections, retryAfter: time.Second,
		msg: "the edge has too many client connections open; retry later"})
	return true
}

// bodyBusy is the answer to a request whose body would pass
// http.max_inflight_body_bytes.
func (h *Handler) bodyBusy() *apiError {
	h.logRefusal(&h.lim.bodyLog, "request refused: request bodies held over http.max_inflight_body_bytes",
		slog.Int64("held_bytes", h.lim.bodies.Used()))
	return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: access.CodeOverloaded, retryAfter: time.Second,
		msg: "the edge is receiving too many request bodies; retry later"}
}

// dropBody lets go of x's request body and gives its bytes back to the
// in-flight budget; idempotent.
func (h *Handler) dropBody(x *exchange) {
	if x.held > 0 {
		h.lim.bodies.Release(x.held)
		x.held = 0
	}
	x.body = nil
}

// logRefusal writes one Warn line through l (at most its burst a second),
// with the count of lines suppressed since the previous one.
func (h *Handler) logRefusal(l *ratelog.Limiter, msg string, attrs ...slog.Attr) {
	ok, suppressed := l.Allow(h.o.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("suppressed", suppressed))
	}
	h.log.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}
