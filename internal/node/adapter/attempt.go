package adapter

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// errStalled is the cause of an attempt context cancelled by the stall
// watchdog (SPEC H1).
var errStalled = errors.New("response stalled")

// attempt is the admitted provider call of one run or tunnel and its stall
// watchdog (SPEC H1–H7).
type attempt struct {
	stall    time.Duration // effective response-stall timeout (SPEC E2)
	deadline time.Duration // timeout_sec; 0 = none

	// Set by begin.
	ctx    context.Context // the caller's ctx + timeout_sec + the stall fence
	cancel context.CancelCauseFunc
	start  time.Time
	last   atomic.Int64 // attempt clock (ns) at the last activity; written by the call
}

// begin derives the attempt context from ctx: the hard deadline, whose
// expiry has errRunDeadline as cause, and the watchdog's cancel, whose cause
// is errStalled. The caller must call a.cancel when the attempt is over.
func (a *attempt) begin(ctx context.Context) context.Context {
	a.start = time.Now()
	inner, cancel := context.WithCancelCause(ctx)
	a.ctx, a.cancel = inner, cancel
	if a.deadline > 0 {
		dctx, stop := context.WithTimeoutCause(inner, a.deadline, errRunDeadline)
		a.ctx = dctx
		a.cancel = func(cause error) { cancel(cause); stop() }
	}
	return a.ctx
}

// activity is called when the response headers arrive and after every
// upstream read that returned bytes (SPEC H1). Any bytes count: SSE
// comments and keep-alive lines are activity too, because the watchdog
// observes the transport, not the content — a provider that keeps its
// stream alive is not stalled, and a hard limit on a live but slow stream
// is timeout_sec's job.
func (a *attempt) activity() { a.last.Store(int64(time.Since(a.start))) }

// attemptIO is what supervise needs from one run or tunnel.
type attemptIO struct {
	// call makes the provider call (on supervise's caller's goroutine) and returns
	// the emitter of the terminal the call itself ended with.
	call func() (own func())
	// fenced emits the terminal of a fenced attempt: the stall terminal
	// when st is set, otherwise the cancel or timeout terminal of a call
	// that has not returned within the close grace. returnSlot: give the
	// capacity slot back first (the call has returned); otherwise it stays
	// taken until the call returns (SPEC H7).
	fenced func(st *stallTerminal, returnSlot bool)
	// fence drops every later non-terminal event or frame.
	fence func()
	// probe is the stall's exact-target health probe, with the attempt's
	// own credential (SPEC H1, C3): a keyed models path would answer a
	// probe without it 401, "unavailable".
	probe func(ctx context.Context) string
}

// supervise runs io.call under the attempt's stall watchdog and ends the
// stream with exactly one terminal (SPEC H1, H7). It returns once the
// terminal is out and the call has returned, so the caller's deferred slot
// release and the session's run entry outlive a call that ignores its
// cancel.
//
// The call runs on the caller's goroutine. Until the stall timeout passes
// or the attempt context ends, the watchdog is two timers (time.AfterFunc,
// context.AfterFunc) and no goroutine: a call that returns first emits its
// own terminal right here, with no hand-off (what nearly every request
// does). When one of them fires first, the watchdog loop (watch) takes over
// on a goroutine of the Set's pool and gets the call's return like any
// other event; its timers and probe then act as they did from the start.
// At most two goroutines of its own (the loop and, after a stall, the
// probe); both have ended when it returns.
func (s *Set) supervise(ctx context.Context, a *attempt, runID, adapter, target string, io attemptIO) {
	t := &takeover{s: s, ctx: ctx, a: a, runID: runID, adapter: adapter, target: target, io: io}
	fire := t.fire
	stallT := time.AfterFunc(a.stall, fire)
	stopCtx := context.AfterFunc(a.ctx, fire)
	own := io.call()
	t.mu.Lock()
	r, d := t.returned, t.loopDone
	t.finished = r == nil
	t.mu.Unlock()
	stallT.Stop()
	stopCtx()
	if r == nil {
		own() // emitOwn with the slot back first, as the machine's evReturned in watchRunning
		return
	}
	r <- own
	<-d
}

// takeover is what supervise shares with its two timers: whether the call
// returned before either fired, or else the watchdog loop that took over.
type takeover struct {
	s                      *Set
	ctx                    context.Context
	a                      *attempt
	runID, adapter, target string
	io                     attemptIO
	mu                     sync.Mutex
	finished               bool          // the call returned with nothing fired: its own terminal, in supervise
	returned               chan func()   // set when the watchdog loop took over
	loopDone               chan struct{} // closed when it returned
}

// fire starts the watchdog loop on a goroutine of the Set's pool, once,
// unless the call already returned.
func (t *takeover) fire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished || t.returned != nil {
		return
	}
	t.returned, t.loopDone = make(chan func(), 1), make(chan struct{})
	t.s.calls.Go(func() {
		defer close(t.loopDone)
		t.s.watch(t.ctx, t.a, t.runID, t.adapter, t.target, t.io, t.returned)
	})
}

