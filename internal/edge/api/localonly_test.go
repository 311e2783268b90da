package api

import (
	"net/http/httptest"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// SPEC V3: /v1/models for a local-only key lists only the groups it can
// reach — those with a route whose adapter is local — on both surfaces
// and for one model; a scope narrows that list further; a key that may
// reach remote adapters sees every group.
func TestModelsLocalOnly(t *testing.T) {
	leakcheck.Check(t)
	cfg := testConfig(nil)
	cfg.Nodes = []config.Node{{ID: "n1", Adapters: []config.Adapter{{Name: "ollama"}, {Name: "llama", Location: config.LocationRemote}}}}
	cfg.Models = append(cfg.Models,
		config.Model{Name: "both", Providers: []config.ModelProvider{{Node: "n1", Provider: "llama", Target: "x"}, {Node: "n1", Provider: "ollama", Target: "x"}}},
		config.Model{Name: "ghost", Providers: []config.ModelProvider{{Node: "n9", Provider: "ollama", Target: "x"}}}) // an unknown node counts as remote
	st := keystore.New()
	sec := map[string]string{}
	for _, s := range []keystore.Spec{{Name: "site", LocalOnly: true}, {Name: "site-scoped", LocalOnly: true, Models: []string{"both", "other"}}, {Name: "anywhere"}} {
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
	r := &rig{fp: newFakePool(protocol.TypeOpenAICompat), st: newFakeStream("run-1"), cfg: cfg}
	r.p, r.d = r.fp, newFakeDispatcher(r.st)
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(), Keys: keys.New(set)})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	t.Cleanup(r.st.kill)
	model := func(id string) string {
		return `{"id":"` + id + `","object":"model","created":1700000000,"owned_by":"iop"}`
	}
	list := func(ids ...string) string {
		b := `{"object":"list","data":[`
		for i, id := range ids {
			if i > 0 {
				b += ","
			}
			b += model(id)
		}
		return b + "]}"
	}
	for _, row := range []struct {
		name, key, path string
		wantStatus      int
		wantBody        string
	}{
		{"local-only: the groups with a local route", "site", "/v1/models", 200, list("tiny", "both")},
		{"local-only and scoped: both narrow the list", "site-scoped", "/v1/models", 200, list("both")},
		{"may reach remote adapters: every group", "anywhere", "/v1/models", 200, list("tiny", "other", "both", "ghost")},
		{"local-only: a group served only remotely is not found", "site", "/v1/models/other", 404, ""},
		{"local-only: a group with a local route is found", "site", "/v1/models/both", 200, model("both")},
	} {
		t.Run(row.name, func(t *testing.T) {
			resp, body := r.do(t, "GET", row.path, "", "Authorization", "Bearer "+sec[row.key])
			if resp.StatusCode != row.wantStatus || (row.wantBody != "" && body != row.wantBody) {
				t.Fatalf("got %d %s\nwant %d %s", resp.StatusCode, body, row.wantStatus, row.wantBody)
			}
		})
	}
	resp, body := r.do(t, "GET", "/v1/models", "", "X-Api-Key", sec["site"], "Anthropic-Version", "2023-06-01")
	if resp.StatusCode != 200 || body != string(anthropicModelList([]string{"tiny", "both"}, 1700000000)) {
		t.Fatalf("Anthropic's list for a local-only key: %d %s", resp.StatusCode, body)
	}
}
