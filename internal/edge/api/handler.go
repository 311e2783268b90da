package api

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/keys"
	"iop/internal/edge/routing"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Pool is the provider pool as the surface uses it; *pool.Pool satisfies it
// (exchange.Pool: Acquire admits a request and returns its lease, SPEC
// Q2–Q4, Q6, Q7; Release returns it exactly once).
type Pool = exchange.Pool

// Health is the Edge's provider-health owner (exchange.Health, SPEC H8,
// H11, H12); *health.Tracker satisfies it.
type Health = exchange.Health

// Outlier is passive health (exchange.Outlier); *outlier.Detector
// satisfies it.
type Outlier = exchange.Outlier

// Credentials issues the credential lease of one dispatched request
// (exchange.Credentials, SPEC C2); *creds.Plane satisfies it.
type Credentials = exchange.Credentials

// Tracer takes the spans of every sampled request (internal/edge/tracing;
// *tracing.Exporter satisfies it): Export never blocks, Drop counts spans
// dropped before Export (a node's invalid ones).
type Tracer = reply.Tracer

// DefaultResponseWaitGrace is added to a lease's stall timeout to make the
// Edge's own response-wait timeout: the node's stall watchdog (stall timeout,
// 2 s close grace, 2 s health probe) always ends a stalled request first, so
// the Edge's timer fires only when a node goes silent without a terminal.
const DefaultResponseWaitGrace = 15 * time.Second

// DefaultBodyReadTimeout bounds reading one request body.
const DefaultBodyReadTimeout = 30 * time.Second

// DefaultCancelDrainTimeout bounds the wait for a cancelled stream's
// terminal: the node's close grace (2 s) plus margin.
const DefaultCancelDrainTimeout = 5 * time.Second

// Options configure a Handler. Config, Pool and Dispatcher are required.
type Options struct {
	// Config returns the current Edge config; it may return a new value
	// after a reload, which the Handler picks up on the next request.
	Config     func() *config.Config
	Pool       Pool
	Dispatcher dispatch.Dispatcher
	// Logger gets one line per failed request; nil discards. Keys and
	// request bodies are never logged (SPEC P4).
	Logger *slog.Logger
	// Now is the clock of "created" fields and of every decision a request
	// makes over its attempts (its re-dispatch deadline, a Retry-After date,
	// the queue wait it records); nil means time.Now. Connection read
	// deadlines, the access record's own timings and the trace spans'
	// times (trace.go) are measurements and use the wall clock.
	Now func() time.Time
	// NewID returns a fresh random token for "chatcmpl-<token>" and
	// "call_<token>" ids; nil means crypto/rand text.
	NewID func() string
	// ResponseWaitGrace: see DefaultResponseWaitGrace; 0 means the default.
	ResponseWaitGrace time.Duration
	// BodyReadTimeout bounds reading a request body (a slow or stalled
	// client gets 408 and the connection is closed); 0 means
	// DefaultBodyReadTimeout. The deadline is lifted once the body is read,
	// so streaming responses are never cut.
	BodyReadTimeout time.Duration
	// CancelDrainTimeout bounds how long the lease of a cancelled stream
	// waits for the node's terminal before it is released anyway; 0 means
	// DefaultCancelDrainTimeout.
	CancelDrainTimeout time.Duration
	// Health, when set, takes every response_stalled terminal before the
	// response is decided (SPEC H8) and the re-dispatch decisions (H11,
	// H12). Without it no stall is re-dispatched.
	Health Health
	// RedispatchWait bounds the wait for the next lease when a stalled
	// request is re-dispatched (SPEC H11); 0 means DefaultRedispatchWait,
	// a negative value turns every re-dispatch off (attempt.go).
	RedispatchWait time.Duration
	// Outlier, when set, hears every attempt's verdict (passive health,
	// attempt.go): failures before the first byte and successes.
	Outlier Outlier
	// OnUsage, when set, observes token usage reported by a run's COMPLETE
	// event or a tunnel's USAGE frames (observation only; never merged into
	// a body, SPEC T2). principal is "" in open mode.
	OnUsage func(principal, model string, u *iop.Usage)
	// AccessLog gets one line per request at its end (access.Record.Log,
	// message "access"); nil writes none. /healthz is not logged.
	AccessLog *slog.Logger
	// Metrics, when set, counts every request (access.Metrics); Recent
	// keeps the last failed ones for the operator page.
	Metrics *access.Metrics
	Recent  *access.Recent
	// Keys authenticates every request and applies its key's model scope,
	// bounds, token budgets and rate-limit headers (docs/keys.md K1–K9);
	// nil = the config's api_keys alone, through a Registry of the
	// Handler's own rebuilt with each config.
	Keys *keys.Registry
	// Credentials, when set, issues each dispatched request's credential
	// lease (SPEC C2); nil = the credential plane is off.
	Credentials Credentials
	// Tracer, when set, takes the spans of every sampled request
	// (trace.go, internal/edge/tracing): a client's valid traceparent is
	// continued, the trace context rides each RunRequest and
	// ProviderTunnelRequest to the node. nil = tracing off: no span, no
	// context on the wire.
	Tracer Tracer
	// TraceRatio is the share of new traces sampled (0 to 1,
	// tracing.sampling_ratio); a client's traceparent decides for its own.
	TraceRatio float64
	// Batches, when set, serves the Files and Batch API (/v1/files*,
	// /v1/batches*; internal/edge/batch) after authentication, the
	// principal in the request's context; nil = those paths are 404.
	Batches http.Handler
}

