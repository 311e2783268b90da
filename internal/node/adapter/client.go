package adapter

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// Upstream connections (issue 11).
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
// Resending. A request that fails on a reused connection before any byte
// of an answer is sent again, on another connection, only when the backend
// cannot have started it. For an inference POST (one generation per
// request, never idempotent) that is exactly:
//
//   - the connection was found closed before the request was written (the
//     backend's FIN or RST was already there; net/http's Transport watches
//     every idle connection and drops it): nothing was sent, so another
//     connection is taken — not even a resend;
//   - not one byte of the request was written (net/http's
//     nothingWrittenError): the backend has nothing, so it cannot have
//     started a generation. (A request whose write failed part-way could
//     not have started one either — the node sends a Content-Length body
//     and a server acts on a request only once its body is complete — but
//     net/http does not resend it, and the Edge's re-dispatch covers it.)
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
// transparent decompression (bodies stream as sent).
//
// Why not a hand-written client: the node had one (h1.Transport: the
// calling goroutine wrote the request and read the answer, no per-
// connection goroutines) until issue 11 measured it against this one in
// the same benchmark runs (BENCHMARKS.md, "Resilience (issue 11)"): 16
// allocations and ~1.5 KiB less per request and some 10 % less node CPU
// on a loopback demo backend, no latency difference above the noise —
// nothing a user of a model server would notice.
func newClient(idle time.Duration) *http.Client {
	if idle <= 0 {
		idle = DefaultUpstreamIdleTimeout
	}
	std := &http.Transport{
		DialContext:            (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           4 * maxIdlePerHost,
		MaxIdleConnsPerHost:    maxIdlePerHost,
		IdleConnTimeout:        idle,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	return &http.Client{Transport: std}
}

// idleTimeout is the idle lifetime in AdapterConfig.upstream_idle_timeout_ms
// (ms; 0 = the default), or an error for a negative or oversized value.
func idleTimeout(ms int64) (time.Duration, error) {
	if ms < 0 || ms > int64(24*time.Hour/time.Millisecond) {
		return 0, fmt.Errorf("%w: %d ms (want 0 to 86400000)", ErrBadIdleTimeout, ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