// watch is the watchdog loop of an attempt whose stall timer fired or
// whose context ended while its call ran (supervise): the pure watchState
// stepped by the stall timer (armed for what is left of the stall
// timeout, at once when it has passed), the call's return on returned, the
// attempt context, the close grace and the probe; it carries out each
// step's effects and returns once the terminal is out and the call has
// returned.
func (s *Set) watch(ctx context.Context, a *attempt, runID, adapter, target string, io attemptIO, returned <-chan func()) {
	w, _ := newWatch(a.stall)
	var fx watchEffects
	stallT := time.NewTimer(max(a.stall-time.Since(a.start), 0))
	defer stallT.Stop()
	var graceT *time.Timer
	var graceC <-chan time.Time
	defer func() {
		if graceT != nil {
			graceT.Stop()
		}
	}()
	var probed chan string
	runDone := a.ctx.Done()
	var own func()
	for {
		var ev watchEvent
		select {
		case <-stallT.C:
			ev = watchEvent{kind: evStallTimer, now: time.Since(a.start), last: time.Duration(a.last.Load())}
			if runDone != nil && a.ctx.Err() != nil { // a cancel or deadline of the same instant wins (SPEC H7)
				runDone, ev = nil, a.ctxEvent(ctx)
			}
		case own = <-returned:
			ev.kind = evReturned
		case <-runDone:
			runDone, ev = nil, a.ctxEvent(ctx)
		case <-graceC:
			ev.kind = evGraceOver
		case h := <-probed:
			ev = watchEvent{kind: evProbed, health: h}
		}
		w, fx = w.step(ev)
		if fx.arm > 0 {
			stallT.Reset(fx.arm)
		}
		if fx.fence {
			io.fence()
		}
		if fx.cancel {
			a.cancel(errStalled)
		}
		if fx.startGrace {
			graceT = time.NewTimer(s.grace)
			graceC = graceT.C
		}
		if fx.probe {
			probed = make(chan string, 1)
			go func() { probed <- io.probe(ctx) }() // bounded by ProbeTimeout; awaited before the terminal
		}
		switch fx.emit {
		case emitOwn:
			own()
		case emitStall:
			st := w.report(runID, adapter, target)
			s.observeStall(ctx, runID, adapter, st.failure) // O2: the final evidence is observed first …
			io.fenced(&st, fx.returnSlot)                   // … and the terminal goes out whatever the observer did
		case emitCtx:
			io.fenced(nil, fx.returnSlot)
		}
		if fx.done {
			return
		}
	}
}

// ctxEvent names why the attempt context ended: the caller's ctx, the
// deadline, or (evNone) the watchdog's own cancel.
func (a *attempt) ctxEvent(ctx context.Context) watchEvent {
	switch {
	case ctx.Err() != nil:
		return watchEvent{kind: evCtxDone, cause: causeCancel}
	case errors.Is(context.Cause(a.ctx), errRunDeadline):
		return watchEvent{kind: evCtxDone, cause: causeDeadline}
	}
	return watchEvent{}
}

// pendingErr is the error of a fenced call that has not returned within
// the close grace: the attempt context's cause, said so.
func (a *attempt) pendingErr() error {
	return &pendingError{cause: context.Cause(a.ctx)}
}

type pendingError struct{ cause error }

func (e *pendingError) Error() string {
	return e.cause.Error() + " (the provider call has not returned within the close grace)"
}

func (e *pendingError) Unwrap() error { return e.cause }

// stallEvent is the RunEvent of a stall terminal.
func stallEvent(st *stallTerminal) *iop.RunEvent {
	return &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: st.msg, FailureCode: protocol.CodeResponseStalled.String(),
		Failure: st.failure, Metadata: st.meta}
}

// stallFrame is the ProviderTunnelFrame of a stall terminal.
func stallFrame(st *stallTerminal) *iop.ProviderTunnelFrame {
	return &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, Error: st.msg, FailureCode: protocol.CodeResponseStalled.String(),
		Failure: st.failure, Metadata: st.meta}
}

// Bounds of the stall observation (SPEC O2).
const (
	// ObserveBudget is the longest a stall terminal waits for the node's
	// logger to take the stall's log line: a logger that has not returned
	// by then (a blocked writer) is left to finish on its own and the
	// terminal goes out.
	ObserveBudget = 100 * time.Millisecond
	// maxStuckObservations bounds the stall log lines a Set leaves to
	// loggers that have not returned; while that many are stuck, a stall's
	// line is dropped without waiting.
	maxStuckObservations = 4
)

// observeStall writes the "response stalled" log line of f, the final
// evidence of a stall on run runID of adapter (SPEC O2), before the
// terminal is built and sent. The line is a local observation (SPEC O1):
// it changes nothing on the wire. A failing logger never holds the
// terminal back: a panic in its handler is recovered (the line is lost),
// an error is ignored (as slog does), and one that blocks is waited for at
// most ObserveBudget and then left running on its own goroutine (at most
// maxStuckObservations per Set; past that, lines are dropped unwritten).
func (s *Set) observeStall(ctx context.Context, runID, adapter string, f *iop.ExecutionFailure) {
	r := slog.NewRecord(time.Now(), slog.LevelWarn, "response stalled", 0)
	r.AddAttrs(slog.String("adapter", adapter), slog.String("run_id", runID), slog.String("request_id", upstream.RequestID(ctx)),
		slog.Int64("idle_ms", f.GetIdleMs()), slog.String("provider_health", f.GetProviderHealth()), slog.String("fence", f.GetFence()))
	select {
	case s.observing <- struct{}{}:
	default:
		return // earlier lines are still stuck in the logger
	}
	h := s.log.Handler()
	done := make(chan struct{})
	go func() {
		defer func() {
			_ = recover() // the logger's failure is not the run's: the line is lost, the terminal is not
			<-s.observing
			close(done)
		}()
		if lctx := context.Background(); h.Enabled(lctx, r.Level) {
			_ = h.Handle(lctx, r)
		}
	}()
	budget := time.NewTimer(ObserveBudget)
	defer budget.Stop()
	select {
	case <-done:
	case <-budget.C:
	}
}
