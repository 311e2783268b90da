package adapter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"iop/internal/node/adapter/upstream"
	iop "iop/proto/gen/iop"
)

// Run executes one normalized run (SPEC E1–E9) and calls emit for each
// RunEvent in order: START (seq 1), DELTA* (assistant text as read), then
// exactly one terminal — COMPLETE (content, finish_reason, usage, metadata
// "openai_tool_calls" / "openai_text_tool_fallback"), ERROR (error and
// failure_code; upstream_status for a non-2xx answer) or CANCELLED — with seq
// strictly increasing and adapter/target set on every event. It returns after
// the terminal was emitted. Every event is a fresh value that emit may keep;
// emit is called only from the calling goroutine and never after Run
// returns; it may block briefly.
//
// Boundary checks before any provider call, each an ERROR terminal: unknown
// adapter (unknown_adapter, SPEC E1), response_stall_timeout_ms negative or
// too large, negative timeout_sec, empty target or missing input
// (invalid_request, SPEC E2), credential lease rules (SPEC C4), then the
// capacity gate (over_capacity, SPEC E4). Cancelling ctx (CancelRequest, SPEC
// E5, or session loss, E6) aborts the upstream request and ends the run with
// CANCELLED; timeout_sec > 0 ends it with ERROR "timeout".
func (s *Set) Run(ctx context.Context, runID string, req *iop.RunRequest, emit func(*iop.RunEvent)) {
	rs := &runStream{emit: emit, adapter: req.GetAdapter(), target: req.GetTarget()}
	rs.send(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_START})
	inst, err := s.lookup(req.GetAdapter(), TypeOllama)
	if err != nil {
		rs.fail(CodeUnknownAdapter, err.Error(), 0)
		return
	}
	rs.adapter = inst.name
	a, code, err := s.admit(inst, req.GetResponseStallTimeoutMs(), req.GetTimeoutSec(), req.GetCredentialLease() != nil, req.GetCredentialBinding() != nil)
	if err == nil && req.GetTarget() == "" {
		code, err = CodeInvalidRequest, errors.New("run request without target")
	}
	if err == nil && req.GetInput() == nil {
		code, err = CodeInvalidRequest, errors.New("run request without input")
	}
	if err != nil {
		rs.fail(code, err.Error(), 0)
		return
	}
	if !inst.gate.tryAcquire() {
		rs.fail(CodeOverCapacity, fmt.Sprintf("adapter %q is at its capacity of %d concurrent requests", inst.name, inst.gate.limit), 0)
		return
	}
	release := sync.OnceFunc(inst.gate.release)
	rs.beforeTerminal = release
	defer release()

	runCtx, cancel := a.context(ctx)
	defer cancel()
	hooks := upstream.Hooks{
		OnDelta:    func(text string) { rs.send(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: text}) },
		OnActivity: a.activity,
	}
	res, err := s.callRunner(runCtx, inst, req, hooks, runID)
	switch {
	case err == nil:
		rs.send(&iop.RunEvent{
			Type:         iop.RunEventType_RUN_EVENT_COMPLETE,
			Content:      res.Content,
			FinishReason: res.FinishReason,
			Usage:        res.Usage,
			Metadata:     res.Metadata,
		})
	case ctx.Err() != nil:
		rs.send(&iop.RunEvent{
			Type:        iop.RunEventType_RUN_EVENT_CANCELLED,
			Error:       fmt.Sprintf("run cancelled: %v", context.Cause(ctx)),
			FailureCode: CodeCancelled,
		})
	default:
		code, status := classify(runCtx, err)
		s.log.Debug("adapter run failed", "adapter", inst.name, "run_id", runID, "failure_code", code, "upstream_status", status)
		rs.fail(code, fmt.Sprintf("adapter %q: %v", inst.name, err), status)
	}
}

// callRunner calls the instance's runner, turning a panic into an error so
// that a driver bug still ends the run with one terminal.
func (s *Set) callRunner(ctx context.Context, inst *instance, req *iop.RunRequest, h upstream.Hooks, runID string) (res upstream.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("adapter run panicked", "adapter", inst.name, "run_id", runID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: internal error", errPanic)
		}
	}()
	return inst.runner.Run(ctx, req.GetTarget(), req.GetInput(), h)
}

