package exchange

import (
	"context"
	"errors"
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

// Endpoint is what an exchange needs of the endpoint a request came to:
// its error shape, its pool operation (SPEC T1), the tunnel's path and its
// run-path surface (run.go).
type Endpoint struct {
	Surface   reply.Surface
	Operation string  // pool/profile operation (SPEC T1)
	Path      string  // the tunnel's fallback path
	Run       RunKind // the run-path surface (run.go); RunNone = tunnel only
}

// Exchange is one admitted request: its response, lease and outcome. It is
// what the Edge keeps per request for the stream's whole life, so it holds
// nothing that only the start needs once the first byte went out. The
// exported fields are set by the admission (internal/edge/api) before
// Serve and read-only after; the rest is the exchange's own.
type Exchange struct {
	Ctx      context.Context // the request's context (the drain's, the client's)
	Header   http.Header     // the client's request headers: the tunnel forwards a few (SPEC T4)
	Acc      *reply.Recorder // the response writer and the access record
	Endpoint *Endpoint
	// Body is the client's request body, kept only while a re-dispatch
	// could still resend it (SPEC H11: before any byte reached the
	// client); deliver drops it once the sink wrote. Held: bytes of Body
	// counted against http.max_inflight_body_bytes, given back to
	// Deps.Bodies when it is dropped.
	Body []byte
	Held int64
	// What the admission read of the body (the head): the model group,
	// every top-level "model" value's span (the tunnel splices the target
	// in, SPEC Q3), stream, stream_options.include_usage, the completion
	// bound (max_tokens …) and, for a prefix_affinity group, the
	// conversation prefix.
	Model        string
	ModelSpans   []jsonscan.Span
	Stream       bool
	IncludeUsage bool
	MaxTokens    int64
	Prefix       []uint64
	// Principal is the authenticated principal, "" in open mode; Sched
	// the request's place in the queue (SPEC G1, G4, V3).
	Principal string
	Sched     Schedule
	// Deadline is the request's arrival plus queue.wait_timeout_ms (zero:
	// none); AttemptBound how many providers it may be sent to
	// (models[].max_attempts, at least 1).
	Deadline     time.Time
	AttemptBound int
	// Statuses are the upstream statuses that count as a provider failure
	// (outlier_detection.statuses), for classify; Unknown the run path's
	// policy for unknown request members (http.unknown_fields).
	Statuses []int
	Unknown  apisurface.UnknownFields

	out   reply.Output
	lease *pool.Lease
	abort bool // end the response by aborting the connection
	// handoff: the stream was cancelled before its terminal and, with the
	// lease, handed to drain, which releases the lease once the node
	// confirms (SPEC Q2, E4).
	handoff bool
	// released: lease went back (Q2); a re-dispatch releases the failed
	// lease before it takes the next one (H11).
	released bool
	ok       bool // a success outcome was written
	// att is the request's attempt machine (attempt.go): its
	// re-dispatch, hold and passive-health decisions.
	att attempt
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
func (x *Exchange) poolRequest() pool.Request {
	r := pool.Request{Model: x.Model, Operation: x.Endpoint.Operation, PromptTokens: pool.EstimatePromptTokens(len(x.Body)),
		Prefix: x.Prefix, Exclude: x.att.tried, SameSlot: x.lease != nil, Slot: x.att.slot,
		MaxTokens: int(min(x.MaxTokens, 1<<30))}
	if x.lease != nil {
		r.Arrival = x.lease.Arrival // G5: a re-dispatch keeps its place
	}
	x.Sched.apply(&r)
	return r
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

// Serve runs one admitted request: acquire a lease (waiting in the queue),
// dispatch by lease type (SPEC Q3) and relay the result. Every lease is
// released exactly once, after its stream closed. A failure or stall before
// any byte may be re-dispatched to a provider not tried yet (H11): the
// attempt machine decides (attempt.go), Serve, relay and reacquire carry
// its effects out. It answers the request in every case, and panics with
// http.ErrAbortHandler (after the lease went back) when the response must
// end by aborting the connection.
//
// Its goroutine is parked in relay for the stream's whole life, so the
// frames below relay are kept small: the queueing and the stream's start
// run in functions that have returned before relay waits (a parked stack
// of under 3 KiB lets the runtime shrink the goroutine's stack to 8 KiB).
func (h *Engine) Serve(x *Exchange) {
	x.out = reply.Output{W: x.Acc}
	defer h.dropBody(x)
	if !h.acquire(x) {
		return
	}
	defer func() {
		if x.abort {
			x.Acc.Cut()
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
// Never inlined, like decide: its effects stay off Serve's frame,
// which lies under every held stream's relay.
//
//go:noinline
func (h *Engine) relayEnded(x *Exchange) bool {
	fx := h.step(x, &event{kind: evRelayEnded, ok: x.ok})
	return fx.redispatch && h.reacquire(x, fx)
}

// acquire takes x's first lease, waiting in the queue (SPEC Q4). It
// reports false when it answered the request itself (no admission) or the
// client left while queued.
func (h *Engine) acquire(x *Exchange) bool {
	w := x.Acc
	queued := h.o.Now()
	lease, err := h.o.Pool.Acquire(x.Ctx, x.poolRequest())
	w.SetLease(lease, h.o.Now().Sub(queued), err)
	if err != nil {
		h.dropBody(x)
		if x.Ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			if shuttingDown(x.Ctx) {
				reply.WriteError(w, x.Endpoint.Surface, shutdownError())
				return false
			}
			w.Leave()
			h.log.Debug("client left while queued", "model", x.Model, "request_id", w.Rec.RequestID) // SPEC Q4, T3: the pool removed the waiter
			return false
		}
		e := PoolError(x.Model, err)
		level := slog.LevelDebug // the client's mistake
		if e.Status >= 429 {
			level = slog.LevelInfo // load or liveness: operators want to see it
		}
		model, logErr := x.Model, err
		if errors.Is(err, pool.ErrUnknownModel) { // O3: a name no group has is the caller's word, not a label (the access line keeps it, cut)
			model, logErr = access.OtherModel, pool.ErrUnknownModel
		}
		h.log.Log(x.Ctx, level, "request not admitted", "model", model, "operation", x.Endpoint.Operation, "status", e.Status,
			"request_id", w.Rec.RequestID, "err", logErr)
		reply.WriteError(w, x.Endpoint.Surface, e)
		return false
	}
	x.lease = lease
	x.att = newAttempt(lease, max(x.AttemptBound, 1), x.Deadline, h.o.RedispatchWait >= 0, h.o.Health != nil)
	return true
}

// dropBody lets go of x's request body and gives its bytes back to the
// in-flight budget; idempotent.
func (h *Engine) dropBody(x *Exchange) {
	if x.Held > 0 {
		if h.o.Bodies != nil {
			h.o.Bodies.Release(x.Held)
		}
		x.Held = 0
	}
	x.Body = nil
}

// start sends the request on x.lease by lease type (SPEC Q3) and returns
// the stream and the sink that relays it; nil when it answered the request
// itself (the operation is not supported, the input is invalid, the node
// could not take it).
func (h *Engine) start(x *Exchange) (dispatch.Stream, sink) {
	l := x.lease
	switch {
	case l.Type == protocol.TypeOpenAICompat:
		return h.tunnel(x)
	case l.Type == protocol.TypeOllama && x.Endpoint.Run != RunNone:
		return h.run(x)
	case l.Type == protocol.TypeOllama:
		return h.tunnel(x) // the node's built-in Ollama profile (/v1/completions)
	}
	reply.WriteError(x.out.W, x.Endpoint.Surface, reply.BadGateway("operation_not_supported", "provider "+l.Provider+" of type "+
		l.Type+" cannot serve "+x.Endpoint.Path))
	return nil, nil
}

// tunnel sends the client's body with only "model" replaced by the lease's
// target (SPEC Q3: one splice, every other byte unchanged); its sink relays
// the provider's response frames.
func (h *Engine) tunnel(x *Exchange) (dispatch.Stream, sink) {
	l := x.lease
	out := x.Body
	if len(x.ModelSpans) != 1 || x.Model != l.Target {
		out = SpliceModel(x.Body, x.ModelSpans, l.Target)
	}
	req := &iop.ProviderTunnelRequest{
		Adapter: l.Provider, Target: l.Target, Method: http.MethodPost, Path: x.Endpoint.Path,
		Headers: forwardHeaders(x.Header), Body: out, Stream: x.Stream,
		Operation: x.Endpoint.Operation, ResponseStallTimeoutMs: l.StallTimeoutMs, RequestId: x.Acc.Rec.RequestID,
		Trace: x.Acc.Trace.BeginAttempt(l, access.PathTunnel),
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

func (h *Engine) startFailed(x *Exchange, err error) {
	msg := "the provider's node could not take the request"
	if errors.Is(err, dispatch.ErrNotReady) {
		msg = "the provider's node is no longer connected"
	}
	h.log.Warn("dispatch failed", "model", x.Model, "node", x.lease.Node, "provider", x.lease.Provider,
		"request_id", x.Acc.Rec.RequestID, "err", err)
	e := reply.BadGateway("provider_unavailable", msg)
	if ev := h.event(x, evStartFailed, x.Body == nil); h.step(x, &ev).stop {
		x.kept = kept{err: e} // nothing was sent: another candidate may take it
		return
	}
	reply.WriteError(x.out.W, x.Endpoint.Surface, e)
}

// responseWait is the Edge's response-wait timeout between two envelopes:
// the lease's stall timeout — the one the request carries to the node,
// resolved once by config.EffectiveStallTimeoutMs (SPEC Q6) — plus the
// grace.
func (h *Engine) responseWait(l *pool.Lease) time.Duration {
	ms := l.StallTimeoutMs
	grace := h.o.ResponseWaitGrace
	if ms > (math.MaxInt64-int64(grace))/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms)*time.Millisecond + grace
}
