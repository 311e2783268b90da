package api

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// fallbackFleet: big on n1/ollama (capacity 1) falls back to small
// (n2/ollama) on unavailable and queue_full, and when its predicted wait
// passes 200 ms; small falls back to hosted (n3/hosted, a remote API) when
// unavailable. rename is what big's entry renames the answer to.
func fallbackFleet(rename string) (*config.Config, pool.Config) {
	cfg := testConfig(nil)
	cfg.Nodes = []config.Node{{ID: "n1", Adapters: []config.Adapter{{Name: "ollama"}}}, {ID: "n2", Adapters: []config.Adapter{{Name: "ollama"}}},
		{ID: "n3", Adapters: []config.Adapter{{Name: "hosted", Location: config.LocationRemote}}}}
	cfg.Models = []config.Model{
		{Name: "big", Providers: []config.ModelProvider{{Node: "n1", Provider: "ollama", Target: "big:70b"}},
			Fallbacks: []config.Fallback{{Model: "small", On: []string{config.OnUnavailable, config.OnQueueFull}, WaitMs: 200, RenameModel: rename}}},
		{Name: "small", Providers: []config.ModelProvider{{Node: "n2", Provider: "ollama", Target: "small:1b"}},
			Fallbacks: []config.Fallback{{Model: "hosted", On: []string{config.OnUnavailable}}}},
		{Name: "hosted", Providers: []config.ModelProvider{{Node: "n3", Provider: "hosted", Target: "gpt"}}},
	}
	res := func(node, prov string) pool.Resource {
		return pool.Resource{Key: pool.Key{Node: node, Provider: prov}, Type: protocol.TypeOllama, Capacity: 1, LongCapacity: 1,
			Operations: []string{protocol.OpChatCompletions}}
	}
	cand := func(node, prov, target string, remote bool) []pool.Candidate {
		return []pool.Candidate{{Key: pool.Key{Node: node, Provider: prov}, Target: target, StallTimeoutMs: 60000, Remote: remote}}
	}
	pc := pool.Config{Nodes: []string{"n1", "n2", "n3"}, Resources: []pool.Resource{res("n1", "ollama"), res("n2", "ollama"), res("n3", "hosted")},
		Groups: []pool.Group{{Name: "big", Candidates: cand("n1", "ollama", "big:70b", false), Timed: true},
			{Name: "small", Candidates: cand("n2", "ollama", "small:1b", false)},
			{Name: "hosted", Candidates: cand("n3", "hosted", "gpt", true)}},
		MaxWaiters: 4, WaitTimeout: 20 * time.Millisecond}
	return cfg, pc
}

