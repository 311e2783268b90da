package api

import (
	"context"
	"net/http"
	"strings"

	"iop/internal/edge/reply"
)

// batchPrincipalKey marks a request the edge itself makes as a key (a
// batch's line, SPEC X4): only code in this process can set it; no header
// or body can.
type batchPrincipalKey struct{}

// AsPrincipal returns ctx under which the Handler serves a request as the
// key named name without its secret: authenticate looks the principal up
// by name with the checks a key gets (revoked, expired, removed: 401), and
// the request then goes the way a client's does (scope, bounds, budgets,
// K4-K6). name "" is open mode's principal.
func AsPrincipal(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, batchPrincipalKey{}, name)
}

// isBatchPath reports whether path is the Files or Batch API's (Options.Batches).
func isBatchPath(path string) bool {
	return path == "/v1/files" || strings.HasPrefix(path, "/v1/files/") ||
		path == "/v1/batches" || strings.HasPrefix(path, "/v1/batches/")
}

// serveBatches authenticates a request of the Files or Batch API and hands
// it to Options.Batches with its principal in the context
// (PrincipalFromContext).
func (h *Handler) serveBatches(w *reply.Recorder, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/files") {
		w.Rec.Surface = "files"
	} else {
		w.Rec.Surface = "batches"
	}
	if v := h.current(); v.cfg == nil {
		reply.WriteError(w, reply.OpenAI, &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Message: "the edge has no configuration loaded"})
		return
	}
	p, ok := h.authenticate(w, r, reply.OpenAI)
	if !ok {
		return
	}
	ctx := r.Context()
	if p != nil {
		h.lim.conns.keyed(connOf(r))
		w.Rec.Principal = p.Name
		ctx = context.WithValue(ctx, principalKey{}, p.Name)
	}
	h.o.Batches.ServeHTTP(w, r.WithContext(ctx))
}
