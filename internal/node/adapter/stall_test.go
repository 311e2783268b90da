package adapter

import (
	"iop/internal/protocol"
	"maps"
	"slices"
	"testing"
	"time"
)

// Table tests of the pure stall watchdog (SPEC H1): every row is a sequence
// of events, each with the exact effects it must produce.

const testStall = 10 * time.Second

func timerAt(now, last time.Duration) watchEvent {
	return watchEvent{kind: evStallTimer, now: now, last: last}
}

var (
	evRet   = watchEvent{kind: evReturned}
	evGrace = watchEvent{kind: evGraceOver}
	evSelf  = watchEvent{kind: evNone} // the attempt context ended by the watchdog's own cancel
)

func probed(h string) watchEvent      { return watchEvent{kind: evProbed, health: h} }
func ctxDone(c fenceCause) watchEvent { return watchEvent{kind: evCtxDone, cause: c} }

var (
	fxStall     = watchEffects{fence: true, cancel: true, startGrace: true, probe: true}
	fxNothing   = watchEffects{}
	fxOwn       = watchEffects{emit: emitOwn, returnSlot: true, done: true}
	fxStallOK   = watchEffects{emit: emitStall, returnSlot: true, done: true} // call returned: slot back first
	fxStallHeld = watchEffects{emit: emitStall}                               // call still running: slot kept (H7)
	fxDone      = watchEffects{done: true}
)

