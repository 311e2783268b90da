package api

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/exchange"
	"iop/internal/edge/keys"
	"iop/internal/edge/reply"
	"iop/internal/edge/routing"
	apisurface "iop/internal/edge/surface"
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
	// times (reply.Trace) are measurements and use the wall clock.
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
	// (reply.Trace, internal/edge/tracing): a client's valid traceparent is
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
	// local are the groups with a route that is not remote, in config
	// order: a local-only key's list (SPEC V3).
	local   []string
	created int64 // the list's "created"
	// anthropicModels is GET /v1/models in Anthropic's list shape (a key
	// without a scope).
	anthropicModels []byte
	// affinity names the model groups routed by prefix_affinity: only
	// their requests carry a conversation prefix.
	affinity map[string]bool
	bounds   map[string]int // model → models[].max_attempts in effect
	// fallbacks are the groups' models[].fallbacks (SPEC V1); nil when
	// none has one.
	fallbacks map[string]routing.FallbackGroup
	statuses  []int // outlier_detection.statuses in effect
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
			if cfg.ServesLocally(&cfg.Models[i]) {
				v.local = append(v.local, cfg.Models[i].Name)
			}
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
		v.fallbacks = cfg.FallbackGroups()
		v.bounds = make(map[string]int, len(cfg.Models))
		for i := range cfg.Models {
			v.bounds[cfg.Models[i].Name] = cfg.AttemptBound(&cfg.Models[i]) // SPEC V1: its fallbacks' providers too
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

// onUsage passes a request's reported usage to Options.OnUsage, read at
// the report.
func (h *Handler) onUsage(principal, model string, u *iop.Usage) {
	if f := h.o.OnUsage; f != nil {
		f(principal, model, u)
	}
}

// Metrics returns iop_edge_request_retries_total{reason}: requests sent to
// another provider after a failure before the first byte;
// iop_edge_fallbacks_total{from,to,reason}: the moves of requests to
// another model group (SPEC V1), from the group named on arrival or the
// group left after admission; and
// iop_edge_header_refusals_total{bound}: the 431s of SPEC B4.
func (h *Handler) Metrics() []Metric {
	return []Metric{{MetricRetries,
		"Requests re-dispatched to a provider not tried yet after a failure before the first byte, by reason.",
		h.ex.RetrySamples}, {MetricFallbacks,
		"Requests moved to another model group, by the group they left (the one named, on arrival), the group they went to and the condition (unavailable, queue_full, context, wait_ms; after admission unavailable).",
		h.ex.FallbackSamples}, h.headers.metric()}
}

// DefaultRedispatchWait bounds the wait for the next lease when a stalled
// request is re-dispatched (SPEC H11). The client has already waited the
// stall timeout; a re-dispatch that would queue longer gives up and answers
// the stall (504). Other failures re-dispatch within the request's own
// deadline (attempt.go).
const DefaultRedispatchWait = 2 * time.Second

// ticketKey carries a request's keys.Ticket in its context.
type ticketKey struct{}

func ticketOf(ctx context.Context) *keys.Ticket {
	t, _ := ctx.Value(ticketKey{}).(*keys.Ticket)
	return t
}
