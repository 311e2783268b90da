// Package h1 is the Node's HTTP/1.1 client transport for plain-HTTP
// backends (http://: Ollama, llama-server, vLLM on the host or the LAN).
//
// It does what net/http.Transport does for such a backend — keep-alive
// connection pooling, Content-Length and chunked bodies, cancellation by the
// request's context — without Transport's two goroutines per connection:
// the calling goroutine writes the request and reads the response itself,
// and the response body reads straight from the connection. A request
// therefore costs no goroutine hand-off on the Node; on a busy 2-core host
// each hand-off is a scheduler wake-up, and the Node's share of an
// edge→node→backend round trip is mostly wake-ups.
//
// Other schemes (https: remote APIs, HTTP/2) and protocol upgrades go to
// Fallback unchanged. The package starts no goroutine (a cancelled request's
// context callback sets a past deadline on its connection), logs nothing
// and reads no environment (no proxy).
package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults for Transport's zero fields.
const (
	DefaultMaxIdlePerHost = 64
	DefaultIdleTimeout    = 90 * time.Second
	// MaxResponseHeaderBytes caps a response's status line and headers
	// (net/http's Transport allows 10 MB; a backend's are a few hundred).
	MaxResponseHeaderBytes = 1 << 20
	maxInformational       = 5       // 1xx answers before the real one, as net/http
	bufferSize             = 4 << 10 // bytes, per connection and direction
)

// Transport is an http.RoundTripper; safe for concurrent use.
type Transport struct {
	// Dial opens a TCP connection; nil means a net.Dialer with a 10 s
	// timeout and 30 s keep-alive.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxIdlePerHost bounds the idle connections kept per host:port.
	MaxIdlePerHost int
	// IdleTimeout closes a connection idle for longer (checked on reuse).
	IdleTimeout time.Duration
	// ProbeAfter: a connection idle for longer is checked before it is
	// reused (one non-blocking MSG_PEEK): one the backend closed
	// (llama-server closes idle ones after 5 s) or that holds bytes nobody
	// asked for is dropped. 0 = every reuse (net/http's Transport watches
	// each idle connection with a goroutine instead); negative = never.
	ProbeAfter time.Duration
	// Fallback serves every request that is not plain http:// (required
	// for those).
	Fallback http.RoundTripper

	mu   sync.Mutex
	idle map[string][]*conn // by host:port; the most recently used last
}

// conn is one keep-alive connection.
type conn struct {
	addr   string // the pool key: host:port as the request named it
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	read   int64 // bytes read by the current exchange
	limit  int64 // while reading a response head: read may not pass it
	usedAt time.Time
}

// errHeaderTooLarge: a response head over MaxResponseHeaderBytes.
var errHeaderTooLarge = fmt.Errorf("h1: response headers over %d bytes", MaxResponseHeaderBytes)

func (c *conn) Read(p []byte) (int, error) {
	if c.limit > 0 && c.read >= c.limit {
		return 0, errHeaderTooLarge
	}
	n, err := c.nc.Read(p)
	c.read += int64(n)
	return n, err
}

// ErrConnClosed: the backend closed a reused keep-alive connection before
// answering (wrapped). The request was sent again once, on a new
// connection, when that was safe: the write had failed, or the method is
// idempotent.
var ErrConnClosed = errors.New("h1: backend closed the connection before answering")

// RoundTrip implements http.RoundTripper (RFC 9112 message framing, as
// net/http reads and writes it). Errors: the dial's, the write's or the
// read's, wrapped; the request context's error when it ended first.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
		if t.Fallback == nil {
			return nil, fmt.Errorf("h1: no fallback transport for %s", req.URL.Scheme)
		}
		return t.Fallback.RoundTrip(req)
	}
	addr := hostPort(req)
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			closeBody(req)
			return nil, fmt.Errorf("h1: %s %s: %w", req.Method, req.URL.Redacted(), context.Cause(ctx))
		}
		c, reused := t.get(addr)
		if c == nil {
			var err error
			if c, err = t.dial(ctx, addr); err != nil {
				closeBody(req)
				return nil, err
			}
		}
		resp, err := t.exchange(ctx, c, req)
		if err == nil {
			return resp, nil
		}
		c.nc.Close()
		if ctx.Err() != nil {
			closeBody(req)
			return nil, fmt.Errorf("h1: %s %s: %w", req.Method, req.URL.Redacted(), context.Cause(ctx))
		}
		// A reused connection the backend closed while it sat idle fails
		// before any byte of an answer: send again on a new one, once, when
		// the body can be sent again — and only when the backend cannot
		// have acted on it: the write itself failed, or the method is
		// idempotent. A POST the backend may have read is never sent twice
		// (one chat completion, one generation), as with net/http.
		if reused && attempt == 0 && c.read == 0 && retryable(err) {
			if isWriteError(err) || idempotent(req.Method) {
				if r2, ok := rewind(req); ok {
					req = r2
					continue
				}
			}
			err = fmt.Errorf("%w: %w", ErrConnClosed, err)
		}
		closeBody(req)
		return nil, fmt.Errorf("h1: %s %s: %w", req.Method, req.URL.Redacted(), err)
	}
}

