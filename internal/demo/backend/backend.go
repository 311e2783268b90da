package backend

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors. Option errors come from New; the others are the Err of a
// RequestEnd (and name what was wrong in the HTTP error body).
var (
	ErrBadOption    = errors.New("demo backend: invalid option")
	ErrUnknownModel = errors.New("model not found")
	ErrBadFault     = errors.New("malformed fault suffix")
	ErrBadRequest   = errors.New("malformed request")
	ErrHijack       = errors.New("reset fault: connection cannot be hijacked")
)

// Options configure a Backend. The zero value is valid: every model, no
// delays, no padding, seed 0, the real clock, no logging.
type Options struct {
	// Logger receives one line per request start and end ("request start",
	// "request end"); nil logs nothing.
	Logger *slog.Logger
	// Now is the clock for timestamps and measured durations; nil = time.Now.
	// Delays use the runtime's timers (testing/synctest fakes both).
	Now func() time.Time
	// TokenDelay is the wait before each content token, stream or not
	// (0 = none). The binary's -token-delay, e.g. 20ms.
	TokenDelay time.Duration
	// PadBytes pads non-stream text answers with filler words appended to the
	// assistant text until the response body is exactly PadBytes bytes
	// (bodies already that long are unchanged; tool calls are never padded).
	// 0 = no padding. For benchmarks that want ~1 KB responses.
	PadBytes int
	// Seed makes ids (chatcmpl-…, call_…) a deterministic function of the
	// seed and the request's sequence number.
	Seed uint64
	// Models restricts the served models to these catalogue names ("tiny",
	// "tiny-tool", "tiny-loop", and the opt-in "tiny-think" and
	// "tiny-agent"); nil or empty serves the first three.
	Models []string
	// LoopTokens is tiny-loop's token limit when a request sets none;
	// 0 = DefaultLoopTokens.
	LoopTokens int
	// PrefixCache is how many prompt prefixes (message boundaries) the
	// instance's prefix cache holds; 0 = no cache: every prompt token is
	// evaluated and reported uncached (see prefixCache).
	PrefixCache int
	// PrefillPerToken is the simulated prefill time per prompt token not
	// served from the prefix cache, waited before anything is written
	// (0 = none). The binary's -prefill-per-token, e.g. 1ms.
	PrefillPerToken time.Duration
	// Slots, when > 0, makes the chat routes share one instance's compute
	// the way llama-server's slots do (see engine): at most Slots requests
	// at once, each generated token one step of every generating slot, a
	// prompt waiting for the prompts queued before it. 0 = each request is
	// paced on its own by TokenDelay and PrefillPerToken (as before). The
	// binary's -slots, e.g. 8 (llama-server -np 8).
	Slots int
	// Batch is the prompt tokens one step processes with Slots (0 =
	// DefaultBatch, llama-server's n_batch); Parallel the generated tokens
	// a step decodes at the cost of one TokenDelay (0 or 1: a CPU, where
	// each generating slot adds a TokenDelay to every step; a GPU batches
	// many). The binary's -batch and -parallel.
	Batch, Parallel int
	// OnRequestEnd, if set, is called on the request's goroutine after the
	// handler is done writing (for a client abort: after the request's
	// context ended and the handler noticed). It must not block for long.
	OnRequestEnd func(RequestEnd)
	// APIKey, when set, is required on the /v1 routes as llama-server's
	// --api-key requires it: "Authorization: Bearer <key>" (or the bare
	// key, or "X-Api-Key: <key>"); /v1/models and /v1/health stay public,
	// as on llama-server, and Ollama's /api/* routes need none (Ollama has
	// no keys). A missing or wrong key gets llama-server's 401
	// {"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}.
	// The key is never logged.
	APIKey string
	// LoadDelay, when > 0, makes the instance act as a llama-server that
	// is loading its model for that long after New: every route answers
	// llama-server's 503 {"error":{"message":"Loading model",
	// "type":"unavailable_error","code":503}} (testdata/samples/
	// llama_health_loading.http) until then, /health included, so it can
	// stand in for a managed process (SPEC U2). The binary's -load-delay.
	LoadDelay time.Duration
}

// Outcome says how a request ended.
type Outcome string

// Outcomes of RequestEnd.
const (
	OutcomeOK         Outcome = "ok"          // answered in full (including forced-status faults)
	OutcomeError      Outcome = "error"       // answered with a 4xx for a bad request or unknown model
	OutcomeClientGone Outcome = "client_gone" // the client went away (or the server shut down) mid-answer
	OutcomeStalled    Outcome = "stalled"     // stall fault; ended when the client went away
	OutcomeReset      Outcome = "reset"       // reset fault closed the connection
)

