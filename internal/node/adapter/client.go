package adapter

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"iop/internal/node/adapter/h1"
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
// One resend. A request that fails on a reused connection before any byte
// of an answer is sent again, once, on a new connection, only when the
// backend cannot have started it. For an inference POST (one generation per
// request, never idempotent) that is exactly:
//
//   - the connection was found closed before the request was written (the
//     backend's FIN or RST was already there): nothing was sent, so another
//     connection is taken — not even a resend;
//   - writing the request failed: the backend never had the whole request
//     (the node sends a Content-Length body from memory, and a server acts
//     on a request only once its body is complete), so it cannot have
//     started a generation.
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
// How this compares. Go's net/http.Transport resends a request whose bytes
// were never written (nothingWrittenError) and, for idempotent or
// Idempotency-Key requests only, one that failed reading the first response
// byte on a reused connection; a POST that was written is never resent — the
// same line as here, except that a partial write is not resent by net/http
// while it is here (safe for the reason above). Envoy's retry_on "reset"
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
)

// Upstream client kinds (Options.UpstreamClient).
const (
	// ClientH1 is h1.Transport for http:// backends and net/http's
	// Transport for the rest.
	ClientH1 = "h1"
	// ClientStdlib is net/http's Transport for every backend.
	ClientStdlib = "stdlib"
)

// validClient reports whether kind names an upstream client ("" = the
// default).
func validClient(kind string) error {
	switch kind {
	case "", ClientH1, ClientStdlib:
		return nil
	}
	return fmt.Errorf("adapter: unknown upstream client %q (want %q or %q)", kind, ClientH1, ClientStdlib)
}

// newClient returns the HTTP client of one adapter instance: pooled
// keep-alive connections idle at most idle (<= 0: the default), no proxy
// (reading proxy settings from the environment is main's job), no overall
// timeout (streams last long), no transparent decompression.
func newClient(kind string, idle time.Duration) *http.Client {
	if idle <= 0 {
		idle = DefaultUpstreamIdleTimeout
	}
	std := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * maxIdlePerHost,
		MaxIdleConnsPerHost:   maxIdlePerHost,
		IdleConnTimeout:       idle,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	if kind == ClientStdlib {
		return &http.Client{Transport: std}
	}
	return &http.Client{Transport: &h1.Transport{MaxIdlePerHost: maxIdlePerHost, IdleTimeout: idle, Fallback: std}}
}

// idleTimeout is the idle lifetime in AdapterConfig.upstream_idle_timeout_ms
// (ms; 0 = the default), or an error for a negative or oversized value.
func idleTimeout(ms int64) (time.Duration, error) {
	if ms < 0 || ms > int64(24*time.Hour/time.Millisecond) {
		return 0, fmt.Errorf("%w: %d ms (want 0 to 86400000)", ErrBadIdleTimeout, ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
