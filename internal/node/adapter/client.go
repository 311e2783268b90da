package adapter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sync/atomic"
	"time"
)

// Upstream connections.
//
// Idle lifetime. A pooled keep-alive connection is reused only while it has
// been idle for less than the adapter's AdapterConfig.upstream_idle_timeout_ms
// (the Edge sends the adapter's value, else its profile's default; 0 here
// means DefaultUpstreamIdleTimeout). llama-server and vLLM close a connection
// idle for 5 s; a client that reuses one at that instant writes its request
// into a socket the backend is closing, and the request fails with nothing
// answered (the keep-alive race). Expiring idle connections before the
// backend does removes the race instead of repairing it afterwards. Each
// adapter instance therefore has its own client and pool.
//
// Connections a backend closes without saying so. llama.cpp's llama-server
// (e95dae18, cpp-httplib 0.46.1; read in tools/server/server-http.cpp and
// vendor/cpp-httplib) answers a streamed request ("stream": true, a chunked
// text/event-stream answer) and then closes the connection at once, although
// the answer's head says "Keep-Alive: timeout=5, max=100" and not
// "Connection: close": its chunked content provider returns false after
// sink.done(), cpp-httplib's write_content_chunked reports that as a failed
// write, and process_server_socket_core leaves the connection's keep-alive
// loop and calls shutdown(SHUT_RDWR) and close — without reading, let alone
// parsing, anything the client sends after the answer. A client that reuses
// the connection in the instant before the server's FIN arrives (a request
// waiting for a connection is handed it the moment the answer's last chunk
// is read) writes its request into a closed socket and gets EOF or a reset
// and no answer: 100 % of the requests sent on such a connection fail, and
// under bursts a few in a hundred are. The node therefore never writes a
// request on a connection whose last answer came chunked from a server that
// says "Server: llama.cpp": such a connection's Write fails before it writes
// a byte (errClosesAfterAnswer), which net/http's Transport treats as
// "nothing written" on a reused connection and answers by taking another
// connection or dialing a new one, with the request body rewound — the
// resend of the first rule below, provably safe because the backend got
// nothing. The rest of llama-server's HTTP layer closes nothing unannounced:
// idle keep-alive connections close after 5 s (CPPHTTPLIB_KEEPALIVE_TIMEOUT_
// SECOND, counted from the end of the last answer; the idle lifetime above
// stays below it), the 100th answer on a connection and every answer with a
// status of 400 or more carry "Connection: close" (net/http honours it),
// and the HTTP thread pool (--threads-http fixed threads, by default
// max(-np + 4, cores - 1), plus up to 1024 more on demand, and an unbounded
// task queue) never closes an accepted connection for want of a thread; a
// request that finds every -np slot busy waits in the server's task queue on
// its HTTP thread and is answered, not closed. (The listen backlog is 5: a
// burst of new connections may wait a SYN retransmission, never fail.)
//
// Resending. A request that fails on a reused connection before any byte
// of an answer is sent again, on another connection, only when the backend
// cannot have started it. For an inference POST (one generation per
// request, never idempotent) that is exactly:
//
//   - the connection was found closed before the request was written (the
//     backend's FIN or RST was already there; net/http's Transport watches
//     every idle connection and drops it): nothing was sent, so another
//     connection is taken — not even a resend;
//   - not one byte of the request was written on the connection it failed
//     on, whatever net/http calls the failure: its nothingWrittenError
//     (which includes a connection the node knows the backend closes after
//     its last answer, above), and its "server closed idle connection",
//     which it resends only for idempotent requests — the backend's FIN
//     arrived while the request was taking the idle connection, before the
//     request was registered on it (net/http then closes the connection
//     and writes nothing). The node counts the bytes written on each
//     connection, so this does not depend on how net/http names it. The
//     backend has nothing, so it cannot have started a generation; the
//     request is sent again at most 3 times. (A request whose
//     write failed part-way could not have started one either — the node
//     sends a Content-Length body and a server acts on a request only once
//     its body is complete — but net/http does not resend it, and the
//     Edge's re-dispatch covers it.)
//
// A request that was written completely and then saw EOF or a reset with
// no answer is NOT sent again on the node: a backend that read it and then
// crashed or closed looks the same on the wire as one that closed an idle
// connection just before the request arrived, and a second POST could run
// a second generation. The node reports it as upstream_reset (no connection
// at all: upstream_connect), and the Edge, which alone can pick another
// provider, decides: it ejects the provider for a while (passive health)
// and re-dispatches the request to a candidate not tried yet, never after a
// byte reached the client.
//
// How this compares. Go's net/http.Transport, which the node uses, resends
// a request whose bytes were never written (nothingWrittenError) and, for
// idempotent or Idempotency-Key requests only, one that failed reading the
// first response byte on a reused connection; a POST that was written is
// never resent — the line above. Envoy's retry_on "reset"
// resends after any reset or disconnect before the response, whatever the
// method — including after the upstream saw the request, which is why Envoy
// added "reset-before-request" (retry only if the request was not yet sent)
// for non-idempotent traffic — and "connect-failure" resends when the TCP
// connection could not be opened. The node takes "reset-before-request"'s
// line; the Edge's re-dispatch to another provider plays the part of
// "connect-failure" and "reset", bounded and within one deadline.

