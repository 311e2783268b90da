package adapter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// request is what the shared prelude (open) reads of a RunRequest or a
// ProviderTunnelRequest.
type request interface {
	GetAdapter() string
	GetTarget() string
	GetResponseStallTimeoutMs() int64
	GetTimeoutSec() int64
	GetCredentialLease() *iop.CredentialLease
	GetCredentialBinding() *iop.CredentialLeaseBinding
	GetTrace() *iop.TraceContext
}

// wire is what a sender needs of its message type F: *iop.RunEvent for a
// run (runWire), *iop.ProviderTunnelFrame for a tunnel (tunnelWire).
type wire[F any] interface {
	// stamp sets f's seq, adapter and target.
	stamp(f F, seq uint64, adapter, target string)
	// spans sets a terminal's trace spans, given its failure code.
	spans(f F, tr *spanRecorder)
	// refusal is an ERROR of code: msg is the legacy error string, err
	// (nil for none) gives the client's words (message).
	refusal(code protocol.Code, msg string, err error) F
	// fairShare sets an over_capacity ERROR's fair share (SPEC E4).
	fairShare(f F, share uint32)
	// stalled is the terminal of a stall (SPEC H1-H3).
	stalled(st *stallTerminal) F
	// ended is the terminal of a request that ended before its call with
	// code and no client words (a managed model's load, SPEC U2): a run's
	// is CANCELLED for code cancelled.
	ended(code protocol.Code, msg string) F
}

// sender numbers and emits the events or frames of one run or tunnel:
// seq rises from 1, adapter and target are on every message sent with
// send, exactly one terminal goes out (end), nothing after it, and nothing
// but the terminal once the attempt is fenced. Its methods are safe for
// concurrent use (the provider call sends the non-terminal messages, and
// supervise or its watchdog loop the terminal); emit calls never overlap.
type sender[F any] struct {
	mu              sync.Mutex
	w               wire[F]
	emit            func(F)
	seq             uint64
	ended           bool
	fenced          atomic.Bool
	adapter, target string
	// release, when set, returns the capacity slot; end calls it just
	// before a terminal that may return it, so that the Edge, which
	// releases its lease on the terminal and may dispatch the next waiter
	// at once, never finds the slot still taken (SPEC E4, Q2).
	release func()
	// trace records the request's spans (trace.go); nil = not traced.
	trace *spanRecorder
}

// newSender is the sender of req, emitting through emit; kind is its own
// span's (RUN or TUNNEL).
func newSender[F any](w wire[F], req request, kind iop.NodeSpanKind, emit func(F)) *sender[F] {
	return &sender[F]{w: w, emit: emit, adapter: req.GetAdapter(), target: req.GetTarget(),
		trace: newSpanRecorder(req.GetTrace(), kind)}
}

// send emits a non-terminal message; it is dropped once the attempt is
// fenced or the sender ended.
func (st *sender[F]) send(f F) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended || st.fenced.Load() {
		return
	}
	st.seq++
	st.w.stamp(f, st.seq, st.adapter, st.target)
	st.emit(f)
}

// sendBare is send without adapter and target (a tunnel's BODY frames:
// they are on every other frame).
func (st *sender[F]) sendBare(f F) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended || st.fenced.Load() {
		return
	}
	st.seq++
	st.w.stamp(f, st.seq, "", "")
	st.emit(f)
}

// end emits the terminal, once. returnSlot: return the capacity slot
// first; otherwise it stays taken until Run or Tunnel returns (SPEC H7).
func (st *sender[F]) end(f F, returnSlot bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return
	}
	st.ended = true
	if returnSlot && st.release != nil {
		st.release()
	}
	st.w.spans(f, st.trace)
	st.seq++
	st.w.stamp(f, st.seq, st.adapter, st.target)
	st.emit(f)
}

// fence drops every later non-terminal message (the attempt was fenced).
func (st *sender[F]) fence() { st.fenced.Store(true) }

// fail ends the run or tunnel with an ERROR of code (wire.refusal).
func (st *sender[F]) fail(code protocol.Code, msg string, err error) {
	st.end(st.w.refusal(code, msg, err), true)
}

// overCapacity ends the run or tunnel with the gate's ERROR over_capacity,
// telling the Edge its fair share of the adapter (SPEC E4).
func (st *sender[F]) overCapacity(msg string, fair int64) {
	f := st.w.refusal(protocol.CodeOverCapacity, msg, nil)
	st.w.fairShare(f, uint32(min(max(fair, 0), 1<<31)))
	st.end(f, true)
}

