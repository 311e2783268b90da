package api

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"iop/internal/edge/keys"
	"iop/internal/edge/reply"
)

// requestKey is the API key request r presents (docs/keys.md): "Authorization:
// Bearer <key>", or on Anthropic routes also "x-api-key: <key>"; "" when
// none. ok is false when r presents credentials that disagree — two
// values that are not the same key among its Authorization and (Anthropic
// routes) x-api-key headers, an Authorization that is not a bearer key
// counting as one — which is a 401 however valid either one is: the edge
// never picks one credential of several.
func requestKey(r *http.Request, s reply.Surface) (key string, ok bool) {
	auth := r.Header["Authorization"]
	var api []string
	if s == reply.Anthropic {
		api = r.Header["X-Api-Key"]
	}
	if len(auth)+len(api) == 1 { // the common case: one credential
		if len(api) == 1 {
			return strings.TrimSpace(api[0]), true
		}
		return bearer(auth[0]), true
	}
	seen := false
	for i, v := range append(auth[:len(auth):len(auth)], api...) {
		k := strings.TrimSpace(v)
		if i < len(auth) {
			if k = bearer(v); k == "" {
				k = "\x00" + v // not a bearer key: disagrees with any key
			}
		}
		switch {
		case !seen:
			key, seen = k, true
		case k != key:
			return "", false
		}
	}
	if strings.HasPrefix(key, "\x00") {
		key = ""
	}
	return key, true
}

// bearer is the key of an "Authorization: Bearer <key>" value, "" when v
// is not one.
func bearer(v string) string {
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// authenticate finds the principal of the request's key (requestKey),
// looked up by its SHA-256 (keys.Registry.Authenticate). In open mode it
// returns nil and true; a request without an accepted key, or with
// credentials that disagree, is answered 401 and ok is false. The key is
// never logged or echoed.
func (h *Handler) authenticate(w *reply.Recorder, r *http.Request, s reply.Surface) (p *keys.Principal, ok bool) {
	if h.keys.OpenMode() {
		return nil, true
	}
	if name, ok := r.Context().Value(batchPrincipalKey{}).(string); ok { // a batch's line (batches.go)
		p, err := h.keys.Lookup(name, h.o.Now())
		if err != nil {
			reject(w, r, s, &reply.Error{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key", Message: "the batch's key: " + err.Error()})
			return nil, false
		}
		return p, true
	}
	key, agree := requestKey(r, s)
	if !agree {
		w.Header().Set("WWW-Authenticate", `Bearer realm="iop"`)
		reject(w, r, s, &reply.Error{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key",
			Message: "the request carries credentials that disagree (Authorization and x-api-key, or one of them twice); send one API key"})
		return nil, false
	}
	p, err := h.keys.Authenticate(key, h.o.Now())
	if err == nil {
		return p, true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="iop"`)
	msg := "missing or invalid API key (send Authorization: Bearer <key>"
	if s == reply.Anthropic {
		msg += " or x-api-key: <key>"
	}
	msg += ")"
	switch {
	case errors.Is(err, keys.ErrRevoked), errors.Is(err, keys.ErrExpired), errors.Is(err, keys.ErrRotated):
		msg = err.Error() // the client holds the key: it may know why it stopped working
	}
	reject(w, r, s, &reply.Error{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key", Message: msg})
	return nil, false
}

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
