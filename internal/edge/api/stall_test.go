package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/health"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// leasePool grants the leases of its list in order, counts every Release
// per lease, and after the list is used up fails with err or (block) waits
// for the caller's context like a queued waiter.
type leasePool struct {
	mu       sync.Mutex
	leases   []*pool.Lease
	next     int
	block    bool
	waiting  chan struct{} // when set, closed as the first blocking Acquire starts to wait
	err      error
	reqs     []pool.Request
	releases map[*pool.Lease]int
	refused  int // ReleaseRefused calls
}

func (p *leasePool) Acquire(ctx context.Context, r pool.Request) (*pool.Lease, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, r)
	if p.next < len(p.leases) {
		l := p.leases[p.next]
		p.next++
		p.mu.Unlock()
		return l, nil
	}
	block, err := p.block, p.err
	if block && p.waiting != nil {
		close(p.waiting)
		p.waiting = nil
	}
	p.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, err
}

// ReleaseRefused counts as a Release and in refused (SPEC E4).
func (p *leasePool) ReleaseRefused(l *pool.Lease, _ int) bool {
	p.mu.Lock()
	p.refused++
	p.mu.Unlock()
	return p.Release(l)
}

func (p *leasePool) Release(l *pool.Lease) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.releases == nil {
		p.releases = map[*pool.Lease]int{}
	}
	p.releases[l]++
	return p.releases[l] == 1
}

// checkReleased fails unless each granted lease went back exactly once (Q2).
func (p *leasePool) checkReleased(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, l := range p.leases[:p.next] {
		if n := p.releases[l]; n != 1 {
			t.Errorf("Q2 lease %d (%v) released %d times, want exactly once", i, l.Key, n)
		}
	}
}

// streamDispatcher hands out its streams in order and records the targets.
type streamDispatcher struct {
	mu      sync.Mutex
	streams []*fakeStream
	targets []dispatch.Target
}

func (d *streamDispatcher) start(t dispatch.Target, adapter, target string) (dispatch.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.targets = append(d.targets, t)
	if len(d.targets) > len(d.streams) {
		return nil, dispatch.ErrNotReady
	}
	st := d.streams[len(d.targets)-1]
	st.bind(adapter, target)
	return st, nil
}

func (d *streamDispatcher) StartRun(t dispatch.Target, req *iop.RunRequest) (dispatch.Stream, error) {
	return d.start(t, req.GetAdapter(), req.GetTarget())
}

func (d *streamDispatcher) StartTunnel(t dispatch.Target, req *iop.ProviderTunnelRequest) (dispatch.Stream, error) {
	return d.start(t, req.GetAdapter(), req.GetTarget())
}

func (d *streamDispatcher) dispatched() []dispatch.Target {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]dispatch.Target(nil), d.targets...)
}

// overlayRec is the pool's overlay as the health Tracker sees it.
type overlayRec struct {
	mu   sync.Mutex
	sets []pool.Key
}

func (o *overlayRec) SetOverlay(k pool.Key, gen, seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sets = append(o.sets, k)
	return true
}

func (o *overlayRec) ClearOverlay(pool.Key, uint64, uint64) bool { return false }

func (o *overlayRec) set() []pool.Key {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]pool.Key(nil), o.sets...)
}

var (
	leaseA = pool.Lease{Key: pool.Key{Node: "n1", Provider: "ollama"}, Generation: 3, Target: "tiny:latest", StallTimeoutMs: 60000}
	leaseB = pool.Lease{Key: pool.Key{Node: "n2", Provider: "ollama"}, Generation: 5, Target: "tiny:latest", StallTimeoutMs: 60000}
)

// stalledFailure is valid stall evidence for a lease on (provider, target).
func stalledFailure(provider, target, healthValue string, seq uint64) *iop.ExecutionFailure {
	cls := map[string]string{protocol.HealthAvailable: protocol.LivenessRequestStalled, protocol.HealthUnavailable: protocol.LivenessProviderUnhealthy,
		protocol.HealthUnknown: protocol.LivenessHealthUnknown}[healthValue]
	return &iop.ExecutionFailure{Code: protocol.CodeResponseStalled.String(), ProviderHealth: healthValue, LivenessClassification: cls,
		IdleMs: 1500, NodeRunId: "nr", AttemptId: "at", Fence: protocol.FenceConfirmed, Adapter: provider, Target: target,
		HealthObservationSeq: seq}
}

