package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
	"log/slog"
	"math"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/pool"
	"iop/internal/jsonscan"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// head is what the surface reads from a request body before it queues:
// enough to validate, admit and route it. Nested values are not decoded.
type head struct {
	model        string
	modelSpans   []span // every top-level "model" value, ascending
	spanBuf      [2]span
	stream       bool
	includeUsage bool
	// maxTokens is the completion's bound the request sets (max_tokens,
	// max_completion_tokens or max_output_tokens: a key's token
	// reservation, K5); 0 when none or not a non-negative integer (the
	// surface refuses what is invalid).
	maxTokens int64
	// serviceTier is the body's service_tier string, "" when none
	// (priority.go, SPEC G4).
	serviceTier string
	// prefix is the conversation prefix for prefix_affinity routing
	// (prefixOf), nil for other groups; it lives in prefixBuf up to 8
	// boundaries.
	prefix    []uint64
	prefixBuf [8]uint64
}

// parseHead validates body as one JSON object and reads its top level:
// "model" (required, a non-empty string), "stream" (boolean), for chat
// "stream_options.include_usage" (boolean), and the endpoint's required
// array field. Errors are 400s naming the field.
func parseHead(body []byte, ep *endpoint, hd *head) *reply.Error {
	if !json.Valid(body) {
		var v struct{}
		return jsonFieldError(json.Unmarshal(body, &v))
	}
	all := jsonscan.All(body)
	it, ok := jsonscan.NewMembers(body, all)
	if !ok {
		return apisurface.BadRequest("", "request body must be a JSON object")
	}
	hd.modelSpans = hd.spanBuf[:0]
	var modelOK, haveField bool
	for {
		key, val, more := it.Next()
		if !more {
			break
		}
		switch {
		case jsonscan.KeyIs(key, "model"):
			s, ok := jsonString(body, val)
			if !ok {
				return apisurface.BadRequest("model", "field \"model\" must be a string")
			}
			hd.model, modelOK = s, true
			hd.modelSpans = append(hd.modelSpans, val)
		case jsonscan.KeyIs(key, "stream"):
			switch jsonscan.Kind(body, val) {
			case 't':
				hd.stream = true
			case 'f', 'n':
				hd.stream = false
			default:
				return apisurface.BadRequest("stream", "field \"stream\" must be a boolean")
			}
		case ep.run == runChat && jsonscan.KeyIs(key, "stream_options"):
			switch jsonscan.Kind(body, val) {
			case 'n':
			case '{':
				so, _ := jsonscan.NewMembers(body, val)
				for {
					k, v, more := so.Next()
					if !more {
						break
					}
					if jsonscan.KeyIs(k, "include_usage") {
						switch jsonscan.Kind(body, v) {
						case 't':
							hd.includeUsage = true
						case 'f', 'n':
							hd.includeUsage = false
						default:
							return apisurface.BadRequest("stream_options.include_usage", "field \"stream_options.include_usage\" must be a boolean")
						}
					}
				}
			default:
				return apisurface.BadRequest("stream_options", "field \"stream_options\" must be an object")
			}
		case jsonscan.KeyIs(key, "service_tier"):
			hd.serviceTier, _ = jsonString(body, val)
		case jsonscan.KeyIs(key, "max_tokens") || jsonscan.KeyIs(key, "max_completion_tokens") || jsonscan.KeyIs(key, "max_output_tokens"):
			hd.maxTokens = max(hd.maxTokens, jsonInt(body, val))
		case ep.field != "" && jsonscan.KeyIs(key, ep.field):
			if jsonscan.Kind(body, val) != '[' {
				return apisurface.BadRequest(ep.field, "field %q must be an array of message objects", ep.field)
			}
			haveField = true
		default:
			if name := foldedHeadKey(key, ep); name != "" {
				k := jsonscan.Key(key)
				return apisurface.BadRequest(k, "field %q: keys are case-sensitive; this API's field is %q", k, name)
			}
		}
	}
	switch {
	case !modelOK:
		return apisurface.BadRequest("model", "missing required field \"model\"")
	case hd.model == "":
		return apisurface.BadRequest("model", "field \"model\" must not be empty")
	case ep.field != "" && !haveField:
		return apisurface.BadRequest(ep.field, "missing required field %q", ep.field)
	}
	return nil
}