// supervised is the attemptIO of the provider call of st (supervise):
// call makes it and returns the emitter of the terminal it ended with
// (st.end), pending builds the terminal of a fenced call that has not
// returned within the close grace, probe is the stall's exact-target probe.
func (st *sender[F]) supervised(call func() (own func()), pending func() F, probe func(context.Context) string) attemptIO {
	return attemptIO{
		probe: probe,
		call:  call,
		fenced: func(s *stallTerminal, returnSlot bool) {
			if s != nil {
				st.end(st.w.stalled(s), returnSlot)
				return
			}
			st.end(pending(), returnSlot)
		},
		fence: st.fence,
	}
}

// admission is a request open let through: its adapter instance, its
// attempt (begun: runCtx is the attempt context), the endpoint to call
// (the lease's credential, a managed model's process) and the releases
// close runs.
type admission struct {
	inst     *instance
	a        *attempt
	ep       *upstream.Endpoint
	runCtx   context.Context
	managed  func() // a managed model's release
	capacity func() // the capacity slot's release, once
}

// close ends the attempt and returns, in this order, the managed model
// and the capacity slot. Run and Tunnel defer it: it runs after the
// provider call returned, even when the terminal went out before (SPEC H7).
func (ad admission) close() {
	ad.a.cancel(nil)
	ad.managed()
	ad.capacity()
}

// open is the prelude Run and Tunnel share; each check ends st
// with an ERROR terminal and open returns false: the stall timeout
// (invalid_request, SPEC E2, before the adapter lookup), the adapter
// (unknown_adapter, SPEC E1; legacyType names the legacy unnamed one),
// timeout_sec and the credential lease's presence (admit, SPEC C4), then
// check's own boundary checks (a rejection), then the capacity gate
// (over_capacity, SPEC E4), then — with the credential plane on — opening
// the lease (credential_required or credential_invalid, SPEC C3), then a
// managed model's load (SPEC U2). The caller defers the admission's close.
func open[F any](ctx context.Context, s *Set, st *sender[F], runID string, req request, legacyType string, check func(*instance) *rejection) (admission, bool) {
	stall, err := StallTimeout(req.GetResponseStallTimeoutMs()) // SPEC E2: before the adapter lookup
	if err != nil {
		st.fail(protocol.CodeInvalidRequest, err.Error(), err)
		return admission{}, false
	}
	inst, err := s.lookup(req.GetAdapter(), legacyType)
	if err != nil {
		st.fail(protocol.CodeUnknownAdapter, err.Error(), nil)
		return admission{}, false
	}
	st.adapter = inst.name
	a, code, err := s.admit(stall, req.GetTimeoutSec(), req.GetCredentialLease(), req.GetCredentialBinding())
	if err != nil {
		st.fail(code, err.Error(), err)
		return admission{}, false
	}
	if r := check(inst); r != nil {
		st.fail(r.code, r.msg, r.err)
		return admission{}, false
	}
	if why, fair := inst.gate.tryAcquire(); why != admitted {
		st.overCapacity(fmt.Sprintf("adapter %q is at %s", inst.name, inst.gate.full(why, fair)), fair)
		return admission{}, false
	}
	release := sync.OnceFunc(inst.gate.release)
	st.release = release
	ep, err := s.credential(inst, req.GetTarget(), req.GetCredentialLease(), req.GetCredentialBinding()) // SPEC C3: after admission
	if err != nil {
		s.log.Warn("credential lease rejected", "adapter", inst.name, "run_id", runID, "err", err)
		st.fail(credentialCode(err), err.Error(), err)
		release()
		return admission{}, false
	}
	ep, mrelease, code, err := s.managedAcquire(ctx, inst, a, req.GetTarget(), ep) // SPEC U2: a managed model loads first
	if code != "" {
		st.end(st.w.ended(code, err.Error()), true)
		release()
		return admission{}, false
	}
	return admission{inst: inst, a: a, ep: ep, runCtx: a.begin(ctx), managed: mrelease, capacity: release}, true
}

// rejection is a failed boundary check of Run or Tunnel (open): its code,
// the legacy error string and the error that gives the client's words.
type rejection struct {
	code protocol.Code
	msg  string
	err  error
}

// reject is the rejection of err with its own text as the error string.
func reject(code protocol.Code, err error) *rejection {
	return &rejection{code: code, msg: err.Error(), err: err}
}

