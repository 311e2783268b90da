package exchange

import (
	"time"

	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
)

// The per-request attempt (SPEC H8, H11, H12, Q2, L8) as a pure state
// machine: attempt.step(event) → effects moves the attempt to its next
// state (a transition like pool/core.go's), no I/O, no clock.
// Time arrives in events as readings of Deps.Now. relay.go turns what
// the request meets — each envelope of the stream (classified once by
// classify), a stall's validated evidence, a lost node connection, a
// dispatch that could not start, the end of a relay, the pool's answer to a
// re-dispatch — into events and carries out the effects: the sink's writes,
// passive health (Deps.Outlier), the stall record (Deps.Health), the
// lease's release and the next Acquire.
//
//	relaying ──envelope, a failure before any byte another provider may not share──▶ failed
//	relaying ──tunnel RESPONSE_START with a failing status, before any byte──▶ holding
//	holding  ──its END──▶ failed         holding ──over maxHeldFailure──▶ relaying (flush)
//	relaying|holding ──stall terminal (Health set)──▶ checking ──evidence──▶ failed | back
//	relaying|holding ──node lost, before any byte──▶ failed      start failed ──▶ failed
//	failed ──relay ended──▶ (redispatch) ──leased──▶ relaying    ──no lease──▶ done
//	relaying ──relay ended──▶ done
//
// An envelope is evidence about the provider only when its typed adapter
// and target (RunEvent.adapter/target, ProviderTunnelFrame.adapter/target)
// are the current lease's provider and target (SPEC H8): one that names
// another gives passive health no verdict and a stall no validation, and
// the request goes on as its class says (the lease still goes back exactly
// once). A re-dispatch stays within the credential slot of the route the
// request was bound to (SPEC C6): the pool is asked for that slot only
// (pool.Request.SameSlot) and a lease of another slot is refused.
//
// A failure the request's own input may have caused (verdict.input: a
// reset before the response head, a status other than 429, 502 and 503)
// is heard as a suspicion, not as a failure: passive health ejects on it
// only when another principal's request corroborates it (outlier
// Suspect), and the attempt keeps it until another provider answers the
// same request, which makes it a failure of the provider
// (effects.corroborated: the input was fine).
//
// A failure is kept for re-dispatch (failed) only while re-dispatch is on,
// the attempt bound (models[].max_attempts) is not used up, nothing reached
// the client (the body is still there) and the client is there, and — but
// after a stall — before the request's deadline (its arrival plus
// queue.wait_timeout_ms). An over-capacity refusal (SPEC E4: a node whose
// capacity other edges hold) is no attempt: the node ran nothing, so the
// request goes back to the queue with its provider not excluded, within
// the credential slot of its route (SPEC C6), and the attempt bound untouched, until its deadline or maxRefusals; the pool
// returns that lease as refused (pool.ReleaseRefused), never cooling the
// provider. Passive health hears each attempt's verdict once,
// before anything else is decided, so a failed provider is cooling before
// the pool picks again.

// retryReason is why an attempt failed before the first byte: the label of
// iop_edge_request_retries_total.
type retryReason uint8

const (
	retryConnect          retryReason = iota // the node could not open a connection to the backend (upstream_connect)
	retryReset                               // the backend closed or reset it before the response head (upstream_reset)
	retryStatus                              // the backend answered one of outlier_detection.statuses (502, 503, 504)
	retryRateLimited                         // the backend answered 429
	retryStall                               // response_stalled with a confirmed handoff (SPEC H8, H11)
	retryProviderError                       // the response broke after its head, before any byte reached the client (upstream_error)
	retryOverCapacity                        // the node's capacity gate refused it (SPEC E4)
	retryNodeLost                            // the node could not take it, its connection was lost (dispatch error, fence L8), or its drain cut the work (node_shutdown)
	retryModelUnavailable                    // the node's managed backend could not have the model loaded (SPEC U2, U3)
	nRetryReasons
)

var retryNames = [nRetryReasons]string{"connect", "reset", "status", "rate_limited", "stall", "provider_error",
	"over_capacity", "node_lost", "model_unavailable"}

func (r retryReason) String() string { return retryNames[r] }

// maxRefusals bounds the over-capacity refusals one request may meet
// (SPEC E4): a node refusing over capacity ran nothing, so the request
// goes back to the queue, the same provider included, until its deadline
// — or this many refusals, against a node that refuses everything.
const maxRefusals = 32

// maxHeldFailure bounds the body of a failing tunnel response held back
// for a possible re-dispatch (bytes); a larger one is passed through.
const maxHeldFailure = 64 << 10