// foldedHeadKey returns the head field ("model", "stream",
// "stream_options", the endpoint's required field) that the raw top-level
// key spells in another case, or "" when it spells none. The edge routes on
// the exact keys, but a backend decoding with Go's encoding/json (Ollama)
// matches keys case-insensitively and lets the last one win: a tunnelled
// {"model":"a","MODEL":"b"} would be routed to group a and served by the
// backend's model b, a target no model group names (SPEC Q1). The keys are
// refused instead. The comparison is Unicode simple folding, as
// encoding/json's ("ſtream" folds to "stream"); it allocates only for a key
// with escapes (TestParseHeadAllocs).
func foldedHeadKey(raw []byte, ep *endpoint) string {
	if len(raw) > 128 { // "stream_options" with every byte escaped is 84
		return ""
	}
	k := raw
	if bytes.IndexByte(raw, '\\') >= 0 {
		k = []byte(jsonscan.Key(raw)) // a key written with escapes (rare)
	}
	for _, name := range [...]string{"model", "stream", "stream_options", ep.field} {
		if name != "" && string(k) != name && bytes.EqualFold(k, []byte(name)) {
			return name
		}
	}
	return ""
}

// exchange is one admitted request: its response, lease and outcome. It is
// what the Edge keeps per request for the stream's whole life, so it holds
// nothing that only the start needs once the first byte went out.
type exchange struct {
	ctx   context.Context // the request's context, carrying the principal
	r     *http.Request
	acc   *reply.Recorder // the response writer and the access record
	out   reply.Output
	ep    *endpoint
	lease *pool.Lease
	model string
	// body is the client's request body, kept only while a re-dispatch
	// could still resend it (SPEC H11: before any byte reached the
	// client); deliver drops it once the sink wrote.
	body []byte
	// held: bytes of body counted against http.max_inflight_body_bytes;
	// dropBody gives them back.
	held  int64
	abort bool // end the response by aborting the connection
	// handoff: the stream was cancelled before its terminal and, with the
	// lease, handed to drain, which releases the lease once the node
	// confirms (SPEC Q2, E4).
	handoff bool
	// released: lease went back (Q2); a re-dispatch releases the failed
	// lease before it takes the next one (H11).
	released bool
	ok       bool // a success outcome was written
	head     head
	// sched is the request's place in the queue (priority.go, SPEC G1,
	// G4), decided at admission.
	sched schedule
	// att is the request's attempt machine (attempt.go): its
	// re-dispatch, hold and passive-health decisions. statuses are the
	// upstream statuses that count as a provider failure
	// (outlier_detection.statuses), for classify.
	att      attempt
	statuses []int
	// unknown: the run path's policy for unknown request members
	// (http.unknown_fields).
	unknown apisurface.UnknownFields
	// kept: the current attempt's failure before any byte, kept from the
	// client while another candidate may answer (SPEC H11).
	kept kept
	// stalled: the lease a stall re-dispatch left, for the record of the
	// next attempt's outcome (SPEC H12).
	stalled *pool.Lease
	// The current attempt's watchers (relay): its context's cancel, the
	// fence callback's stop and the response-wait timer.
	cancel    context.CancelCauseFunc
	stopFence func() bool
	timer     *time.Timer
}

// kept is an attempt's failure before any byte. Its sink answers the
// request when no other candidate takes it: the envelopes held back (the
// upstream's own answer, or the ERROR terminal) are handed to it, or err is
// written when there are none.
type kept struct {
	sink sink
	envs []*iop.Envelope
	err  *reply.Error
}

// poolRequest is x's admission request (SPEC Q4, Q7); a re-dispatch asks
// again with it (H11), while the body is still there, excluding every
// provider tried and within the credential slot of the route the request
// was bound to (C6). That holds from the first lease on, an over-capacity
// re-queue included (E4): its refused route is no attempt, so it leaves
// tried and may take the request again, but the request stays bound to
// that route's slot and waits for a route of it.
func (x *exchange) poolRequest() pool.Request {
	r := pool.Request{Model: x.head.model, Operation: x.ep.operation, PromptTokens: pool.EstimatePromptTokens(len(x.body)),
		Prefix: x.head.prefix, Exclude: x.att.tried, SameSlot: x.lease != nil, Slot: x.att.slot,
		MaxTokens: int(min(x.head.maxTokens, 1<<30))}
	if x.lease != nil {
		r.Arrival = x.lease.Arrival // G5: a re-dispatch keeps its place
	}
	x.sched.apply(&r)
	return r
}

// principal is the request's authenticated principal; "" in open mode.
func (x *exchange) principal() string {
	p, _ := PrincipalFromContext(x.ctx)
	return p
}

