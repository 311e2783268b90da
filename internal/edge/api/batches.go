package api

import (
	"context"
	"net/http"
	"strings"

	"iop/internal/edge/reply"
)

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