type attemptPhase uint8

const (
	phaseRelaying attemptPhase = iota // envelopes go to the sink
	phaseHolding                      // a failing tunnel response is held until its END
	phaseChecking                     // a stall's evidence is with Deps.Health (evStallChecked answers)
	phaseFailed                       // the attempt failed before any byte; relay stops, the request is re-dispatched
	phaseDone                         // the request is answered
)

// attempt is the state of one request across its attempts.
type attempt struct {
	// Fixed for the request.
	bound      int       // providers it may be sent to (models[].max_attempts)
	deadline   time.Time // re-dispatch deadline after a failure; zero = none
	redispatch bool      // re-dispatch is on (Deps.RedispatchWait ≥ 0)
	stalls     bool      // stalls are validated evidence (Deps.Health set)

	// slot: the credential slot of the route the request was bound to
	// (pool.Lease.Slot; SPEC C6); every re-dispatch stays within it.
	slot string

	// tried: the providers the request was sent to, in order, never one
	// twice (pool.Request.Exclude); the last is the current lease's, and
	// target its target (SPEC H8: what an envelope's typed identity must
	// name).
	tried    []pool.Key
	target   string
	phase    attemptPhase
	from     attemptPhase // phaseChecking: the phase it came from
	reason   retryReason  // phaseHolding, phaseFailed: why
	held     int          // phaseHolding: body bytes held
	observed bool         // passive health has the current attempt's verdict
	// recovering: the current attempt follows a stall re-dispatch; its
	// outcome is recorded (SPEC H12).
	recovering bool
	// suspects: the failures of earlier attempts that the input may have
	// caused, until another provider answers the request (corroborated)
	// or the request ends (dropped).
	suspects []suspect
	// refusals: the over-capacity refusals met (SPEC E4); they are no
	// attempt: not in tried, not counted against bound.
	refusals int
}

// suspect is one attempt's failure that the request's input may have
// caused.
type suspect struct {
	key    pool.Key
	reason outlier.Reason
}

type eventKind uint8

const (
	evEnvelope     eventKind = iota // an envelope of the stream arrived (class)
	evStallChecked                  // Deps.Health answered the stall evidence (valid)
	evLost                          // the node connection ended before the terminal: fence (L8), session loss, a drained node
	evStartFailed                   // the request could not be dispatched on the lease
	evRelayEnded                    // the attempt's relay returned (ok: a success outcome was written)
	evLeased                        // a re-dispatch got its next lease (lease)
	evNoLease                       // a re-dispatch got none (no untried candidate, none in time, the client left)
)

// event is one input of the machine.
type event struct {
	kind  eventKind
	class class       // evEnvelope, evStallChecked
	lease *pool.Lease // evLeased: the next lease
	valid bool        // evStallChecked: the evidence was validated against the lease (SPEC H8)
	ok    bool        // evRelayEnded
	// wrote: something reached the client or the body was dropped, so
	// nothing may be resent (SPEC H11); gone: the client's context ended;
	// now: the clock's reading. gone and now are read only for a failure
	// that may be kept (a retryable class, a stall, a lost node, a start
	// that failed); for any other envelope the caller may leave them zero.
	wrote, gone bool
	now         time.Time
}

// envAction is what happens to the envelope of an evEnvelope.
type envAction uint8

const (
	envPass  envAction = iota // the sink handles it
	envHold                   // added to the held failure
	envFail                   // it alone is the attempt's failure (what answers when no other provider does)
	envFlush                  // added to the held failure, and everything held goes to the sink, in order
	envWait                   // kept by the caller until evStallChecked decides
)

// leaseWait is how long a re-dispatch waits for its next lease.
type leaseWait uint8

const (
	waitRedispatch leaseWait = iota // Deps.RedispatchWait (after a stall, or with no deadline)
	waitDeadline                    // until the request's deadline
)

// effects is what the caller must do after a step.
type effects struct {
	verdict verdict // passive health hears the attempt's verdict (verdictOpen: nothing)
	// corroborated: failures of earlier attempts that another provider's
	// answer to the same request shows were the providers' own, not the
	// input's; passive health hears each as a failure, before verdict.
	corroborated []suspect
	checkStall   bool // hand the stall evidence to Deps.Health; step evStallChecked with its answer
	// eligibility is the stall re-dispatch decision to record (SPEC H12),
	// when recordEligibility.
	eligibility       health.Eligibility
	recordEligibility bool
	env               envAction
	// stop: relay stops; the attempt failed before any byte for reason
	// and is kept for re-dispatch.
	stop   bool
	reason retryReason
	// redispatch: release the lease (SPEC Q2: before the next is taken)
	// and ask the pool again, excluding every provider tried, waiting wait.
	redispatch bool
	wait       leaseWait
	// recovery is the outcome of a stall re-dispatch to record (SPEC H12),
	// when recordRecovery.
	recovery       health.RecoveryResult
	recordRecovery bool
	// answer: no other provider takes it; the kept failure answers the
	// request (unless the client is gone).
	answer bool
	// refuse: the re-dispatch's lease (evLeased) is of another credential
	// slot (SPEC C6): release it unused; answer says the kept failure
	// answers.
	refuse bool
}