// sink turns one stream's envelopes into the client response. handle's err
// is a write error (the client is gone); fail ends the response with e
// unless a terminal outcome was already written; failure reports the error
// outcome written, if any.
type sink interface {
	handle(env *iop.Envelope) (done bool, err error)
	fail(e *reply.Error) error
	failure() *reply.Error
	// wrote reports whether anything (the status line) reached the
	// client; a stalled request is re-dispatched only before (SPEC H11).
	wrote() bool
}

// serveModel runs one model request: read and validate the body, acquire a
// lease (waiting in the queue), dispatch by lease type (SPEC Q3) and relay
// the result. Every lease is released exactly once, after its stream
// closed. A failure or stall before any byte may be re-dispatched to a
// provider not tried yet (H11): the attempt machine decides (attempt.go),
// serveModel, relay and reacquire carry its effects out.
//
// Its goroutine is parked in relay for the stream's whole life, so the
// frames below relay are kept small: admission and the stream's start run
// in functions that have returned before relay waits (a parked stack of
// under 3 KiB lets the runtime shrink the goroutine's stack to 8 KiB).
func (h *Handler) serveModel(ctx context.Context, w *reply.Recorder, r *http.Request, v *view, ep *endpoint) {
	x := h.admit(ctx, w, r, v, ep)
	if x == nil {
		return
	}
	defer h.dropBody(x)
	defer func() {
		if x.abort {
			x.acc.Cut()
			panic(http.ErrAbortHandler) // after the lease went back
		}
	}()
	defer h.releaseLease(x)
	for {
		if st, s := h.start(x); st != nil {
			h.relay(x, st, s)
		}
		if !h.relayEnded(x) {
			return
		}
	}
}

// relayEnded steps x's attempt machine with the relay's end and, when it
// says so, takes the next lease (reacquire); false: the request is over.
// Never inlined, like decide: its effects stay off serveModel's frame,
// which lies under every held stream's relay.
//
//go:noinline
func (h *Handler) relayEnded(x *exchange) bool {
	fx := h.step(x, &event{kind: evRelayEnded, ok: x.ok})
	return fx.redispatch && h.reacquire(x, fx)
}

// admit reads and validates the body and acquires a lease, waiting in the
// queue (SPEC Q4). It returns nil when it answered the request itself (a
// bad body, no admission) or the client left while queued.
func (h *Handler) admit(ctx context.Context, w *reply.Recorder, r *http.Request, v *view, ep *endpoint) *exchange {
	body, e := h.readBody(w, r, v.maxBody)
	if e != nil {
		closeUnread(w, r)
		if e.ClientGone {
			w.Leave() // nothing is written: 499, client_cancelled
			h.log.Debug("client left before its request body arrived", "request_id", w.Rec.RequestID, "err", e.Message)
			return nil
		}
		reply.WriteError(w, ep.surface, e)
		return nil
	}
	// The body is in: lift the read deadline so that nothing later on this
	// connection (its disconnect detector's read) ever runs into it.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	x := &exchange{ctx: ctx, r: r, acc: w, out: reply.Output{W: w}, ep: ep, body: body, held: int64(cap(body)),
		statuses: v.statuses, unknown: v.unknown}
	var deadline time.Time
	if ms := v.cfg.Queue.WaitTimeoutMs; ms > 0 {
		deadline = h.o.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	hd := &x.head
	if e := parseHead(body, ep, hd); e != nil {
		h.dropBody(x)
		reply.WriteError(w, ep.surface, e)
		return nil
	}
	if v.affinity[hd.model] {
		hd.prefix = prefixOf(h.hasher, body, ep, hd.model, hd.prefixBuf[:0])
	}
	w.SetModel(hd.model, v.cfg != nil && v.cfg.ModelByName(hd.model) != nil, h.o.Metrics)
	if t := ticketOf(ctx); t != nil && !t.Principal().Allows(hd.model) {
		h.dropBody(x)
		reply.WriteError(w, ep.surface, poolError(hd.model, pool.ErrUnknownModel)) // K4: the same 404 as a model that does not exist
		return nil
	}
	if e := decideSchedule(x); e != nil {
		h.dropBody(x)
		reply.WriteError(w, ep.surface, e)
		return nil
	}
	if !h.reserveKey(x, w) {
		h.dropBody(x)
		return nil
	}
	queued := h.o.Now()
	lease, err := h.o.Pool.Acquire(ctx, x.poolRequest())
	w.SetLease(lease, h.o.Now().Sub(queued), err)
	if err != nil {
		h.dropBody(x)
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			if shuttingDown(ctx) {
				reply.WriteError(w, ep.surface, shutdownError())
				return nil
			}
			w.Leave()
			h.log.Debug("client left while queued", "model", hd.model, "request_id", w.Rec.RequestID) // SPEC Q4, T3: the pool removed the waiter
			return nil
		}
		e := poolError(hd.model, err)
		level := slog.LevelDebug // the client's mistake
		if e.Status >= 429 {
			level = slog.LevelInfo // load or liveness: operators want to see it
		}
		model, logErr := hd.model, err
		if errors.Is(err, pool.ErrUnknownModel) { // O3: a name no group has is the caller's word, not a label (the access line keeps it, cut)
			model, logErr = access.OtherModel, pool.ErrUnknownModel
		}
		h.log.Log(ctx, level, "request not admitted", "model", model, "operation", ep.operation, "status", e.Status,
			"request_id", w.Rec.RequestID, "err", logErr)
		reply.WriteError(w, ep.surface, e)
		return nil
	}
	x.lease, x.model = lease, hd.model
	x.att = newAttempt(lease, v.attemptBound(hd.model), deadline, h.o.RedispatchWait >= 0, h.o.Health != nil)
	return x
}