// RequestEnd describes one finished request, for tests and logs.
type RequestEnd struct {
	Seq        uint64 // request sequence number, from 1
	Method     string
	Path       string
	Model      string // echoed model name; "" for routes without one
	Fault      string // the fault suffix without '+'; "" = none
	Stream     bool
	Status     int // HTTP status written; 0 if none (stall, reset)
	Outcome    Outcome
	Tokens     int       // content chunks written or generated
	Start, End time.Time // by Options.Now
	Err        error     // wraps ErrBadRequest, ErrUnknownModel, ErrBadFault or ErrHijack, else nil
	// RequestID is the request's X-Request-Id header ("" when absent): the
	// tests check the node passes the Edge's request id upstream.
	RequestID string
}

// Stats are the request counters of /_demo/stats.
type Stats struct {
	Active  int    // requests in flight
	Started uint64 // requests accepted since New
	Ended   uint64 // requests finished since New
	// PromptTokens and CachedTokens sum the chat requests' prompt tokens and
	// the part of them served from the prefix cache.
	PromptTokens, CachedTokens uint64
}

// Backend is the demo backend's http.Handler. It is safe for concurrent use.
type Backend struct {
	opts   Options
	log    *slog.Logger // nil = no logging
	now    func() time.Time
	script script
	models []*model          // served, in catalogue order
	byName map[string]*model // catalogue name → model; read-only after New

	// Static bodies rendered in New.
	tagsBody    []byte
	versionBody []byte

	bufs sync.Pool // *[]byte request buffers

	seq     atomic.Uint64
	active  atomic.Int64
	started atomic.Uint64
	ended   atomic.Uint64

	cache        *prefixCache // nil without Options.PrefixCache
	engine       *engine      // nil without Options.Slots
	promptTokens atomic.Uint64
	cachedTokens atomic.Uint64

	mu     sync.Mutex
	loaded map[string]time.Time // guarded by mu: catalogue name → when it unloads (/api/ps's expires_at)

	readyAt time.Time // New + Options.LoadDelay (by Options.Now)
}

// loadingBody is llama-server's answer while it loads its model.
var loadingBody = []byte(`{"error":{"message":"Loading model","type":"unavailable_error","code":503}}`)

// maxBody caps a request body (bytes).
const maxBody = 16 << 20