func TestWatchMachine(t *testing.T) {
	type step struct {
		ev   watchEvent
		want watchEffects
	}
	cases := []struct {
		name   string
		steps  []step
		phase  watchPhase
		fence  string // of the stall report; "" = no stall terminal
		health string
		idle   time.Duration
	}{
		{"H1 no activity at all (no headers, or headers then nothing) stalls at the timeout",
			[]step{{timerAt(testStall, 0), fxStall}}, watchFencing, "", "", testStall},
		{"H1 activity since arming re-arms for the rest of the timeout",
			[]step{{timerAt(testStall, 4*time.Second), watchEffects{arm: 4 * time.Second}},
				{timerAt(testStall+3*time.Second, 4*time.Second), watchEffects{arm: time.Second}},
				{timerAt(14*time.Second, 4*time.Second), fxStall}}, watchFencing, "", "", testStall},
		{"H1 activity at the very instant re-arms for the full timeout",
			[]step{{timerAt(testStall, testStall), watchEffects{arm: testStall}}}, watchRunning, "", "", 0},
		{"H1 a late timer measures the real idle time",
			[]step{{timerAt(25*time.Second, 2*time.Second), fxStall}}, watchFencing, "", "", 23 * time.Second},
		{"H1 confirmed: the call returns in the grace, then the probe answers",
			[]step{{timerAt(testStall, 0), fxStall}, {evRet, fxNothing}, {probed(protocol.HealthAvailable), fxStallOK}},
			watchDone, protocol.FenceConfirmed, protocol.HealthAvailable, testStall},
		{"H1 the probe answers first, then the call returns in the grace",
			[]step{{timerAt(testStall, 0), fxStall}, {probed(protocol.HealthUnavailable), fxNothing}, {evRet, fxStallOK}},
			watchDone, protocol.FenceConfirmed, protocol.HealthUnavailable, testStall},
		{"H1 H7 grace over before the call returns: terminal with fence unconfirmed, slot kept until the return",
			[]step{{timerAt(testStall, 0), fxStall}, {probed(protocol.HealthAvailable), fxNothing}, {evGrace, fxStallHeld}, {evRet, fxDone}},
			watchDone, protocol.FenceUnconfirmed, protocol.HealthAvailable, testStall},
		{"H1 grace and probe side by side: a probe slower than the grace ends it, not grace+probe",
			[]step{{timerAt(testStall, 0), fxStall}, {evGrace, fxNothing}, {probed(protocol.HealthUnknown), fxStallHeld}, {evRet, fxDone}},
			watchDone, protocol.FenceUnconfirmed, protocol.HealthUnknown, testStall},
		{"H7 the call returns after the grace but before the probe: unconfirmed, slot already free",
			[]step{{timerAt(testStall, 0), fxStall}, {evGrace, fxNothing}, {evRet, fxNothing}, {probed(protocol.HealthAvailable), fxStallOK}},
			watchDone, protocol.FenceUnconfirmed, protocol.HealthAvailable, testStall},
		{"H2 a probe answer outside the three values fails closed to unknown",
			[]step{{timerAt(testStall, 0), fxStall}, {evRet, fxNothing}, {probed("healthy"), fxStallOK}},
			watchDone, protocol.FenceConfirmed, protocol.HealthUnknown, testStall},
		{"H6 an unavailable probe does not turn a confirmed fence, nor an available one an unconfirmed fence",
			[]step{{timerAt(testStall, 0), fxStall}, {evGrace, fxNothing}, {probed(protocol.HealthAvailable), fxStallHeld},
				{probed(protocol.HealthUnavailable), fxNothing}, {timerAt(30*time.Second, 29*time.Second), fxNothing}, {evRet, fxDone}},
			watchDone, protocol.FenceUnconfirmed, protocol.HealthAvailable, testStall},
		{"H6 activity after the fence does not reset it; no re-arm, no retry",
			[]step{{timerAt(testStall, 0), fxStall}, {timerAt(12*time.Second, 11*time.Second), fxNothing},
				{evRet, fxNothing}, {probed(protocol.HealthAvailable), fxStallOK}},
			watchDone, protocol.FenceConfirmed, protocol.HealthAvailable, testStall},
		{"H7 the call returns first: its own terminal",
			[]step{{evRet, fxOwn}, {timerAt(testStall, 0), fxNothing}, {evGrace, fxNothing}}, watchDone, "", "", 0},
		{"H7 cancel first keeps its own terminal; the stall timer is ignored",
			[]step{{ctxDone(causeCancel), watchEffects{fence: true, startGrace: true}}, {timerAt(testStall, 0), fxNothing}, {evRet, fxOwn}},
			watchDone, "", "", 0},
		{"H7 deadline first keeps its own terminal",
			[]step{{timerAt(testStall/2, 0), watchEffects{arm: testStall / 2}}, {ctxDone(causeDeadline), watchEffects{fence: true, startGrace: true}}, {evRet, fxOwn}},
			watchDone, "", "", 0},
		{"H7 deadline first and the call stuck past the grace: the timeout terminal, slot kept until the return",
			[]step{{ctxDone(causeDeadline), watchEffects{fence: true, startGrace: true}}, {evGrace, watchEffects{emit: emitCtx}},
				{timerAt(testStall, 0), fxNothing}, {evRet, fxDone}},
			watchDone, "", "", 0},
		{"H7 cancel after the stall fence changes nothing",
			[]step{{timerAt(testStall, 0), fxStall}, {ctxDone(causeCancel), fxNothing}, {evSelf, fxNothing}, {probed(protocol.HealthAvailable), fxNothing}, {evRet, fxStallOK}},
			watchDone, protocol.FenceConfirmed, protocol.HealthAvailable, testStall},
		{"H1 the watchdog's own cancel is no event",
			[]step{{evSelf, fxNothing}, {evRet, fxOwn}}, watchDone, "", "", 0},
		{"E3 done is terminal: nothing after it has an effect",
			[]step{{timerAt(testStall, 0), fxStall}, {evRet, fxNothing}, {probed(protocol.HealthAvailable), fxStallOK},
				{evGrace, fxNothing}, {evRet, fxNothing}, {ctxDone(causeCancel), fxNothing}, {timerAt(time.Hour, 0), fxNothing}},
			watchDone, protocol.FenceConfirmed, protocol.HealthAvailable, testStall},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, fx := newWatch(testStall)
			if fx != (watchEffects{arm: testStall}) {
				t.Fatalf("E2: newWatch effects %+v, want the stall timer armed for %v", fx, testStall)
			}
			stalls := 0
			for i, st := range tc.steps {
				w, fx = w.step(st.ev)
				if fx != st.want {
					t.Fatalf("step %d (%+v): got effects %+v, want %+v", i, st.ev, fx, st.want)
				}
				if fx.emit == emitStall {
					stalls++
				}
			}
			if w.phase != tc.phase {
				t.Fatalf("got phase %d, want %d", w.phase, tc.phase)
			}
			if w.idle != tc.idle {
				t.Fatalf("got idle %v, want %v", w.idle, tc.idle)
			}
			if tc.fence == "" {
				if stalls != 0 {
					t.Fatalf("H7: %d stall terminals, want none", stalls)
				}
				return
			}
			if stalls != 1 {
				t.Fatalf("H1: %d stall terminals, want exactly one", stalls)
			}
			f := w.report("r1", "llama", "tiny").failure
			if f.GetFence() != tc.fence || f.GetProviderHealth() != tc.health {
				t.Fatalf("got fence %q health %q, want %q %q", f.GetFence(), f.GetProviderHealth(), tc.fence, tc.health)
			}
		})
	}
}