// Handler is the Edge's client HTTP surface (an http.Handler): GET
// /v1/models, POST /v1/chat/completions, /v1/responses, /v1/messages,
// /v1/messages/count_tokens, GET /healthz. Safe for concurrent use.
type Handler struct {
	o       Options
	log     *slog.Logger
	view    atomic.Pointer[view]
	drain   *drainer
	books   reply.Books      // each request's id, trace, access line and metrics sample
	keys    *keys.Registry   // Options.Keys, or its own (ownKeys)
	ownKeys bool             // keys follows the config's api_keys (no Options.Keys)
	lim     limits           // connections and body bytes
	headers headerCounts     // 431s by bound (headers.go)
	hasher  *routing.Hasher  // conversation prefixes for prefix_affinity groups
	ex      *exchange.Engine // serves each admitted request (internal/edge/exchange)
}

// New returns the Handler for o.
func New(o Options) *Handler {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewID == nil {
		o.NewID = rand.Text
	}
	if o.BodyReadTimeout <= 0 {
		o.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if o.CancelDrainTimeout <= 0 {
		o.CancelDrainTimeout = DefaultCancelDrainTimeout
	}
	if o.RedispatchWait == 0 {
		o.RedispatchWait = DefaultRedispatchWait
	}
	if o.ResponseWaitGrace <= 0 {
		o.ResponseWaitGrace = DefaultResponseWaitGrace
	}
	h := &Handler{o: o, log: o.Logger, drain: newDrainer(), hasher: routing.NewHasher(), keys: o.Keys,
		books: reply.Books{NewID: o.NewID, Tracer: o.Tracer, TraceRatio: o.TraceRatio, AccessLog: o.AccessLog,
			Metrics: o.Metrics, Recent: o.Recent}}
	if h.keys == nil {
		empty, _ := keys.Build(nil, nil, false, 1)
		h.keys, h.ownKeys = keys.New(empty), true
	}
	h.ex = exchange.New(exchange.Deps{Pool: o.Pool, Dispatcher: o.Dispatcher, Health: o.Health, Outlier: o.Outlier,
		Credentials: o.Credentials, Tracer: o.Tracer, Now: o.Now, NewID: o.NewID, Logger: o.Logger, OnUsage: h.onUsage,
		RedispatchWait: o.RedispatchWait, ResponseWaitGrace: o.ResponseWaitGrace, CancelDrainTimeout: o.CancelDrainTimeout,
		Bodies: &h.lim.bodies, Detach: h.drain.detach, OpenMode: h.keys.OpenMode})
	return h
}

// view is what the Handler derives from one config value, rebuilt when
// Options.Config returns a different pointer.
type view struct {
	cfg      *config.Config
	maxBody  int64
	maxConns int
	// maxHeaderBytes, maxHeaderFields: http.max_header_bytes and
	// http.max_header_fields (SPEC B4).
	maxHeaderBytes, maxHeaderFields int
	models                          []byte   // the GET /v1/models body of a key without a scope
	names                           []string // the model groups, in config order (a scoped key's list, K4)
	created                         int64    // the list's "created"
	// anthropicModels is GET /v1/models in Anthropic's list shape (a key
	// without a scope).
	anthropicModels []byte
	// affinity names the model groups routed by prefix_affinity: only
	// their requests carry a conversation prefix.
	affinity map[string]bool
	bounds   map[string]int // model → models[].max_attempts in effect
	statuses []int          // outlier_detection.statuses in effect
	// unknown is http.unknown_fields: what the run path does with a
	// request member its field tables do not know.
	unknown apisurface.UnknownFields
}

// attemptBound is how many providers one request of model may be sent to
// (at least 1).
func (v *view) attemptBound(model string) int {
	return max(v.bounds[model], 1)
}

func (h *Handler) current() *view {
	cfg := h.o.Config()
	if v := h.view.Load(); v != nil && v.cfg == cfg {
		return v
	}
	v := &view{cfg: cfg, maxBody: config.DefaultMaxBodyBytes, maxConns: config.DefaultMaxConnections,
		maxHeaderBytes: MaxHeaderBytes(cfg), maxHeaderFields: config.DefaultMaxHeaderFields}
	inflight := int64(config.DefaultMaxInflightBodyBytes)
	if cfg != nil {
		if h.ownKeys {
			if set, err := keys.Build(cfg.APIKeys, nil, false, 1); err == nil { // config.Parse refused what fails here
				h.keys.Swap(set)
			}
		}
		if cfg.HTTP.MaxBodyBytes > 0 {
			v.maxBody = cfg.HTTP.MaxBodyBytes
		}
		if cfg.HTTP.MaxConnections > 0 {
			v.maxConns = cfg.HTTP.MaxConnections
		}
		if cfg.HTTP.MaxHeaderFields > 0 {
			v.maxHeaderFields = cfg.HTTP.MaxHeaderFields
		}
		if cfg.HTTP.MaxInflightBodyBytes > 0 {
			inflight = cfg.HTTP.MaxInflightBodyBytes
		}
		v.created = h.o.Now().Unix()
		for i := range cfg.Models {
			v.names = append(v.names, cfg.Models[i].Name)
		}
		v.models = modelList(v.names, v.created)
		v.anthropicModels = anthropicModelList(v.names, v.created)
		for _, m := range cfg.Models {
			if m.Routing == routing.NamePrefixAffinity {
				if v.affinity == nil {
					v.affinity = make(map[string]bool)
				}
				v.affinity[m.Name] = true
			}
		}
		v.unknown, _ = apisurface.ParseUnknownFields(cfg.HTTP.UnknownFields) // config.Parse checked it
		v.statuses = cfg.OutlierDetection.Statuses
		if v.statuses == nil { // a config that did not go through config.Parse
			v.statuses = config.DefaultEjectStatuses
		}
		v.bounds = make(map[string]int, len(cfg.Models))
		for i := range cfg.Models {
			v.bounds[cfg.Models[i].Name] = cfg.Models[i].AttemptBound()
		}
	}
	h.lim.bodies.SetMax(inflight)
	h.view.Store(v)
	return v
}

// OpenMode reports whether no API keys and no key store are configured:
// every request is then admitted without a principal. The caller logs the
// startup warning.
func (h *Handler) OpenMode() bool {
	h.current() // the Handler's own registry follows the config
	return h.keys.OpenMode()
}

type principalKey struct{}

// PrincipalFromContext returns the authenticated principal (the api_keys
// entry's name) of the request whose context ctx is; ok is false in open
// mode.
func PrincipalFromContext(ctx context.Context) (principal string, ok bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok
}

// endpoint describes one model-serving route: what its exchange needs
// (exchange.Endpoint) and the required array field ("messages"), if any,
// that the head parse checks.
type endpoint struct {
	exchange.Endpoint
	field string
}

var (
	epChat        = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpChatCompletions, Path: "/v1/chat/completions", Run: exchange.RunChat}, "messages"}
	epResponses   = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpResponses, Path: "/v1/responses", Run: exchange.RunResponses}, ""}
	epMessages    = endpoint{exchange.Endpoint{Surface: reply.Anthropic, Operation: protocol.OpMessages, Path: "/v1/messages", Run: exchange.RunMessages}, "messages"}
	epCountTokens = endpoint{exchange.Endpoint{Surface: reply.Anthropic, Operation: protocol.OpCountTokens, Path: "/v1/messages/count_tokens", Run: exchange.RunCountTokens}, "messages"}
	epCompletions = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpCompletions, Path: "/v1/completions", Run: exchange.RunNone}, ""}
	epEmbeddings  = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpEmbeddings, Path: "/v1/embeddings", Run: exchange.RunEmbeddings}, ""}
)