// Defaults of the upstream clients.
const (
	// DefaultUpstreamIdleTimeout is the idle lifetime of a pooled upstream
	// connection when the adapter config sets none (Ollama's Go server and
	// hosted APIs keep idle connections longer; net/http's own default).
	DefaultUpstreamIdleTimeout = 90 * time.Second
	// maxIdlePerHost bounds the idle connections kept per backend.
	maxIdlePerHost = 64
	// maxResponseHeaderBytes caps a response's status line and headers
	// (net/http allows 10 MB by default; a backend's are a few hundred).
	maxResponseHeaderBytes = 1 << 20
)

// newClient returns the HTTP client of one adapter instance: net/http's
// Transport (HTTP/2 when an https backend offers it), pooled keep-alive
// connections idle at most idle (<= 0: the default), response heads of at
// most maxResponseHeaderBytes, no proxy (reading proxy settings from the
// environment is main's job), no overall timeout (streams last long), no
// transparent decompression (bodies stream as sent), and no redirect ever
// followed (keepRedirect).
//
// Why not a hand-written client: the node had one (h1.Transport: the
// calling goroutine wrote the request and read the answer, no per-
// connection goroutines) until it was measured against this one in the
// same benchmark runs (BENCHMARKS.md, "Resilience: one of two providers
// answers 503"): 16
// allocations and ~1.5 KiB less per request and some 10 % less node CPU
// on a loopback demo backend, no latency difference above the noise —
// nothing a user of a model server would notice.
func newClient(idle time.Duration) *http.Client {
	if idle <= 0 {
		idle = DefaultUpstreamIdleTimeout
	}
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	std := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &trackedConn{Conn: c}, nil
		},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           4 * maxIdlePerHost,
		MaxIdleConnsPerHost:    maxIdlePerHost,
		IdleConnTimeout:        idle,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	return &http.Client{Transport: &closeAwareTransport{base: std}, CheckRedirect: keepRedirect}
}

// keepRedirect is every upstream client's redirect policy: a 3xx is the
// upstream's answer and is returned as it is, never followed. Following
// one would send the request — its body and the upstream key in the
// adapter's auth header (net/http drops Authorization only across hosts,
// never a custom header such as x-api-key) — wherever a backend's
// Location points: another host, another port of this one, the edge's
// admin listener. Runs, tunnels and probes all go through clients with
// this policy (newClient; NewSet applies it to Options.HTTPClient too).
func keepRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// noRedirects returns c with the keepRedirect policy: c itself when it
// already has it is not detectable, so a shallow copy sharing c's
// Transport (and its connection pool) is returned.
func noRedirects(c *http.Client) *http.Client {
	cp := *c
	cp.CheckRedirect = keepRedirect
	return &cp
}

