package exchange

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/creds"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
	iop "iop/proto/gen/iop"
)

// Pool is the provider pool as an exchange uses it; *pool.Pool satisfies
// it. Acquire admits a request and returns its lease (SPEC Q2–Q4, Q6, Q7);
// Release returns it exactly once.
type Pool interface {
	Acquire(ctx context.Context, r pool.Request) (*pool.Lease, error)
	Release(l *pool.Lease) bool
}

// refusedReleaser is a Pool that learns from a node's over-capacity
// refusal (SPEC E4; *pool.Pool): the lease goes back and the provider
// admits less for a while. A Pool without it gets Release.
type refusedReleaser interface {
	ReleaseRefused(l *pool.Lease, fairShare int) bool
}

// Health is the Edge's provider-health owner as an exchange uses it (SPEC
// H8, H11, H12); *health.Tracker satisfies it.
//
// ObserveStall takes the ExecutionFailure of a response_stalled terminal
// (nil when the node sent none) of a stream on lease l, validates it
// against l (the transport identity and the lease binding, never the
// payload's) and, when valid, adds provider_id, the validated
// provider_health and recovery_handoff="confirmed" to it; it reports
// whether it did. It never returns l. RecoveryEligibility and
// RecoveryOutcome record the exchange's re-dispatch decision and its
// outcome (second is nil when no second lease came).
type Health interface {
	ObserveStall(l *pool.Lease, f *iop.ExecutionFailure) bool
	RecoveryEligibility(l *pool.Lease, model string, e health.Eligibility)
	RecoveryOutcome(first, second *pool.Lease, model string, r health.RecoveryResult)
}

// Outlier is passive health as an exchange feeds it; *outlier.Detector
// satisfies it. Failure: provider k failed a request before the first
// byte in a way that is the provider's (retryAfter: a 429's Retry-After,
// 0 = none); Suspect: it failed in a way the request's own input may have
// caused, for principal ("" in open mode), which counts only when
// corroborated (outlier.Machine.Suspect); Success: it answered.
type Outlier interface {
	Failure(k pool.Key, r outlier.Reason, retryAfter time.Duration)
	Suspect(k pool.Key, r outlier.Reason, principal string)
	Success(k pool.Key)
}

// Credentials issues the credential lease of one dispatched request (SPEC
// C2); *creds.Plane satisfies it. It returns nil, nil, nil while the
// credential plane is off.
type Credentials interface {
	Lease(r creds.Request) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error)
}

// Budget is the bytes of request bodies in flight
// (http.max_inflight_body_bytes; *limit.Budget satisfies it): an
// exchange gives its body's bytes back once the body can no longer be
// resent.
type Budget interface {
	Release(n int64)
}

// Deps is what an Engine needs from the rest of the Edge, every part an
// interface or a function. Pool and Dispatcher are required; the others
// may be left nil (zero durations: none).
type Deps struct {
	Pool       Pool
	Dispatcher dispatch.Dispatcher
	// Health, when set, takes every response_stalled terminal before the
	// response is decided (SPEC H8) and the re-dispatch decisions (H11,
	// H12). Without it no stall is re-dispatched.
	Health Health
	// Outlier, when set, hears every attempt's verdict (passive health,
	// attempt.go).
	Outlier Outlier
	// Credentials, when set, issues each dispatched request's credential
	// lease (SPEC C2).
	Credentials Credentials
	// Tracer takes a sampled request's node spans (reply.Trace).
	Tracer reply.Tracer
	// Now is the clock of every decision a request makes over its
	// attempts (its re-dispatch deadline, a Retry-After date, the queue
	// wait it records) and of the run path's "created"; NewID returns a
	// fresh random token for response and tool-call ids.
	Now   func() time.Time
	NewID func() string
	// Logger gets one line per failed request; keys and bodies are never
	// logged (SPEC P4).
	Logger *slog.Logger
	// OnUsage, when set, observes token usage reported by a run's COMPLETE
	// or a tunnel's USAGE frames (observation only, SPEC T2).
	OnUsage func(principal, model string, u *iop.Usage)
	// RedispatchWait bounds the wait for the next lease after a stall
	// (SPEC H11); a negative value turns every re-dispatch off.
	RedispatchWait time.Duration
	// ResponseWaitGrace is added to a lease's stall timeout to make the
	// response-wait timeout between two envelopes.
	ResponseWaitGrace time.Duration
	// CancelDrainTimeout bounds how long the lease of a cancelled stream
	// waits for the node's terminal before it is released anyway.
	CancelDrainTimeout time.Duration
	// Bodies takes back a request body's bytes (Exchange.Held).
	Bodies Budget
	// Detach counts one goroutine that keeps a cancelled stream's lease
	// until the node confirms (handOff); done is called once it released
	// the lease. nil counts nothing.
	Detach func() (done func())
	// OpenMode reports whether the Edge runs without API keys: only then
	// are an upstream's rate-limit headers relayed (SPEC K6).
	OpenMode func() bool
}

// Engine serves admitted requests (Serve), one Exchange each, and keeps
// what they share: the run path's encoding buffers and the re-dispatch
// counters. Safe for concurrent use.
type Engine struct {
	o       Deps
	log     *slog.Logger
	bufs    sync.Pool // *[]byte: encoding buffers of run-path responses (runSink)
	retries [nRetryReasons]atomic.Uint64
}