// start sends the request on x.lease by lease type (SPEC Q3) and returns
// the stream and the sink that relays it; nil when it answered the request
// itself (the operation is not supported, the input is invalid, the node
// could not take it).
func (h *Handler) start(x *exchange) (dispatch.Stream, sink) {
	l := x.lease
	switch {
	case l.Type == protocol.TypeOpenAICompat:
		return h.tunnel(x)
	case l.Type == protocol.TypeOllama && x.ep.run != runNone:
		return h.run(x)
	case l.Type == protocol.TypeOllama:
		return h.tunnel(x) // the node's built-in Ollama profile (/v1/completions)
	}
	reply.WriteError(x.out.W, x.ep.surface, reply.BadGateway("operation_not_supported", "provider "+l.Provider+" of type "+
		l.Type+" cannot serve "+x.ep.path))
	return nil, nil
}

// tunnel sends the client's body with only "model" replaced by the lease's
// target (SPEC Q3: one splice, every other byte unchanged); its sink relays
// the provider's response frames.
func (h *Handler) tunnel(x *exchange) (dispatch.Stream, sink) {
	l, hd := x.lease, &x.head
	out := x.body
	if len(hd.modelSpans) != 1 || hd.model != l.Target {
		out = spliceModel(x.body, hd.modelSpans, l.Target)
	}
	req := &iop.ProviderTunnelRequest{
		Adapter: l.Provider, Target: l.Target, Method: http.MethodPost, Path: x.ep.path,
		Headers: forwardHeaders(x.r.Header), Body: out, Stream: hd.stream,
		Operation: x.ep.operation, ResponseStallTimeoutMs: l.StallTimeoutMs, RequestId: x.acc.Rec.RequestID,
		Trace: x.acc.Trace.BeginAttempt(l, access.PathTunnel),
	}
	var ok bool
	if req.CredentialLease, req.CredentialBinding, ok = h.credential(x); !ok {
		return nil, nil
	}
	st, err := h.o.Dispatcher.StartTunnel(dispatch.Target{Node: l.Node, Generation: l.Generation}, req)
	if err != nil {
		h.startFailed(x, err)
		return nil, nil
	}
	return st, &tunnelSink{h: h, x: x}
}

func (h *Handler) startFailed(x *exchange, err error) {
	msg := "the provider's node could not take the request"
	if errors.Is(err, dispatch.ErrNotReady) {
		msg = "the provider's node is no longer connected"
	}
	h.log.Warn("dispatch failed", "model", x.model, "node", x.lease.Node, "provider", x.lease.Provider,
		"request_id", x.acc.Rec.RequestID, "err", err)
	e := reply.BadGateway("provider_unavailable", msg)
	if ev := h.event(x, evStartFailed, x.body == nil); h.step(x, &ev).stop {
		x.kept = kept{err: e} // nothing was sent: another candidate may take it
		return
	}
	reply.WriteError(x.out.W, x.ep.surface, e)
}

// responseWait is the Edge's response-wait timeout between two envelopes:
// the lease's stall timeout — the one the request carries to the node,
// resolved once by config.EffectiveStallTimeoutMs (SPEC Q6) — plus the
// grace.
func (h *Handler) responseWait(l *pool.Lease) time.Duration {
	ms := l.StallTimeoutMs
	grace := h.o.ResponseWaitGrace
	if ms > (math.MaxInt64-int64(grace))/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms)*time.Millisecond + grace
}

