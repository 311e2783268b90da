package adapter_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// keyed wraps h like a server started with an API key whose models path
// needs it, as vLLM's --api-key guards every /v1 route and OpenAI's API
// does (its /health stays public): without "Authorization: Bearer <key>"
// a /v1 request is answered 401. It counts the model-list requests and
// records their Authorization headers.
type keyed struct {
	h      http.Handler
	key    string
	mu     sync.Mutex
	models []string // Authorization of each /v1/models request
}

func (k *keyed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		k.mu.Lock()
		k.models = append(k.models, r.Header.Get("Authorization"))
		k.mu.Unlock()
	}
	if r.URL.Path != "/health" && r.Header.Get("Authorization") != "Bearer "+k.key {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
		return
	}
	k.h.ServeHTTP(w, r)
}

func (k *keyed) modelCalls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.models...)
}

// vllmBinding is kitBinding for the keyed adapter "llama" of profile vllm.
func vllmBinding() *iop.CredentialLeaseBinding {
	b := kitBinding()
	b.Profile = "vllm"
	return b
}

// C3, H1, H10: with the credential plane on, health probes reach a keyed
// models path with the credential: the stall probe of a request with that
// request's, a recovery probe (CAPABILITIES) with the lease the Edge sent
// for it. Without one a keyed server answers 401 and the probe says
// "unavailable": one stall would set the Edge's overlay, and no recovery
// probe could ever clear it.
func TestCredentialProbes(t *testing.T) {
	type row struct {
		name   string
		tunnel bool
	}
	for _, tc := range []row{{"C3 H1 a stalled run's probe carries the run's credential", false},
		{"C3 H1 a stalled tunnel's probe carries the tunnel's credential", true}} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			synctest.Test(t, func(t *testing.T) {
				k := newLeaseKit(t)
				var chats atomic.Int32
				up := &keyed{h: upstream(plan{chunks: 1}, &chats), key: kitSecret}
				s := k.planeSetWith(t, adapter.Options{HTTPClient: pipeClient(t, up, false)}, vllmAdapter())
				b := vllmBinding()
				l := k.issue(t, b)
				var fail *iop.ExecutionFailure
				if tc.tunnel {
					var frames []*iop.ProviderTunnelFrame
					s.Tunnel(context.Background(), "run-1", &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny",
						Operation: protocol.OpChatCompletions, Body: []byte(`{"model":"tiny","stream":true}`), ResponseStallTimeoutMs: 10000,
						CredentialLease: l, CredentialBinding: b}, func(f *iop.ProviderTunnelFrame) { frames = append(frames, f) })
					last, _, _, _ := checkTunnel(t, frames)
					fail = last.GetFailure()
				} else {
					var evs []*iop.RunEvent
					s.Run(context.Background(), "run-1", &iop.RunRequest{Adapter: "llama", Target: "tiny", Stream: true, Input: userInput("Hi"),
						ResponseStallTimeoutMs: 10000, CredentialLease: l, CredentialBinding: b}, func(ev *iop.RunEvent) { evs = append(evs, ev) })
					last, _ := checkRun(t, evs)
					fail = last.GetFailure()
				}
				if fail.GetCode() != protocol.CodeResponseStalled.String() || fail.GetProviderHealth() != protocol.HealthAvailable {
					t.Fatalf("H1: stall failure %v, want response_stalled with provider_health available", fail)
				}
				if got := up.modelCalls(); len(got) != 1 || got[0] != "Bearer "+kitSecret {
					t.Fatalf("C3: the stall probe sent Authorization %q, want the request's credential", got)
				}
			})
		})
	}

	t.Run("H10 C3 C4 recovery probes", func(t *testing.T) {
		leakcheck.Check(t)
		k := newLeaseKit(t)
		var chats atomic.Int32
		up := &keyed{h: upstream(plan{}, &chats), key: kitSecret}
		srv := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { up.ServeHTTP(w, r) })
		s := k.planeSetWith(t, adapter.Options{}, vllmAdapterAt(srv.URL))
		off := newSet(t, adapter.Options{}, vllmAdapterAt(srv.URL))
		replayed := vllmBinding()
		replayedLease := k.issue(t, replayed)
		rows := []struct {
			name  string
			set   *adapter.Set
			lease func() (*iop.CredentialLease, *iop.CredentialLeaseBinding)
			want  string
			auth  string // the probe's Authorization; "-" = no upstream call
		}{
			{"C3 H10 a probe lease opens and the keyed models path answers", s,
				func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return replayedLease, replayed },
				protocol.HealthAvailable, "Bearer " + kitSecret},
			{"H10 without a lease the keyed path answers 401: unavailable", s,
				func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return nil, nil }, protocol.HealthUnavailable, ""},
			{"C3 a replayed probe lease: unknown, nothing sent", s,
				func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return replayedLease, replayed }, protocol.HealthUnknown, "-"},
			{"C6 a probe lease for another target: unknown, nothing sent", s,
				func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) {
					b := vllmBinding()
					b.UpstreamTarget = "big"
					return k.issue(t, b), b
				}, protocol.HealthUnknown, "-"},
			{"C4 a probe lease without its binding: unknown, nothing sent", s,
				func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return k.issue(t, vllmBinding()), nil }, protocol.HealthUnknown, "-"},
			{"C4 a probe lease with the plane off: unknown, nothing sent", off,
				func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) {
					b := vllmBinding()
					return k.issue(t, b), b
				},
				protocol.HealthUnknown, "-"},
		}
		for _, row := range rows {
			before := len(up.modelCalls())
			l, b := row.lease()
			if got := row.set.Probe(context.Background(), "llama", "tiny", l, b); got != row.want {
				t.Fatalf("%s: Probe = %q, want %q", row.name, got, row.want)
			}
			calls := up.modelCalls()[before:]
			switch {
			case row.auth == "-" && len(calls) != 0:
				t.Fatalf("%s: %d upstream model-list calls, want none", row.name, len(calls))
			case row.auth != "-" && (len(calls) != 1 || calls[0] != row.auth):
				t.Fatalf("%s: model-list calls with Authorization %q, want one with %q", row.name, calls, row.auth)
			}
		}
	})
}

// vllmAdapter is adapter "llama" with the vllm profile at http://upstream
// (the pipe client's server).
func vllmAdapter() *iop.AdapterConfig { return vllmAdapterAt("http://upstream") }

func vllmAdapterAt(base string) *iop.AdapterConfig {
	p := llamaProfile(base)
	p.Name = "vllm"
	return compatAdapter("llama", p, 1)
}

// planeSetWith is planeSet with more options (a pipe client).
func (k *leaseKit) planeSetWith(t testing.TB, o adapter.Options, adapters ...*iop.AdapterConfig) *adapter.Set {
	t.Helper()
	o.NodeID, o.Leases, o.Now = "gpu-1", k.opener, func() time.Time { return k.now }
	s, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: adapters, Runtime: &iop.NodeRuntimeConfig{
		CredentialsEnabled: true, CredentialProjectionGeneration: 10, CredentialSlotRevisions: map[string]uint64{"llama": 2}}}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