// onUsage passes a request's reported usage to Options.OnUsage, read at
// the report.
func (h *Handler) onUsage(principal, model string, u *iop.Usage) {
	if f := h.o.OnUsage; f != nil {
		f(principal, model, u)
	}
}

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
	if e := h.overHeaderBounds(w, r, h.current()); e != nil { // B4: before any other work, authentication included
		rw := h.books.Begin(w, r, start, traceRoute(r.URL.Path))
		rw.Rec.Surface = surfaceOf(r.URL.Path)
		reply.WriteError(rw, surfaceFor(r.URL.Path), e)
		h.books.End(r.Context(), rw)
		return
	}
	if r.URL.Path == "/healthz" {
		healthz(w, r, ok)
		return
	}
	rw := h.books.Begin(w, r, start, traceRoute(r.URL.Path))
	defer h.books.End(r.Context(), rw)
	if !ok {
		rw.Rec.Surface = surfaceOf(r.URL.Path)
		w.Header().Set("Connection", "close")
		closeUnread(rw, r)
		reply.WriteError(rw, surfaceFor(r.URL.Path), drainingError())
		return
	}
	// A model request's goroutine stays in serveModel for the stream's
	// whole life: route's large frame is gone by then (see serveModel).
	if ctx, v, ep := h.route(rw, r); ep != nil {
		defer h.finishKey(ctx, rw) // the key's in-flight slot and token reservation count until here (K5)
		ctx, release := h.requestContext(ctx)
		defer release()
		h.serveModel(ctx, rw, r, v, ep)
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

// surfaceFor is the error shape of requests to path.
func surfaceFor(path string) reply.Surface {
	if path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/") {
		return reply.Anthropic
	}
	return reply.OpenAI
}

