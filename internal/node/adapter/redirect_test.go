package adapter_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// T4 (security): the node never follows an upstream redirect — on a run,
// a tunnel or a probe, with the node's own per-adapter clients or an
// injected one. A 3xx is the upstream's answer: a run ends with
// upstream_status and the 3xx status, a tunnel relays the 3xx as it came
// (RESPONSE_START, END), a probe is not "available"; and nothing — no body,
// no upstream key — reaches the Location, be it another host (x-api-key,
// which net/http would carry anywhere), another port of the same host
// (Authorization, which net/http keeps for the same host name), or the
// edge's admin listener.
func TestUpstreamRedirectsNotFollowed(t *testing.T) {
	leakcheck.Check(t)
	elsewhere := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"nodes":[],"secret":"admin status"}`))
	})
	eu, err := url.Parse(elsewhere.URL)
	if err != nil {
		t.Fatal(err)
	}
	// Another host name for the same listener: net/http drops
	// Authorization there but keeps every other header.
	otherHost := "http://localhost:" + eu.Port()
	var location atomic.Value // string: set per row before the request; read by the origin
	origin := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Location", location.Load().(string)+r.URL.Path)
		w.WriteHeader(http.StatusTemporaryRedirect) // 307 keeps method and body
	})
	env := func(k string) (string, bool) { return "sk-node-secret", k == "IOP_TEST_KEY" }
	allow := func(k string) bool { return k == "IOP_TEST_KEY" }

	type path struct {
		name string
		do   func(t *testing.T, s *adapter.Set) string // returns what the caller got
	}
	paths := []path{
		{"run", func(t *testing.T, s *adapter.Set) string {
			last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "a", Target: "tiny", Input: userInput("Hi")}))
			return fmt.Sprintf("%v %s %d", last.GetType(), last.GetFailureCode(), last.GetUpstreamStatus())
		}},
		{"tunnel", func(t *testing.T, s *adapter.Set) string {
			last, status, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{
				Adapter: "a", Target: "tiny", Operation: protocol.OpChatCompletions, Body: []byte(`{"model":"tiny"}`)}))
			return fmt.Sprintf("%v %d", last.GetKind(), status)
		}},
		{"probe", func(t *testing.T, s *adapter.Set) string {
			return s.Probe(context.Background(), "a", "tiny", nil, nil)
		}},
	}
	rows := []struct {
		name     string
		adapter  func() *iop.AdapterConfig
		location string
	}{
		{"ollama, Authorization, same host other port", func() *iop.AdapterConfig {
			ac := ollamaAdapter("a", origin.URL, 4)
			ac.ApiKeyEnv = "IOP_TEST_KEY"
			return ac
		}, elsewhere.URL},
		{"openai_compat, x-api-key, another host", func() *iop.AdapterConfig {
			p := llamaProfile(origin.URL)
			p.AuthHeader, p.AuthScheme = "x-api-key", ""
			ac := compatAdapter("a", p, 4)
			ac.ApiKeyEnv = "IOP_TEST_KEY"
			return ac
		}, otherHost},
		{"openai_compat, Authorization, same host other port", func() *iop.AdapterConfig {
			ac := compatAdapter("a", llamaProfile(origin.URL), 4)
			ac.ApiKeyEnv = "IOP_TEST_KEY"
			return ac
		}, elsewhere.URL},
	}
	want := map[string]string{
		"run":    "RUN_EVENT_ERROR upstream_status 307",
		"tunnel": "TUNNEL_FRAME_END 307",
		"probe":  protocol.HealthUnavailable,
	}
	clients := []struct {
		name string
		opts func() adapter.Options
	}{
		{"own clients", func() adapter.Options { return adapter.Options{} }},
		{"injected client", func() adapter.Options { return adapter.Options{HTTPClient: &http.Client{}} }},
	}
	for _, c := range clients {
		for _, r := range rows {
			for _, p := range paths {
				if strings.HasPrefix(r.name, "ollama") && p.name == "tunnel" {
					continue // tunnels drive openai_compat providers
				}
				t.Run(c.name+"/"+r.name+"/"+p.name, func(t *testing.T) {
					o := c.opts()
					o.LookupEnv, o.AllowEnv = env, allow
					s := newSet(t, o, r.adapter())
					location.Store(r.location)
					before := len(elsewhere.requests())
					if got := p.do(t, s); got != want[p.name] {
						t.Errorf("caller got %q, want %q", got, want[p.name])
					}
					if n := len(elsewhere.requests()) - before; n != 0 {
						t.Errorf("T4: the redirect was followed: %d requests reached %s (headers %v)", n, r.location, elsewhere.requests()[before].Header)
					}
				})
			}
		}
	}
}
