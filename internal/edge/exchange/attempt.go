package exchange

import (
	"errors"
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
//	queued   ──leased──▶ relaying          queued ──no lease──▶ done (the pool's error answers)
//	relaying ──envelope, a failure before any byte another provider may not share──▶ failed
//	relaying ──tunnel RESPONSE_START with a failing status, before any byte──▶ holding
//	holding  ──its END──▶ failed         holding ──over maxHeldFailure──▶ relaying (flush)
//	relaying|holding ──stall terminal (Health set)──▶ checking ──evidence──▶ failed | back
//	relaying|holding ──node lost, before any byte──▶ failed      start failed ──▶ failed
//	failed ──relay ended──▶ (redispatch) ──leased──▶ relaying    ──no lease──▶ done
//	queued|failed ──no live provider left, or all tried (a fallback may take it)──▶ (decide)
//	(decide) ──moved to another group──▶ (acquire there)   ──none, unavailable──▶ (acquire again, waiting)
//	(decide) ──none, all tried──▶ done
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
//
// A fallback after admission (SPEC V1): a request whose group has a
// fallback on unavailable (fallback) asks the pool to say so rather than
// wait while no provider it may use is live (pool.Request.LeaveUnavailable).
// When the pool says that, or that every provider was tried, while the
// request waits for its first lease or for a re-dispatch's, the machine
// asks for the fallback decision (effects.fallback) — only while nothing
// reached the client, the client is there, the attempt bound is not used
// up (attempts in the groups it left count: spent) and, but after a stall,
// before the deadline. Moved (evFallback with moved), the request asks the
// fallback group's pool for any of its providers (tried starts anew, no
// credential slot binds it until its first lease there, SPEC C6) within
// the same bound and deadline; with no group to take it, a request the pool
// found no live provider for waits in its own group as it would have
// without a fallback, and one that tried them all is answered with its
// kept failure.

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
	phaseQueued                       // waiting for its first lease in its group (SPEC Q4, V1)
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
	// spent: the attempts made in the groups a fallback moved the request
	// away from (SPEC V1); they count against bound with tried.
	spent int
	// fallback: a fallback decision may move the request when its group
	// has no live provider left for it (SPEC V1): it asks the pool with
	// pool.Request.LeaveUnavailable.
	fallback bool
	// unbound: no route binds the request's credential slot yet (waiting
	// for its first lease, or moved to another group); the next lease binds
	// it (SPEC C6).
	unbound bool
	// asked: the pool's word that made the machine ask for the fallback
	// decision (effects.fallback), until evFallback answers.
	asked noLease
}

// noLease is why the pool gave no lease, as the machine reads it
// (evNoLease).
type noLease uint8

const (
	noLeaseOther       noLease = iota // the wait ended, the queue is full, the client left, …
	noLeaseTried                      // every provider of the group was tried (pool.ErrAllTried)
	noLeaseUnavailable                // no provider the request may use is live (pool.ErrUnavailable)
)

// noLeaseOf reads an Acquire error.
func noLeaseOf(err error) noLease {
	switch {
	case errors.Is(err, pool.ErrUnavailable):
		return noLeaseUnavailable
	case errors.Is(err, pool.ErrAllTried):
		return noLeaseTried
	}
	return noLeaseOther
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
	evLeased                        // the pool granted the request's next lease (lease): its first, or a re-dispatch's
	evNoLease                       // the pool granted none (why: no untried candidate, no live one, none in time, the client left)
	evFallback                      // the fallback decision after effects.fallback answered (moved; fallback)
)

// event is one input of the machine.
type event struct {
	kind  eventKind
	class class       // evEnvelope, evStallChecked
	lease *pool.Lease // evLeased: the next lease
	valid bool        // evStallChecked: the evidence was validated against the lease (SPEC H8)
	ok    bool        // evRelayEnded
	why   noLease     // evNoLease
	// evFallback: moved — the decision took the request to another group;
	// fallback — that group may move it on (attempt.fallback).
	moved, fallback bool
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
	waitQueue                       // as a first Acquire: the request's context and the pool's queue.wait_timeout_ms
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
	// fallback: decide the fallback from the group the client named, the
	// groups the request left unavailable (SPEC V1), and step evFallback
	// with the answer; after it, redispatch asks the pool again (in the
	// group it moved to, or in its own), waiting wait.
	fallback bool
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

// queuedAttempt is the state of a request admitted to its group, before
// its first lease; fallback: a fallback decision may move it (SPEC V1).
func queuedAttempt(bound int, deadline time.Time, redispatch, stalls, fallback bool) attempt {
	return attempt{bound: bound, deadline: deadline, redispatch: redispatch, stalls: stalls, fallback: fallback,
		phase: phaseQueued, unbound: true}
}

// newAttempt is the state of a request admitted on its first lease.
func newAttempt(first *pool.Lease, bound int, deadline time.Time, redispatch, stalls bool) attempt {
	a := queuedAttempt(bound, deadline, redispatch, stalls, false)
	a.step(&event{kind: evLeased, lease: first})
	return a
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
	case !a.redispatch, a.spent+len(a.tried) >= a.bound, e.wrote, e.gone:
		return false
	case !stall && !a.deadline.IsZero() && !e.now.Before(a.deadline):
		return false
	}
	return true
}