type verdictKind uint8

const (
	verdictOpen    verdictKind = iota // the envelope says nothing about the provider yet
	verdictSuccess                    // the upstream answered
	verdictFailure                    // the provider failed before the first byte
)

// verdict is one attempt's passive-health verdict (internal/edge/outlier).
type verdict struct {
	kind       verdictKind
	reason     outlier.Reason
	retryAfter time.Duration // a 429's Retry-After; 0 = none
	// input: a failure the request's own input may have caused (a reset
	// before the response head; a status of outlier_detection.statuses
	// other than 502 and 503), heard as a suspicion (Outlier.Suspect).
	input bool
	// accepted: a success whose upstream took the input (2xx, a stream's
	// output), which corroborates the suspects of earlier attempts; an
	// upstream 4xx is a success that does not.
	accepted bool
}

// newAttempt is the state of a request admitted on its first lease.
func newAttempt(first *pool.Lease, bound int, deadline time.Time, redispatch, stalls bool) attempt {
	return attempt{bound: bound, deadline: deadline, redispatch: redispatch, stalls: stalls, tried: []pool.Key{first.Key},
		target: first.Target, slot: first.Slot}
}

// binds reports whether c's typed adapter and target are the current
// lease's provider and target (SPEC H8).
func (a *attempt) binds(c *class) bool {
	return c.adapter == a.tried[len(a.tried)-1].Provider && c.target == a.target
}

// hear sets fx's verdict from c's, once per attempt, when c is evidence
// about the current lease (binds), keeping a suspicion for corroboration
// and corroborating the kept ones with an accepted answer.
func (a *attempt) hear(c *class, fx *effects) {
	if a.observed || c.verdict.kind == verdictOpen || !a.binds(c) {
		return // SPEC H8: an envelope naming another adapter or target is no evidence
	}
	a.observed, fx.verdict = true, c.verdict
	switch v := c.verdict; {
	case v.kind == verdictFailure && v.input:
		a.suspects = append(a.suspects, suspect{key: a.tried[len(a.tried)-1], reason: v.reason})
	case v.kind == verdictSuccess && v.accepted && len(a.suspects) > 0:
		fx.corroborated, a.suspects = a.suspects, nil
	}
}

// mayRetry reports whether a failure may still go to another provider
// (SPEC H11): re-dispatch is on, the attempt bound is not used up, nothing
// was written, the client is there and, unless after a stall, the
// deadline has not passed.
func (a *attempt) mayRetry(e *event, stall bool) bool {
	switch {
	case !a.redispatch, len(a.tried) >= a.bound, e.wrote, e.gone:
		return false
	case !stall && !a.deadline.IsZero() && !e.now.Before(a.deadline):
		return false
	}
	return true
}

// mayRequeue reports whether an over-capacity refusal may go back to the
// queue (SPEC E4): as mayRetry, but the attempt bound does not count (the
// node ran nothing) and maxRefusals does.
func (a *attempt) mayRequeue(e *event) bool {
	switch {
	case !a.redispatch, a.refusals >= maxRefusals, e.wrote, e.gone:
		return false
	case !a.deadline.IsZero() && !e.now.Before(a.deadline):
		return false
	}
	return true
}

