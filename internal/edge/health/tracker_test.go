package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/proctest"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// testPool is a real pool with keyA (cap 2) and n1/llama (cap 2) serving
// model "tiny" (target "tiny" on both), node n1 ready at generation 3.
func testPool(t *testing.T) *pool.Pool {
	t.Helper()
	kB := pool.Key{Node: "n1", Provider: "llama"}
	p := pool.New(pool.Config{
		Nodes: []string{"n1"},
		Resources: []pool.Resource{
			{Key: keyA, Type: "ollama", Category: "local_inference", Capacity: 2, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}},
			{Key: kB, Type: "openai_compat", Category: "local_inference", Capacity: 2, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}},
		},
		Groups: []pool.Group{{Name: "tiny", Candidates: []pool.Candidate{{Key: keyA, Target: "tiny"}, {Key: kB, Target: "tiny"}}}},
	}, nil)
	if !p.NodeReady("n1", 3) {
		t.Fatal("NodeReady n1/3 not applied")
	}
	return p
}

func acquire(t *testing.T, p *pool.Pool) *pool.Lease {
	t.Helper()
	l, err := p.Acquire(context.Background(), pool.Request{Model: "tiny", Operation: protocol.OpChatCompletions})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// providerStatus returns the snapshot status/health of provider name of n1.
func providerStatus(p *pool.Pool, name string) string {
	for _, n := range p.Snapshot() {
		for _, ps := range n.Providers {
			if ps.ProviderId == name {
				return ps.Status + "/" + ps.Health
			}
		}
	}
	return "missing"
}

// debugLogger writes text lines at debug level to logs.
func debugLogger(logs *proctest.Log) *slog.Logger {
	return slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func sample(t *testing.T, tr *Tracker, family, labels string) float64 {
	t.Helper()
	for _, m := range tr.Metrics() {
		if m.Name == family {
			v, ok := m.Samples()[labels]
			if !ok {
				t.Fatalf("%s has no sample {%s}", family, labels)
			}
			return v
		}
	}
	t.Fatalf("no metric family %s", family)
	return 0
}

// H8, H9: ObserveStall on a real pool: a validated stall is decorated
// (provider_id, provider_health, recovery_handoff) whatever its freshness;
// only a fresh unavailable one overlays the provider (snapshot shows
// unavailable/unavailable, zero capacity; the next lease goes to the other
// provider); rejected evidence is left undecorated and changes nothing.
func TestObserveStall(t *testing.T) {
	leakcheck.Check(t)
	var logs proctest.Log
	p := testPool(t)
	tr := New(Options{Overlay: p, Logger: debugLogger(&logs)})
	l := acquire(t, p)
	if l.Key != keyA {
		t.Fatalf("first lease on %v, want %v", l.Key, keyA)
	}

	bad := with(stallFailure(protocol.HealthUnavailable, 5), func(f *iop.ExecutionFailure) { f.Adapter = "llama" })
	if tr.ObserveStall(l, bad) {
		t.Error("H8 mismatched adapter validated")
	}
	if bad.ProviderId != "" || bad.RecoveryHandoff != "" {
		t.Errorf("H8 rejected evidence decorated: %v", bad)
	}
	if got := providerStatus(p, "ollama"); got != "available/healthy" {
		t.Errorf("H8 after rejected evidence: %s, want available/healthy", got)
	}

	avail := stallFailure(protocol.HealthAvailable, 6)
	if !tr.ObserveStall(l, avail) {
		t.Error("H8 valid available stall not validated")
	}
	if avail.ProviderId != "ollama" || avail.ProviderHealth != protocol.HealthAvailable || avail.RecoveryHandoff != protocol.HandoffConfirmed {
		t.Errorf("H8 decoration = %q %q %q", avail.ProviderId, avail.ProviderHealth, avail.RecoveryHandoff)
	}
	if got := providerStatus(p, "ollama"); got != "available/healthy" {
		t.Errorf("H8 available evidence overlaid: %s", got)
	}

	unav := stallFailure(protocol.HealthUnavailable, 7)
	if !tr.ObserveStall(l, unav) || unav.RecoveryHandoff != protocol.HandoffConfirmed {
		t.Error("H8 fresh unavailable not validated")
	}
	if got := providerStatus(p, "ollama"); got != "unavailable/unavailable" {
		t.Errorf("H9 overlaid provider shows %s, want unavailable/unavailable", got)
	}
	if got := tr.Overlaid(); len(got) != 1 || got[0] != keyA {
		t.Errorf("Overlaid = %v, want [%v]", got, keyA)
	}
	// H9: excluded from candidates — the next lease goes to llama.
	l2 := acquire(t, p)
	if l2.Provider != "llama" {
		t.Errorf("H9 lease after overlay on %v, want n1/llama", l2.Key)
	}

	stale := stallFailure(protocol.HealthUnavailable, 7)
	if !tr.ObserveStall(l, stale) || stale.RecoveryHandoff != protocol.HandoffConfirmed {
		t.Error("H8 sequence-stale stall must still get the request-local handoff")
	}

	// Leases are the caller's: ObserveStall never returned any.
	if !p.Release(l) || !p.Release(l2) {
		t.Error("Q2 a lease was returned by ObserveStall")
	}

	for labels, want := range map[string]float64{
		`source="stall",evidence="rejected"`:    1,
		`source="stall",evidence="available"`:   1,
		`source="stall",evidence="unavailable"`: 1,
		`source="stall",evidence="stale"`:       1,
		`source="probe",evidence="available"`:   0,
	} {
		if got := sample(t, tr, MetricEvidence, labels); got != want {
			t.Errorf("H12 evidence{%s} = %v, want %v", labels, got, want)
		}
	}
	if got := sample(t, tr, MetricTransitions, `to="unavailable"`); got != 1 {
		t.Errorf("H12 transitions to unavailable = %v, want 1", got)
	}
	out := logs.String()
	if n := strings.Count(out, "msg=edge_provider_health_observation"); n != 4 {
		t.Errorf("H12 %d observation log events, want 4:\n%s", n, out)
	}
	for _, banned := range []string{"nr-1", "a-1"} {
		if strings.Contains(out, banned) {
			t.Errorf("H12 log carries node run/attempt id %q:\n%s", banned, out)
		}
	}
}

// H8: a stall on a lease whose generation was fenced (the node
// re-registered) is not current: not validated, no overlay on the new
// generation.
func TestObserveStallFencedLease(t *testing.T) {
	leakcheck.Check(t)
	p := testPool(t)
	tr := New(Options{Overlay: p})
	l := acquire(t, p)
	p.NodeReady("n1", 4)
	f := stallFailure(protocol.HealthUnavailable, 9)
	if tr.ObserveStall(l, f) {
		t.Error("stall of a fenced generation validated")
	}
	if got := providerStatus(p, "ollama"); got != "available/healthy" {
		t.Errorf("new generation shows %s, want available/healthy", got)
	}
	if p.Release(l) {
		t.Error("Q2 fenced lease released twice")
	}
}

// H12: metric labels are the bounded sets only.
func TestMetricLabelsBounded(t *testing.T) {
	tr := New(Options{Overlay: testPool(t)})
	allowed := map[string]bool{}
	for _, s := range sourceNames {
		for _, e := range evidenceNames {
			allowed[`source="`+s+`",evidence="`+e+`"`] = true
		}
	}
	for _, n := range transitionNames {
		allowed[`to="`+n+`"`] = true
	}
	for _, n := range eligibilityNames {
		allowed[`result="`+n+`"`] = true
	}
	for _, n := range resultNames {
		allowed[`result="`+n+`"`] = true
	}
	l := &pool.Lease{Key: keyA, Generation: 3, Target: "tiny"}
	tr.ObserveStall(l, stallFailure(protocol.HealthUnavailable, 1))
	tr.RecoveryEligibility(l, "tiny", Eligible)
	tr.RecoveryOutcome(l, l, "tiny", RecoveryRecovered)
	names := map[string]bool{}
	for _, m := range tr.Metrics() {
		names[m.Name] = true
		for k := range m.Samples() {
			if !allowed[k] {
				t.Errorf("%s has unbounded label set {%s}", m.Name, k)
			}
		}
	}
	for _, n := range []string{MetricEvidence, MetricTransitions, MetricEligibility, MetricResults} {
		if !names[n] {
			t.Errorf("metric family %s missing", n)
		}
	}
	if got := sample(t, tr, MetricEligibility, `result="eligible"`); got != 1 {
		t.Errorf("eligibility{eligible} = %v, want 1", got)
	}
	if got := sample(t, tr, MetricResults, `result="recovered"`); got != 1 {
		t.Errorf("results{recovered} = %v, want 1", got)
	}
}

// fakeCommander answers CAPABILITIES from a script, one answer per call.
type fakeCommander struct {
	mu     sync.Mutex
	calls  []string // "node/gen adapter target"
	leases []string // each call's credential lease id and binding slot ("" "": none)
	answer func(call int, node string, gen uint64) (*iop.NodeCommandResponse, error)
}

func (c *fakeCommander) Command(ctx context.Context, node string, gen uint64, req *iop.NodeCommandRequest) (*iop.NodeCommandResponse, error) {
	c.mu.Lock()
	n := len(c.calls)
	c.calls = append(c.calls, fmt.Sprintf("%s/%d %s %s %s", node, gen, req.GetType(), req.GetAdapter(), req.GetTarget()))
	c.leases = append(c.leases, req.GetCredentialLease().GetLeaseId()+" "+req.GetCredentialBinding().GetSlot())
	c.mu.Unlock()
	if req.GetType() != iop.NodeCommandType_NODE_COMMAND_CAPABILITIES {
		return nil, errors.New("not CAPABILITIES")
	}
	return c.answer(n, node, gen)
}

func (c *fakeCommander) callLog() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

// C3, H10: with the credential plane on, each recovery probe carries the
// lease ProbeCredentials issues for its node, provider and target (a keyed
// models path answers a probe without it 401); when none can be issued
// the probe goes without and the failure is logged.
func TestRecoveryProbeCarriesLease(t *testing.T) {
	leakcheck.Check(t)
	p := testPool(t)
	cmd := &fakeCommander{answer: func(int, string, uint64) (*iop.NodeCommandResponse, error) {
		return capResp("ollama", "tiny", protocol.HealthUnavailable, "9"), nil
	}}
	var asked []string
	fail := false
	issue := func(node, provider, target string) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error) {
		asked = append(asked, node+" "+provider+" "+target)
		if fail {
			return nil, nil, errors.New("no credential route")
		}
		return &iop.CredentialLease{LeaseId: fmt.Sprintf("lease-%d", len(asked))}, &iop.CredentialLeaseBinding{Slot: "openai"}, nil
	}
	var logs proctest.Log
	tr := New(Options{Overlay: p, Commander: cmd, Logger: debugLogger(&logs), ProbeCredentials: issue})
	l := acquire(t, p)
	tr.ObserveStall(l, stallFailure(protocol.HealthUnavailable, 7))
	p.Release(l)
	tr.ProbeRound(t.Context())
	fail = true
	tr.ProbeRound(t.Context())
	if want := []string{"n1 ollama tiny", "n1 ollama tiny"}; fmt.Sprint(asked) != fmt.Sprint(want) {
		t.Errorf("C3: leases asked for %q, want %q", asked, want)
	}
	cmd.mu.Lock()
	leases := append([]string(nil), cmd.leases...)
	cmd.mu.Unlock()
	if want := []string{"lease-1 openai", " "}; fmt.Sprint(leases) != fmt.Sprint(want) {
		t.Errorf("C3: probes carried %q, want %q", leases, want)
	}
	if !strings.Contains(logs.String(), "credential lease not issued for a recovery probe") {
		t.Errorf("the failed issue was not logged:\n%s", logs.String())
	}
}

// H10: the recovery loop probes the overlaid provider every interval for
// the stall's adapter and target on the overlay's generation; error,
// unknown, unavailable, stale and mismatched answers change nothing; the
// first higher-seq available answer clears the overlay (snapshot back to
// available) and probing stops.
func TestRecoveryLoop(t *testing.T) {
	leakcheck.Check(t)
	synctest.Test(t, func(t *testing.T) {
		p := testPool(t)
		script := []struct {
			resp *iop.NodeCommandResponse
			err  error
		}{
			{err: errors.New("send queue full")},
			{resp: capResp("ollama", "tiny", protocol.HealthUnknown, "8")},
			{resp: capResp("ollama", "tiny", protocol.HealthUnavailable, "9")},
			{resp: capResp("ollama", "tiny", protocol.HealthAvailable, "9")},   // stale: not above 9
			{resp: capResp("ollama", "other", protocol.HealthAvailable, "10")}, // names another binding
			{resp: capResp("llama", "tiny", protocol.HealthAvailable, "11")},   // names another binding
			{resp: &iop.NodeCommandResponse{Error: "probe failed"}},
			{resp: capResp("ollama", "tiny", protocol.HealthAvailable, "12")},
		}
		cmd := &fakeCommander{answer: func(call int, _ string, _ uint64) (*iop.NodeCommandResponse, error) {
			if call >= len(script) {
				return nil, errors.New("unscripted call")
			}
			return script[call].resp, script[call].err
		}}
		var logs proctest.Log
		tr := New(Options{Overlay: p, Commander: cmd, Logger: debugLogger(&logs), ProbeInterval: time.Second})
		l := acquire(t, p)
		tr.ObserveStall(l, stallFailure(protocol.HealthUnavailable, 7))
		p.Release(l)

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); tr.Run(ctx) }()

		synctest.Wait()
		if n := len(cmd.callLog()); n != 0 {
			t.Errorf("probed %d times before the first interval", n)
		}
		for i := range len(script) - 1 {
			time.Sleep(time.Second)
			synctest.Wait()
			if got := providerStatus(p, "ollama"); got != "unavailable/unavailable" {
				t.Fatalf("after answer %d (%v %v): %s, want still overlaid", i, script[i].resp, script[i].err, got)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := providerStatus(p, "ollama"); got != "available/healthy" {
			t.Errorf("after the fresh available answer: %s, want available/healthy", got)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		calls := cmd.callLog()
		if len(calls) != len(script) {
			t.Errorf("%d probes, want %d (none after the clear)", len(calls), len(script))
		}
		for _, c := range calls {
			if c != "n1/3 NODE_COMMAND_CAPABILITIES ollama tiny" {
				t.Errorf("probe %q, want CAPABILITIES ollama tiny to n1/3", c)
			}
		}
		if got := sample(t, tr, MetricTransitions, `to="available"`); got != 1 {
			t.Errorf("H12 transitions to available = %v, want 1", got)
		}
		for labels, want := range map[string]float64{
			`source="probe",evidence="error"`:       1,
			`source="probe",evidence="unknown"`:     1,
			`source="probe",evidence="unavailable"`: 1,
			`source="probe",evidence="stale"`:       1,
			`source="probe",evidence="rejected"`:    3,
			`source="probe",evidence="available"`:   1,
		} {
			if got := sample(t, tr, MetricEvidence, labels); got != want {
				t.Errorf("H12 evidence{%s} = %v, want %v", labels, got, want)
			}
		}
		cancel()
		<-done
	})
}

// H9, H10: when the overlay's generation is fenced (node re-registered),
// probes stop: either the fence hook dropped the record, or the command
// says the generation is not ready. The new generation is never cleared or
// overlaid by the old one's answers.
func TestRecoveryGenerationChanged(t *testing.T) {
	rows := []struct {
		name      string
		fenceHook bool
		wantCalls int
	}{
		{"H9 fence hook drops the record before any probe", true, 0},
		{"H10 not-ready answer drops the record", false, 1},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			leakcheck.Check(t)
			synctest.Test(t, func(t *testing.T) {
				p := testPool(t)
				cmd := &fakeCommander{answer: func(_ int, node string, gen uint64) (*iop.NodeCommandResponse, error) {
					return nil, fmt.Errorf("command to node %s generation %d: %w", node, gen, dispatch.ErrNotReady)
				}}
				tr := New(Options{Overlay: p, Commander: cmd, ProbeInterval: time.Second})
				l := acquire(t, p)
				tr.ObserveStall(l, stallFailure(protocol.HealthUnavailable, 7))
				p.Release(l)
				p.NodeReady("n1", 4)
				if r.fenceHook {
					tr.NodeFenced("n1", 3)
				}
				if got := providerStatus(p, "ollama"); got != "available/healthy" {
					t.Errorf("H9 new generation shows %s, want available/healthy", got)
				}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() { defer close(done); tr.Run(ctx) }()
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if n := len(cmd.callLog()); n != r.wantCalls {
					t.Errorf("%d probes, want %d", n, r.wantCalls)
				}
				if got := tr.Overlaid(); len(got) != 0 {
					t.Errorf("still tracking %v", got)
				}
				cancel()
				<-done
			})
		})
	}
}