// traceRoute is a request's http.route: the endpoint's path, "" for an
// unknown one.
func traceRoute(p string) string {
	switch p {
	case "/v1/models", epChat.Path, epResponses.Path, epMessages.Path, epCountTokens.Path, epCompletions.Path, epEmbeddings.Path:
		return p
	}
	return ""
}

// surfaceOf is the access record's surface of a request to path.
func surfaceOf(path string) string {
	if strings.HasPrefix(path, "/v1/models/") {
		return protocol.OpModels
	}
	switch path {
	case "/v1/models":
		return protocol.OpModels
	case epChat.Path:
		return epChat.Operation
	case epResponses.Path:
		return epResponses.Operation
	case epMessages.Path:
		return epMessages.Operation
	case epCountTokens.Path:
		return epCountTokens.Operation
	case epCompletions.Path:
		return epCompletions.Operation
	case epEmbeddings.Path:
		return epEmbeddings.Operation
	}
	return reply.SurfaceOther
}

// route answers every request except an authenticated model request, for
// which it returns the request's context (carrying the principal), the
// config view and the endpoint; the endpoint is nil when route answered.
func (h *Handler) route(w *reply.Recorder, r *http.Request) (context.Context, *view, *endpoint) {
	if r.Body != nil && r.Body != http.NoBody {
		// Bound the body read; serveModel lifts it once the body is in.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.o.BodyReadTimeout))
	}
	if h.overConnections(w, r) {
		return nil, nil, nil
	}
	var ep *endpoint
	method := http.MethodPost
	w.Rec.Surface = surfaceOf(r.URL.Path)
	// The models endpoints answer in Anthropic's shapes when asked as the
	// Anthropic API is (its SDKs send anthropic-version on every request).
	anthropicModels := r.Header.Get("Anthropic-Version") != ""
	modelID, oneModel := strings.CutPrefix(r.URL.Path, "/v1/models/")
	switch r.URL.Path {
	case "/v1/models":
		method = http.MethodGet
	case "/v1/chat/completions":
		ep = &epChat
	case "/v1/responses":
		ep = &epResponses
	case "/v1/messages":
		ep = &epMessages
	case "/v1/messages/count_tokens":
		ep = &epCountTokens
	case "/v1/completions":
		ep = &epCompletions
	case "/v1/embeddings":
		ep = &epEmbeddings
	default:
		if h.o.Batches != nil && isBatchPath(r.URL.Path) {
			h.serveBatches(w, r) // batches.go
			return nil, nil, nil
		}
		if oneModel && modelID != "" {
			method = http.MethodGet
			break
		}
		s := reply.OpenAI
		if strings.HasPrefix(r.URL.Path, "/v1/messages/") {
			s = reply.Anthropic
		}
		reject(w, r, s, &reply.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "unknown endpoint: " + r.Method + " " + reply.Truncate(r.URL.Path, 256)})
		return nil, nil, nil
	}
	s := reply.OpenAI
	if ep != nil {
		s = ep.Surface
	} else if anthropicModels {
		s = reply.Anthropic
	}
	if r.Method != method {
		closeUnread(w, r)
		methodNotAllowed(w, s, method)
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
	if ep == nil {
		names := v.names
		if p != nil {
			rl := h.keys.State(p, h.o.Now())
			writeRateLimit(w.Header(), s, &rl, h.o.Now())
			if p.Scoped() {
				names = p.FilterModels(v.names) // K4
			}
		}
		serveModels(w, v, s, names, oneModel, modelID)
		return nil, nil, nil
	}
	if p != nil {
		if ctx = h.admitKey(ctx, w, r, s, p); ctx == nil {
			return nil, nil, nil
		}
	}
	return ctx, v, ep
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

// appendOpenAIModel appends one OpenAI model object {"id","object":
// "model","created","owned_by"}.
func appendOpenAIModel(b []byte, name string, created int64) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, created, 10)
	return append(b, `,"owned_by":"iop"}`...)
}