// mayFallBack reports whether a request the pool had no lease for (e) may
// be decided a fallback (SPEC V1): the pool found no provider it may still
// use live, or every one tried; a fallback may move it; nothing was
// written; the client is there; an attempt is left of the bound; and,
// but after a stall, the deadline has not passed.
func (a *attempt) mayFallBack(e *event) bool {
	switch {
	case e.why == noLeaseOther, !a.fallback, e.wrote, e.gone, a.spent+len(a.tried) >= a.bound:
		return false
	case (a.phase == phaseQueued || a.reason != retryStall) && !a.deadline.IsZero() && !e.now.Before(a.deadline):
		return false
	}
	return true
}

// leaseWait is how long the request's next Acquire waits: after a
// failure as a re-dispatch; queued (its first lease, in another group or
// again in its own after a fallback decision) until the deadline.
func (a *attempt) leaseWait() leaseWait {
	switch {
	case a.phase == phaseQueued && a.deadline.IsZero():
		return waitQueue
	case a.phase == phaseQueued, a.reason != retryStall && !a.deadline.IsZero():
		return waitDeadline
	}
	return waitRedispatch
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
		fx.redispatch, fx.reason, fx.wait = true, a.reason, a.leaseWait()
		if a.reason == retryOverCapacity { // SPEC E4: not an attempt; its provider may take it again
			a.tried = a.tried[:len(a.tried)-1]
			a.refusals++
		}
	case evLeased:
		if a.phase != phaseFailed && a.phase != phaseQueued {
			return fx
		}
		if !a.unbound && e.lease.Slot != a.slot { // SPEC C6: never another credential slot after a bound route failed
			if a.reason == retryStall {
				fx.recordRecovery, fx.recovery = true, health.RecoveryNoLease
			}
			a.phase, a.suspects = phaseDone, nil
			fx.refuse, fx.answer = true, !e.gone
			return fx
		}
		a.recovering = a.phase == phaseFailed && a.reason == retryStall
		a.tried = append(a.tried, e.lease.Key)
		a.target, a.slot, a.unbound = e.lease.Target, e.lease.Slot, false
		a.phase, a.observed, a.held = phaseRelaying, false, 0
	case evNoLease:
		if a.phase != phaseFailed && a.phase != phaseQueued {
			return fx
		}
		if a.mayFallBack(e) { // SPEC V1: its group cannot serve it any more; another may
			a.asked, fx.fallback = e.why, true
			return fx
		}
		return a.noLease(e, fx)
	case evFallback:
		if a.asked == noLeaseOther {
			return fx
		}
		why := a.asked
		a.asked = noLeaseOther
		switch {
		case e.moved: // the fallback group's providers, within the same bound and deadline
			a.spent += len(a.tried)
			a.tried, a.target, a.slot, a.unbound, a.fallback = nil, "", "", true, e.fallback
		case why == noLeaseUnavailable: // no group takes it: it waits in its own as without a fallback
			a.fallback = false
		default: // every provider tried and no group takes it: the kept failure answers
			return a.noLease(e, fx)
		}
		fx.redispatch, fx.reason, fx.wait = true, a.reason, a.leaseWait()
	}
	return fx
}

// noLease ends a request the pool had no lease for and no fallback takes:
// the kept failure answers (the pool's error, for one never leased).
func (a *attempt) noLease(e *event, fx effects) effects {
	if a.phase == phaseFailed && a.reason == retryStall {
		fx.recordRecovery, fx.recovery = true, health.RecoveryNoLease
	}
	a.phase, a.suspects = phaseDone, nil
	fx.answer = !e.gone
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
	case a.spent+len(a.tried) >= a.bound:
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