// H2, H3: the stall report: the paired health evidence, Node-owned ids,
// and metadata of exactly the allow-listed keys (health_observation_seq is
// the session's; never recovery_eligible, never caller data).
func TestStallReport(t *testing.T) {
	cases := []struct {
		name, health, liveness string
		returned               bool
		fence                  string
	}{
		{"H2 available is request_stalled", protocol.HealthAvailable, protocol.LivenessRequestStalled, true, protocol.FenceConfirmed},
		{"H2 unavailable is provider_unhealthy", protocol.HealthUnavailable, protocol.LivenessProviderUnhealthy, true, protocol.FenceConfirmed},
		{"H2 unknown is health_unknown, H7 unconfirmed", protocol.HealthUnknown, protocol.LivenessHealthUnknown, false, protocol.FenceUnconfirmed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := newWatch(testStall)
			w, _ = w.step(timerAt(testStall+1500*time.Millisecond, 0))
			if tc.returned {
				w, _ = w.step(evRet)
			} else {
				w, _ = w.step(evGrace)
			}
			w, _ = w.step(probed(tc.health))
			st := w.report("run-7", "llama", "tiny")
			f := st.failure
			if f.GetCode() != protocol.CodeResponseStalled.String() || f.GetProviderHealth() != tc.health || f.GetLivenessClassification() != tc.liveness ||
				f.GetIdleMs() != 11500 || f.GetNodeRunId() != "run-7" || f.GetAttemptId() != "run-7/1" || f.GetFence() != tc.fence ||
				f.GetAdapter() != "llama" || f.GetTarget() != "tiny" {
				t.Fatalf("H2: got failure %v", f)
			}
			if f.GetHealthObservationSeq() != 0 || f.GetProviderId() != "" || f.GetRecoveryHandoff() != "" {
				t.Fatalf("H5, H8: the node set seq %d, provider_id %q, recovery_handoff %q; those belong to the session and the Edge",
					f.GetHealthObservationSeq(), f.GetProviderId(), f.GetRecoveryHandoff())
			}
			want := map[string]string{
				protocol.MetaIdleMs: "11500", protocol.MetaRunID: "run-7", protocol.MetaAttemptID: "run-7/1", protocol.MetaFence: tc.fence,
				protocol.MetaAdapter: "llama", protocol.MetaTarget: "tiny", protocol.MetaProviderHealth: tc.health, protocol.MetaLivenessClassification: tc.liveness,
			}
			if !maps.Equal(st.meta, want) {
				t.Fatalf("H3: metadata keys %v, want exactly %v", slices.Sorted(maps.Keys(st.meta)), slices.Sorted(maps.Keys(want)))
			}
			if st.msg == "" {
				t.Fatal("H4: stall terminal without a legacy error string")
			}
		})
	}
}