// New returns a Backend. It fails with ErrBadOption when an option is
// negative or Models names an unknown model.
func New(opts Options) (*Backend, error) {
	var errs []error
	if opts.TokenDelay < 0 {
		errs = append(errs, fmt.Errorf("TokenDelay %s is negative: %w", opts.TokenDelay, ErrBadOption))
	}
	if opts.PadBytes < 0 {
		errs = append(errs, fmt.Errorf("PadBytes %d is negative: %w", opts.PadBytes, ErrBadOption))
	}
	if opts.PrefixCache < 0 {
		errs = append(errs, fmt.Errorf("PrefixCache %d is negative: %w", opts.PrefixCache, ErrBadOption))
	}
	if opts.PrefillPerToken < 0 {
		errs = append(errs, fmt.Errorf("PrefillPerToken %s is negative: %w", opts.PrefillPerToken, ErrBadOption))
	}
	if opts.Slots < 0 || opts.Batch < 0 || opts.Parallel < 0 {
		errs = append(errs, fmt.Errorf("Slots %d, Batch %d, Parallel %d: none may be negative: %w", opts.Slots, opts.Batch, opts.Parallel, ErrBadOption))
	}
	if opts.LoadDelay < 0 {
		errs = append(errs, fmt.Errorf("LoadDelay %s is negative: %w", opts.LoadDelay, ErrBadOption))
	}
	if opts.LoopTokens < 0 || opts.LoopTokens > maxTokenLimit {
		errs = append(errs, fmt.Errorf("LoopTokens %d is outside 0-%d: %w", opts.LoopTokens, maxTokenLimit, ErrBadOption))
	}
	b := &Backend{
		opts:   opts,
		log:    opts.Logger,
		now:    opts.Now,
		byName: map[string]*model{},
		loaded: map[string]time.Time{},
		script: script{answer: answerTokens(), loop: loopTokens(), loopDefault: opts.LoopTokens, think: thinkTokens()},
	}
	if b.now == nil {
		b.now = time.Now
	}
	b.readyAt = b.now().Add(opts.LoadDelay)
	if b.script.loopDefault == 0 {
		b.script.loopDefault = DefaultLoopTokens
	}
	all := catalogue()
	for _, name := range opts.Models {
		if !slices.ContainsFunc(all, func(m model) bool { return m.name == name }) {
			errs = append(errs, fmt.Errorf("Models: %q is not tiny, tiny-tool, tiny-loop, tiny-think or tiny-agent: %w", name, ErrBadOption))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i := range all {
		m := &all[i]
		if slices.Contains(opts.Models, m.name) || (len(opts.Models) == 0 && slices.Contains(defaultModels, m.name)) {
			b.models = append(b.models, m)
			b.byName[m.name] = m
		}
	}
	for _, s := range append(append(answerTokens(), loopTokens()...), thinkTokens()...) {
		if needsEscape(s) {
			return nil, fmt.Errorf("token %q needs escaping: %w", s, ErrBadOption)
		}
	}
	if opts.PrefixCache > 0 {
		b.cache = newPrefixCache(opts.PrefixCache)
	}
	if opts.Slots > 0 {
		b.engine = newEngine(opts)
	}
	b.tagsBody = b.renderTags()
	b.versionBody = []byte(`{"version":"0.17.4"}`)
	b.bufs.New = func() any { s := make([]byte, 0, 4096); return &s }
	return b, nil
}

// Active returns the number of requests in flight.
func (b *Backend) Active() int { return int(b.active.Load()) }

// Stats returns the request counters.
func (b *Backend) Stats() Stats {
	return Stats{Active: b.Active(), Started: b.started.Load(), Ended: b.ended.Load(),
		PromptTokens: b.promptTokens.Load(), CachedTokens: b.cachedTokens.Load()}
}

// Serve answers HTTP/1.1 on ln until ctx ends, then shuts down: request
// contexts derive from ctx, so stalled streams end at once; connections
// still open after 5 s are closed. It returns nil after a shutdown caused by
// ctx, else the server's error.
func (b *Backend) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           b,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	if b.log != nil {
		srv.ErrorLog = slog.NewLogLogger(b.log.Handler(), slog.LevelWarn)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("demo backend: serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}

// ServeHTTP routes one request (see the package doc for the routes).
func (b *Backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &call{b: b, w: w, r: r, ctx: r.Context(), seq: b.seq.Add(1), start: b.now(), outcome: OutcomeOK}
	b.active.Add(1)
	b.started.Add(1)
	if b.log != nil {
		b.log.LogAttrs(c.ctx, slog.LevelInfo, "request start", slog.Uint64("seq", c.seq),
			slog.String("method", r.Method), slog.String("path", r.URL.Path))
	}
	defer b.finish(c)
	if b.opts.LoadDelay > 0 && c.start.Before(b.readyAt) {
		c.outcome = OutcomeError
		c.writeJSON(http.StatusServiceUnavailable, loadingBody)
		return
	}
	if !b.authorized(c.r) {
		c.err = errUnauthorized
		c.outcome = OutcomeError
		c.writeJSON(http.StatusUnauthorized, []byte(`{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}`))
		return
	}
	b.route(c)
}

// errUnauthorized is RequestEnd.Err of a request refused for its key.
var errUnauthorized = errors.New("invalid API key")

// authorized applies Options.APIKey the way llama-server's API key
// middleware does (tools/server/server-http.cpp): public paths pass; the
// key comes from Authorization, else X-Api-Key, with an optional "Bearer "
// prefix.
func (b *Backend) authorized(r *http.Request) bool {
	if b.opts.APIKey == "" || !strings.HasPrefix(r.URL.Path, "/v1/") {
		return true
	}
	switch r.URL.Path {
	case "/v1/models", "/v1/health":
		return true
	}
	key := r.Header.Get("Authorization")
	if key == "" {
		key = r.Header.Get("X-Api-Key")
	}
	key = strings.TrimPrefix(key, "Bearer ")
	return subtle.ConstantTimeCompare([]byte(key), []byte(b.opts.APIKey)) == 1
}

func (b *Backend) route(c *call) {
	method, path := c.r.Method, c.r.URL.Path
	want := http.MethodGet
	switch path {
	case "/api/chat", "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/api/embed", "/v1/embeddings",
		"/v1/responses", "/v1/completions", "/api/show":
		want = http.MethodPost
	}
	if method != want {
		switch path {
		case "/", "/api/chat", "/api/tags", "/api/ps", "/api/version", "/v1/models",
			"/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/health", "/_demo/stats",
			"/api/embed", "/v1/embeddings", "/v1/responses", "/v1/completions", "/api/show":
			c.w.Header().Set("Allow", want)
			c.writeError(shapeFor(path), http.StatusMethodNotAllowed, "method "+method+" not allowed on "+path, nil)
			return
		}
	}
	switch path {
	case "/api/chat":
		c.chat(shapeOllama)
	case "/v1/chat/completions":
		c.chat(shapeOpenAI)
	case "/v1/messages":
		c.chat(shapeAnthropic)
	case "/v1/messages/count_tokens":
		c.countTokens()
	case "/v1/responses":
		c.chat(shapeResponses)
	case "/v1/completions":
		c.chat(shapeCompletions)
	case "/api/embed":
		c.embed(shapeOllama)
	case "/v1/embeddings":
		c.embed(shapeOpenAI)
	case "/api/show":
		c.show()
	case "/api/tags":
		c.writeJSON(http.StatusOK, b.tagsBody)
	case "/api/ps":
		c.writeJSON(http.StatusOK, b.renderPS(c.buffer()))
	case "/api/version":
		c.writeJSON(http.StatusOK, b.versionBody)
	case "/v1/models":
		c.writeJSON(http.StatusOK, b.renderV1Models(c.buffer(), c.start))
	case "/health":
		c.writeJSON(http.StatusOK, []byte(`{"status":"ok"}`))
	case "/_demo/stats":
		buf := append(c.buffer(), `{"active":`...)
		buf = strconv.AppendInt(buf, b.active.Load()-1, 10)
		buf = append(buf, `,"started":`...)
		buf = strconv.AppendUint(buf, b.started.Load(), 10)
		buf = append(buf, `,"ended":`...)
		buf = strconv.AppendUint(buf, b.ended.Load(), 10)
		buf = append(buf, `,"prompt_tokens":`...)
		buf = strconv.AppendUint(buf, b.promptTokens.Load(), 10)
		buf = append(buf, `,"cached_tokens":`...)
		buf = strconv.AppendUint(buf, b.cachedTokens.Load(), 10)
		c.writeJSON(http.StatusOK, append(buf, '}'))
	case "/":
		c.w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		c.writeHeader(http.StatusOK)
		c.w.Write([]byte("iop demo-backend: a deterministic stand-in for a model server, not a model\n"))
	default:
		c.writeError(shapeFor(path), http.StatusNotFound, "path "+path+" not found", nil)
	}
}

// finish ends a request: counters, the OnRequestEnd callback and the log line.
func (b *Backend) finish(c *call) {
	if c.bufp != nil {
		*c.bufp = c.buf[:0]
		if cap(c.buf) <= 1<<20 {
			b.bufs.Put(c.bufp)
		}
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.slot {
		b.engine.release(c.generating)
	}
	end := RequestEnd{
		Seq: c.seq, Method: c.r.Method, Path: c.r.URL.Path, Model: c.echo, Fault: c.fault.suffix,
		Stream: c.stream, Status: c.status, Outcome: c.outcome, Tokens: c.emitted,
		Start: c.start, End: b.now(), Err: c.err, RequestID: c.r.Header.Get("X-Request-Id"),
	}
	b.active.Add(-1)
	b.ended.Add(1)
	if b.opts.OnRequestEnd != nil {
		b.opts.OnRequestEnd(end)
	}
	if b.log != nil {
		attrs := []slog.Attr{
			slog.Uint64("seq", end.Seq), slog.String("method", end.Method), slog.String("path", end.Path),
			slog.Int("status", end.Status), slog.String("outcome", string(end.Outcome)),
			slog.Float64("elapsed_ms", float64(end.End.Sub(end.Start))/1e6),
		}
		if end.Model != "" {
			attrs = append(attrs, slog.String("model", end.Model), slog.Bool("stream", end.Stream), slog.Int("tokens", end.Tokens))
		}
		if end.Fault != "" {
			attrs = append(attrs, slog.String("fault", end.Fault))
		}
		if end.RequestID != "" {
			attrs = append(attrs, slog.String("request_id", end.RequestID))
		}
		if end.Err != nil {
			attrs = append(attrs, slog.String("error", end.Err.Error()))
		}
		b.log.LogAttrs(context.WithoutCancel(c.ctx), slog.LevelInfo, "request end", attrs...)
	}
}

// markLoaded records a use of m at at for /api/ps, with the request's
// keep_alive (keepAlive).
func (b *Backend) markLoaded(m *model, at time.Time, keepAlive json.RawMessage) {
	b.mu.Lock()
	b.loaded[m.name] = at.Add(keepAliveOf(keepAlive))
	b.mu.Unlock()
}

// keepAliveOf is how long a request's keep_alive keeps its model loaded,
// as Ollama 0.17.4 reads it: absent = 5 minutes, a JSON number =
// seconds, a JSON string = a Go duration, negative = for good (here: a
// century); 0 unloads the model after the request. A value Ollama would
// refuse counts as absent (the node never sends one: protocol.KeepAliveSeconds).
func keepAliveOf(raw json.RawMessage) time.Duration {
	var secs float64
	var s string
	d := psKeepAlive
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case json.Unmarshal(raw, &secs) == nil:
		d = time.Duration(secs * float64(time.Second))
	case json.Unmarshal(raw, &s) == nil:
		if v, err := time.ParseDuration(s); err == nil {
			d = v
		}
	}
	if d < 0 {
		d = 100 * 365 * 24 * time.Hour
	}
	return d
}
