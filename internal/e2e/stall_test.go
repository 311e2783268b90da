package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// sickBackend fronts the demo backend for one adapter: while stall is set
// it holds every /api/chat without sending a byte until the caller goes
// away (the node's stall watchdog); while tagsDown is set /api/tags answers
// 503, so the node's exact-target probe says "unavailable".
type sickBackend struct {
	stall, tagsDown atomic.Bool
	held            *recorder[string] // one entry per held /api/chat
	next            http.Handler
}

func (s *sickBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/api/chat" && s.stall.Load():
		// Read the body first: net/http notices the client going away
		// only once the body is consumed.
		io.Copy(io.Discard, r.Body)
		s.held.add(r.URL.Path)
		<-r.Context().Done()
	case r.URL.Path == "/api/tags" && s.tagsDown.Load():
		http.Error(w, "model store offline", http.StatusServiceUnavailable)
	default:
		s.next.ServeHTTP(w, r)
	}
}

// TestStallHealthRecovery runs the whole stall path through the real Edge,
// Node and demo backend: node gpu-1 has adapters "sick" (behind
// sickBackend) and "well"; model "pair" lists sick then well, "solo" sick
// only, both with a 300 ms stall timeout on sick.
//
//   - H1, H8, H9, H11: sick stalls and its probe says unavailable: the
//     request is re-dispatched to well and answers 200; sick is overlaid
//     (/status unavailable/unavailable, zero capacity).
//   - H10: recovery probes keep the overlay while the probe says
//     unavailable and clear it once it says available.
//   - H8, H11: sick stalls with its target present: available/
//     request_stalled evidence sets no overlay; "solo" has no other
//     candidate and a request never goes to the same provider twice, so the
//     client gets 504 response_stalled after the one stall.
//   - H12: the four counter families count each of those once.
func TestStallHealthRecovery(t *testing.T) {
	leakcheck.Check(t)
	const stallMs = 300
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	sick := &sickBackend{held: newRecorder[string](), next: bp.b}
	sickURL, wellURL := bp.serve(t, sick), bp.serve(t, nil)
	sickProv := provider("gpu-1", "sick", "tiny")
	sickProv.ResponseStallTimeoutMs = stallMs
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("sick", sickURL, 2), ollamaAdapter("well", wellURL, 2)}}},
		[]config.Model{modelGroup("pair", sickProv, provider("gpu-1", "well", "tiny")), modelGroup("solo", sickProv)}, nil)
	_, adm, api := startReady(t, p, cfg, logs, func(o *edge.Options) { o.HealthProbeInterval = 100 * time.Millisecond })

	sickStatus := func() (providerStatus, error) {
		d, err := adm.status()
		if err != nil {
			return providerStatus{}, err
		}
		n, _ := d.node("gpu-1")
		for _, ps := range n.Providers {
			if ps.ProviderID == "sick" {
				return ps, nil
			}
		}
		return providerStatus{}, fmt.Errorf("no provider sick in %+v", n)
	}
	waitSick := func(what, status, health string) {
		t.Helper()
		eventually(t, 10*time.Second, what, func() (bool, string) {
			ps, err := sickStatus()
			if err != nil {
				return false, err.Error()
			}
			return ps.Status == status && ps.Health == health, fmt.Sprintf("sick is %+v", ps)
		})
	}
	counter := func(name string) float64 {
		t.Helper()
		m, err := adm.metrics()
		if err != nil {
			t.Fatal(err)
		}
		v, ok := m[name]
		if !ok {
			t.Fatalf("/metrics has no %s", name)
		}
		return v
	}
	const (
		evStallUnavailable = `iop_edge_provider_health_evidence_total{source="stall",evidence="unavailable"}`
		evStallAvailable   = `iop_edge_provider_health_evidence_total{source="stall",evidence="available"}`
		evProbeUnavailable = `iop_edge_provider_health_evidence_total{source="probe",evidence="unavailable"}`
		toUnavailable      = `iop_edge_provider_health_transitions_total{to="unavailable"}`
		toAvailable        = `iop_edge_provider_health_transitions_total{to="available"}`
		eligible           = `iop_edge_liveness_recovery_eligibility_total{result="eligible"}`
		attemptUsed        = `iop_edge_liveness_recovery_eligibility_total{result="attempt_used"}`
		recovered          = `iop_edge_liveness_recovery_results_total{result="recovered"}`
		failed             = `iop_edge_liveness_recovery_results_total{result="failed"}`
	)

	// H8, H9, H11: stall + unavailable probe → overlay, re-dispatch to well.
	sick.stall.Store(true)
	sick.tagsDown.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	res, err := api.chat(ctx, chatRequest{model: "pair"})
	if err != nil || res.status != http.StatusOK || res.text != answer {
		t.Fatalf("H11 pair after a stall on sick: err %v, %d %s; want 200 from well", err, res.status, res.raw)
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("H11 re-dispatched answer took %v, want about the %d ms stall plus the node's close grace", took, stallMs)
	}
	if items, _ := sick.held.snapshot(); len(items) != 1 {
		t.Errorf("sick held %d chat requests, want 1", len(items))
	}
	ps, err := sickStatus()
	if err != nil {
		t.Fatal(err)
	}
	if ps.Status != "unavailable" || ps.Health != "unavailable" || ps.Capacity != 0 {
		t.Errorf("H9 overlaid sick shows %+v, want unavailable/unavailable with capacity 0", ps)
	}
	for name, want := range map[string]float64{evStallUnavailable: 1, toUnavailable: 1, eligible: 1, recovered: 1} {
		if got := counter(name); got != want {
			t.Errorf("H12 %s = %v, want %v", name, got, want)
		}
	}

	// H10: probes that say unavailable keep the overlay ...
	eventually(t, 10*time.Second, "H10 a recovery probe answered unavailable", func() (bool, string) {
		v := counter(evProbeUnavailable)
		return v >= 1, fmt.Sprintf("%s = %v", evProbeUnavailable, v)
	})
	if ps, err := sickStatus(); err != nil || ps.Status != "unavailable" {
		t.Errorf("H10 overlay lifted by an unavailable probe: %+v %v", ps, err)
	}
	// ... and the first available one clears it.
	sick.tagsDown.Store(false)
	waitSick("H10 overlay cleared by an available probe", "available", "healthy")
	if got := counter(toAvailable); got != 1 {
		t.Errorf("H12 %s = %v, want 1", toAvailable, got)
	}

	// H8, H11: available evidence, no overlay; no untried candidate, so
	// the client gets the stall's 504 (never the same provider twice).
	start = time.Now()
	res, err = api.chat(ctx, chatRequest{model: "solo"})
	took := time.Since(start)
	if err != nil || res.status != http.StatusGatewayTimeout || len(res.errs) != 1 {
		t.Fatalf("H11 solo stalled: err %v, %d %s; want one 504 error", err, res.status, res.raw)
	}
	if want := `"code":"response_stalled"`; !strings.Contains(res.raw, want) {
		t.Errorf("H1 504 body %s lacks %s", res.raw, want)
	}
	if took < stallMs*time.Millisecond || took > 8*time.Second {
		t.Errorf("H11 504 after %v, want one stall of %d ms plus the node's close grace", took, stallMs)
	}
	if items, _ := sick.held.snapshot(); len(items) != 2 {
		t.Errorf("sick held %d chat requests in all, want 2 (1 of pair, 1 of solo: never twice)", len(items))
	}
	if ps, err := sickStatus(); err != nil || ps.Status != "available" || ps.Health != "healthy" {
		t.Errorf("H8 available evidence overlaid sick: %+v %v", ps, err)
	}
	for name, want := range map[string]float64{evStallAvailable: 1, toUnavailable: 1, eligible: 1, attemptUsed: 1, recovered: 1, failed: 0} {
		if got := counter(name); got != want {
			t.Errorf("H12 %s = %v, want %v", name, got, want)
		}
	}
	sick.stall.Store(false)
	adm.waitGauges(t, 10*time.Second, 0, 0) // Q2: every lease went back
	if n := logs.messages("edge_provider_health_observation"); n < 3 {
		t.Errorf("H12 %d edge_provider_health_observation events, want at least 3 (two stalls, the clearing probe)", n)
	}
	if n := logs.messages("edge_liveness_recovery_observation"); n != 3 {
		t.Errorf("H12 %d edge_liveness_recovery_observation events, want 3 (2 decisions, 1 result)", n)
	}
}