// SPEC V1, V2, V3: a request for a group that cannot serve it goes down the
// group's fallbacks on arrival, to the real pool's group states: the
// fallback group's provider serves it, the run path's answer names the
// group the client asked for (or the entry's rename_model), the
// Iop-Served-Model header names the group that served it, and
// iop_edge_fallbacks_total counts it; a key whose scope does not admit the
// fallback group, or a local-only key whose only fallback is remote, gets
// the named group's own answer (here its wait timeout, 503).
func TestFallback(t *testing.T) {
	for _, row := range []struct {
		name      string
		ready     []string // nodes up
		busyBig   bool     // big's one slot held
		key       string
		rename    string
		wantNode  string // the node that served, "" = none
		wantModel string // the response's model
		wantServe string // Iop-Served-Model
		wantCount string // the fallbacks series counted, "" = none
		wantCode  int
	}{
		{name: "V1 big unavailable: small serves it, the answer says big", ready: []string{"n2", "n3"}, key: "any",
			wantNode: "n2", wantModel: "big", wantServe: "small", wantCount: `from="big",to="small",reason="unavailable"`, wantCode: 200},
		{name: "V1 rename_model names the answer", ready: []string{"n2", "n3"}, key: "any", rename: "big-lite",
			wantNode: "n2", wantModel: "big-lite", wantServe: "small", wantCount: `from="big",to="small",reason="unavailable"`, wantCode: 200},
		{name: "V1 big healthy: no fallback", ready: []string{"n1", "n2", "n3"}, key: "any",
			wantNode: "n1", wantModel: "big", wantServe: "big", wantCode: 200},
		{name: "V1 big full, predicted wait over wait_ms (1 s prior): small", ready: []string{"n1", "n2", "n3"}, busyBig: true, key: "any",
			wantNode: "n2", wantModel: "big", wantServe: "small", wantCount: `from="big",to="small",reason="wait_ms"`, wantCode: 200},
		{name: "V1 two hops: big and small down, hosted serves it", ready: []string{"n3"}, key: "any",
			wantNode: "n3", wantModel: "big", wantServe: "hosted", wantCount: `from="big",to="hosted",reason="unavailable"`, wantCode: 200},
		{name: "V2 a key scoped to big never reaches small", ready: []string{"n2", "n3"}, key: "big-only", wantCode: 503},
		{name: "V3 a local-only key never reaches hosted through the chain", ready: []string{"n3"}, key: "site", wantCode: 503},
		{name: "V3 a local-only key reaches the local fallback", ready: []string{"n2", "n3"}, key: "site",
			wantNode: "n2", wantModel: "big", wantServe: "small", wantCount: `from="big",to="small",reason="unavailable"`, wantCode: 200},
	} {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			cfg, pc := fallbackFleet(row.rename)
			p := pool.New(pc, nil)
			for i, n := range row.ready {
				p.NodeReady(n, uint64(i+1))
			}
			if row.busyBig {
				l, err := p.Acquire(t.Context(), pool.Request{Model: "big", Operation: protocol.OpChatCompletions})
				if err != nil {
					t.Fatal(err)
				}
				defer p.Release(l)
			}
			st := keystore.New()
			sec := map[string]string{}
			for _, s := range []keystore.Spec{{Name: "any"}, {Name: "big-only", Models: []string{"big"}}, {Name: "site", LocalOnly: true}} {
				k, err := st.Create(s, fixedNow().Add(-time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				sec[s.Name] = k
			}
			set, err := keys.Build(nil, st, true, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := &rig{p: p, fp: newFakePool(""), st: newFakeStream("run-1"), cfg: cfg}
			r.d = newFakeDispatcher(r.st)
			r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(), Keys: keys.New(set)})
			r.srv = httptest.NewServer(r.h)
			t.Cleanup(r.srv.Close)
			t.Cleanup(r.srv.Client().CloseIdleConnections)
			t.Cleanup(r.st.kill)
			r.st.run(evStart(), evComplete(2, "hi", "stop", nil, nil))
			resp, body := r.do(t, "POST", "/v1/chat/completions", `{"model":"big","messages":[{"role":"user","content":"hi"}]}`,
				"Authorization", "Bearer "+sec[row.key])
			if resp.StatusCode != row.wantCode {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, row.wantCode, body)
			}
			samples := r.h.ex.FallbackSamples()
			if row.wantCount == "" && len(samples) > 0 || row.wantCount != "" && (len(samples) != 1 || samples[row.wantCount] != 1) {
				t.Errorf("iop_edge_fallbacks_total %v, want %s 1", samples, row.wantCount)
			}
			if row.wantNode == "" {
				if len(r.d.targets) != 0 {
					t.Fatalf("dispatched to %v, want nowhere", r.d.targets)
				}
				return
			}
			if len(r.d.targets) != 1 || r.d.targets[0].Node != row.wantNode {
				t.Fatalf("dispatched to %v, want node %s", r.d.targets, row.wantNode)
			}
			var got struct{ Model string }
			if err := json.Unmarshal([]byte(body), &got); err != nil || got.Model != row.wantModel {
				t.Errorf("response model %q (%v), want %q: %s", got.Model, err, row.wantModel, body)
			}
			if h := resp.Header.Get("Iop-Served-Model"); h != row.wantServe {
				t.Errorf("Iop-Served-Model %q, want %q", h, row.wantServe)
			}
			if !strings.Contains(body, `"hi"`) {
				t.Errorf("body %s", body)
			}
		})
	}
}