// step applies one event and returns what the caller must do: a pure transition, no I/O, time arrives as an event.
func (a *attempt) step(e *event) effects {
	var fx effects
	switch e.kind {
	case evEnvelope:
		c := &e.class
		if a.phase == phaseRelaying && !c.retryable && !c.stall && (a.observed || c.verdict.kind == verdictOpen) {
			return fx // the common case, a stream's next envelope: it goes to the sink (envPass)
		}
		if a.phase != phaseRelaying && a.phase != phaseHolding {
			return fx // nothing is relayed after the attempt failed or the request was answered
		}
		a.hear(c, &fx)
		if c.stall && a.stalls {
			if !a.binds(c) { // SPEC H8: evidence naming another adapter or target is rejected unseen
				a.from, a.phase = a.phase, phaseChecking
				return a.checked(e, false, fx)
			}
			a.from, a.phase = a.phase, phaseChecking // validated and decorated before anything is decided
			fx.checkStall, fx.env = true, envWait
			return fx
		}
		return a.relay(e, fx)
	case evStallChecked:
		if a.phase != phaseChecking {
			return fx
		}
		return a.checked(e, e.valid, fx)
	case evLost, evStartFailed:
		if (a.phase == phaseRelaying || a.phase == phaseHolding) && a.mayRetry(e, false) {
			a.phase, a.reason = phaseFailed, retryNodeLost
			fx.stop, fx.reason = true, retryNodeLost
			return fx
		}
		a.phase = phaseDone
	case evRelayEnded:
		if a.recovering {
			a.recovering, fx.recordRecovery, fx.recovery = false, true, health.RecoveryFailed
			if e.ok {
				fx.recovery = health.RecoveryRecovered
			}
		}
		if a.phase != phaseFailed {
			a.phase, a.suspects = phaseDone, nil // no other provider answered: the suspicions stay unconfirmed
			return fx
		}
		fx.redispatch, fx.reason = true, a.reason
		if a.reason != retryStall && !a.deadline.IsZero() {
			fx.wait = waitDeadline
		}
		if a.reason == retryOverCapacity { // SPEC E4: not an attempt; its provider may take it again
			a.tried = a.tried[:len(a.tried)-1]
			a.refusals++
		}
	case evLeased:
		if a.phase != phaseFailed {
			return fx
		}
		if e.lease.Slot != a.slot { // SPEC C6: never another credential slot after a bound route failed
			if a.reason == retryStall {
				fx.recordRecovery, fx.recovery = true, health.RecoveryNoLease
			}
			a.phase, a.suspects = phaseDone, nil
			fx.refuse, fx.answer = true, !e.gone
			return fx
		}
		a.recovering = a.reason == retryStall
		a.tried = append(a.tried, e.lease.Key)
		a.target = e.lease.Target
		a.phase, a.observed, a.held = phaseRelaying, false, 0
	case evNoLease:
		if a.phase != phaseFailed {
			return fx
		}
		if a.reason == retryStall {
			fx.recordRecovery, fx.recovery = true, health.RecoveryNoLease
		}
		a.phase, a.suspects = phaseDone, nil
		fx.answer = !e.gone
	}
	return fx
}

// checked decides on a stall whose evidence was checked (valid: validated
// against the lease, SPEC H8): re-dispatched when eligible (SPEC H11),
// else relayed to the client; the decision is recorded (SPEC H12).
func (a *attempt) checked(e *event, valid bool, fx effects) effects {
	a.phase = a.from
	fx.recordEligibility = true
	switch {
	case !a.redispatch:
		fx.eligibility = health.IneligibleDisabled
	case !valid:
		fx.eligibility = health.IneligibleEvidence
	case len(a.tried) >= a.bound:
		fx.eligibility = health.IneligibleAttempted
	case e.wrote:
		fx.eligibility = health.IneligibleStarted
	case e.gone:
		fx.eligibility = health.IneligibleClientGone
	default:
		fx.eligibility = health.Eligible
		a.phase, a.reason = phaseFailed, retryStall
		fx.env, fx.stop, fx.reason = envFail, true, retryStall
		return fx
	}
	return a.relay(e, fx)
}

// relay decides what happens to an envelope while relaying or holding.
func (a *attempt) relay(e *event, fx effects) effects {
	c := &e.class
	if a.phase == phaseHolding {
		a.held += c.body
		switch {
		case c.terminal:
			a.phase = phaseFailed
			fx.env, fx.stop, fx.reason = envHold, true, a.reason
		case a.held > maxHeldFailure:
			a.phase, a.held = phaseRelaying, 0
			fx.env = envFlush
		default:
			fx.env = envHold
		}
		return fx
	}
	switch {
	case c.retryable && c.retry == retryOverCapacity:
		if !a.mayRequeue(e) {
			fx.env = envPass
			return fx
		}
		a.phase, a.reason = phaseFailed, c.retry
		fx.env, fx.stop, fx.reason = envFail, true, c.retry
	case c.retryable && c.holdStart && a.mayRetry(e, false):
		a.phase, a.reason, a.held = phaseHolding, c.retry, 0
		fx.env = envHold
	case c.retryable && !c.holdStart && a.mayRetry(e, false):
		a.phase, a.reason = phaseFailed, c.retry
		fx.env, fx.stop, fx.reason = envFail, true, c.retry
	default:
		fx.env = envPass
	}
	return fx
}
