package h1

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// scriptConn is a connection whose peer answered with script, then closed;
// what is written to it is discarded.
type scriptConn struct {
	r *bytes.Reader
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzResponse: whatever a plain-HTTP backend answers (peer input: status
// line, headers, Content-Length or chunked framing, 1xx answers, surplus
// bytes), the Transport never panics and never reads a head past
// MaxResponseHeaderBytes; a response it returns has a status and a body
// that reads to its end or fails.
func FuzzResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n5\r\ndata:\r\n0\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\n\r\n",
		"HTTP/1.0 500 oops\r\n\r\nbody until close",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
		"garbage\r\n\r\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, answer []byte, post bool) {
		tr := &Transport{Dial: func(context.Context, string, string) (net.Conn, error) {
			return &scriptConn{r: bytes.NewReader(answer)}, nil
		}}
		defer tr.CloseIdleConnections()
		method, body := http.MethodGet, io.Reader(nil)
		if post {
			method, body = http.MethodPost, strings.NewReader(`{"model":"tiny"}`)
		}
		req, err := http.NewRequest(method, "http://backend:8081/v1/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			if errors.Is(err, errHeaderTooLarge) && len(answer) <= MaxResponseHeaderBytes {
				t.Fatalf("a %d-byte answer reported as over the head cap", len(answer))
			}
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 999 {
			t.Fatalf("status %d returned", resp.StatusCode)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		if n > int64(len(answer)) {
			t.Fatalf("read %d body bytes from a %d-byte answer", n, len(answer))
		}
	})
}
