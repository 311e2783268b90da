package health

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// watcher is a slog.Handler that, at each record, notes what the pool and
// the Tracker's counters said at that instant (the observation's view of
// the decision it reports).
type watcher struct {
	mu    sync.Mutex
	lines []string      // "msg key=value …" of each record
	at    []string      // what look returned when each record was handled
	look  func() string // nil: nothing
}

func (w *watcher) Enabled(context.Context, slog.Level) bool { return true }
func (w *watcher) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *watcher) WithGroup(string) slog.Handler            { return w }

func (w *watcher) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%s", a.Key, a.Value); return true })
	seen := ""
	if w.look != nil {
		seen = w.look()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, b.String())
	w.at = append(w.at, seen)
	return nil
}

func (w *watcher) all() (lines, at []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...), append([]string(nil), w.at...)
}

// healthScript drives tr on p through every kind of health decision: a
// rejected, an available, a fresh unavailable (overlay) and a stale stall,
// then recovery rounds whose answers are unavailable, stale, mismatched and
// finally available (clear), and the HTTP layer's re-dispatch records. It
// returns, step by step, what the decisions were: each ObserveStall's
// answer and the failure as it decorated it, the pool's view of the
// provider, and the overlaid set.
func healthScript(t *testing.T, p *pool.Pool, tr *Tracker, scrape func()) []string {
	t.Helper()
	var out []string
	note := func(what string) {
		scrape()
		out = append(out, fmt.Sprintf("%s: pool %s, overlaid %v", what, providerStatus(p, "ollama"), tr.Overlaid()))
	}
	l := acquire(t, p)
	for i, f := range []*iop.ExecutionFailure{
		with(stallFailure(protocol.HealthUnavailable, 5), func(f *iop.ExecutionFailure) { f.Adapter = "llama" }),
		stallFailure(protocol.HealthAvailable, 6),
		stallFailure(protocol.HealthUnavailable, 7),
		stallFailure(protocol.HealthUnavailable, 7),
	} {
		ok := tr.ObserveStall(l, f)
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		note(fmt.Sprintf("stall %d valid=%v failure=%x", i, ok, b))
	}
	tr.RecoveryEligibility(l, "tiny", Eligible)
	tr.RecoveryOutcome(l, nil, "tiny", RecoveryNoLease)
	p.Release(l)
	for i := range 4 {
		tr.ProbeRound(t.Context())
		note(fmt.Sprintf("probe round %d", i))
	}
	return out
}

// O1: the health observations (the log events and the counters) are local
// projections of decisions already taken: the same stalls and probe answers
// give the same validation, decoration, overlay and recovery decisions
// whether the Tracker logs nowhere and is never scraped, or logs every
// event at debug level and has its metrics read after every step.
func TestO1HealthDecisionsIndependentOfObservation(t *testing.T) {
	leakcheck.Check(t)
	answers := func() *fakeCommander {
		script := []*iop.NodeCommandResponse{
			capResp("ollama", "tiny", protocol.HealthUnavailable, "8"),
			capResp("ollama", "tiny", protocol.HealthAvailable, "8"),   // stale
			capResp("ollama", "other", protocol.HealthAvailable, "10"), // another binding
			capResp("ollama", "tiny", protocol.HealthAvailable, "11"),
		}
		return &fakeCommander{answer: func(call int, _ string, _ uint64) (*iop.NodeCommandResponse, error) {
			return script[min(call, len(script)-1)], nil
		}}
	}
	pOff, pOn := testPool(t), testPool(t)
	cmdOff, cmdOn := answers(), answers()
	off := New(Options{Overlay: pOff, Commander: cmdOff})
	w := &watcher{}
	on := New(Options{Overlay: pOn, Commander: cmdOn, Logger: slog.New(w)})
	gotOff := healthScript(t, pOff, off, func() {})
	gotOn := healthScript(t, pOn, on, func() {
		for _, m := range on.Metrics() {
			_ = m.Samples()
		}
	})
	if strings.Join(gotOff, "\n") != strings.Join(gotOn, "\n") {
		t.Errorf("O1 decisions differ with observations on:\noff:\n%s\non:\n%s", strings.Join(gotOff, "\n"), strings.Join(gotOn, "\n"))
	}
	if a, b := cmdOff.callLog(), cmdOn.callLog(); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("O1 probes differ with observations on: %q, %q", a, b)
	}
	if lines, _ := w.all(); len(lines) == 0 {
		t.Fatal("the observed Tracker logged nothing: the comparison proves nothing")
	}
}