// appendAnthropicModel appends one Anthropic model object {"type":"model",
// "id","display_name","created_at"} (created_at RFC 3339, UTC).
func appendAnthropicModel(b []byte, name string, created int64) []byte {
	b = append(b, `{"type":"model","id":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"display_name":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"created_at":"`...)
	b = time.Unix(created, 0).UTC().AppendFormat(b, time.RFC3339)
	return append(b, `"}`...)
}

// anthropicModelList is GET /v1/models in Anthropic's list shape: the
// groups names holds, on one page.
func anthropicModelList(names []string, created int64) []byte {
	b := []byte(`{"data":[`)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendAnthropicModel(b, name, created)
	}
	b = append(b, `],"has_more":false,"first_id":`...)
	if n := len(names); n > 0 {
		b = appendJSONString(b, names[0])
		b = append(b, `,"last_id":`...)
		b = appendJSONString(b, names[n-1])
	} else {
		b = append(b, `null,"last_id":null`...)
	}
	return append(b, '}')
}

// modelList is the GET /v1/models body: the configured model groups in the
// OpenAI list shape (OpenAI API reference, "List models").
func modelList(names []string, created int64) []byte {
	b := []byte(`{"object":"list","data":[`)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendOpenAIModel(b, name, created)
	}
	return append(b, "]}"...)
}

// DefaultRedispatchWait bounds the wait for the next lease when a stalled
// request is re-dispatched (SPEC H11). The client has already waited the
// stall timeout; a re-dispatch that would queue longer gives up and answers
// the stall (504). Other failures re-dispatch within the request's own
// deadline (attempt.go).
const DefaultRedispatchWait = 2 * time.Second

// MetricRetries is the re-dispatch counter family.
const MetricRetries = "iop_edge_request_retries_total"

// Metric is one counter family: Samples maps a rendered, bounded label set
// to its value, every label value present. The shape matches admin.Counter.
type Metric struct {
	Name, Help string
	Samples    func() map[string]float64
}

// Metrics returns iop_edge_request_retries_total{reason}: requests sent to
// another provider after a failure before the first byte; and
// iop_edge_header_refusals_total{bound}: the 431s of SPEC B4.
func (h *Handler) Metrics() []Metric {
	return []Metric{{MetricRetries,
		"Requests re-dispatched to a provider not tried yet after a failure before the first byte, by reason.",
		h.ex.RetrySamples}, h.headerMetric()}
}