// admit applies the boundary checks shared by runs and tunnels after the
// adapter lookup — timeout_sec and the credential lease's presence (SPEC
// C4; it is opened only after capacity admission, SPEC C3) — and returns
// the attempt with stall, the request's stall timeout (StallTimeout, which
// open calls before anything else, SPEC E2).
func (s *Set) admit(stall time.Duration, timeoutSec int64, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) (*attempt, protocol.Code, error) {
	if timeoutSec < 0 || timeoutSec > math.MaxInt64/int64(time.Second) {
		return nil, protocol.CodeInvalidRequest, fmt.Errorf("timeout_sec %d is negative or too large", timeoutSec)
	}
	if code, err := s.checkPresence(l, b); err != nil {
		return nil, code, err
	}
	return &attempt{stall: stall, deadline: time.Duration(timeoutSec) * time.Second}, "", nil
}

// requestErrorCode is the failure code of a request that got no response
// head: upstream_connect when no connection opened, else upstream_reset.
func requestErrorCode(re *upstream.RequestError) protocol.Code {
	if re.Connect {
		return protocol.CodeUpstreamConnect
	}
	return protocol.CodeUpstreamReset
}

// message is the failure in the words a client may see (RunEvent.message,
// ProviderTunnelFrame.message): the upstream's own message for a status it
// answered; for invalid_request the refusal without the "invalid run
// input" prefix and without encoding/json's Go type names (internal); why a
// credential lease was refused; which content coding the node could not
// decode (SPEC B3); "" for every other code (the Edge has the code's own
// words) and for a nil err.
func message(code protocol.Code, err error) string {
	var se *upstream.StatusError
	var ee *upstream.EncodingError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &se):
		return se.Message
	case errors.As(err, &ee):
		return ee.Error()
	case code == protocol.CodeCredentialRequired, code == protocol.CodeCredentialInvalid:
		return err.Error()
	case code != protocol.CodeInvalidRequest:
		return ""
	}
	var fe *upstream.FieldError
	if errors.As(err, &fe) {
		return fe.Msg
	}
	msg := strings.TrimPrefix(err.Error(), upstream.ErrInvalidInput.Error()+": ")
	if i := strings.Index(msg, "Go struct field"); i >= 0 {
		msg = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(msg[:i]), "of"))
	}
	return msg
}

// runWire is the wire of a run's RunEvents.
type runWire struct{}

func (runWire) stamp(ev *iop.RunEvent, seq uint64, adapter, target string) {
	ev.Seq, ev.Adapter, ev.Target = seq, adapter, target
}

func (runWire) spans(ev *iop.RunEvent, tr *spanRecorder) {
	ev.TraceSpans = tr.spans(ev.GetFailureCode())
}

func (runWire) refusal(code protocol.Code, msg string, err error) *iop.RunEvent {
	return &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: msg, FailureCode: code.String(), Message: message(code, err)}
}

func (runWire) fairShare(ev *iop.RunEvent, share uint32) { ev.FairShare = share }

func (runWire) stalled(st *stallTerminal) *iop.RunEvent { return stallEvent(st) }

func (runWire) ended(code protocol.Code, msg string) *iop.RunEvent {
	ev := &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: msg, FailureCode: code.String()}
	if code == protocol.CodeCancelled {
		ev.Type = iop.RunEventType_RUN_EVENT_CANCELLED
	}
	return ev
}

// tunnelWire is the wire of a tunnel's ProviderTunnelFrames.
type tunnelWire struct{}

func (tunnelWire) stamp(f *iop.ProviderTunnelFrame, seq uint64, adapter, target string) {
	f.Seq, f.Adapter, f.Target = seq, adapter, target
}

func (tunnelWire) spans(f *iop.ProviderTunnelFrame, tr *spanRecorder) {
	f.TraceSpans = tr.spans(f.GetFailureCode())
}

func (tunnelWire) refusal(code protocol.Code, msg string, err error) *iop.ProviderTunnelFrame {
	return errorFrame(code, msg, err)
}

func (tunnelWire) fairShare(f *iop.ProviderTunnelFrame, share uint32) { f.FairShare = share }

func (tunnelWire) stalled(st *stallTerminal) *iop.ProviderTunnelFrame { return stallFrame(st) }

func (tunnelWire) ended(code protocol.Code, msg string) *iop.ProviderTunnelFrame {
	return errorFrame(code, msg, nil)
}
