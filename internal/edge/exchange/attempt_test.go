package exchange

import (
	"reflect"
	"testing"
	"time"

	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// The attempt machine, one row per decision it makes (SPEC H8, H11, H12,
// Q2, L8, E4, T5, V1): a request on its first lease of two (max_attempts
// 2, a deadline a second after t0, re-dispatch on, stall evidence
// validated) meets the events of the row in order; the row checks the
// effects of the last step and the phase it leaves. No I/O, no clock: time
// is the events' now.
func TestAttemptMachine(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	statuses := []int{502, 503, 504}
	// Envelopes name the first lease's provider p1 and target t1 (SPEC
	// H8: typed identity), unless as says otherwise.
	as := func(provider, target string, e *iop.Envelope) *iop.Envelope {
		e = proto.Clone(e).(*iop.Envelope)
		if ev := e.GetRunEvent(); ev != nil {
			ev.Adapter, ev.Target = provider, target
		} else if f := e.GetTunnelFrame(); f != nil {
			f.Adapter, f.Target = provider, target
		}
		return e
	}
	env := func(e *iop.Envelope) event {
		return event{kind: evEnvelope, class: classify(e, statuses, func() time.Time { return t0 }), now: t0}
	}
	runErr := func(code protocol.Code, status int32) *iop.Envelope {
		return as("p1", "t1", &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR,
			FailureCode: code.String(), UpstreamStatus: status, RetryAfterMs: 3000}}})
	}
	runEv := func(ty iop.RunEventType) *iop.Envelope {
		return as("p1", "t1", &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Type: ty}}})
	}
	frame := func(f *iop.ProviderTunnelFrame) *iop.Envelope {
		if f.Kind != iop.TunnelFrameKind_TUNNEL_FRAME_BODY {
			f.Adapter, f.Target = "p1", "t1"
		}
		return &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: f}}
	}
	start := func(status int32, hdr ...*iop.Header) *iop.Envelope {
		return frame(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, Status: status, Headers: hdr})
	}
	body := func(n int) *iop.Envelope {
		return frame(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: make([]byte, n)})
	}
	end := frame(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END})
	stall := runErr(protocol.CodeResponseStalled, 0)
	checked := func(valid bool) event {
		return event{kind: evStallChecked, class: classify(stall, statuses, func() time.Time { return t0 }), valid: valid, now: t0}
	}
	wrote := func(e event) event { e.wrote = true; return e }
	gone := func(e event) event { e.gone = true; return e }
	late := func(e event) event { e.now = t0.Add(2 * time.Second); return e }
	ended := func(ok bool) event { return event{kind: evRelayEnded, ok: ok, now: t0} }
	leased := event{kind: evLeased, lease: &pool.Lease{Key: pool.Key{Node: "n2", Provider: "p2"}, Target: "t2", Slot: "slot-a"}, now: t0}
	otherSlot := event{kind: evLeased, lease: &pool.Lease{Key: pool.Key{Node: "n3", Provider: "p3"}, Target: "t1", Slot: "slot-b"}, now: t0}
	accepted := verdict{kind: verdictSuccess, accepted: true}
	// p2's answer on the next lease.
	p2 := func(e *iop.Envelope) *iop.Envelope { return as("p2", "t2", e) }
	// Fallbacks after admission (SPEC V1): the pool's word (noLeaseEv),
	// the decision's answer (fellBack), a request a fallback may move
	// (mayFall) and one still waiting for its first lease (queued).
	noLeaseEv := func(why noLease) event { return event{kind: evNoLease, why: why, now: t0} }
	fellBack := func(moved, fallback bool) event {
		return event{kind: evFallback, moved: moved, fallback: fallback, now: t0}
	}
	mayFall := func(a *attempt) { a.fallback = true }
	queued := func(a *attempt) { *a = queuedAttempt(2, t0.Add(time.Second), true, true, true) }
	smallLease := event{kind: evLeased, lease: &pool.Lease{Key: pool.Key{Node: "n4", Provider: "p4"}, Target: "t4", Slot: "slot-b", Model: "small"}, now: t0}
	p4 := func(e *iop.Envelope) *iop.Envelope { return as("p4", "t4", e) }

	rows := []struct {
		name   string
		setup  func(a *attempt)
		events []event
		phase  attemptPhase
		want   effects
	}{
		{name: "T5 a delta is passive health's success and goes to the client",
			events: []event{env(runEv(iop.RunEventType_RUN_EVENT_DELTA))},
			phase:  phaseRelaying, want: effects{verdict: accepted, env: envPass}},
		{name: "T5 the verdict is heard once per attempt",
			events: []event{env(runEv(iop.RunEventType_RUN_EVENT_DELTA)), env(runEv(iop.RunEventType_RUN_EVENT_COMPLETE))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "H8 a failure naming another adapter is no verdict, and the request still fails over",
			events: []event{env(as("other", "t1", runErr(protocol.CodeUpstreamConnect, 0)))},
			phase:  phaseFailed, want: effects{env: envFail, stop: true, reason: retryConnect}},
		{name: "H8 a failure naming another target is no verdict",
			events: []event{env(as("p1", "other", runErr(protocol.CodeUpstreamConnect, 0)))},
			phase:  phaseFailed, want: effects{env: envFail, stop: true, reason: retryConnect}},
		{name: "H8 a terminal without typed identity is no verdict",
			events: []event{env(as("", "", runErr(protocol.CodeUpstreamStatus, 503)))},
			phase:  phaseFailed, want: effects{env: envFail, stop: true, reason: retryStatus}},
		{name: "H8 a tunnel head naming another adapter is no verdict",
			events: []event{env(as("other", "t1", start(503)))},
			phase:  phaseHolding, want: effects{env: envHold}},
		{name: "H8 a delta naming another adapter is no success either",
			events: []event{env(as("other", "t1", runEv(iop.RunEventType_RUN_EVENT_DELTA)))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "H8 a stall naming another adapter is rejected without the Health check and answered",
			events: []event{env(as("other", "t1", stall))},
			phase:  phaseRelaying, want: effects{recordEligibility: true, eligibility: health.IneligibleEvidence, env: envPass}},
		{name: "H11 upstream_connect before any byte is kept for re-dispatch and ejects",
			events: []event{env(runErr(protocol.CodeUpstreamConnect, 0))},
			phase:  phaseFailed, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonConnect},
				env: envFail, stop: true, reason: retryConnect}},
		{name: "H11 a 429 on the run path keeps its Retry-After for passive health",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 429))},
			phase:  phaseFailed, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonRateLimited, retryAfter: 3 * time.Second},
				env: envFail, stop: true, reason: retryRateLimited}},
		{name: "T5 an upstream 400 is the client's: passed on, a success for passive health",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 400))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictSuccess}, env: envPass}},
		{name: "H11 a 504 may be the input's: a suspicion, kept for re-dispatch",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 504))},
			phase:  phaseFailed, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonStatus, retryAfter: 3 * time.Second, input: true},
				env: envFail, stop: true, reason: retryStatus}},
		{name: "H11 a 503 is the upstream's own state: a failure",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503))},
			phase:  phaseFailed, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonStatus, retryAfter: 3 * time.Second},
				env: envFail, stop: true, reason: retryStatus}},
		{name: "H11 a reset before the head may be the input's: a suspicion",
			events: []event{env(runErr(protocol.CodeUpstreamReset, 0))},
			phase:  phaseFailed, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonReset, input: true},
				env: envFail, stop: true, reason: retryReset}},
		{name: "H11 another provider's answer to the same request corroborates the suspicion",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 504)), ended(false), leased,
				env(p2(runEv(iop.RunEventType_RUN_EVENT_DELTA)))},
			phase: phaseRelaying, want: effects{verdict: accepted, env: envPass,
				corroborated: []suspect{{key: pool.Key{Node: "n1", Provider: "p1"}, reason: outlier.ReasonStatus}}}},
		{name: "H11 another provider's 400 to the same request corroborates nothing",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 504)), ended(false), leased,
				env(p2(runErr(protocol.CodeUpstreamStatus, 400)))},
			phase: phaseRelaying, want: effects{verdict: verdict{kind: verdictSuccess}, env: envPass}},
		{name: "H11 a suspicion of a request no other provider answered is dropped",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 504)), ended(false), {kind: evNoLease, now: t0}},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "E4 over_capacity is re-dispatched, no verdict",
			events: []event{env(runErr(protocol.CodeOverCapacity, 0))},
			phase:  phaseFailed, want: effects{env: envFail, stop: true, reason: retryOverCapacity}},
		{name: "E4 over_capacity is no attempt: requeued with max_attempts used up", setup: func(a *attempt) { a.bound = 1 },
			events: []event{env(runErr(protocol.CodeOverCapacity, 0)), ended(false)},
			phase:  phaseFailed, want: effects{redispatch: true, reason: retryOverCapacity, wait: waitDeadline}},
		{name: "E4 over_capacity past maxRefusals is answered", setup: func(a *attempt) { a.refusals = maxRefusals },
			events: []event{env(runErr(protocol.CodeOverCapacity, 0))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "E4 over_capacity past the deadline is answered",
			events: []event{late(env(runErr(protocol.CodeOverCapacity, 0)))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "U3 model_unavailable goes to another provider, no verdict",
			events: []event{env(runErr(protocol.CodeModelUnavailable, 0))},
			phase:  phaseFailed, want: effects{env: envFail, stop: true, reason: retryModelUnavailable}},
		{name: "U3 model_unavailable is an attempt: answered with max_attempts used up, never requeued to the same provider",
			setup:  func(a *attempt) { a.bound = 1 },
			events: []event{env(runErr(protocol.CodeModelUnavailable, 0))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "H11 never after a byte reached the client",
			events: []event{wrote(env(runErr(protocol.CodeUpstreamConnect, 0)))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonConnect}, env: envPass}},
		{name: "H11 never once the client left",
			events: []event{gone(env(runErr(protocol.CodeUpstreamReset, 0)))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonReset, input: true}, env: envPass}},
		{name: "H11 never past the deadline",
			events: []event{late(env(runErr(protocol.CodeUpstreamError, 0)))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "H11 never beyond max_attempts", setup: func(a *attempt) { a.bound = 1 },
			events: []event{env(runErr(protocol.CodeUpstreamError, 0))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "H11 never with re-dispatch off", setup: func(a *attempt) { a.redispatch = false },
			events: []event{env(runErr(protocol.CodeUpstreamError, 0))},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "T5 a failing tunnel status is held with its Retry-After until END",
			events: []event{env(start(503, &iop.Header{Name: "Retry-After", Value: "7"}))},
			phase:  phaseHolding, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonStatus, retryAfter: 7 * time.Second},
				env: envHold}},
		{name: "H11 the held tunnel failure ends at END and is re-dispatched",
			events: []event{env(start(503)), env(body(10)), env(end)},
			phase:  phaseFailed, want: effects{env: envHold, stop: true, reason: retryStatus}},
		{name: "T2 a held failure over maxHeldFailure is flushed to the client",
			events: []event{env(start(503)), env(body(maxHeldFailure + 1))},
			phase:  phaseRelaying, want: effects{env: envFlush}},
		{name: "H8 a stall's evidence is checked before anything is decided",
			events: []event{env(stall)},
			phase:  phaseChecking, want: effects{checkStall: true, env: envWait}},
		{name: "H8 H11 a validated stall before any byte is re-dispatched",
			events: []event{env(stall), checked(true)},
			phase:  phaseFailed, want: effects{recordEligibility: true, eligibility: health.Eligible, env: envFail, stop: true, reason: retryStall}},
		{name: "H8 unvalidated stall evidence is answered, never re-dispatched",
			events: []event{env(stall), checked(false)},
			phase:  phaseRelaying, want: effects{recordEligibility: true, eligibility: health.IneligibleEvidence, env: envPass}},
		{name: "H11 a stall after a byte is answered",
			events: []event{env(stall), wrote(checked(true))},
			phase:  phaseRelaying, want: effects{recordEligibility: true, eligibility: health.IneligibleStarted, env: envPass}},
		{name: "H11 a stall is re-dispatched after the deadline too",
			events: []event{env(stall), late(checked(true))},
			phase:  phaseFailed, want: effects{recordEligibility: true, eligibility: health.Eligible, env: envFail, stop: true, reason: retryStall}},
		{name: "H12 a stall with the attempt bound used up is ineligible", setup: func(a *attempt) { a.bound = 1 },
			events: []event{env(stall), checked(true)},
			phase:  phaseRelaying, want: effects{recordEligibility: true, eligibility: health.IneligibleAttempted, env: envPass}},
		{name: "H1 without Options.Health a stall is the client's 504", setup: func(a *attempt) { a.stalls = false },
			events: []event{env(stall)},
			phase:  phaseRelaying, want: effects{env: envPass}},
		{name: "L8 a fenced lease before any byte is re-dispatched as node_lost",
			events: []event{{kind: evLost, now: t0}},
			phase:  phaseFailed, want: effects{stop: true, reason: retryNodeLost}},
		{name: "L8 a fenced lease after a byte is answered",
			events: []event{{kind: evLost, wrote: true, now: t0}},
			phase:  phaseDone, want: effects{}},
		{name: "Q2 a dispatch that could not start goes to another candidate",
			events: []event{{kind: evStartFailed, now: t0}},
			phase:  phaseFailed, want: effects{stop: true, reason: retryNodeLost}},
		{name: "Q2 a kept failure is re-dispatched within the deadline when relay ends",
			events: []event{env(runErr(protocol.CodeUpstreamReset, 0)), ended(false)},
			phase:  phaseFailed, want: effects{redispatch: true, reason: retryReset, wait: waitDeadline}},
		{name: "H11 a stall's re-dispatch waits RedispatchWait",
			events: []event{env(stall), checked(true), ended(false)},
			phase:  phaseFailed, want: effects{redispatch: true, reason: retryStall, wait: waitRedispatch}},
		{name: "H12 the attempt after a stall re-dispatch is recorded recovered",
			events: []event{env(stall), checked(true), ended(false), leased, ended(true)},
			phase:  phaseDone, want: effects{recordRecovery: true, recovery: health.RecoveryRecovered}},
		{name: "H12 a stall re-dispatch that got no lease is recorded",
			events: []event{env(stall), checked(true), ended(false), {kind: evNoLease, now: t0}},
			phase:  phaseDone, want: effects{recordRecovery: true, recovery: health.RecoveryNoLease, answer: true}},
		{name: "H11 no candidate left: the kept failure answers",
			events: []event{env(runErr(protocol.CodeUpstreamError, 0)), ended(false), {kind: evNoLease, now: t0}},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "H8 the next attempt's envelopes naming the first lease are no verdict",
			events: []event{env(runErr(protocol.CodeUpstreamConnect, 0)), ended(false), leased,
				env(runErr(protocol.CodeUpstreamConnect, 0))},
			phase: phaseRelaying, want: effects{env: envPass}},
		{name: "H8 H11 the next attempt's verdict is heard anew, by its own lease's identity, and the bound counts it",
			events: []event{env(runErr(protocol.CodeUpstreamConnect, 0)), ended(false), leased,
				env(p2(runErr(protocol.CodeUpstreamConnect, 0)))},
			phase: phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonConnect}, env: envPass}},
		{name: "C6 a re-dispatch lease of another credential slot is refused and the kept failure answers",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), otherSlot},
			phase:  phaseDone, want: effects{refuse: true, answer: true}},
		{name: "C6 H12 a stall re-dispatch refused for another slot is recorded as no lease",
			events: []event{env(stall), checked(true), ended(false), otherSlot},
			phase:  phaseDone, want: effects{refuse: true, answer: true, recordRecovery: true, recovery: health.RecoveryNoLease}},
		{name: "V1 queued: the first lease binds the request's route", setup: queued,
			events: []event{smallLease},
			phase:  phaseRelaying, want: effects{}},
		{name: "V1 queued, the pool finds no live provider: the fallback is decided", setup: queued,
			events: []event{noLeaseEv(noLeaseUnavailable)},
			phase:  phaseQueued, want: effects{fallback: true}},
		{name: "V1 queued without a fallback: the pool's error answers",
			setup:  func(a *attempt) { queued(a); a.fallback = false },
			events: []event{noLeaseEv(noLeaseUnavailable)},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "V1 queued, a wait timeout is no fallback", setup: queued,
			events: []event{noLeaseEv(noLeaseOther)},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "V1 moved while queued: the new group is asked until the deadline", setup: queued,
			events: []event{noLeaseEv(noLeaseUnavailable), fellBack(true, false)},
			phase:  phaseQueued, want: effects{redispatch: true, wait: waitDeadline}},
		{name: "V1 no group takes a queued request: it waits in its own as without a fallback", setup: queued,
			events: []event{noLeaseEv(noLeaseUnavailable), fellBack(false, false), noLeaseEv(noLeaseUnavailable)},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "V1 queued, past the deadline: no fallback", setup: queued,
			events: []event{late(noLeaseEv(noLeaseUnavailable))},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "V1 H11 every provider failed it before any byte: the fallback is decided", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseTried)},
			phase:  phaseFailed, want: effects{fallback: true}},
		{name: "V1 H11 the untried providers are down: the fallback is decided", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseUnavailable)},
			phase:  phaseFailed, want: effects{fallback: true}},
		{name: "V1 L8 the node lost before any byte, nothing left: the fallback is decided", setup: mayFall,
			events: []event{{kind: evLost, now: t0}, ended(false), noLeaseEv(noLeaseTried)},
			phase:  phaseFailed, want: effects{fallback: true}},
		{name: "V1 moved after a failure: the fallback group is asked within the deadline", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseTried), fellBack(true, false)},
			phase:  phaseFailed, want: effects{redispatch: true, reason: retryStatus, wait: waitDeadline}},
		{name: "V1 C6 moved: the fallback group's lease binds its own credential slot", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseTried), fellBack(true, false), smallLease},
			phase:  phaseRelaying, want: effects{}},
		{name: "V1 H11 the attempts in the group left count: none is left for another failure", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseTried), fellBack(true, false), smallLease,
				env(p4(runErr(protocol.CodeUpstreamStatus, 503)))},
			phase: phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonStatus, retryAfter: 3 * time.Second}, env: envPass}},
		{name: "V1 every provider tried and no group takes it: the kept failure answers", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseTried), fellBack(false, false)},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "V1 the untried providers are down and no group takes it: it waits for them, leaving no more", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseUnavailable), fellBack(false, false)},
			phase:  phaseFailed, want: effects{redispatch: true, reason: retryStatus, wait: waitDeadline}},
		{name: "V1 never without a fallback that may move it",
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), noLeaseEv(noLeaseTried)},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "V1 never past the deadline", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), late(noLeaseEv(noLeaseTried))},
			phase:  phaseDone, want: effects{answer: true}},
		{name: "V1 never once the client left", setup: mayFall,
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503)), ended(false), gone(noLeaseEv(noLeaseTried))},
			phase:  phaseDone, want: effects{}},
		{name: "V1 never with the attempt bound used up: the failure goes to the client", setup: func(a *attempt) { a.fallback, a.bound = true, 1 },
			events: []event{env(runErr(protocol.CodeUpstreamStatus, 503))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonStatus, retryAfter: 3 * time.Second}, env: envPass}},
		{name: "V1 H11 never after a byte reached the client", setup: mayFall,
			events: []event{wrote(env(runErr(protocol.CodeUpstreamStatus, 503)))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonStatus, retryAfter: 3 * time.Second}, env: envPass}},
		{name: "V1 H12 after a stall past the deadline: falls back within RedispatchWait", setup: mayFall,
			events: []event{env(stall), late(checked(true)), ended(false), late(noLeaseEv(noLeaseTried)), fellBack(true, false)},
			phase:  phaseFailed, want: effects{redispatch: true, reason: retryStall, wait: waitRedispatch}},
		{name: "V1 H12 a stall re-dispatch no group takes is recorded as no lease", setup: mayFall,
			events: []event{env(stall), checked(true), ended(false), noLeaseEv(noLeaseTried), fellBack(false, false)},
			phase:  phaseDone, want: effects{recordRecovery: true, recovery: health.RecoveryNoLease, answer: true}},
		{name: "V1 an answer from the decision nobody asked for changes nothing",
			events: []event{fellBack(true, true)},
			phase:  phaseRelaying, want: effects{}},
		{name: "T5 a code no row knows is neither retried nor a verdict",
			events: []event{env(runErr("from_a_newer_node", 0))},
			phase:  phaseRelaying, want: effects{env: envPass}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			a := newAttempt(&pool.Lease{Key: pool.Key{Node: "n1", Provider: "p1"}, Target: "t1", Slot: "slot-a"}, 2, t0.Add(time.Second), true, true)
			if row.setup != nil {
				row.setup(&a)
			}
			var fx effects
			for _, e := range row.events {
				fx = a.step(&e)
			}
			if a.phase != row.phase {
				t.Errorf("phase %d, want %d", a.phase, row.phase)
			}
			if !reflect.DeepEqual(fx, row.want) {
				t.Errorf("effects\n got %+v\nwant %+v", fx, row.want)
			}
		})
	}
}

