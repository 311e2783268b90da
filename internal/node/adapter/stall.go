package adapter

import (
	"fmt"
	"strconv"
	"time"

	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// The response-stall watchdog of one attempt (SPEC H1–H7) as a pure state
// machine: watchState.step(event) → (state, effects), no I/O, no clock. Time
// arrives in events as readings of the attempt clock (time since the
// attempt began). The timer wrapper, supervise in attempt.go, turns timers,
// the provider call's return, the attempt context and the probe into
// events and carries out the effects.
//
//	running ──stall timer, idle ≥ stall──▶ fencing(stall)   cancel+fence, grace, probe
//	running ──cancel / deadline─────────▶ fencing(cause)   fence, grace
//	running ──call returned─────────────▶ done              its own terminal
//	fencing(stall): terminal once the probe answered AND (call returned OR grace over)
//	fencing(cancel|deadline): call returned → its own terminal; grace over → the
//	                          cancel/timeout terminal without it
//	terminal sent, call still running ─▶ ended ──call returned──▶ done
//
// done is terminal: every later event is ignored.

type watchPhase uint8

const (
	watchRunning watchPhase = iota // call running, stall timer armed
	watchFencing                   // fenced; waiting for the call (close grace) and, for a stall, the probe
	watchEnded                     // terminal sent; the call still runs and owns the slot (SPEC H7)
	watchDone                      // terminal sent and call returned
)

// fenceCause is what ended an attempt before its call returned.
type fenceCause uint8

const (
	causeNone     fenceCause = iota
	causeStall               // the watchdog (SPEC H1)
	causeCancel              // the caller's ctx: CancelRequest or session loss (SPEC E5, E6)
	causeDeadline            // timeout_sec expired
)

type watchEventKind uint8

const (
	evNone       watchEventKind = iota // nothing (e.g. the attempt context ended by the watchdog's own cancel)
	evStallTimer                       // the stall timer fired
	evReturned                         // the provider call returned
	evCtxDone                          // the caller's ctx or the deadline ended the attempt context
	evGraceOver                        // the close grace ended
	evProbed                           // the health probe answered
)

// watchEvent is one input of the machine.
type watchEvent struct {
	kind   watchEventKind
	now    time.Duration // evStallTimer: attempt clock
	last   time.Duration // evStallTimer: attempt clock at the last activity
	cause  fenceCause    // evCtxDone: causeCancel or causeDeadline
	health string        // evProbed: protocol.HealthAvailable, protocol.HealthUnavailable or protocol.HealthUnknown
}

// terminalKind says which terminal to emit.
type terminalKind uint8

const (
	emitNone  terminalKind = iota
	emitOwn                // the call's own terminal (it returned)
	emitStall              // response_stalled with ExecutionFailure (SPEC H1)
	emitCtx                // the cancel / timeout terminal of a call not returned within the close grace (SPEC H7)
)

// watchEffects is what the wrapper must do after a step, in field order.
type watchEffects struct {
	arm        time.Duration // > 0: (re)arm the stall timer to fire after arm
	fence      bool          // drop every later non-terminal event or frame of the attempt
	cancel     bool          // cancel the attempt context with errStalled
	startGrace bool          // start the close-grace timer
	probe      bool          // start the one exact-target health probe
	emit       terminalKind
	returnSlot bool // with emit: the call returned, so the capacity slot goes back before the terminal; else when it returns (SPEC H7)
	done       bool // the call returned and the terminal is out: the attempt is over
}

// watchState is the watchdog of one attempt.
type watchState struct {
	phase     watchPhase
	cause     fenceCause
	stall     time.Duration // effective stall timeout (SPEC E2), > 0
	idle      time.Duration // idle time when the stall fence fell
	health    string        // probe answer; "" until it came
	returned  bool          // the provider call returned
	inGrace   bool          // … and did so before the close grace ended
	graceOver bool
}

// newWatch starts the watchdog of an attempt with the effective stall
// timeout: the stall timer is armed at once, so a provider that never
// answers (no headers) stalls too.
func newWatch(stall time.Duration) (watchState, watchEffects) {
	return watchState{stall: stall}, watchEffects{arm: stall}
}

// step applies one event: a pure transition, no I/O, time arrives as an
// event.
func (w watchState) step(e watchEvent) (watchState, watchEffects) {
	var fx watchEffects
	switch w.phase {
	case watchRunning:
		switch e.kind {
		case evStallTimer:
			idle := max(e.now-e.last, 0)
			if idle < w.stall {
				fx.arm = w.stall - idle // activity since the timer was armed: re-arm for the rest
				return w, fx
			}
			w.phase, w.cause, w.idle = watchFencing, causeStall, idle
			fx.fence, fx.cancel, fx.startGrace, fx.probe = true, true, true, true
		case evReturned:
			w.phase, w.returned, w.inGrace = watchDone, true, true
			fx.emit, fx.returnSlot, fx.done = emitOwn, true, true
		case evCtxDone:
			if e.cause == causeCancel || e.cause == causeDeadline { // H7: it came first and keeps its own terminal
				w.phase, w.cause = watchFencing, e.cause
				fx.fence, fx.startGrace = true, true
			}
		}
	case watchFencing:
		switch e.kind {
		case evReturned:
			w.returned, w.inGrace = true, !w.graceOver
			if w.cause != causeStall {
				w.phase = watchDone
				fx.emit, fx.returnSlot, fx.done = emitOwn, true, true
				return w, fx
			}
		case evGraceOver:
			w.graceOver = true
			if w.cause != causeStall && !w.returned {
				w.phase = watchEnded
				fx.emit = emitCtx
				return w, fx
			}
		case evProbed:
			if w.cause == causeStall && w.health == "" {
				w.health = normalHealth(e.health)
			}
		}
		// H1: the grace and the probe run side by side; the terminal waits
		// for both, never for one after the other.
		if w.cause == causeStall && w.health != "" && (w.returned || w.graceOver) {
			fx.emit, fx.returnSlot = emitStall, w.returned
			if w.returned {
				w.phase, fx.done = watchDone, true
			} else {
				w.phase = watchEnded
			}
		}
	case watchEnded:
		if e.kind == evReturned {
			w.phase, w.returned = watchDone, true
			fx.done = true // the deferred slot release happens now (SPEC H7)
		}
	}
	return w, fx
}

// normalHealth fails closed: anything but available/unavailable is unknown.
func normalHealth(h string) string {
	switch h {
	case protocol.HealthAvailable, protocol.HealthUnavailable:
		return h
	}
	return protocol.HealthUnknown
}

// stallTerminal is the content of a stall terminal.
type stallTerminal struct {
	msg     string // legacy error string (RunEvent.error, ProviderTunnelFrame.error)
	failure *iop.ExecutionFailure
	meta    map[string]string // allow-listed keys only (SPEC H3)
}

// report builds the stall terminal of a state that emitted emitStall. The
// run id is the Node's run id (Envelope.run_id); the attempt id is that run
// id and "/1" — the Node makes one attempt per run and never retries
// (SPEC H6). health_observation_seq stays 0: the session stamps it (SPEC
// H5). Nothing caller-controlled but adapter and target (already resolved
// and on every event) goes in.
func (w watchState) report(runID, adapter, target string) stallTerminal {
	fence := protocol.FenceUnconfirmed
	if w.inGrace {
		fence = protocol.FenceConfirmed
	}
	health := normalHealth(w.health)
	f := &iop.ExecutionFailure{
		Code:                   protocol.CodeResponseStalled.String(),
		ProviderHealth:         health,
		LivenessClassification: protocol.Liveness(health),
		IdleMs:                 w.idle.Milliseconds(),
		NodeRunId:              runID,
		AttemptId:              runID + "/1",
		Fence:                  fence,
		Adapter:                adapter,
		Target:                 target,
	}
	return stallTerminal{
		msg: fmt.Sprintf("adapter %q: response stalled: no provider activity for %d ms (stall timeout %d ms); provider health %s, fence %s",
			adapter, f.IdleMs, w.stall.Milliseconds(), health, fence),
		failure: f,
		meta: map[string]string{
			protocol.MetaIdleMs:                 strconv.FormatInt(f.IdleMs, 10),
			protocol.MetaRunID:                  f.NodeRunId,
			protocol.MetaAttemptID:              f.AttemptId,
			protocol.MetaFence:                  f.Fence,
			protocol.MetaAdapter:                f.Adapter,
			protocol.MetaTarget:                 f.Target,
			protocol.MetaProviderHealth:         f.ProviderHealth,
			protocol.MetaLivenessClassification: f.LivenessClassification,
		},
	}
}
