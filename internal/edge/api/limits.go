package api

import (
	"context"
	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	"log/slog"
	"net"
	"net/http"
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

// ConnContext is the http.Server hook that counts client connections
// (http.max_connections, conns.go): a new connection at the bound takes
// the slot of the longest-quiet connection that never presented a valid
// key, which is closed; without one it is over the bound: its requests get
// a fast 503 with Retry-After in the surface's shape and "Connection:
// close" unless they present a valid key (claim), and beyond twice the
// bound it is closed at once, without an answer. The accept loop never
// waits. Wire it with ConnState, which follows every connection
// ConnContext counted until it closes.
func (h *Handler) ConnContext(ctx context.Context, c net.Conn) context.Context {
	max := h.current().maxConns
	cc, shed, closeNow := h.lim.conns.accept(c, max)
	if shed != nil {
		h.shed(shed, max)
	}
	if closeNow {
		h.logRefusal(&h.lim.connLog, "client connection closed at once: over twice http.max_connections",
			slog.Int("max_connections", max))
		c.Close()
	}
	return context.WithValue(ctx, connKey{}, cc)
}

// ConnState is the http.Server hook that follows a connection's state:
// whether it is quiet (may be shed) and when it ended.
func (h *Handler) ConnState(c net.Conn, s http.ConnState) {
	if s != http.StateNew {
		h.lim.conns.state(c, s)
	}
}

// shed closes cc, a quiet connection whose slot went to another.
func (h *Handler) shed(cc *clientConn, max int) {
	h.logRefusal(&h.lim.shedLog, "quiet client connection closed: its slot went to a new one at http.max_connections",
		slog.Int("max_connections", max), slog.Bool("keyed", cc.keyed.Load()))
	cc.c.Close()
}

// overConnections answers a request on a connection beyond
// http.max_connections; false when the connection is within the bound or
// the request presents a valid key and so claimed a slot (conns.go). s is
// the path's error shape (routeOf).
func (h *Handler) overConnections(w http.ResponseWriter, r *http.Request, s reply.Surface) bool {
	cc := connOf(r)
	if cc == nil || !cc.over.Load() {
		return false
	}
	max := h.current().maxConns
	if key, ok := requestKey(r, s); ok && key != "" && !h.keys.OpenMode() {
		if _, err := h.keys.Authenticate(key, h.o.Now()); err == nil {
			ok, shed := h.lim.conns.claim(cc, max)
			if shed != nil {
				h.shed(shed, max)
			}
			if ok {
				return false
			}
		}
	}
	h.logRefusal(&h.lim.connLog, "client connection refused: over http.max_connections",
		slog.Int("max_connections", max))
	w.Header().Set("Connection", "close")
	reject(w, r, s, &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error",
		Code: access.CodeTooManyConnections, RetryAfter: time.Second,
		Message: "the edge has too many client connections open; retry later"})
	return true
}

// bodyBusy is the answer to a request whose body would pass
// http.max_inflight_body_bytes.
func (h *Handler) bodyBusy() *reply.Error {
	h.logRefusal(&h.lim.bodyLog, "request refused: request bodies held over http.max_inflight_body_bytes",
		slog.Int64("held_bytes", h.lim.bodies.Used()))
	return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: access.CodeOverloaded, RetryAfter: time.Second,
		Message: "the edge is receiving too many request bodies; retry later"}
}

// dropBody lets go of x's request body and gives its bytes back to the
// in-flight budget; idempotent.
func (h *Handler) dropBody(x *exchange.Exchange) {
	if x.Held > 0 {
		h.lim.bodies.Release(x.Held)
		x.Held = 0
	}
	x.Body = nil
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