// relay reads st until its terminal and hands each envelope to s. It
// watches, concurrently with Recv, the client (r.Context: a disconnect
// while a long prefill produces nothing is noticed at once), the lease's
// fence and the response-wait timer; any of them, or a failed write, sends
// Cancel to the node at once (SPEC T3) and ends the response with exactly
// one outcome. st is closed before relay returns.
//
// The request's goroutine waits in Recv for the stream's whole life: relay
// keeps its own frame small and does the work per envelope in deliver,
// whose frame is gone while it waits.
func (h *Handler) relay(x *exchange, st dispatch.Stream, s sink) {
	ctx := h.watch(x)
	defer h.unwatch(x, st)
	for {
		env, err := st.Recv(ctx)
		if err != nil {
			x.out.Batch = false
			if h.recvFailed(x, st, s, ctx, err) {
				h.handOff(x, st)
			}
			return
		}
		if h.deliver(x, st, s, env) {
			return
		}
	}
}

// watch starts the watchers of one attempt's relay and returns the context
// Recv waits on: it ends when the client's request context does, with
// ErrFenced when the lease's fence context does (a callback, not a
// goroutine per request: the fence context is shared by the generation's
// leases) and with ErrResponseWait when no envelope came for the
// response-wait timeout.
func (h *Handler) watch(x *exchange) context.Context {
	ctx, cancel := context.WithCancelCause(x.ctx)
	x.cancel, x.stopFence = cancel, nil
	if fc := x.lease.FenceContext(); fc != nil {
		x.stopFence = context.AfterFunc(fc, func() { cancel(ErrFenced) })
	}
	x.timer = time.AfterFunc(h.responseWait(x.lease), func() { cancel(ErrResponseWait) })
	return ctx
}

// unwatch closes st (unless handed off to drain) and stops the watchers.
func (h *Handler) unwatch(x *exchange, st dispatch.Stream) {
	if !x.handoff {
		st.Close()
	}
	x.timer.Stop()
	if x.stopFence != nil {
		x.stopFence()
	}
	x.cancel(nil)
	x.cancel, x.stopFence, x.timer = nil, nil, nil
}

// deliver hands one envelope to the attempt machine and carries out what
// it decides; it reports whether relay is done: a terminal was written,
// the client is gone, or the attempt failed before any byte and is kept for
// re-dispatch (x.kept). env is classified once (classify); a stall's
// evidence goes to Options.Health when the machine asks (SPEC H8). Once s
// wrote, the body can never be resent and is dropped.
func (h *Handler) deliver(x *exchange, st dispatch.Stream, s sink, env *iop.Envelope) bool {
	act, stop := h.decide(x, s, env)
	switch act {
	case envHold:
		x.kept.sink, x.kept.envs = s, append(x.kept.envs, env)
	case envFail:
		x.kept = kept{sink: s, envs: []*iop.Envelope{env}}
	case envFlush: // held too much: everything held goes to s, in order, and relay goes on
		envs := append(x.kept.envs, env)
		x.kept = kept{}
		for _, env := range envs {
			if h.pass(x, st, s, env) {
				return true
			}
		}
		return false
	case envPass:
		return h.pass(x, st, s, env)
	}
	return stop
}

// decide steps x's attempt machine with env (and, when it asks, with the
// stall verdict of Options.Health) and returns what becomes of env and
// whether relay stops. It is a frame of its own, never inlined, so that
// its event and effects (~650 bytes) are off the stack when deliver calls
// pass: the deepest point of a held stream's handler goroutine is its
// first write (pass → the surface encoder → the response's first flush,
// which writes the header and drains the request body), and every held
// stream keeps the stack that point grew until a collection finds it
// mostly unused (BENCHMARKS.md "Concurrent slow streams": ≤ 32 KiB of
// Edge RSS per stream).
//
//go:noinline
func (h *Handler) decide(x *exchange, s sink, env *iop.Envelope) (envAction, bool) {
	x.timer.Reset(h.responseWait(x.lease))
	e := event{kind: evEnvelope, class: classify(env, x.statuses, h.o.Now), wrote: s.wrote() || x.body == nil}
	if e.class.retryable || e.class.stall { // only a failure that may be kept reads the clock and the client's context
		e.gone, e.now = x.ctx.Err() != nil, h.o.Now()
	}
	fx := h.step(x, &e)
	if fx.checkStall {
		e.kind, e.valid = evStallChecked, h.o.Health.ObserveStall(x.lease, e.class.failure)
		fx = h.step(x, &e)
	}
	return fx.env, fx.stop
}

// event is an event of kind at the injected clock's reading, with what the
// request's state says: wrote (nothing may be resent: a byte reached the
// client or the body was dropped) and whether the client is gone.
func (h *Handler) event(x *exchange, kind eventKind, wrote bool) event {
	return event{kind: kind, wrote: wrote, gone: x.ctx.Err() != nil, now: h.o.Now()}
}

