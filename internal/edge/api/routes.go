package api

import (
	"context"
	"net/http"
	"strings"
	"time"

	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	"iop/internal/protocol"
)

// endpoint describes one model-serving route: what its exchange needs
// (exchange.Endpoint) and the required array field ("messages"), if any,
// that the head parse checks.
type endpoint struct {
	exchange.Endpoint
	field string
}

var (
	epChat = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpChatCompletions,
		Path: "/v1/chat/completions", Run: exchange.RunChat}, "messages"}
	epResponses = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpResponses,
		Path: "/v1/responses", Run: exchange.RunResponses}, ""}
	epMessages = endpoint{exchange.Endpoint{Surface: reply.Anthropic, Operation: protocol.OpMessages,
		Path: "/v1/messages", Run: exchange.RunMessages}, "messages"}
	epCountTokens = endpoint{exchange.Endpoint{Surface: reply.Anthropic, Operation: protocol.OpCountTokens,
		Path: "/v1/messages/count_tokens", Run: exchange.RunCountTokens}, "messages"}
	epCompletions = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpCompletions,
		Path: "/v1/completions", Run: exchange.RunNone}, ""}
	epEmbeddings = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpEmbeddings,
		Path: "/v1/embeddings", Run: exchange.RunEmbeddings}, ""}
)

// apiRoute is what a request's path says before anything else is read:
// the method it takes ("" for a path the edge does not serve), the access
// record's surface, the error shape, its trace's http.route and, for a
// model request, its endpoint; /v1/models/{id} names one model.
type apiRoute struct {
	method     string
	record     string        // access.Record.Surface: the operation, protocol.OpModels or reply.SurfaceOther
	shape      reply.Surface // the error shape of the path's answers (the models endpoints: see route)
	traceRoute string        // http.route: the endpoint's path, "" for none
	ep         *endpoint     // nil: not a model request
	oneModel   bool          // GET /v1/models/{id}
	modelID    string
}

// endpoints is the one table of the paths the edge serves, keyed by path
// (docs/surfaces.md): the model list and the model endpoints. Every other
// path is routeOf's.
var endpoints = map[string]apiRoute{
	"/v1/models":       {method: http.MethodGet, record: protocol.OpModels, shape: reply.OpenAI, traceRoute: "/v1/models"},
	epChat.Path:        modelRoute(&epChat),
	epResponses.Path:   modelRoute(&epResponses),
	epMessages.Path:    modelRoute(&epMessages),
	epCountTokens.Path: modelRoute(&epCountTokens),
	epCompletions.Path: modelRoute(&epCompletions),
	epEmbeddings.Path:  modelRoute(&epEmbeddings),
}

// modelRoute is the row of a model endpoint: POST, recorded and traced as
// its operation and path, answered in its surface's shape.
func modelRoute(ep *endpoint) apiRoute {
	return apiRoute{method: http.MethodPost, record: ep.Operation, shape: ep.Surface, traceRoute: ep.Path, ep: ep}
}

// routeOf is path's row of endpoints, or for another path: GET
// /v1/models/{id} (a non-empty id), or a path the edge does not serve
// (method ""), answered in Anthropic's shape under /v1/messages/ and in
// OpenAI's elsewhere.
func routeOf(path string) apiRoute {
	if rt, ok := endpoints[path]; ok {
		return rt
	}
	rt := apiRoute{record: reply.SurfaceOther, shape: reply.OpenAI}
	if strings.HasPrefix(path, "/v1/messages/") {
		rt.shape = reply.Anthropic
	}
	if id, ok := strings.CutPrefix(path, "/v1/models/"); ok {
		rt.record = protocol.OpModels
		if id != "" {
			rt.method, rt.oneModel, rt.modelID = http.MethodGet, true, id
		}
	}
	return rt
}

// route answers every request except an authenticated model request, for
// which it returns the request's context (carrying the principal), the
// config view and the endpoint; the endpoint is nil when route answered.
// rt is the request's row (routeOf).
func (h *Handler) route(w *reply.Recorder, r *http.Request, rt *apiRoute) (context.Context, *view, *endpoint) {
	if r.Body != nil && r.Body != http.NoBody {
		// Bound the body read; serveModel lifts it once the body is in.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.o.BodyReadTimeout))
	}
	if h.overConnections(w, r, rt.shape) {
		return nil, nil, nil
	}
	w.Rec.Surface = rt.record
	if rt.method == "" {
		if h.o.Batches != nil && isBatchPath(r.URL.Path) {
			h.serveBatches(w, r) // batches.go
			return nil, nil, nil
		}
		reject(w, r, rt.shape, &reply.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "unknown endpoint: " + r.Method + " " + reply.Truncate(r.URL.Path, 256)})
		return nil, nil, nil
	}
	s := rt.shape
	if rt.ep == nil && r.Header.Get("Anthropic-Version") != "" {
		// The models endpoints answer in Anthropic's shapes when asked as
		// the Anthropic API is (its SDKs send anthropic-version on every
		// request).
		s = reply.Anthropic
	}
	if r.Method != rt.method {
		closeUnread(w, r)
		methodNotAllowed(w, s, rt.method)
		return nil, nil, nil
	}
	v := h.current()
	if v.cfg == nil {
		reply.WriteError(w, s, &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Message: "the edge has no configuration loaded"})
		return nil, nil, nil
	}
	p, ok := h.authenticate(w, r, s)
	if !ok {
		return nil, nil, nil
	}
	ctx := r.Context()
	if p != nil {
		h.lim.conns.keyed(connOf(r)) // its connection is shed after those without a key (conns.go)
		w.Rec.Principal = p.Name
		ctx = context.WithValue(ctx, principalKey{}, p.Name)
	}
	if rt.ep == nil {
		names := v.names
		if p != nil {
			rl := h.keys.State(p, h.o.Now())
			writeRateLimit(w.Header(), s, &rl, h.o.Now())
			if p.LocalOnly {
				names = v.local // SPEC V3: only the groups it can reach
			}
			if p.Scoped() {
				names = p.FilterModels(names) // K4
			}
		}
		serveModels(w, v, s, names, rt.oneModel, rt.modelID)
		return nil, nil, nil
	}
	if p != nil {
		if ctx = h.admitKey(ctx, w, r, s, p); ctx == nil {
			return nil, nil, nil
		}
	}
	return ctx, v, rt.ep
}

// reject answers a request refused before its body was read. An unread
// body would make the server drain it before answering, so a client that
// declared a body and never sends it could hold the connection: the
// connection is closed after the answer instead.
func reject(w http.ResponseWriter, r *http.Request, s reply.Surface, e *reply.Error) {
	closeUnread(w, r)
	reply.WriteError(w, s, e)
}

func closeUnread(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func methodNotAllowed(w http.ResponseWriter, s reply.Surface, allow string) {
	w.Header().Set("Allow", allow)
	reply.WriteError(w, s, &reply.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: "method not allowed; use " + allow})
}

// DefaultRedispatchWait bounds the wait for the next lease when a stalled
// request is re-dispatched (SPEC H11). The client has already waited the
// stall timeout; a re-dispatch that would queue longer gives up and answers
// the stall (504). Other failures re-dispatch within the request's own
// deadline (attempt.go).
const DefaultRedispatchWait = 2 * time.Second