// classify maps a failed attempt to a failure code and, for a non-2xx
// answer, the upstream status.
func classify(runCtx context.Context, err error) (string, int32) {
	var se *upstream.StatusError
	switch {
	case runCtx.Err() != nil && errors.Is(context.Cause(runCtx), errRunDeadline):
		return CodeTimeout, 0
	case errors.As(err, &se):
		return CodeUpstreamStatus, int32(se.Status)
	case errors.Is(err, upstream.ErrInvalidInput):
		return CodeInvalidRequest, 0
	case errors.Is(err, upstream.ErrUnsupported):
		return CodeUnsupportedOperation, 0
	case errors.Is(err, errPanic):
		return CodeInternal, 0
	}
	return CodeUpstreamError, 0
}

// attempt is the admitted provider call of one run or tunnel. The stall
// watchdog (SPEC H1, a later change) hooks in here: it arms a timer of
// stall, re-armed by activity, and cancels the attempt's context when it
// fires.
type attempt struct {
	stall    time.Duration // effective response-stall timeout (SPEC E2)
	deadline time.Duration // timeout_sec; 0 = none
}

// activity is called after every upstream read that returned bytes.
func (a *attempt) activity() {}

// context derives the attempt's context: ctx plus the hard deadline, whose
// expiry has errRunDeadline as cause.
func (a *attempt) context(ctx context.Context) (context.Context, context.CancelFunc) {
	if a.deadline > 0 {
		return context.WithTimeoutCause(ctx, a.deadline, errRunDeadline)
	}
	return context.WithCancel(ctx)
}

// admit applies the boundary checks shared by runs and tunnels: stall
// timeout (request, then instance, then Set default; SPEC E2), timeout_sec,
// and the credential lease rules (SPEC C4).
func (s *Set) admit(inst *instance, stallMs, timeoutSec int64, hasLease, hasBinding bool) (*attempt, string, error) {
	def, err := StallTimeout(inst.stallMs, s.stallDef)
	if err != nil {
		return nil, CodeInvalidRequest, err
	}
	stall, err := StallTimeout(stallMs, def)
	if err != nil {
		return nil, CodeInvalidRequest, err
	}
	if timeoutSec < 0 || timeoutSec > math.MaxInt64/int64(time.Second) {
		return nil, CodeInvalidRequest, fmt.Errorf("timeout_sec %d is negative or too large", timeoutSec)
	}
	if code, err := s.checkCredentials(hasLease, hasBinding); err != nil {
		return nil, code, err
	}
	return &attempt{stall: stall, deadline: time.Duration(timeoutSec) * time.Second}, "", nil
}

// checkCredentials applies SPEC C4. Lease and binding travel together. With
// the credential plane on, a request without them is rejected; opening a
// lease (SPEC C3) is not in this build yet, so a request with them is
// rejected too, never served with another credential. With the plane off, a
// request carrying a lease is rejected as a configuration mismatch.
func (s *Set) checkCredentials(hasLease, hasBinding bool) (string, error) {
	switch {
	case hasLease != hasBinding:
		return CodeCredentialInvalid, errors.New("credential lease and binding must travel together (SPEC C4)")
	case s.creds && !hasLease:
		return CodeCredentialRequired, errors.New("the credential plane is on and the request carries no credential lease (SPEC C4)")
	case s.creds:
		// TODO(SPEC C3): open and verify the lease after capacity admission.
		return CodeCredentialInvalid, errors.New("credential lease verification is not available in this node build (SPEC C3)")
	case hasLease:
		return CodeCredentialInvalid, errors.New("the credential plane is off but the request carries a credential lease (SPEC C4)")
	}
	return "", nil
}

// runStream numbers and emits the events of one run.
type runStream struct {
	emit            func(*iop.RunEvent)
	seq             uint64
	adapter, target string
	// beforeTerminal, when set, runs once just before the terminal event is
	// emitted: it returns the capacity slot, so that the Edge, which
	// releases its lease on the terminal and may dispatch the next waiter
	// at once, never finds the slot still taken (SPEC E4, Q2).
	beforeTerminal func()
}

func (r *runStream) send(ev *iop.RunEvent) {
	switch ev.Type {
	case iop.RunEventType_RUN_EVENT_COMPLETE, iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
		if r.beforeTerminal != nil {
			r.beforeTerminal()
		}
	}
	r.seq++
	ev.Seq = r.seq
	ev.Adapter = r.adapter
	ev.Target = r.target
	r.emit(ev)
}

func (r *runStream) fail(code, msg string, status int32) {
	r.send(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: msg, FailureCode: code, UpstreamStatus: status})
}