// New returns the Engine for d.
func New(d Deps) *Engine {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Detach == nil {
		d.Detach = func() func() { return func() {} }
	}
	if d.OpenMode == nil {
		d.OpenMode = func() bool { return true }
	}
	return &Engine{o: d, log: d.Logger}
}

// RetrySamples is iop_edge_request_retries_total{reason}: requests sent to
// another provider after a failure before the first byte, every reason
// present.
func (h *Engine) RetrySamples() map[string]float64 {
	out := make(map[string]float64, nRetryReasons)
	for r := range nRetryReasons {
		out[`reason="`+r.String()+`"`] = float64(h.retries[r].Load())
	}
	return out
}

// Errors an exchange uses as context causes; test with errors.Is.
var (
	// ErrFenced: the lease's node generation was fenced mid-request (SPEC L8).
	ErrFenced = errors.New("api: provider lease fenced")
	// ErrResponseWait: no frame or event arrived within the response-wait
	// timeout (the lease's stall timeout plus Deps.ResponseWaitGrace).
	ErrResponseWait = errors.New("api: response wait timeout")
	// ErrShutdown is the cause of a request context the drain timeout
	// ended: the node work is cancelled and the client gets a 503, or an
	// error event in its surface's shape when bytes were already sent.
	ErrShutdown = errors.New("api: edge shutting down")
)

// DrainRetryAfter is the Retry-After of a request refused or ended while
// the Edge drains.
const DrainRetryAfter = 5 * time.Second

// shuttingDown reports whether ctx was ended with ErrShutdown.
func shuttingDown(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrShutdown)
}

func shutdownError() *reply.Error {
	return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: access.CodeShutdown,
		RetryAfter: DrainRetryAfter, Message: "the edge shut down before the response was complete"}
}

// Schedule is a request's place in the queue (SPEC G1, G4), decided once
// at admission and asked with on every Acquire: its key, the key's weight,
// its priority class and whether it may reach a remote adapter.
type Schedule struct {
	Key      string
	Weight   int
	Priority pool.Priority
	// LocalOnly: the key never reaches a remote adapter (SPEC V3).
	LocalOnly bool
}

// apply copies s into the pool request r.
func (s *Schedule) apply(r *pool.Request) {
	r.Key, r.Weight, r.Priority, r.LocalOnly = s.Key, s.Weight, s.Priority, s.LocalOnly
}

// PoolError maps an Acquire error to the client-visible one (SPEC Q4):
// unknown model 404, no candidate for the operation 400, queue full (the
// group's or the key's share, G3) 429 with Retry-After, wait timeout 503
// naming the model and the reason.
func PoolError(model string, err error) *reply.Error {
	var qf *pool.QueueFullError
	var wt *pool.WaitTimeoutError
	var nc *pool.NoCandidateError
	if e := keyShareError(model, err); e != nil { // G3
		return e
	}
	switch {
	case errors.Is(err, pool.ErrUnknownModel):
		return &reply.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("the model %q does not exist", reply.Truncate(model, access.MaxModelLen))}
	case errors.As(err, &qf):
		ra := qf.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		return &reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", RetryAfter: ra,
			Message: fmt.Sprintf("model %q: too many requests waiting; retry later", model)}
	case errors.Is(err, pool.ErrQueueFull):
		return &reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", RetryAfter: time.Second,
			Message: fmt.Sprintf("model %q: too many requests waiting; retry later", model)}
	case errors.As(err, &wt):
		return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_provider_available",
			Message: fmt.Sprintf("model %q: no live provider within %s: %s", wt.Model, wt.Waited, wt.Reason)}
	case errors.Is(err, pool.ErrWaitTimeout):
		return &reply.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_provider_available",
			Message: fmt.Sprintf("model %q: no live provider in time", model)}
	case errors.As(err, &nc):
		return &reply.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "operation_not_supported", Param: "model",
			Message: nc.Error()}
	case errors.Is(err, pool.ErrNoCandidate):
		return &reply.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "operation_not_supported", Param: "model",
			Message: fmt.Sprintf("model %q has no provider for this endpoint", model)}
	default:
		return &reply.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "internal error while selecting a provider"}
	}
}

// keyShareError is the 429 of a request refused for its key's share of
// the queue (SPEC G3), nil for any other error.
func keyShareError(model string, err error) *reply.Error {
	var ks *pool.KeyShareError
	if !errors.As(err, &ks) {
		return nil
	}
	ra := ks.RetryAfter
	if ra <= 0 {
		ra = time.Second
	}
	return &reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", RetryAfter: ra,
		Message: fmt.Sprintf("model %q: this key's share of the queue is full (%d of its requests wait while other keys wait too); retry later",
			model, ks.Waiting)}
}

// The exchange's bounds, for the tests that meet them from outside.
const (
	// MaxRefusals: over-capacity refusals (SPEC E4) a request is re-queued
	// after before it is answered 503 over_capacity.
	MaxRefusals = maxRefusals
	// MaxRunText: the assistant text a run may stream, in bytes (run.go).
	MaxRunText = maxRunText
	// MaxHeldBody: the plain tunnel body held until END, in bytes (tunnel.go).
	MaxHeldBody = maxHeldBody
)