// H10: an answer that arrives after the overlay's generation was fenced
// and a new one overlaid the provider again cannot clear the new overlay.
func TestRecoveryAnswerFromOldGeneration(t *testing.T) {
	leakcheck.Check(t)
	synctest.Test(t, func(t *testing.T) {
		p := testPool(t)
		release := make(chan struct{})
		cmd := &fakeCommander{answer: func(call int, _ string, gen uint64) (*iop.NodeCommandResponse, error) {
			if gen == 3 {
				<-release
				return capResp("ollama", "tiny", protocol.HealthAvailable, "99"), nil
			}
			return capResp("ollama", "tiny", protocol.HealthUnavailable, "50"), nil
		}}
		tr := New(Options{Overlay: p, Commander: cmd})
		l := acquire(t, p)
		tr.ObserveStall(l, stallFailure(protocol.HealthUnavailable, 7))
		p.Release(l)
		round := make(chan struct{})
		go func() { defer close(round); tr.ProbeRound(t.Context()) }()
		synctest.Wait() // the gen-3 probe is in flight
		p.NodeReady("n1", 4)
		l4 := acquire(t, p)
		if l4.Generation != 4 || l4.Key != keyA {
			t.Fatalf("lease %v/%d, want %v/4", l4.Key, l4.Generation, keyA)
		}
		tr.ObserveStall(l4, stallFailure(protocol.HealthUnavailable, 1))
		p.Release(l4)
		close(release)
		<-round
		if got := providerStatus(p, "ollama"); got != "unavailable/unavailable" {
			t.Errorf("old generation's answer changed the new overlay: %s", got)
		}
		if got := tr.Overlaid(); len(got) != 1 {
			t.Errorf("Overlaid = %v, want the gen-4 overlay", got)
		}
	})
}