// Q2, H11: a re-dispatch excludes every provider tried, in order; a second
// lease counts against max_attempts.
func TestAttemptTried(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	a := newAttempt(&pool.Lease{Key: pool.Key{Node: "n1", Provider: "p1"}}, 3, time.Time{}, true, false)
	a.step(&event{kind: evStartFailed, now: t0})
	a.step(&event{kind: evRelayEnded, now: t0})
	a.step(&event{kind: evLeased, lease: &pool.Lease{Key: pool.Key{Node: "n2", Provider: "p2"}}, now: t0})
	if len(a.tried) != 2 || a.tried[1].Provider != "p2" || a.phase != phaseRelaying || a.observed {
		t.Fatalf("after a re-dispatch: %+v", a)
	}
	fx := a.step(&event{kind: evStartFailed, now: t0})
	fx = a.step(&event{kind: evRelayEnded, now: t0})
	if !fx.redispatch || fx.wait != waitRedispatch { // no deadline: RedispatchWait bounds the wait
		t.Fatalf("effects %+v", fx)
	}
	a.step(&event{kind: evLeased, lease: &pool.Lease{Key: pool.Key{Node: "n3", Provider: "p3"}}, now: t0})
	if fx = a.step(&event{kind: evStartFailed, now: t0}); fx.stop {
		t.Fatal("H11: a fourth provider with max_attempts 3")
	}
}

