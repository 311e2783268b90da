package api

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"iop/internal/edge/config"
	"iop/internal/edge/reply"
)

// MetricHeaderRefusals counts requests refused 431 for their head (SPEC
// B4), by the bound they passed: bound="bytes" (http.max_header_bytes,
// including the heads net/http refuses itself before any handler) or
// bound="fields" (http.max_header_fields).
const MetricHeaderRefusals = "iop_edge_header_refusals_total"

// CodeHeaderTooLarge is the error code of a 431 (RFC 6585 §5).
const CodeHeaderTooLarge = "request_header_fields_too_large"

// headerCounts are the 431s by bound.
type headerCounts struct{ bytes, fields atomic.Int64 }

// MaxHeaderBytes is http.max_header_bytes of cfg (its default for none):
// the value for the client listener's http.Server.MaxHeaderBytes, which
// makes net/http refuse, before any handler, a head that exceeds it by more
// than its 4 KiB read slack; the handler refuses the rest (SPEC B4).
func MaxHeaderBytes(cfg *config.Config) int {
	if cfg != nil && cfg.HTTP.MaxHeaderBytes > 0 {
		return cfg.HTTP.MaxHeaderBytes
	}
	return config.DefaultMaxHeaderBytes
}

// Listener wraps the client listener so that the 431 net/http writes
// itself, for a head past the server's MaxHeaderBytes, is counted in
// MetricHeaderRefusals (SPEC B4): it never reaches a handler.
func (h *Handler) Listener(ln net.Listener) net.Listener {
	return &headerListener{Listener: ln, n: &h.headers.bytes}
}

type headerListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *headerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &headerConn{Conn: c, n: l.n}, nil
}

// headerConn counts net/http's own 431. It writes that answer straight to
// the connection in one Write, in these bytes (net/http's server.go), while
// a handler's 431 is JSON (Content-Type application/json) and never starts
// so.
type headerConn struct {
	net.Conn
	n *atomic.Int64
}

var netHTTP431 = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n")

func (c *headerConn) Write(p []byte) (int, error) {
	if len(p) >= len(netHTTP431) && p[9] == '4' && p[10] == '3' && p[11] == '1' && bytes.HasPrefix(p, netHTTP431) {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection as net/http does before it closes
// one it refused (so the client reads the answer instead of a reset).
func (c *headerConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// headerSize is the bytes of r's head as sent: the request line and every
// field line with its CRLF, and the blank line.
func headerSize(r *http.Request) (size, fields int) {
	size = len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2 + 2
	if r.Host != "" { // net/http moves Host out of r.Header
		size += len("Host: ") + len(r.Host) + 2
		fields++
	}
	for name, values := range r.Header {
		for _, v := range values {
			size += len(name) + 2 + len(v) + 2
		}
		fields += len(values)
	}
	return size, fields
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

// headerMetric is MetricHeaderRefusals for Metrics.
func (h *Handler) headerMetric() Metric {
	return Metric{MetricHeaderRefusals,
		"Requests refused 431 for their head, by the bound passed: bytes (http.max_header_bytes, net/http's own refusals included) or fields (http.max_header_fields).",
		func() map[string]float64 {
			return map[string]float64{`bound="bytes"`: float64(h.headers.bytes.Load()), `bound="fields"`: float64(h.headers.fields.Load())}
		}}
}
