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
	"iop/internal/protocol"
)

// keyedVLLM fronts the demo backend (itself started with the key) like
// vLLM started with --api-key: /health stays public and every /v1 path,
// /v1/models included (llama-server keeps that one public), answers 401
// {"error": "Unauthorized"} without "Authorization: Bearer <key>", as
// vLLM's auth middleware does. Behind the key check, while stall is set it
// holds /v1/chat/completions without a byte until the caller goes away,
// and while modelsDown is set /v1/models answers 503.
type keyedVLLM struct {
	key                string
	stall, modelsDown  atomic.Bool
	unauthorized, held atomic.Int32
	next               http.Handler
}

func (k *keyedVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1/") && r.Header.Get("Authorization") != "Bearer "+k.key:
		k.unauthorized.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":"Unauthorized"}`)
	case r.URL.Path == "/v1/models" && k.modelsDown.Load():
		http.Error(w, "model store offline", http.StatusServiceUnavailable)
	case r.URL.Path == "/v1/chat/completions" && k.stall.Load():
		io.Copy(io.Discard, r.Body) // net/http notices the client going away only once the body is read
		k.held.Add(1)
		<-r.Context().Done()
	default:
		k.next.ServeHTTP(w, r)
	}
}

// TestCredentialPlaneHealthProbes: with the credential plane on, a keyed
// vLLM-style provider's health probes carry the credential, so health
// works as without the plane (SPEC C3, H1, H8, H10):
//
//   - H1, H8: its stall probe, with the stalled request's credential,
//     tells unavailable (models path down) from available (models path
//     up); only the former overlays it;
//   - H10: recovery probes carry a lease the edge issues for the provider
//     and target, and the first available one clears the overlay;
//   - C3: the keyed server never answers 401 to any of it.
//
// Without the credential every probe of the keyed models path was 401,
// "unavailable": one stall overlaid the provider for good.
func TestCredentialPlaneHealthProbes(t *testing.T) {
	leakcheck.Check(t)
	const secret, stallMs = "sk-e2e-PROBE-5e4d3c2b1a", 300
	p := newPKI(t, "gpu-1")
	k := newCredKit(t, p, secret)
	bp := startBackend(t, backend.Options{APIKey: secret})
	sick := &keyedVLLM{key: secret, next: bp.b}
	sickURL, wellURL := bp.serve(t, sick), bp.serve(t, nil)
	vllm := compatAdapter("sick", sickURL, 2)
	vllm.Profile = protocol.ProfileVLLM
	sickProv := provider("gpu-1", "sick", "tiny")
	sickProv.ResponseStallTimeoutMs = stallMs
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{vllm, compatAdapter("well", wellURL, 2)}}},
		[]config.Model{modelGroup("pair", sickProv, provider("gpu-1", "well", "tiny")), modelGroup("solo", sickProv)}, k.tweak(t))
	logs := newLogSink(t)
	e := startEdge(t, cfg, nil, logs.logger("edge"), func(o *edge.Options) { o.HealthProbeInterval = 100 * time.Millisecond })
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	k.startCredNode(t, e.nodeAddr, logs.logger("node"), nil)
	adm.waitConnected(t, time.Minute, "gpu-1")
	sickIs := func(status, health string) func() (bool, string) {
		return func() (bool, string) {
			d, err := adm.status()
			if err != nil {
				return false, err.Error()
			}
			n, _ := d.node("gpu-1")
			for _, ps := range n.Providers {
				if ps.ProviderID == "sick" {
					return ps.Status == status && ps.Health == health, fmt.Sprintf("sick is %+v", ps)
				}
			}
			return false, fmt.Sprintf("no provider sick in %+v", n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// H1, H8: a stall whose probe (with the request's credential) finds
	// the models path down overlays sick; the request goes to well.
	sick.stall.Store(true)
	sick.modelsDown.Store(true)
	if res, err := api.chat(ctx, chatRequest{model: "pair"}); err != nil || res.status != http.StatusOK || res.text != answer {
		t.Fatalf("H11 pair after a stall on sick: err %v, %d %s; want 200 from well", err, res.status, res.raw)
	}
	if ok, why := sickIs("unavailable", "unavailable")(); !ok {
		t.Fatalf("H8 a stall with the models path down: %s, want sick overlaid", why)
	}
	// H10, C3: recovery probes carry a lease; once the models path is up
	// again the first one clears the overlay.
	sick.modelsDown.Store(false)
	eventually(t, time.Minute, "H10 the overlay cleared by a recovery probe with a lease", sickIs("available", "healthy"))
	// H1, H8: a stall with the models path up is available evidence: no
	// overlay; the client gets the stall's 504.
	res, err := api.chat(ctx, chatRequest{model: "solo"})
	if err != nil || res.status != http.StatusGatewayTimeout || !strings.Contains(res.raw, `"code":"response_stalled"`) {
		t.Fatalf("H1 solo stalled: err %v, %d %s; want 504 response_stalled", err, res.status, res.raw)
	}
	if ok, why := sickIs("available", "healthy")(); !ok {
		t.Fatalf("H8 a stall whose probe found the target: %s, want sick not overlaid", why)
	}
	if n := sick.held.Load(); n != 2 {
		t.Errorf("sick held %d chat requests, want 2 (pair once, solo once: never the same provider twice)", n)
	}
	if n := sick.unauthorized.Load(); n != 0 {
		t.Errorf("C3: the keyed server answered %d requests 401 (a probe or a request without the credential)", n)
	}
	sick.stall.Store(false)
	adm.waitGauges(t, time.Minute, 0, 0) // every lease went back
}