// step applies e to x's attempt machine and carries out the effects that
// only report: passive health's verdicts (Options.Outlier: the failures
// another provider's answer corroborated, then the attempt's own, a
// failure the input may have caused as a suspicion of the request's
// principal) and the stall records (Options.Health: the re-dispatch
// decision and its outcome, SPEC H12) and, for a sampled request, the
// attempt's span (trace.go: its first envelope, the node's spans on its
// terminal, its end). The effects that steer the request are returned.
func (h *Handler) step(x *exchange, e *event) effects {
	fx := x.att.step(e)
	if x.acc.Trace.Sampled() {
		switch e.kind {
		case evEnvelope:
			x.acc.Trace.Envelope(e.class.terminal, e.class.spans, x.lease, h.o.Tracer)
		case evRelayEnded:
			x.attemptEnded(&fx)
		}
	}
	if v := fx.verdict; v.kind != verdictOpen && h.o.Outlier != nil {
		for _, s := range fx.corroborated {
			h.o.Outlier.Failure(s.key, s.reason, 0)
		}
		switch {
		case v.kind == verdictFailure && v.input:
			h.o.Outlier.Suspect(x.lease.Key, v.reason, x.principal())
		case v.kind == verdictFailure:
			h.o.Outlier.Failure(x.lease.Key, v.reason, v.retryAfter)
		default:
			h.o.Outlier.Success(x.lease.Key)
		}
	}
	if fx.recordEligibility {
		h.o.Health.RecoveryEligibility(x.lease, x.model, fx.eligibility)
	}
	if fx.recordRecovery {
		second := x.lease
		if e.kind == evNoLease || fx.refuse {
			second = nil
		}
		h.o.Health.RecoveryOutcome(x.stalled, second, x.model, fx.recovery)
	}
	return fx
}

// lost keeps a lost node connection (fence, session loss, a drained node)
// before any byte as the attempt's failure e, when the machine says another
// candidate may take the request; it reports whether it did.
func (h *Handler) lost(x *exchange, s sink, e *reply.Error) bool {
	if ev := h.event(x, evLost, s.wrote() || x.body == nil); h.step(x, &ev).stop {
		x.kept = kept{sink: s, err: e}
		return true
	}
	return false
}

// pass is deliver's plain path: s writes env.
func (h *Handler) pass(x *exchange, st dispatch.Stream, s sink, env *iop.Envelope) bool {
	x.out.Batch = st.Pending() // flush once per burst of frames (SPEC T2)
	done, err := s.handle(env)
	if err == nil && !done {
		err = x.out.EndBurst()
	}
	if x.body != nil && s.wrote() {
		h.dropBody(x)
	}
	if err != nil {
		st.Cancel("write_failed")
		x.acc.Leave()
		h.log.Debug("client write failed", "model", x.model, "run_id", st.RunID(), "request_id", x.acc.Rec.RequestID, "err", err)
		if !terminal(env) {
			h.handOff(x, st)
		}
		return true
	}
	if done {
		if e := s.failure(); e != nil {
			x.acc.Fail(e)
			h.logFailure(x, st, e)
		} else {
			x.ok = true
		}
	}
	return done
}

// recvFailed ends the response after Recv failed. It reports whether it
// cancelled a stream whose terminal has not arrived yet: the node still
// holds the provider's capacity slot until its upstream call returns.
func (h *Handler) recvFailed(x *exchange, st dispatch.Stream, s sink, ctx context.Context, err error) (cancelled bool) {
	var e *reply.Error
	switch {
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		cause := context.Cause(ctx)
		switch {
		case errors.Is(cause, ErrFenced):
			st.Cancel("fenced")
			e = reply.BadGateway("provider_lost", "the provider's node connection was lost")
			if h.lost(x, s, e) {
				return false
			}
		case errors.Is(cause, ErrResponseWait):
			st.Cancel("response_wait_timeout")
			cancelled = true
			e = &reply.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: access.CodeResponseTimeout,
				Message: "no response from the provider in time"}
		case errors.Is(cause, ErrShutdown):
			st.Cancel("edge_shutdown")
			cancelled = true
			e = shutdownError()
		default:
			st.Cancel("client_disconnected")
			x.acc.Leave()
			h.log.Debug("client left", "model", x.model, "run_id", st.RunID(), "request_id", x.acc.Rec.RequestID)
			return true
		}
	case errors.Is(err, dispatch.ErrNodeDrained):
		// A dispatch that met a node already closing after its drain: the
		// node never started it. 503 with Retry-After, not 502.
		e = nodeFailure(protocol.CodeNodeShutdown.String(), "", "", 0, nil)
		if h.lost(x, s, e) {
			return false
		}
	case errors.Is(err, dispatch.ErrSessionLost):
		e = reply.BadGateway("provider_lost", "the provider's node connection was lost")
		if h.lost(x, s, e) {
			return false
		}
	case errors.Is(err, io.EOF):
		e = reply.BadGateway("provider_error", "the provider's stream ended without a result")
	case errors.Is(err, dispatch.ErrProtocol):
		// The transport dropped the misordered envelope, cancelled the
		// stream on the node and logged it with node and generation.
		e = reply.BadGateway("provider_protocol_error", "the provider's node broke the stream protocol")
	default:
		st.Cancel("stream_error")
		cancelled = true
		e = reply.BadGateway("provider_error", "the provider's stream failed")
	}
	h.logFailure(x, st, e)
	x.acc.Fail(e)
	_ = s.fail(e)
	return cancelled
}