// O3: the health events and counters come after the overlay decision is
// final: when edge_provider_health_observation is written for the stall
// that overlays the provider, the pool already shows it unavailable and the
// transition is counted; when it is written for the probe that clears it,
// the pool already shows it available. The re-dispatch records count once
// per call (once per request lifecycle: the HTTP layer calls each once).
// No label or log line carries the node's run or attempt id, the
// caller-facing ids or payload-like values a node put in the evidence.
func TestO3HealthObservedAfterOverlayDecision(t *testing.T) {
	leakcheck.Check(t)
	p := testPool(t)
	cmd := &fakeCommander{answer: func(int, string, uint64) (*iop.NodeCommandResponse, error) {
		return capResp("ollama", "tiny", protocol.HealthAvailable, "9"), nil
	}}
	var tr *Tracker
	w := &watcher{}
	w.look = func() string {
		return fmt.Sprintf("pool %s, to_unavailable %v, to_available %v", providerStatus(p, "ollama"),
			sample(t, tr, MetricTransitions, `to="unavailable"`), sample(t, tr, MetricTransitions, `to="available"`))
	}
	tr = New(Options{Overlay: p, Commander: cmd, Logger: slog.New(w)})
	hostileRun := "run-" + strings.Repeat("R", 10<<10)
	const hostileAttempt = "sk-live-ATTEMPT-0123456789abcdef"
	l := acquire(t, p)
	f := with(stallFailure(protocol.HealthUnavailable, 7), func(f *iop.ExecutionFailure) {
		f.NodeRunId, f.AttemptId = hostileRun, hostileAttempt
	})
	if !tr.ObserveStall(l, f) {
		t.Fatal("H8 fresh unavailable stall not validated")
	}
	tr.RecoveryEligibility(l, "tiny", Eligible)
	tr.RecoveryOutcome(l, nil, "tiny", RecoveryNoLease)
	p.Release(l)
	tr.ProbeRound(t.Context())

	lines, at := w.all()
	want := []struct{ msg, at string }{
		{"edge_provider_health_observation source=stall", "pool unavailable/unavailable, to_unavailable 1, to_available 0"},
		{"edge_liveness_recovery_observation phase=eligibility", ""},
		{"edge_liveness_recovery_observation phase=result", ""},
		{"edge_provider_health_observation source=probe", "pool available/healthy, to_unavailable 1, to_available 1"},
	}
	if len(lines) != len(want) {
		t.Fatalf("O3 %d log events, want %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	for i, wl := range want {
		if !strings.HasPrefix(lines[i], wl.msg) {
			t.Errorf("O3 event %d = %.200s, want %s …", i, lines[i], wl.msg)
		}
		if wl.at != "" && at[i] != wl.at {
			t.Errorf("O3 %s written when %s, want after the decision: %s", wl.msg, at[i], wl.at)
		}
	}
	for labels, v := range map[string]float64{`result="eligible"`: 1} {
		if got := sample(t, tr, MetricEligibility, labels); got != v {
			t.Errorf("O3 eligibility{%s} = %v, want %v", labels, got, v)
		}
	}
	if got := sample(t, tr, MetricResults, `result="no_lease"`); got != 1 {
		t.Errorf("O3 results{no_lease} = %v, want 1", got)
	}
	var exposition strings.Builder
	for _, m := range tr.Metrics() {
		for k := range m.Samples() {
			exposition.WriteString(m.Name + "{" + k + "}\n")
		}
	}
	for _, text := range []string{strings.Join(lines, "\n"), exposition.String()} {
		for _, banned := range []string{"RRRR", hostileAttempt, "nr-1"} {
			if strings.Contains(text, banned) {
				t.Errorf("O3 an observation carries %q:\n%.2000s", banned, text)
			}
		}
	}
	if n := strings.Count(exposition.String(), "\n"); n != 2*nEvidence+len(transitionNames)+int(nEligibility)+int(nResults) {
		t.Errorf("O3 %d label sets, want the fixed %d", n, 2*nEvidence+len(transitionNames)+int(nEligibility)+int(nResults))
	}
}
