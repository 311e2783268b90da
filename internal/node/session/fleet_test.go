package session_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/session"
	iop "iop/proto/gen/iop"
)

// listerExec is a fakeExec that lists models for discovery.
type listerExec struct {
	*fakeExec
	models func(adapter string) ([]string, error)
}

func (l listerExec) ListModels(_ context.Context, adapter string) ([]string, error) {
	return l.models(adapter)
}

// modelsSource is what the fake backends list now; tests change it.
type modelsSource struct {
	mu   sync.Mutex
	list map[string][]string
	fail map[string]bool
}

func (m *modelsSource) set(adapter string, models ...string) {
	m.mu.Lock()
	m.list[adapter] = models
	m.mu.Unlock()
}

func (m *modelsSource) get(adapter string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail[adapter] {
		return nil, errors.New("connection refused")
	}
	return append([]string(nil), m.list[adapter]...), nil
}

// nextReport reads until a NodeModelsReport (other frames skipped).
func nextReport(c *edgeConn) *iop.NodeModelsReport {
	c.t.Helper()
	for {
		if r := c.recv().GetModelsReport(); r != nil {
			return r
		}
	}
}

// D1: a ready node lists every discovering adapter's models at once, sends
// a report only when the lists change, leaves adapters without
// discovery_interval_ms alone, and reports a failed listing as an error.
func TestDiscoveryReports(t *testing.T) {
	leakcheck.Check(t)
	src := &modelsSource{list: map[string][]string{"ollama": {"tiny:latest"}, "openai_compat": {"x"}}, fail: map[string]bool{}}
	cfg := payload("r1")
	cfg.Adapters[0].DiscoveryIntervalMs = 100
	s := startReady(t, cfg, func(o *session.Options) {
		build := o.NewExecutor
		o.NewExecutor = func(p *iop.NodeConfigPayload) (session.Executor, error) {
			ex, err := build(p)
			if err != nil {
				return nil, err
			}
			return listerExec{fakeExec: ex.(*fakeExec), models: src.get}, nil
		}
	})
	r := nextReport(s.c)
	if len(r.GetAdapters()) != 1 || r.GetAdapters()[0].GetAdapter() != "ollama" || !slices.Equal(r.GetAdapters()[0].GetModels(), []string{"tiny:latest"}) {
		t.Fatalf("D1 the first report: %v (only ollama discovers)", r)
	}
	start := time.Now()
	src.set("ollama", "tiny:latest", "tiny-copy:latest")
	r = nextReport(s.c)
	if got := r.GetAdapters()[0].GetModels(); !slices.Equal(got, []string{"tiny:latest", "tiny-copy:latest"}) {
		t.Fatalf("D1 after a pull: %v", got)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("D1 a change reported after %v with a 100 ms poll", d)
	}
	src.mu.Lock()
	src.fail["ollama"] = true
	src.mu.Unlock()
	if r := nextReport(s.c); r.GetAdapters()[0].GetError() == "" || len(r.GetAdapters()[0].GetModels()) != 0 {
		t.Fatalf("D1 a failed listing: %v", r)
	}
	// Unchanged (failing again): no report; a ping round trip after three
	// polls sees none.
	deadline := time.Now().Add(350 * time.Millisecond)
	for time.Now().Before(deadline) {
		s.c.send(&iop.Envelope{Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{Nonce: 9}}})
		for {
			env := s.c.recv()
			if env.GetModelsReport() != nil {
				t.Fatal("D1 an unchanged failure was reported again")
			}
			if env.GetPong() != nil {
				break
			}
		}
	}
}

// fakeRenewer is a CertRenewer that is due at once and records installs.
type fakeRenewer struct {
	mu        sync.Mutex
	due       time.Time
	requests  int
	installed [][]byte
	installCh chan []byte
}

func (r *fakeRenewer) RenewAt() (time.Time, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.due, nil
}

func (r *fakeRenewer) NewRequest() ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	return []byte{byte(r.requests)}, nil
}

func (r *fakeRenewer) Install(pem []byte) error {
	r.mu.Lock()
	r.installed = append(r.installed, pem)
	r.due = time.Now().Add(time.Hour)
	r.mu.Unlock()
	r.installCh <- pem
	return nil
}