// holdChats holds every chat request (Ollama's /api/chat and the
// OpenAI-compatible /v1/chat/completions) without sending a byte until the
// caller goes away, and passes everything else (the probes) to next.
type holdChats struct{ next http.Handler }

func (h holdChats) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/api/chat" || r.URL.Path == "/v1/chat/completions" {
		io.Copy(io.Discard, r.Body) // net/http notices the client going away only once the body is read
		<-r.Context().Done()
		return
	}
	h.next.ServeHTTP(w, r)
}

// Q6, E2: the stall timeout is resolved once, at the edge, and travels with
// every pool call. Here only the adapters set response_stall_timeout_ms
// (300 ms; their routes set none), the node payload carries no stall
// timeout, and the node applies the request's: both paths answer 504
// response_stalled after about 300 ms plus the node's close grace. Were
// the edge to send 0, the node would wait its default of 300000 ms and the
// client's 10 s deadline would pass first.
func TestQ6StallTimeoutResolvedAtTheEdge(t *testing.T) {
	leakcheck.Check(t)
	const stallMs = 300
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, holdChats{next: bp.b})
	run, tunnel := ollamaAdapter("run", url, 1), compatAdapter("tunnel", url, 1)
	run.ResponseStallTimeoutMs, tunnel.ResponseStallTimeoutMs = stallMs, stallMs
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{run, tunnel}}},
		[]config.Model{modelGroup("on-run", provider("gpu-1", "run", "tiny")), modelGroup("on-tunnel", provider("gpu-1", "tunnel", "tiny"))}, nil)
	_, adm, api := startReady(t, p, cfg, logs)
	for _, model := range []string{"on-run", "on-tunnel"} {
		t.Run("Q6 "+model, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			res, err := api.chat(ctx, chatRequest{model: model})
			took := time.Since(start)
			if err != nil || res.status != http.StatusGatewayTimeout || !strings.Contains(res.raw, `"code":"response_stalled"`) {
				t.Fatalf("err %v, %d %s after %v; want 504 response_stalled", err, res.status, res.raw, took)
			}
			if took < stallMs*time.Millisecond || took > 8*time.Second {
				t.Errorf("504 after %v, want the adapter's %d ms stall plus the node's close grace", took, stallMs)
			}
		})
	}
	adm.waitGauges(t, 10*time.Second, 0, 0) // Q2: every lease went back
}
