package api

import (
	"io"
	"net/http"
	"time"

	"iop/internal/edge/reply"
)

// ServeHTTP routes one request. Unknown paths get 404 and known paths with
// another method 405, both in OpenAI shape (Anthropic shape under
// /v1/messages). Every response carries X-Request-Id; every request but
// GET /healthz gets one access record (Options.AccessLog, Metrics). After
// Drain every request gets 503 (healthz too, so load balancers stop
// sending).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ok := h.drain.enter()
	defer h.drain.exit()
	rt := routeOf(r.URL.Path)
	if e := h.overHeaderBounds(w, r, h.current()); e != nil { // B4: before any other work, authentication included
		rw := h.books.Begin(w, r, start, rt.traceRoute)
		rw.Rec.Surface = rt.record
		reply.WriteError(rw, rt.shape, e)
		h.books.End(r.Context(), rw)
		return
	}
	if r.URL.Path == "/healthz" {
		healthz(w, r, ok)
		return
	}
	rw := h.books.Begin(w, r, start, rt.traceRoute)
	defer h.books.End(r.Context(), rw)
	if !ok {
		rw.Rec.Surface = rt.record
		w.Header().Set("Connection", "close")
		closeUnread(rw, r)
		reply.WriteError(rw, rt.shape, drainingError())
		return
	}
	// A model request's goroutine stays in the exchange's relay for the
	// stream's whole life: route's and admit's large frames are gone by
	// then, and ServeHTTP's is the only one of this package under it
	// (exchange.Engine.Serve).
	if ctx, v, ep := h.route(rw, r, rt); ep != nil {
		defer h.finishKey(ctx, rw) // the key's in-flight slot and token reservation count until here (K5)
		ctx, release := h.requestContext(ctx)
		defer release()
		if x := h.admit(ctx, rw, r, v, ep); x != nil {
			h.ex.Serve(x) // SPEC Q2: every lease goes back before it returns
		}
	}
	if rw.Gone() && !rw.Wrote() {
		// The client left (its connection ended, or half-closed, which
		// net/http takes for leaving) before anything was written. Return
		// without writing and net/http would send "200 OK" with an empty
		// body, a success to a client still reading; abort the connection
		// instead, as the access record's 499 says. The deferred
		// access record and releases run first.
		panic(http.ErrAbortHandler)
	}
}

// healthz answers GET /healthz: 200 {"status":"ok"}, or 503
// {"status":"draining"} after Drain. A request that declares a body (it
// needs none, and no key) gets its answer with the connection closed
// after it (closeUnread): net/http would otherwise wait for an unread
// body of up to 256 KiB before writing the answer, and a connection
// serving a request is never shed, so such requests held open could take
// every slot of http.max_connections from clients with a key (conns.go).
func healthz(w http.ResponseWriter, r *http.Request, ok bool) {
	closeUnread(w, r)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, reply.OpenAI, "GET")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"status":"draining"}`)
		return
	}
	_, _ = io.WriteString(w, `{"status":"ok"}`)
}