// J5: a session whose payload asks for renewal sends one
// CertificateRenewRequest when the certificate is due, installs the
// answer and goes on (the same connection answers pings); a refused
// renewal is retried; a session whose payload does not ask never renews.
func TestRenewalOverSession(t *testing.T) {
	leakcheck.Check(t)
	rn := &fakeRenewer{due: time.Now(), installCh: make(chan []byte, 4)}
	cfg := payload("r1")
	cfg.Runtime.CertificateRenewal = true
	s := startReady(t, cfg, func(o *session.Options) { o.Renewer = rn })
	var req *iop.CertificateRenewRequest
	for req == nil {
		req = s.c.recv().GetRenewRequest()
	}
	s.c.send(&iop.Envelope{Kind: &iop.Envelope_RenewResponse{RenewResponse: &iop.CertificateRenewResponse{Error: "certificate renewed too recently"}}})
	for req = nil; req == nil; { // retried after 2 s
		req = s.c.recv().GetRenewRequest()
	}
	s.c.send(&iop.Envelope{Kind: &iop.Envelope_RenewResponse{RenewResponse: &iop.CertificateRenewResponse{Ok: true,
		CertificatePem: []byte("PEM"), NotAfterUnixMs: time.Now().Add(time.Hour).UnixMilli()}}})
	select {
	case got := <-rn.installCh:
		if string(got) != "PEM" {
			t.Errorf("J5 installed %q", got)
		}
	case <-time.After(waitFor):
		t.Fatal("J5 the renewed certificate was not installed")
	}
	s.c.alive(3)
	if rn.requests != 2 {
		t.Errorf("J5 %d requests, want 2 (one refused, one granted)", rn.requests)
	}

	none := &fakeRenewer{due: time.Now(), installCh: make(chan []byte, 1)}
	s2 := startReady(t, payload("r1"), func(o *session.Options) { o.Renewer = none })
	s2.c.alive(4)
	s2.c.alive(5)
	none.mu.Lock()
	defer none.mu.Unlock()
	if none.requests != 0 {
		t.Error("J5 a node whose payload does not ask renewed")
	}
}

// residencyExec is a fakeExec whose residency a test sets; set notifies
// like the adapter Set's Signal.
type residencyExec struct {
	*fakeExec
	src *residencySource
}

type residencySource struct {
	mu      sync.Mutex
	models  []*iop.ModelResidency
	changed chan struct{}
}

func (r *residencySource) set(models ...*iop.ModelResidency) {
	r.mu.Lock()
	r.models = models
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (e residencyExec) Residency() []*iop.AdapterResidency {
	e.src.mu.Lock()
	defer e.src.mu.Unlock()
	return []*iop.AdapterResidency{{Adapter: "llama", Models: e.src.models}}
}

func (e residencyExec) ResidencyChanged() <-chan struct{} {
	e.src.mu.Lock()
	defer e.src.mu.Unlock()
	return e.src.changed
}

// nextResidency reads until a NodeResidencyReport (other frames skipped).
func nextResidency(c *edgeConn) *iop.NodeResidencyReport {
	c.t.Helper()
	for {
		if r := c.recv().GetResidencyReport(); r != nil {
			return r
		}
	}
}

// U6: a ready node reports residency at once, then each change of a
// model's state as the executor signals it (not at a poll: the executor
// here only signals), and a change of in_flight alone no sooner than
// ResidencyInterval after the report before it, the last count winning.
func TestResidencyReportsOnChange(t *testing.T) {
	leakcheck.Check(t)
	src := &residencySource{changed: make(chan struct{}),
		models: []*iop.ModelResidency{{Model: "tiny", State: "unloaded"}}}
	s := startReady(t, payload("r1"), func(o *session.Options) {
		build := o.NewExecutor
		o.NewExecutor = func(p *iop.NodeConfigPayload) (session.Executor, error) {
			ex, err := build(p)
			if err != nil {
				return nil, err
			}
			return residencyExec{fakeExec: ex.(*fakeExec), src: src}, nil
		}
	})
	if r := nextResidency(s.c); r.GetAdapters()[0].GetModels()[0].GetState() != "unloaded" {
		t.Fatalf("U6 first report %v", r)
	}
	for _, st := range []string{"loading", "loaded", "stopping", "unloaded"} {
		src.set(&iop.ModelResidency{Model: "tiny", State: st})
		if got := nextResidency(s.c).GetAdapters()[0].GetModels()[0].GetState(); got != st {
			t.Fatalf("U6 report %q after a change to %q", got, st)
		}
	}
	src.set(&iop.ModelResidency{Model: "tiny", State: "loaded", LoadMs: 140})
	sent := time.Now()
	nextResidency(s.c)
	for n := int32(1); n <= 5; n++ { // in_flight alone: coalesced
		src.set(&iop.ModelResidency{Model: "tiny", State: "loaded", LoadMs: 140, InFlight: n})
	}
	r := nextResidency(s.c)
	if d := time.Since(sent); d < session.ResidencyInterval {
		t.Errorf("U6 an in_flight change reported %v after the last report (< %v)", d, session.ResidencyInterval)
	}
	if got := r.GetAdapters()[0].GetModels()[0].GetInFlight(); got != 5 {
		t.Errorf("U6 coalesced report in_flight %d, want the last, 5", got)
	}
}