// exchange writes req on c and reads the response head; the body reads
// from c and returns it to the pool at its end.
func (t *Transport) exchange(ctx context.Context, c *conn, req *http.Request) (*http.Response, error) {
	c.read = 0
	stop := context.AfterFunc(ctx, func() {
		_ = c.nc.SetDeadline(time.Unix(1, 0)) // unblocks a read or write at once
	})
	err := req.Write(c.bw)
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		stop()
		// net/http's request writer does not always wrap the socket's
		// error (errors.Is cannot see EPIPE through it): mark the failure
		// as the write's. The Node's bodies are in memory and never fail
		// to read.
		return nil, &writeError{err}
	}
	var resp *http.Response
	c.limit = c.read + MaxResponseHeaderBytes
	for n := 0; ; n++ {
		resp, err = http.ReadResponse(c.br, req)
		if err != nil {
			stop()
			return nil, err
		}
		if resp.StatusCode < 100 { // "000"-"099" parse, but no status is below 100 (RFC 9110 §15)
			stop()
			resp.Body.Close()
			return nil, fmt.Errorf("h1: invalid status %q from the backend", resp.Status)
		}
		// 1xx informational answers (103 Early Hints) precede the real one.
		if resp.StatusCode >= 200 {
			break
		}
		if resp.StatusCode == http.StatusSwitchingProtocols || n+1 >= maxInformational {
			stop()
			return nil, fmt.Errorf("h1: unexpected %s from the backend", resp.Status)
		}
	}
	c.limit = 0
	keep := !resp.Close && !req.Close
	if resp.Body == http.NoBody || resp.Body == nil {
		if stop() && keep {
			t.put(c)
		} else {
			c.nc.Close()
		}
		return resp, nil
	}
	resp.Body = &body{t: t, c: c, rc: resp.Body, ctx: ctx, stop: stop, keep: keep}
	return resp, nil
}

// body returns its connection to the pool after the last byte was read, and
// closes it when the body is closed early or fails. Close may be called
// while a Read blocks in another goroutine (it closes the connection under
// it), as with net/http's Transport.
type body struct {
	t    *Transport
	c    *conn
	rc   io.ReadCloser
	ctx  context.Context
	stop func() bool
	keep bool
	done atomic.Bool
}

func (b *body) Read(p []byte) (int, error) {
	if b.done.Load() {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.finish(true)
	case err != nil:
		b.finish(false)
		if b.ctx.Err() != nil {
			err = context.Cause(b.ctx)
		}
	}
	return n, err
}

func (b *body) Close() error {
	b.finish(false)
	return nil
}

func (b *body) finish(atEOF bool) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	if b.stop() && atEOF && b.keep {
		b.t.put(b.c)
		return
	}
	b.c.nc.Close()
}

func (t *Transport) dial(ctx context.Context, addr string) (*conn, error) {
	dial := t.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("h1: dial %s: %w", addr, err)
	}
	c := &conn{addr: addr, nc: nc}
	c.br = bufio.NewReaderSize(c, bufferSize)
	c.bw = bufio.NewWriterSize(nc, bufferSize)
	return c, nil
}

// get takes the most recently used idle connection to addr that is still
// usable; reused reports whether one was found.
func (t *Transport) get(addr string) (c *conn, reused bool) {
	maxIdle, probe := t.IdleTimeout, t.ProbeAfter
	if maxIdle <= 0 {
		maxIdle = DefaultIdleTimeout
	}
	now := time.Now()
	for {
		t.mu.Lock()
		list := t.idle[addr]
		if len(list) == 0 {
			t.mu.Unlock()
			return nil, false
		}
		c = list[len(list)-1]
		list[len(list)-1] = nil
		t.idle[addr] = list[:len(list)-1]
		t.mu.Unlock()
		idle := now.Sub(c.usedAt)
		if idle > maxIdle || (probe >= 0 && idle >= probe && !alive(c.nc)) {
			c.nc.Close()
			continue
		}
		return c, true
	}
}

// put returns c to the pool, or closes it when the pool is full.
func (t *Transport) put(c *conn) {
	if c.br.Buffered() > 0 { // bytes beyond the answer: the stream is off
		c.nc.Close()
		return
	}
	_ = c.nc.SetDeadline(time.Time{})
	c.usedAt = time.Now()
	maxIdle := t.MaxIdlePerHost
	if maxIdle <= 0 {
		maxIdle = DefaultMaxIdlePerHost
	}
	addr := c.addr
	t.mu.Lock()
	if t.idle == nil {
		t.idle = make(map[string][]*conn)
	}
	if len(t.idle[addr]) < maxIdle {
		t.idle[addr] = append(t.idle[addr], c)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	c.nc.Close()
}

// CloseIdleConnections closes every idle connection and the Fallback's
// (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, list := range idle {
		for _, c := range list {
			c.nc.Close()
		}
	}
	if ci, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// alive peeks at an idle connection without blocking: a backend that closed
// it (EOF), reset it, or sent bytes nobody asked for makes it unusable.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = n < 0 && (err == syscall.EAGAIN || err == syscall.EWOULDBLOCK)
		return true // never wait
	})
	return err == nil && ok
}

// writeError is a failed request write on the connection.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

func isWriteError(err error) bool {
	var we *writeError
	return errors.As(err, &we)
}

// idempotent reports whether a request with this method may be sent twice
// (RFC 9110 §9.2.2).
func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// retryable reports whether err is what a write to, or a read from, a
// connection the peer already closed returns.
func retryable(err error) bool {
	var we *writeError
	return errors.As(err, &we) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// rewind returns req with a fresh body for a second attempt.
func rewind(req *http.Request) (*http.Request, bool) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	b, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	r2 := *req
	r2.Body = b
	return &r2, true
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// hostPort is the request's host:port, port 80 when the URL has none.
func hostPort(req *http.Request) string {
	h := req.URL.Host
	if _, _, err := net.SplitHostPort(h); err == nil {
		return h
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		return h + ":80"
	}
	return net.JoinHostPort(h, "80")
}
