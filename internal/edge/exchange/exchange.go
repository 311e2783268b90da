package exchange

import (
	"context"
	"net/http"
	"time"

	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
	"iop/internal/edge/routing"
	apisurface "iop/internal/edge/surface"
	"iop/internal/jsonscan"
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
	// Fallbacks are the model groups' fallbacks (models[].fallbacks, SPEC
	// V1), nil when no group has one; InScope reports whether the key's
	// model scope admits a group (nil: every group, SPEC V2). fallback.go
	// decides with them on arrival.
	Fallbacks map[string]routing.FallbackGroup
	InScope   func(group string) bool

	// requested is the group the client named when a fallback moved the
	// request to Model (fallback.go), else ""; responseModel the model its
	// run-path response names (the requested name unless rename_model);
	// left the groups it was admitted to and could no longer be served by
	// (SPEC V1), in order.
	requested, responseModel string
	left                     []string
	// arrival is the request's place in the queue once the pool gave it
	// one (SPEC G5: a lease's, or an UnavailableError's), asked with again.
	arrival uint64

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
// that route's slot and waits for a route of it. A request moved to
// another group after admission (SPEC V1) starts there unbound, with
// nothing tried; one a fallback may move asks the pool to say when no
// provider it may use is live rather than wait (LeaveUnavailable).
func (x *Exchange) poolRequest() pool.Request {
	r := pool.Request{Model: x.Model, Operation: x.Endpoint.Operation, PromptTokens: pool.EstimatePromptTokens(len(x.Body)),
		Prefix: x.Prefix, Exclude: x.att.tried, SameSlot: x.lease != nil && !x.att.unbound, Slot: x.att.slot,
		MaxTokens: int(min(x.MaxTokens, 1<<30)), Arrival: x.arrival, LeaveUnavailable: x.att.fallback} // G5: a request asking again keeps its place
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

// RunKind is the run-path surface of an endpoint: which package converts
// its requests and encodes its responses.
type RunKind uint8

const (
	RunNone        RunKind = iota // tunnel only
	RunChat                       // surface/openai Chat
	RunMessages                   // surface/anthropic Messages
	RunCountTokens                // surface/anthropic Count
	RunResponses                  // surface/responses Encoder
	RunEmbeddings                 // surface/openai Embeddings
)
