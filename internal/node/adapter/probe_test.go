package adapter_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// H2, H10: the exact-target probe of each adapter type.
func TestProbe(t *testing.T) {
	leakcheck.Check(t)
	tags := sample(t, "ollama_api_tags.json")
	llamaModels := sample(t, "llama_v1_models.json")
	ollamaModels := sample(t, "ollama_v1_models.json")
	var healthy atomic.Bool
	healthy.Store(true)
	never := make(chan struct{})
	defer close(never)
	up := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/tags":
			_, _ = w.Write(tags)
		case "/ollama/v1/models":
			_, _ = w.Write(ollamaModels)
		case "/health":
			if !healthy.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":{"code":503,"message":"Loading model"}}`))
				return
			}
			_, _ = w.Write([]byte(`{"status":"ok"}`))
		case "/v1/models":
			_, _ = w.Write(llamaModels)
		case "/garbage/v1/models":
			_, _ = w.Write([]byte("<html>"))
		case "/slow/v1/models":
			select {
			case <-r.Context().Done():
			case <-never:
			}
		default:
			http.NotFound(w, r)
		}
	})
	ollamaCompat := &iop.ConcreteProtocolProfile{Name: "ollama", BaseUrl: up.URL + "/ollama", ModelsPath: "/v1/models", HealthPath: "/v1/models"}
	garbage := &iop.ConcreteProtocolProfile{Name: "vllm", BaseUrl: up.URL + "/garbage", ModelsPath: "/v1/models", HealthPath: "/v1/models"}
	slow := &iop.ConcreteProtocolProfile{Name: "vllm", BaseUrl: up.URL + "/slow", ModelsPath: "/v1/models", HealthPath: "/v1/models"}
	noPaths := &iop.ConcreteProtocolProfile{Name: "openai", BaseUrl: up.URL}
	// A probe's timeout only ends the slow row; the others must not race it
	// on a loaded machine (a 200 ms bound for all turned a two-request
	// llama-server probe into "unknown" under load).
	short := newSet(t, adapter.Options{ProbeTimeout: 200 * time.Millisecond}, compatAdapter("slow", slow, 1))
	s := newSet(t, adapter.Options{ProbeTimeout: time.Minute},
		ollamaAdapter("ollama", up.URL, 1),
		compatAdapter("llama", llamaProfile(up.URL), 1),
		compatAdapter("ollama-v1", ollamaCompat, 1),
		compatAdapter("garbage", garbage, 1),
		compatAdapter("slow", slow, 1),
		compatAdapter("bare", noPaths, 1),
		ollamaAdapter("down", "http://127.0.0.1:1", 1),
	)
	cases := []struct {
		name, adapter, target, want string
		unhealthy                   bool
	}{
		{"H10 ollama tag-aware match", "ollama", "tiny", protocol.HealthAvailable, false},
		{"H10 ollama exact tag", "ollama", "tiny-tool:latest", protocol.HealthAvailable, false},
		{"H10 ollama target absent", "ollama", "llama3.1:8b", protocol.HealthUnavailable, false},
		{"H10 ollama prefix is not a match", "ollama", "tin", protocol.HealthUnavailable, false},
		{"H10 llama-server health then models list", "llama", "tiny", protocol.HealthAvailable, false},
		{"H10 llama-server target absent", "llama", "big", protocol.HealthUnavailable, false},
		{"H10 llama-server unhealthy", "llama", "tiny", protocol.HealthUnavailable, true},
		{"H10 ollama /v1 models list is tag-aware", "ollama-v1", "tiny", protocol.HealthAvailable, false},
		{"H2 unreadable models list is unknown", "garbage", "tiny", protocol.HealthUnknown, false},
		{"H2 probe bounded by its timeout is unknown (the server never answers)", "slow", "tiny", protocol.HealthUnknown, false},
		{"H2 profile without probe paths is unknown", "bare", "tiny", protocol.HealthUnknown, false},
		{"H2 unreachable server is unavailable", "down", "tiny", protocol.HealthUnavailable, false},
		{"H10 unknown adapter is unknown", "nope", "tiny", protocol.HealthUnknown, false},
		{"H10 empty target is unknown", "ollama", "", protocol.HealthUnknown, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			healthy.Store(!tc.unhealthy)
			set := s
			if tc.adapter == "slow" {
				set = short
			}
			if got := set.Probe(context.Background(), tc.adapter, tc.target, nil, nil); got != tc.want {
				t.Fatalf("Probe(%q, %q) = %q, want %q", tc.adapter, tc.target, got, tc.want)
			}
		})
	}
}
