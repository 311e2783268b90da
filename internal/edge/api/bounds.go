package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	"iop/internal/ratelog"
)

// takeBody reads r's body under the Handler's bounds: max bytes
// (http.max_body_bytes) and the bytes held across all requests
// (http.max_inflight_body_bytes: a body that would pass it is a 503 with
// Retry-After). The returned body's cap(body) bytes stay counted until
// dropBody.
func (h *Handler) takeBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, *reply.Error) {
	body, err := readBody(w, r, max, &h.lim.bodies)
	if errors.Is(err, errBodyBudget) {
		return nil, h.bodyBusy()
	}
	if err != nil {
		return nil, err.(*reply.Error)
	}
	return body, nil
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
		h.shedConn(shed, max)
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
func (h *Handler) shedConn(cc *clientConn, max int) {
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
				h.shedConn(shed, max)
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

// Listener wraps the client listener so that the 431 net/http writes
// itself, for a head past the server's MaxHeaderBytes, is counted in
// MetricHeaderRefusals (SPEC B4): it never reaches a handler.
func (h *Handler) Listener(ln net.Listener) net.Listener {
	return &headerListener{Listener: ln, n: &h.headers.bytes}
}

// overHeaderBounds is the 431 of a request whose head passes
// http.max_header_bytes or http.max_header_fields, with the connection set
// to close after it; nil when it is within both. It runs before
// anything else looks at the request: no key is checked, no body read.
func (h *Handler) overHeaderBounds(w http.ResponseWriter, r *http.Request, v *view) *reply.Error {
	size, fields := headerSize(r)
	var e *reply.Error
	switch {
	case fields > v.maxHeaderFields:
		h.headers.fields.Add(1)
		e = &reply.Error{Status: http.StatusRequestHeaderFieldsTooLarge, Type: "invalid_request_error", Code: CodeHeaderTooLarge,
			Message: fmt.Sprintf("the request has %d header fields, more than http.max_header_fields (%d)", fields, v.maxHeaderFields)}
	case size > v.maxHeaderBytes:
		h.headers.bytes.Add(1)
		e = &reply.Error{Status: http.StatusRequestHeaderFieldsTooLarge, Type: "invalid_request_error", Code: CodeHeaderTooLarge,
			Message: fmt.Sprintf("the request head is %d bytes, more than http.max_header_bytes (%d)", size, v.maxHeaderBytes)}
	default:
		return nil
	}
	h.logRefusal(&h.lim.headerLog, "request refused: its head passes http.max_header_bytes or http.max_header_fields",
		slog.Int("header_bytes", size), slog.Int("header_fields", fields))
	w.Header().Set("Connection", "close")
	closeUnread(w, r)
	return e
}