// handOff keeps the lease of a cancelled stream until the node confirms the
// cancel with the stream's terminal (or the session is lost, the lease's
// generation is fenced, or CancelDrainTimeout passes), then closes the
// stream and releases the lease exactly once (SPEC Q2). Releasing at once
// would let the next waiter reach a node whose capacity gate (SPEC E4) still
// counts the cancelled call, and be refused. The response is already ended;
// this runs on its own goroutine, owned by the Handler, bounded by the
// timeout, and counted until it released the lease (WaitDetached).
func (h *Handler) handOff(x *exchange, st dispatch.Stream) {
	x.handoff = true
	lease := x.lease
	done := h.drain.detach()
	go func() {
		defer done()
		defer h.o.Pool.Release(lease)
		defer st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), h.o.CancelDrainTimeout)
		defer cancel()
		fenced := lease.Fenced()
		for {
			if fenced != nil {
				select {
				case <-fenced:
					return
				default:
				}
			}
			env, err := st.Recv(ctx)
			if err != nil || terminal(env) {
				return
			}
		}
	}()
}

// releaseLease returns x.lease exactly once (SPEC Q2), unless relay handed
// it to the drain goroutine (which returns it).
func (h *Handler) releaseLease(x *exchange) {
	if x.handoff || x.released {
		return
	}
	x.released = true
	h.o.Pool.Release(x.lease)
}

// reacquire carries out a re-dispatch (fx.redispatch, after a failed
// attempt kept in x.kept): the failed lease goes back first (SPEC Q2), then
// the pool picks again among the providers x has not tried (waiting as
// fx.wait says: RedispatchWait after a stall, else until x's deadline).
// With a lease it returns true and x runs again on it; with none — no
// untried candidate, none in time, the client left — the kept failure is
// answered and it returns false.
func (h *Handler) reacquire(x *exchange, fx effects) bool {
	k := x.kept
	x.kept = kept{}
	first := x.lease
	if fx.reason == retryStall {
		x.stalled = first
	}
	if rr, ok := h.o.Pool.(refusedReleaser); ok && fx.reason == retryOverCapacity && !x.handoff && !x.released {
		x.released = true
		rr.ReleaseRefused(x.lease, fairShare(k.envs)) // SPEC E4: the node is full with other edges' work: no cooling, the provider admits less for a while
	}
	h.releaseLease(x)
	var ctx context.Context
	var cancel context.CancelFunc
	if fx.wait == waitRedispatch {
		ctx, cancel = context.WithTimeout(x.ctx, h.o.RedispatchWait)
	} else {
		ctx, cancel = context.WithDeadline(x.ctx, x.att.deadline)
	}
	queued := h.o.Now()
	l, err := h.o.Pool.Acquire(ctx, x.poolRequest())
	x.acc.SetLease(l, h.o.Now().Sub(queued), err)
	cancel()
	if err != nil {
		e := h.event(x, evNoLease, false)
		h.step(x, &e)
		if x.ctx.Err() != nil {
			if shuttingDown(x.ctx) {
				reply.WriteError(x.out.W, x.ep.surface, shutdownError())
				return false
			}
			x.acc.Leave()
			h.log.Debug("client left during re-dispatch", "model", x.model, "request_id", x.acc.Rec.RequestID)
			return false
		}
		h.answerRetry(x, k, fx.reason, first, err)
		return false
	}
	e := h.event(x, evLeased, false)
	e.lease = l
	if h.step(x, &e).refuse { // SPEC C6: a lease of another credential slot is never used
		h.o.Pool.Release(l)
		h.log.Warn("re-dispatch lease refused: another credential slot", "model", x.model, "request_id", x.acc.Rec.RequestID,
			"node", l.Node, "provider", l.Provider)
		if x.ctx.Err() == nil {
			h.answerRetry(x, k, fx.reason, first, errOtherSlot)
		}
		return false
	}
	h.retries[fx.reason].Add(1)
	x.acc.Rec.Retries++
	h.log.LogAttrs(x.ctx, slog.LevelInfo, "request re-dispatched", slog.String("request_id", x.acc.Rec.RequestID),
		slog.String("model", x.model), slog.String("reason", fx.reason.String()),
		slog.String("from_node", first.Node), slog.String("from_provider", first.Provider),
		slog.String("node", l.Node), slog.String("provider", l.Provider), slog.Int("attempt", len(x.att.tried)+1))
	x.lease, x.released = l, false
	return true
}