func evStall(seq uint64, f *iop.ExecutionFailure) *iop.RunEvent {
	ev := evError(seq, protocol.CodeResponseStalled.String(), "no provider output for 1500 ms")
	ev.Failure = f
	return ev
}

func fStall(f *iop.ExecutionFailure) *iop.ProviderTunnelFrame {
	fr := fError(protocol.CodeResponseStalled.String(), "no provider output for 1500 ms")
	fr.Failure = f
	return fr
}

func withType(l pool.Lease, typ string) *pool.Lease {
	l.Type = typ
	return &l
}

func metricValue(tr *health.Tracker, family, labels string) float64 {
	for _, m := range tr.Metrics() {
		if m.Name == family {
			return m.Samples()[labels]
		}
	}
	return -1
}

// H8, H11: a response_stalled terminal reaches Options.Health before the
// response is decided; the request is re-dispatched once to a second lease
// only when the evidence was validated and nothing was written; otherwise
// the client gets 504 (before bytes) or an error event (after bytes). Every
// lease goes back exactly once whatever the evidence.
func TestStallRedispatch(t *testing.T) {
	streamChat := `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	sse := fStart(200, "Content-Type", "text/event-stream")
	type attempt struct {
		lease  *pool.Lease
		events []*iop.RunEvent
		frames []*iop.ProviderTunnelFrame
	}
	rows := []struct {
		name      string
		body      string
		path      string
		attempts  []attempt
		noHealth  bool
		wait      time.Duration // RedispatchWait
		block     bool          // no second lease: Acquire waits for its context
		failure   *iop.ExecutionFailure
		want      int
		contains  string
		dispatch  int    // streams started
		elig      string // eligibility label counted once
		result    string // results label counted once ("" = none)
		decorated bool   // the first stall's failure got the handoff
		overlaid  bool
	}{
		{name: "H11 run stall before any byte re-dispatches once, second lease answers", body: chatBody,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}},
				{lease: withType(leaseB, protocol.TypeOllama), events: []*iop.RunEvent{evStart(), evDelta(2, "hello"), evComplete(3, "", "stop", nil, nil)}},
			},
			want: 200, contains: `"content":"hello"`, dispatch: 2, elig: "eligible", result: "recovered", decorated: true},
		{name: "H11 streamed run stall before the first byte re-dispatches", body: streamChat,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthUnknown, 2),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}},
				{lease: withType(leaseB, protocol.TypeOllama), events: []*iop.RunEvent{evStart(), evDelta(2, "hey"), evComplete(3, "", "stop", nil, nil)}},
			},
			want: 200, contains: "data: [DONE]", dispatch: 2, elig: "eligible", result: "recovered", decorated: true},
		{name: "H8 H11 tunnel stall after RESPONSE_START, before any body byte, re-dispatches; fresh unavailable overlays", body: streamChat,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthUnavailable, 3),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOpenAICompat), frames: []*iop.ProviderTunnelFrame{sse}},
				{lease: withType(leaseB, protocol.TypeOpenAICompat), frames: []*iop.ProviderTunnelFrame{sse, fBody([]byte("data: {\"x\":1}\n\n")), fEnd()}},
			},
			want: 200, contains: `data: {"x":1}`, dispatch: 2, elig: "eligible", result: "recovered", decorated: true, overlaid: true},
		{name: "H11 stall after bytes is an error event, no re-dispatch", body: streamChat,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart(), evDelta(2, "par")}},
				{lease: withType(leaseB, protocol.TypeOllama)},
			},
			want: 200, contains: `data: {"error":{"message":"the provider stopped responding: no output for 1500 ms (response stalled)","type":"server_error","param":null,"code":"response_stalled"}}`,
			dispatch: 1, elig: "response_started", decorated: true},
		{name: "H11 tunnel stall after body bytes is an error event", body: streamChat,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOpenAICompat), frames: []*iop.ProviderTunnelFrame{sse, fBody([]byte("data: {}\n\n"))}},
				{lease: withType(leaseB, protocol.TypeOpenAICompat)},
			},
			want: 200, contains: `"code":"response_stalled"`, dispatch: 1, elig: "response_started", decorated: true},
		{name: "H11 no second lease in time is the stall's 504", body: chatBody, block: true, wait: 20 * time.Millisecond,
			failure:  stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1),
			attempts: []attempt{{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}}},
			want:     504, contains: `"code":"response_stalled"`, dispatch: 1, elig: "eligible", result: "no_lease", decorated: true},
		{name: "H11 second attempt stalls too: 504, never a third", body: chatBody,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}},
				{lease: withType(leaseB, protocol.TypeOllama), events: []*iop.RunEvent{evStall(2, stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1))}},
				{lease: withType(leaseA, protocol.TypeOllama)},
			},
			want: 504, contains: `"code":"response_stalled"`, dispatch: 2, elig: "eligible", result: "failed", decorated: true},
		{name: "H8 mismatched target: evidence rejected, 504, no re-dispatch, lease back once", body: chatBody,
			failure: stalledFailure("ollama", "other-model", protocol.HealthUnavailable, 9),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}},
				{lease: withType(leaseB, protocol.TypeOllama)},
			},
			want: 504, contains: `"code":"response_stalled"`, dispatch: 1, elig: "evidence_rejected"},
		{name: "H8 stall without evidence: rejected, 504", body: chatBody,
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}},
				{lease: withType(leaseB, protocol.TypeOllama)},
			},
			want: 504, contains: `"code":"response_stalled"`, dispatch: 1, elig: "evidence_rejected"},
		{name: "H11 re-dispatch turned off: 504", body: chatBody, wait: -1,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}},
				{lease: withType(leaseB, protocol.TypeOllama)},
			},
			want: 504, contains: `"code":"response_stalled"`, dispatch: 1, elig: "disabled", decorated: true},
		{name: "H11 without a health owner a stall is a 504", body: chatBody, noHealth: true,
			failure: stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1),
			attempts: []attempt{
				{lease: withType(leaseA, protocol.TypeOllama), events: []*iop.RunEvent{evStart()}},
				{lease: withType(leaseB, protocol.TypeOllama)},
			},
			want: 504, contains: `"code":"response_stalled"`, dispatch: 1},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			leakcheck.Check(t)
			p := &leasePool{block: r.block, err: pool.ErrWaitTimeout}
			d := &streamDispatcher{}
			for i, a := range r.attempts {
				p.leases = append(p.leases, a.lease)
				st := newFakeStream("run-" + string(rune('a'+i)))
				t.Cleanup(st.kill)
				if i == 0 {
					// The first attempt ends with the stall under test.
					if a.lease.Type == protocol.TypeOpenAICompat {
						st.frames(append(a.frames, fStall(r.failure))...)
					} else {
						st.run(append(a.events, evStall(9, r.failure))...)
					}
				} else {
					st.run(a.events...)
					st.frames(a.frames...)
					if len(a.events)+len(a.frames) == 0 {
						st.kill() // a dispatch that must not happen fails fast
					}
				}
				d.streams = append(d.streams, st)
			}
			ov := &overlayRec{}
			tr := health.New(health.Options{Overlay: ov})
			cfg := retryConfig(2)
			o := Options{Config: func() *config.Config { return cfg }, Pool: p, Dispatcher: d, Now: fixedNow, NewID: seqIDs(),
				RedispatchWait: r.wait}
			if !r.noHealth {
				o.Health = tr
			}
			srv := httptest.NewServer(New(o))
			t.Cleanup(srv.Close)
			t.Cleanup(srv.Client().CloseIdleConnections)

			resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(r.body))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("read body: %v", err)
			}
			if resp.StatusCode != r.want || !strings.Contains(string(b), r.contains) {
				t.Errorf("got %d %s, want %d containing %s", resp.StatusCode, b, r.want, r.contains)
			}
			if r.want == http.StatusGatewayTimeout && strings.Count(string(b), `"error"`) != 1 {
				t.Errorf("want exactly one error outcome, got %s", b)
			}
			got := d.dispatched()
			if len(got) != r.dispatch {
				t.Errorf("H11 %d dispatches %v, want %d", len(got), got, r.dispatch)
			}
			for i, tg := range got {
				l := r.attempts[i].lease
				if tg != (dispatch.Target{Node: l.Node, Generation: l.Generation}) {
					t.Errorf("dispatch %d to %v, want lease %d's %s/%d", i, tg, i, l.Node, l.Generation)
				}
			}
			p.checkReleased(t)
			if r.failure != nil {
				f := r.failure
				handoff := f.RecoveryHandoff == protocol.HandoffConfirmed && f.ProviderId == "ollama"
				if handoff != r.decorated {
					t.Errorf("H8 handoff on the failure = %v (provider_id %q, recovery_handoff %q), want %v",
						handoff, f.ProviderId, f.RecoveryHandoff, r.decorated)
				}
			}
			if gotOv := len(ov.set()) > 0; gotOv != r.overlaid {
				t.Errorf("H8 overlay set = %v (%v), want %v", gotOv, ov.set(), r.overlaid)
			}
			if r.noHealth {
				return
			}
			if r.elig != "" {
				if v := metricValue(tr, health.MetricEligibility, `result="`+r.elig+`"`); v != 1 {
					t.Errorf("H12 eligibility{%s} = %v, want 1", r.elig, v)
				}
			}
			var results float64
			for _, n := range []string{"recovered", "failed", "no_lease"} {
				results += metricValue(tr, health.MetricResults, `result="`+n+`"`)
			}
			switch {
			case r.result == "" && results != 0:
				t.Errorf("H12 %v recovery results, want none", results)
			case r.result != "" && (results != 1 || metricValue(tr, health.MetricResults, `result="`+r.result+`"`) != 1):
				t.Errorf("H12 results{%s} not the single result (%v in all)", r.result, results)
			}
		})
	}
}

// H11: a re-dispatch asks the pool for the same request as the first
// admission (model, operation, estimated prompt tokens).
func TestRedispatchSameRequest(t *testing.T) {
	leakcheck.Check(t)
	p := &leasePool{leases: []*pool.Lease{withType(leaseA, protocol.TypeOllama), withType(leaseB, protocol.TypeOllama)}}
	st1, st2 := newFakeStream("r1"), newFakeStream("r2")
	t.Cleanup(st1.kill)
	t.Cleanup(st2.kill)
	st1.run(evStall(1, stalledFailure("ollama", "tiny:latest", protocol.HealthAvailable, 1)))
	st2.run(evComplete(1, "ok", "stop", nil, nil))
	d := &streamDispatcher{streams: []*fakeStream{st1, st2}}
	cfg := retryConfig(2)
	srv := httptest.NewServer(New(Options{Config: func() *config.Config { return cfg }, Pool: p, Dispatcher: d,
		Health: health.New(health.Options{Overlay: &overlayRec{}})}))
	t.Cleanup(srv.Close)
	t.Cleanup(srv.Client().CloseIdleConnections)
	resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	p.mu.Lock()
	reqs := append([]pool.Request(nil), p.reqs...)
	p.mu.Unlock()
	// H11: the same request, excluding the provider already tried; C6:
	// within the first lease's credential slot.
	want := reqs[0]
	want.Exclude = []pool.Key{leaseA.Key}
	want.SameSlot, want.Slot = true, leaseA.Slot
	if len(reqs) != 2 || len(reqs[0].Exclude) != 0 || reqs[0].SameSlot || !reflect.DeepEqual(reqs[1], want) {
		t.Errorf("pool requests %+v, want the same request twice, the second excluding %v within slot %q", reqs, leaseA.Key, leaseA.Slot)
	}
	p.checkReleased(t)
}
