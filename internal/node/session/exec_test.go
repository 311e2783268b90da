package session_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/node/session"
	iop "iop/proto/gen/iop"
)

// Behaviours of fakeExec, chosen by RunRequest.target /
// ProviderTunnelRequest.target.
const (
	tEcho  = "echo"  // start, delta "he", delta "llo", complete "hello"
	tBlock = "block" // start; wait for ctx; wait for release; cancelled
	tHold  = "hold"  // start; wait for release (or ctx); complete
	tStall = "stall" // start; stall error terminal with ExecutionFailure
	tFlood = "flood" // start; many 1 MiB deltas; complete
)

// fakeFactory builds fakeExecs and records what happened to them.
type fakeFactory struct {
	mu       sync.Mutex
	built    []*fakeExec
	failNext error // the next build fails with it

	release   chan struct{} // closed by releaseAll to let block/hold runs finish
	releaseMu sync.Once
	started   chan string // run ids that started
	cancelled chan string // run ids whose ctx was cancelled
	probes    chan [2]string
	leases    chan *iop.CredentialLease // each Probe's credential lease (nil: none)
	status    string                    // Probe answer

	probeBounded atomic.Bool // a Probe ctx had a deadline within 2 s
}

func newFactory() *fakeFactory {
	return &fakeFactory{
		release:   make(chan struct{}),
		started:   make(chan string, 64),
		cancelled: make(chan string, 64),
		probes:    make(chan [2]string, 64),
		leases:    make(chan *iop.CredentialLease, 64),
		status:    "available",
	}
}

// releaseAll lets every block and hold run finish; safe to call twice.
func (f *fakeFactory) releaseAll() { f.releaseMu.Do(func() { close(f.release) }) }

func (f *fakeFactory) build(cfg *iop.NodeConfigPayload) (session.Executor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failNext; err != nil {
		f.failNext = nil
		return nil, err
	}
	ex := &fakeExec{f: f, id: len(f.built) + 1, cfg: cfg, closed: make(chan struct{})}
	f.built = append(f.built, ex)
	return ex, nil
}

func (f *fakeFactory) setFail(err error) {
	f.mu.Lock()
	f.failNext = err
	f.mu.Unlock()
}

func (f *fakeFactory) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.built)
}

func (f *fakeFactory) exec(i int) *fakeExec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.built[i]
}

type fakeExec struct {
	f      *fakeFactory
	id     int
	cfg    *iop.NodeConfigPayload
	closes atomic.Int32
	active atomic.Int32 // Run/Tunnel/Probe calls in progress
	closed chan struct{}
	// closedWhileActive records a Close that came before work returned.
	closedWhileActive atomic.Bool
}

func (e *fakeExec) isClosed() bool {
	select {
	case <-e.closed:
		return true
	default:
		return false
	}
}

func (e *fakeExec) Close() {
	if e.active.Load() != 0 {
		e.closedWhileActive.Store(true)
	}
	if e.closes.Add(1) == 1 {
		close(e.closed)
	}
}

func (e *fakeExec) Probe(ctx context.Context, adapter, target string, l *iop.CredentialLease, _ *iop.CredentialLeaseBinding) string {
	e.active.Add(1)
	defer e.active.Add(-1)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= session.DefaultProbeTimeout {
		e.f.probeBounded.Store(true)
	}
	e.f.probes <- [2]string{adapter, target}
	e.f.leases <- l
	return e.f.status
}

func (e *fakeExec) Run(ctx context.Context, runID string, req *iop.RunRequest, emit func(*iop.RunEvent)) {
	e.active.Add(1)
	defer e.active.Add(-1)
	var seq uint64
	ev := func(ev *iop.RunEvent) {
		seq++
		ev.Seq = seq
		ev.Adapter, ev.Target = req.GetAdapter(), req.GetTarget()
		emit(ev)
	}
	ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_START})
	done := &iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_COMPLETE, Content: "hello", FinishReason: "stop",
		Metadata: map[string]string{"exec": strconv.Itoa(e.id)}}
	switch req.GetTarget() {
	case tEcho:
		ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: "he"})
		ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: "llo"})
		ev(done)
	case tBlock:
		e.f.started <- runID
		<-ctx.Done()
		e.f.cancelled <- runID
		<-e.f.release
		ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_CANCELLED, Error: context.Cause(ctx).Error()})
	case tHold:
		e.f.started <- runID
		select {
		case <-e.f.release:
			ev(done)
		case <-ctx.Done():
			ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_CANCELLED})
		}
	case tStall:
		ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: "response stalled", FailureCode: "response_stalled",
			Failure: &iop.ExecutionFailure{Code: "response_stalled", ProviderHealth: "available", LivenessClassification: "request_stalled"}})
	case tFlood:
		big := strings.Repeat("x", 1<<20)
		for range 64 {
			if ctx.Err() != nil {
				break
			}
			ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: big})
		}
		ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_CANCELLED})
	default:
		ev(&iop.RunEvent{Type: iop.RunEventType_RUN_EVENT_ERROR, Error: "unknown target", FailureCode: "invalid_request"})
	}
}

func (e *fakeExec) Tunnel(ctx context.Context, runID string, req *iop.ProviderTunnelRequest, emit func(*iop.ProviderTunnelFrame)) {
	e.active.Add(1)
	defer e.active.Add(-1)
	var seq uint64
	fr := func(f *iop.ProviderTunnelFrame) {
		seq++
		f.Seq = seq
		emit(f)
	}
	switch req.GetTarget() {
	case tBlock:
		e.f.started <- runID
		<-ctx.Done()
		e.f.cancelled <- runID
		<-e.f.release
		fr(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, Error: "cancelled", FailureCode: "cancelled"})
	default:
		fr(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, Status: 200})
		fr(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: req.GetBody()})
		fr(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END})
	}
}
