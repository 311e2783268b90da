package adapter

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Run executes one normalized run (SPEC E1–E9) and calls emit for each
// RunEvent in order: START (seq 1), DELTA* (assistant text as read), then
// exactly one terminal — COMPLETE (content, finish_reason, usage, metadata
// "openai_tool_calls" / "openai_text_tool_fallback"), ERROR (error and
// failure_code; upstream_status for a non-2xx answer) or CANCELLED — with seq
// strictly increasing and adapter/target set on every event. Every event is
// a fresh value that emit may keep. emit calls never overlap (deltas come
// from the provider call's goroutine, the terminal from the calling one),
// never happen after Run returns, and may block briefly.
//
// Stall watchdog (SPEC H1–H7): when the provider sends nothing — no
// headers, no body bytes — for the request's response_stall_timeout_ms
// (StallTimeout: 0 = 300000 ms), the attempt is cancelled and fenced
// (later deltas are dropped), then the close
// grace (Options.StallCloseGrace, 2 s) and one exact-target Probe run side
// by side, and the run ends with ERROR failure_code "response_stalled",
// Failure (ExecutionFailure: provider_health, liveness_classification,
// idle_ms, node_run_id = runID, attempt_id = runID+"/1", fence, adapter,
// target; health_observation_seq 0 for the session to stamp) and the
// allow-listed Meta* metadata. Any other failure leaves Failure nil (H4). A
// cancel or deadline that comes first keeps its own terminal (H7). Run
// returns after the terminal and after the provider call returned: when a
// fenced call does not return within the close grace, the terminal goes out
// (fence "unconfirmed") and the capacity slot stays taken until it does.
//
// Boundary checks before any provider call, each an ERROR terminal: unknown
// adapter (unknown_adapter, SPEC E1), response_stall_timeout_ms negative or
// too large, negative timeout_sec, empty target or missing input
// (invalid_request, SPEC E2), the credential lease's presence (SPEC C4),
// then the capacity gate (over_capacity, SPEC E4), then — with the
// credential plane on — opening the lease (credential_required or
// credential_invalid, SPEC C3; see credential). Cancelling ctx (CancelRequest, SPEC
// E5, or session loss, E6) aborts the upstream request and ends the run with
// CANCELLED; timeout_sec > 0 ends it with ERROR "timeout". On an adapter
// whose profile has a priority_field the chat body carries the value of
// req.priority_class as its "priority" (SPEC G7).
func (s *Set) Run(ctx context.Context, runID string, req *iop.RunRequest, emit func(*iop.RunEvent)) {
	ctx = upstream.WithRequestID(ctx, req.GetRequestId()) // logs and the upstream's X-Request-Id
	rs := newSender[*iop.RunEvent](runWire{}, req, iop.NodeSpanKind_NODE_SPAN_RUN, emit)
	rs.send(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_START})
	ad, ok := open(ctx, s, rs, runID, req, protocol.TypeOllama, func(*instance) *rejection {
		switch {
		case req.GetTarget() == "":
			return reject(protocol.CodeInvalidRequest, errors.New("run request without target"))
		case req.GetInput() == nil:
			return reject(protocol.CodeInvalidRequest, errors.New("run request without input"))
		}
		return nil
	})
	if !ok {
		return
	}
	defer ad.close()
	inst, a, runCtx := ad.inst, ad.a, ad.runCtx
	callCtx := runCtx
	if f := inst.profile.GetPriorityField(); f != nil {
		callCtx = upstream.WithPriority(runCtx, protocol.PriorityValue(f, req.GetPriorityClass())) // SPEC G7
	}
	runner := inst.runnerFor(ad.ep)
	hooks := upstream.Hooks{OnActivity: a.activity}
	if req.GetStream() {
		// A non-stream caller gets the whole content on COMPLETE; one DELTA
		// frame per token would only be discarded by the Edge.
		hooks.OnDelta = func(text string, lp []*iop.TokenLogprob) {
			rs.send(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: text, Logprobs: lp})
		}
		hooks.OnReasoning = func(text string) {
			rs.send(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_DELTA, ReasoningDelta: text})
		}
	}
	s.supervise(ctx, a, runID, inst.name, req.GetTarget(), rs.supervised(
		func() func() {
			res, err := s.callRunner(rs.trace.context(callCtx), inst, runner, req, hooks, runID)
			rs.trace.returned()
			if req.GetStream() {
				res.Logprobs = nil // the deltas carried them
			}
			return func() { rs.end(s.runTerminal(ctx, runCtx, inst.name, runID, res, err), true) }
		},
		func() *iop.RunEvent {
			return s.runTerminal(ctx, runCtx, inst.name, runID, upstream.Result{}, a.pendingErr())
		},
		func(ctx context.Context) string { return s.probeWith(ctx, inst, runner, req.GetTarget()) },
	))
}