// E4: a refusal over capacity leaves tried as it was before the refused
// lease: the same provider may take the request again.
func TestAttemptRefusalNotTried(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	p1 := pool.Key{Node: "n1", Provider: "p1"}
	a := newAttempt(&pool.Lease{Key: p1}, 1, t0.Add(time.Second), true, false)
	refusal := &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR,
		FailureCode: protocol.CodeOverCapacity.String()}}}
	for i := range 3 {
		a.step(&event{kind: evEnvelope, class: classify(refusal, nil, func() time.Time { return t0 }), now: t0})
		if fx := a.step(&event{kind: evRelayEnded, now: t0}); !fx.redispatch || len(a.tried) != 0 || a.refusals != i+1 {
			t.Fatalf("refusal %d: effects %+v, tried %v, refusals %d", i, fx, a.tried, a.refusals)
		}
		a.step(&event{kind: evLeased, lease: &pool.Lease{Key: p1}, now: t0})
		if len(a.tried) != 1 || a.tried[0] != p1 {
			t.Fatalf("refusal %d: tried %v after the next lease", i, a.tried)
		}
	}
}

// V1, H11, C6: a request moved to another group after its attempts failed
// asks there for any provider (nothing excluded, no slot bound) and the
// attempts it spent still count against the bound.
func TestAttemptFallbackTried(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	a := newAttempt(&pool.Lease{Key: pool.Key{Node: "n1", Provider: "p1"}, Slot: "big"}, 3, time.Time{}, true, false)
	a.fallback = true
	a.step(&event{kind: evStartFailed, now: t0})
	a.step(&event{kind: evRelayEnded, now: t0})
	if fx := a.step(&event{kind: evNoLease, why: noLeaseTried, now: t0}); !fx.fallback {
		t.Fatalf("all tried: effects %+v, want the fallback decided", fx)
	}
	a.step(&event{kind: evFallback, moved: true, fallback: true, now: t0})
	if len(a.tried) != 0 || a.spent != 1 || !a.unbound || !a.fallback {
		t.Fatalf("moved: %+v", a)
	}
	a.step(&event{kind: evLeased, lease: &pool.Lease{Key: pool.Key{Node: "n1", Provider: "p1"}, Slot: "small"}, now: t0})
	if len(a.tried) != 1 || a.slot != "small" || a.unbound || a.phase != phaseRelaying {
		t.Fatalf("leased in the fallback group (the same provider key, another target): %+v", a)
	}
}
