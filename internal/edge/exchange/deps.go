package exchange

import (
	"context"
	"log/slog"
	"time"

	"iop/internal/edge/creds"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
	"iop/internal/edge/routing"
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
	ReleaseRefused(l *pool.Lease, share int) bool
}

// groupStates is a Pool that tells a model group's state for a request
// without changing anything (SPEC V1; *pool.Pool): what a fallback
// decision reads. A Pool without it takes no fallback.
type groupStates interface {
	GroupState(r pool.Request) routing.GroupState
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