// runTerminal is the terminal of a run whose call ended with res, err:
// COMPLETE, CANCELLED when ctx ended (ERROR node_shutdown when the node's
// drain ended it), else ERROR with the classified code.
func (s *Set) runTerminal(ctx, runCtx context.Context, adapter, runID string, res upstream.Result, err error) *iop.RunEvent {
	switch {
	case err == nil:
		return &iop.RunEvent{
			Type:         iop.RunEventType_RUN_EVENT_COMPLETE,
			Content:      res.Content,
			FinishReason: res.FinishReason,
			Usage:        res.Usage,
			Metadata:     res.Metadata,
			Logprobs:     res.Logprobs,
			Embeddings:   res.Embeddings,
			Reasoning:    res.Reasoning,
		}
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrNodeShutdown):
		return &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: "run cancelled: " + ErrNodeShutdown.Error(),
			FailureCode: protocol.CodeNodeShutdown.String()}
	case ctx.Err() != nil:
		return &iop.RunEvent{
			Type:        iop.RunEventType_RUN_EVENT_CANCELLED,
			Error:       fmt.Sprintf("run cancelled: %v", context.Cause(ctx)),
			FailureCode: protocol.CodeCancelled.String(),
		}
	}
	code, status := classify(runCtx, err)
	s.log.Debug("adapter run failed", "adapter", adapter, "run_id", runID, "request_id", upstream.RequestID(ctx),
		"failure_code", code, "upstream_status", status)
	ev := &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: fmt.Sprintf("adapter %q: %v", adapter, err),
		FailureCode: code.String(), UpstreamStatus: status, Message: message(code, err)}
	var se *upstream.StatusError
	if errors.As(err, &se) {
		ev.RetryAfterMs = se.RetryAfter.Milliseconds()
	}
	var fe *upstream.FieldError
	if errors.As(err, &fe) && fe.Field != "" {
		ev.Param = fe.Field
	}
	return ev
}

// callRunner calls the instance's runner, turning a panic into an error so
// that a driver bug still ends the run with one terminal.
func (s *Set) callRunner(ctx context.Context, inst *instance, r runner, req *iop.RunRequest, h upstream.Hooks, runID string) (res upstream.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("adapter run panicked", "adapter", inst.name, "run_id", runID, "request_id", upstream.RequestID(ctx), "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: internal error", errPanic)
		}
	}()
	switch op := req.GetOperation(); op {
	case "", protocol.RunChat:
		return r.Run(ctx, req.GetTarget(), req.GetInput(), h)
	case protocol.RunEmbeddings:
		e, ok := r.(embedder)
		if !ok {
			return upstream.Result{}, fmt.Errorf("%w: embeddings are not served on the run path by adapter %q; use its tunnel", upstream.ErrInvalidInput, inst.name)
		}
		return e.Embed(ctx, req.GetTarget(), req.GetInput(), h)
	default:
		return upstream.Result{}, fmt.Errorf("%w: unknown run operation %q (want chat or embeddings)", upstream.ErrInvalidInput, op)
	}
}

// embedder is what a runner that serves the "embeddings" run operation
// implements: one vector per input.embed_input in Result.Embeddings and the
// prompt token count in Result.Usage.
type embedder interface {
	Embed(ctx context.Context, target string, in *iop.RunInput, h upstream.Hooks) (upstream.Result, error)
}

// classify maps a failed attempt to a failure code and, for a non-2xx
// answer, the upstream status.
func classify(runCtx context.Context, err error) (protocol.Code, int32) {
	var se *upstream.StatusError
	var re *upstream.RequestError
	switch {
	case runCtx.Err() != nil && errors.Is(context.Cause(runCtx), errRunDeadline):
		return protocol.CodeTimeout, 0
	case errors.As(err, &se):
		return protocol.CodeUpstreamStatus, int32(se.Status)
	case errors.As(err, &re):
		return requestErrorCode(re), 0
	case errors.Is(err, upstream.ErrInvalidInput):
		return protocol.CodeInvalidRequest, 0
	case errors.Is(err, upstream.ErrUnsupported):
		return protocol.CodeUnsupportedOperation, 0
	case errors.Is(err, errPanic):
		return protocol.CodeInternal, 0
	}
	return protocol.CodeUpstreamError, 0
}
