package api

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/reply"
	"iop/internal/protocol"
)

// apiRoute is what a request's path says before anything else is read:
// the method it takes ("" for a path the edge does not serve), the access
// record's surface, the error shape, its trace's http.route and, for a
// model request, its endpoint. The rows are shared by every request
// (routeOf returns a pointer to one): a request's own frames stay small
// (BENCHMARKS.md "Concurrent slow streams").
type apiRoute struct {
	method     string
	record     string        // access.Record.Surface: the operation, protocol.OpModels or reply.SurfaceOther
	shape      reply.Surface // the error shape of the path's answers (the models endpoints: see route)
	traceRoute string        // http.route: the endpoint's path, "" for none
	ep         *endpoint     // nil: not a model request
	oneModel   bool          // GET /v1/models/{id}: the id is the path's rest
}

// endpoints is the one table of the paths the edge serves, keyed by path
// (docs/surfaces.md): the model list and the model endpoints. Every other
// path is routeOf's.
var endpoints = map[string]*apiRoute{
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
func modelRoute(ep *endpoint) *apiRoute {
	return &apiRoute{method: http.MethodPost, record: ep.Operation, shape: ep.Surface, traceRoute: ep.Path, ep: ep}
}

// The rows of the paths endpoints does not hold: GET /v1/models/{id} (a
// non-empty id), /v1/models/ without one, and any other path, answered in
// Anthropic's shape under /v1/messages/ and in OpenAI's elsewhere.
var (
	routeOneModel       = apiRoute{method: http.MethodGet, record: protocol.OpModels, shape: reply.OpenAI, oneModel: true}
	routeNoModel        = apiRoute{record: protocol.OpModels, shape: reply.OpenAI}
	routeUnknown        = apiRoute{record: reply.SurfaceOther, shape: reply.OpenAI}
	routeUnknownMessage = apiRoute{record: reply.SurfaceOther, shape: reply.Anthropic}
)

// routeOf is path's row: of endpoints, or one of the rows above.
func routeOf(path string) *apiRoute {
	if rt, ok := endpoints[path]; ok {
		return rt
	}
	switch id, ok := strings.CutPrefix(path, "/v1/models/"); {
	case ok && id != "":
		return &routeOneModel
	case ok:
		return &routeNoModel
	case strings.HasPrefix(path, "/v1/messages/"):
		return &routeUnknownMessage
	}
	return &routeUnknown
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
		serveModels(w, v, s, names, rt.oneModel, strings.TrimPrefix(r.URL.Path, "/v1/models/"))
		return nil, nil, nil
	}
	if p != nil {
		if ctx = h.admitKey(ctx, w, r, s, p); ctx == nil {
			return nil, nil, nil
		}
	}
	return ctx, v, rt.ep
}

// serveModels answers GET /v1/models (the model groups names holds: every
// configured one, or a scoped key's, K4) and GET /v1/models/{id} (one of
// them; 404 model_not_found for any other id), in OpenAI's shapes (API
// reference, "Models": list and retrieve) or, with surface s Anthropic's,
// in Anthropic's ("Models": list {data, has_more, first_id, last_id}, get
// {type, id, display_name, created_at}).
func serveModels(w http.ResponseWriter, v *view, s reply.Surface, names []string, one bool, id string) {
	var body []byte
	switch {
	case one:
		if !slices.Contains(names, id) {
			e := &reply.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
				Message: "The model '" + reply.Truncate(id, 256) + "' does not exist"}
			reply.WriteError(w, s, e)
			return
		}
		if s == reply.Anthropic {
			body = appendAnthropicModel(nil, id, v.created)
		} else {
			body = appendOpenAIModel(nil, id, v.created)
		}
	case s == reply.Anthropic && len(names) == len(v.names):
		body = v.anthropicModels
	case s == reply.Anthropic:
		body = anthropicModelList(names, v.created)
	case len(names) == len(v.names):
		body = v.models
	default:
		body = modelList(names, v.created)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}
