package api

import (
	"testing"
	"time"

	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// The attempt machine, one row per decision it makes (SPEC H8, H11, H12,
// Q2, L8, E4, T5): a request on its first lease of two (max_attempts
// 2, a deadline a second after t0, re-dispatch on, stall evidence
// validated) meets the events of the row in order; the row checks the
// effects of the last step and the phase it leaves. No I/O, no clock: time
// is the events' now.
func TestAttemptMachine(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	statuses := []int{502, 503, 504}
	env := func(e *iop.Envelope) event {
		return event{kind: evEnvelope, class: classify(e, statuses, func() time.Time { return t0 }), now: t0}
	}
	runErr := func(code protocol.Code, status int32) *iop.Envelope {
		return &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR,
			FailureCode: code.String(), UpstreamStatus: status, RetryAfterMs: 3000}}}
	}
	runEv := func(ty iop.RunEventType) *iop.Envelope {
		return &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Type: ty}}}
	}
	frame := func(f *iop.ProviderTunnelFrame) *iop.Envelope {
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
	leased := event{kind: evLeased, key: pool.Key{Node: "n2", Provider: "p2"}, now: t0}

	rows := []struct {
		name   string
		setup  func(a *attempt)
		events []event
		phase  attemptPhase
		want   effects
	}{
		{name: "T5 a delta is passive health's success and goes to the client",
			events: []event{env(runEv(iop.RunEventType_RUN_EVENT_DELTA))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictSuccess}, env: envPass}},
		{name: "T5 the verdict is heard once per attempt",
			events: []event{env(runEv(iop.RunEventType_RUN_EVENT_DELTA)), env(runEv(iop.RunEventType_RUN_EVENT_COMPLETE))},
			phase:  phaseRelaying, want: effects{env: envPass}},
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
		{name: "E4 over_capacity is re-dispatched, no verdict",
			events: []event{env(runErr(protocol.CodeOverCapacity, 0))},
			phase:  phaseFailed, want: effects{env: envFail, stop: true, reason: retryOverCapacity}},
		{name: "H11 never after a byte reached the client",
			events: []event{wrote(env(runErr(protocol.CodeUpstreamConnect, 0)))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonConnect}, env: envPass}},
		{name: "H11 never once the client left",
			events: []event{gone(env(runErr(protocol.CodeUpstreamReset, 0)))},
			phase:  phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonReset}, env: envPass}},
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
		{name: "H11 the next attempt's verdict is heard anew and the bound counts it",
			events: []event{env(runErr(protocol.CodeUpstreamConnect, 0)), ended(false), leased,
				env(runErr(protocol.CodeUpstreamConnect, 0))},
			phase: phaseRelaying, want: effects{verdict: verdict{kind: verdictFailure, reason: outlier.ReasonConnect}, env: envPass}},
		{name: "T5 a code no row knows is neither retried nor a verdict",
			events: []event{env(runErr("from_a_newer_node", 0))},
			phase:  phaseRelaying, want: effects{env: envPass}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			a := newAttempt(pool.Key{Node: "n1", Provider: "p1"}, 2, t0.Add(time.Second), true, true)
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
			if fx != row.want {
				t.Errorf("effects\n got %+v\nwant %+v", fx, row.want)
			}
		})
	}
}

// Q2, H11: a re-dispatch excludes every provider tried, in order; a second
// lease counts against max_attempts.
func TestAttemptTried(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	a := newAttempt(pool.Key{Node: "n1", Provider: "p1"}, 3, time.Time{}, true, false)
	a.step(&event{kind: evStartFailed, now: t0})
	a.step(&event{kind: evRelayEnded, now: t0})
	a.step(&event{kind: evLeased, key: pool.Key{Node: "n2", Provider: "p2"}, now: t0})
	if len(a.tried) != 2 || a.tried[1].Provider != "p2" || a.phase != phaseRelaying || a.observed {
		t.Fatalf("after a re-dispatch: %+v", a)
	}
	fx := a.step(&event{kind: evStartFailed, now: t0})
	fx = a.step(&event{kind: evRelayEnded, now: t0})
	if !fx.redispatch || fx.wait != waitRedispatch { // no deadline: RedispatchWait bounds the wait
		t.Fatalf("effects %+v", fx)
	}
	a.step(&event{kind: evLeased, key: pool.Key{Node: "n3", Provider: "p3"}, now: t0})
	if fx = a.step(&event{kind: evStartFailed, now: t0}); fx.stop {
		t.Fatal("H11: a fourth provider with max_attempts 3")
	}
}