// errClosesAfterAnswer is the Write error of a connection whose backend
// closes it after its last answer without saying so (see the package's
// "Connections a backend closes without saying so"); nothing was written,
// so net/http's Transport takes another connection for the request.
var errClosesAfterAnswer = errors.New("the backend closes this connection after its last answer; not reused")

// trackedConn is a dialed upstream connection that counts the bytes written
// on it and can be marked as closed by the backend after the answer it is
// carrying; from then on Write returns errClosesAfterAnswer without
// writing. closing is set by the request's goroutine
// (closeAwareTransport.RoundTrip) while the answer's body is still unread,
// so before the Transport can hand the connection to another request;
// Write runs on the Transport's write goroutine.
type trackedConn struct {
	net.Conn
	closing atomic.Bool
	written atomic.Int64 // bytes written
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if c.closing.Load() {
		return 0, errClosesAfterAnswer
	}
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// maxUnwrittenResends bounds how often one request is sent again after
// failing with none of its bytes written (each time on the connection the
// Transport gives it next, a new one once the idle ones are gone).
const maxUnwrittenResends = 3

// closeAwareTransport is net/http's Transport plus two rules (see
// "Connections a backend closes without saying so" and "Resending"): a
// connection whose answer closesAfter reports is never written again, and a
// request that failed with not one of its bytes written on its connection
// is sent again.
type closeAwareTransport struct {
	base interface {
		http.RoundTripper
		CloseIdleConnections()
	} // *http.Transport; a fake in tests
}

// RoundTrip sends req on base, noting which connection carried it
// (httptrace's GotConn, called on this goroutine; the last call wins when
// the Transport took another connection) and how many bytes had been
// written on it before. It marks that connection when the backend closes it
// after this answer. A request that failed on a connection without one of
// its bytes written on it — the backend's close of an idle connection met
// the request as it took the connection (net/http's "server closed idle
// connection", which it resends only for idempotent requests), or the
// connection was marked — is sent again with its body rewound, at most
// maxUnwrittenResends times, while req's context lives. (After an error
// the Transport's write goroutine for that connection has ended, so the
// count is final.)
func (t *closeAwareTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	for resends := 0; ; resends++ {
		var conn *trackedConn
		var before int64
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
			conn, _ = unwrapConn(i.Conn).(*trackedConn)
			if conn != nil {
				before = conn.written.Load()
			}
		}}
		resp, err := t.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
		if err == nil {
			if conn != nil && closesAfter(resp) {
				conn.closing.Store(true)
			}
			return resp, nil
		}
		if conn == nil || conn.written.Load() != before || resends == maxUnwrittenResends || req.Context().Err() != nil {
			return nil, err
		}
		next, ok := rewind(req)
		if !ok {
			return nil, err
		}
		req = next
	}
}

// rewind returns req with a fresh body for a resend, or false when its body
// cannot be read again.
func rewind(req *http.Request) (*http.Request, bool) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	next := req.WithContext(req.Context())
	next.Body = body
	return next, true
}

// CloseIdleConnections closes base's idle connections (http.Client.
// CloseIdleConnections calls it).
func (t *closeAwareTransport) CloseIdleConnections() { t.base.CloseIdleConnections() }

// closesAfter reports whether the backend closes the connection right after
// resp although resp does not say "Connection: close": an HTTP/1.1 chunked
// answer from llama.cpp's llama-server ("Server: llama.cpp"), which ends its
// keep-alive loop after every streamed answer.
func closesAfter(resp *http.Response) bool {
	return !resp.Close && resp.ProtoMajor == 1 && slices.Contains(resp.TransferEncoding, "chunked") &&
		resp.Header.Get("Server") == "llama.cpp"
}

// unwrapConn returns the connection under a TLS one (an https backend), or c.
func unwrapConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}

// idleTimeout is the idle lifetime in AdapterConfig.upstream_idle_timeout_ms
// (ms; 0 = the default), or an error for a negative or oversized value.
func idleTimeout(ms int64) (time.Duration, error) {
	if ms < 0 || ms > int64(24*time.Hour/time.Millisecond) {
		return 0, fmt.Errorf("%w: %d ms (want 0 to 86400000)", ErrBadIdleTimeout, ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