// errOtherSlot is why a re-dispatch found no candidate when the pool
// offered a lease of another credential slot (SPEC C6).
var errOtherSlot = errors.New("no untried provider within the request's credential slot")

// fairShare is the over_capacity terminal's fair_share (SPEC E4): what
// the node admits from this edge while other edges want the provider; 0
// when it said none.
func fairShare(envs []*iop.Envelope) int {
	if len(envs) == 0 {
		return 0
	}
	env := envs[len(envs)-1]
	return int(min(env.GetRunEvent().GetFairShare()+env.GetTunnelFrame().GetFairShare(), 1<<20))
}

// answerRetry answers x with the failure r of its last attempt (failed for
// reason) on lease last, after no other candidate could take it (why).
func (h *Handler) answerRetry(x *exchange, r kept, reason retryReason, last *pool.Lease, why error) {
	detail := "no other provider: " + why.Error()
	if errors.Is(why, pool.ErrAllTried) {
		detail = "every provider of the model was tried"
	}
	if len(r.envs) == 0 {
		if r.sink != nil {
			_ = r.sink.fail(r.err)
		} else {
			reply.WriteError(x.out.W, x.ep.surface, r.err)
		}
	}
	for _, env := range r.envs {
		if done, err := r.sink.handle(env); done || err != nil {
			break
		}
	}
	status := 0
	if e := r.err; e != nil {
		status = e.Status
	}
	if r.sink != nil {
		if e := r.sink.failure(); e != nil {
			status = e.Status
			x.acc.Fail(e)
		}
	}
	if f := r.envs; len(f) > 0 {
		if fr := f[0].GetTunnelFrame(); fr != nil && fr.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START {
			status = int(fr.GetStatus())
		}
	}
	h.log.LogAttrs(x.ctx, slog.LevelWarn, "request failed", slog.String("request_id", x.acc.Rec.RequestID),
		slog.String("model", x.model), slog.String("node", last.Node), slog.String("provider", last.Provider),
		slog.String("reason", reason.String()), slog.Int("status", status), slog.Int("attempts", len(x.att.tried)),
		slog.String("detail", detail))
}

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
		func() map[string]float64 {
			out := make(map[string]float64, nRetryReasons)
			for r := range nRetryReasons {
				out[`reason="`+r.String()+`"`] = float64(h.retries[r].Load())
			}
			return out
		}}, h.headerMetric()}
}

func (h *Handler) logFailure(x *exchange, st dispatch.Stream, e *reply.Error) {
	h.log.LogAttrs(x.ctx, slog.LevelWarn, "request failed", slog.String("request_id", x.acc.Rec.RequestID),
		slog.String("model", x.model), slog.String("node", x.lease.Node), slog.String("provider", x.lease.Provider),
		slog.String("run_id", st.RunID()), slog.Int("status", e.Status), slog.String("code", e.Code), slog.String("error", e.Message),
		slog.String("detail", e.Detail))
}

// Client request headers a tunnel forwards (SPEC T4). Everything else —
// Authorization, x-api-key, cookies, hop-by-hop and X-Iop-* headers — stays
// at the Edge; upstream auth comes from the adapter config or a lease.
var forwardedRequestHeaders = [...]struct{ canon, wire string }{
	{"Content-Type", "Content-Type"},
	{"Accept", "Accept"},
	{"Anthropic-Version", "anthropic-version"},
	{"Anthropic-Beta", "anthropic-beta"},
	{"Openai-Beta", "OpenAI-Beta"},
}

func forwardHeaders(h http.Header) []*iop.Header {
	var out []*iop.Header
	for _, f := range forwardedRequestHeaders {
		for _, v := range h[f.canon] {
			out = append(out, &iop.Header{Name: f.wire, Value: v})
		}
	}
	return out
}
