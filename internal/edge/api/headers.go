package api

import (
	"bytes"
	"net"
	"net/http"
	"sync/atomic"

	"iop/internal/edge/config"
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

// metric is MetricHeaderRefusals for Metrics.
func (c *headerCounts) metric() Metric {
	return Metric{MetricHeaderRefusals,
		"Requests refused 431 for their head, by the bound passed: bytes (http.max_header_bytes, net/http's own refusals included) or fields (http.max_header_fields).",
		func() map[string]float64 {
			return map[string]float64{`bound="bytes"`: float64(c.bytes.Load()), `bound="fields"`: float64(c.fields.Load())}
		}}
}
