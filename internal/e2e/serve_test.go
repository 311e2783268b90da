package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// checkOffline asserts the N3 projection of a configured node without a
// ready generation: connected=false, no ready_since, and every provider
// status=unavailable, health=offline with all numbers 0.
func checkOffline(t *testing.T, d statusDoc, id string, providers ...string) {
	t.Helper()
	n, ok := d.node(id)
	if !ok {
		t.Fatalf("N3: /status lacks configured node %q: %+v", id, d)
	}
	if n.Connected || n.ReadySince != "" {
		t.Errorf("N3: node %s connected=%v ready_since=%q, want false and absent", id, n.Connected, n.ReadySince)
	}
	if len(n.Providers) != len(providers) {
		t.Fatalf("N3: node %s has %d providers, want %d (%v)", id, len(n.Providers), len(providers), providers)
	}
	for i, p := range n.Providers {
		want := providerStatus{ProviderID: providers[i], Category: config.CategoryLocalInference, Status: "unavailable", Health: "offline"}
		if p != want {
			t.Errorf("N3: offline provider snapshot = %+v, want %+v", p, want)
		}
	}
}

// TestServeBothPaths drives one node with an ollama adapter (normalized run
// path) and an openai_compat adapter (raw tunnel path) against the demo
// backend, checking /status before ready, while ready and after the fence.
func TestServeBothPaths(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 2), compatAdapter("oa", url, 3)}}},
		[]config.Model{
			modelGroup("tiny", provider("gpu-1", "ollama", "tiny")),
			modelGroup("tiny-oa", provider("gpu-1", "oa", "tiny")),
		},
		func(c *config.Config) { c.Queue.WaitTimeoutMs = 300 })
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm := newAdminClient(t, e)
	events := adm.subscribeEvents(t)
	api := newAPIClient(t, e)

	// N3, L3, P3: configured but never connected.
	checkOffline(t, adm.mustStatus(t), "gpu-1", "ollama", "oa")

	n := startNode(t, p, "gpu-1", e.nodeAddr, nodeOpts{log: logs.logger("node")})
	d := adm.waitConnected(t, 10*time.Second, "gpu-1")

	// N3: after ready the same identities return with configured capacity.
	ns, _ := d.node("gpu-1")
	if _, err := time.Parse(time.RFC3339, ns.ReadySince); err != nil {
		t.Errorf("N3: ready_since %q is not RFC 3339: %v", ns.ReadySince, err)
	}
	wantReady := []providerStatus{
		{ProviderID: "ollama", Category: "local_inference", Status: "available", Health: "healthy", Capacity: 2, LongCapacity: 2},
		{ProviderID: "oa", Category: "local_inference", Status: "available", Health: "healthy", Capacity: 3, LongCapacity: 3},
	}
	if len(ns.Providers) != 2 || ns.Providers[0] != wantReady[0] || ns.Providers[1] != wantReady[1] {
		t.Errorf("N3: ready providers = %+v, want %+v", ns.Providers, wantReady)
	}
	if _, err := events.waitFor(5*time.Second, func(es []nodeEvent) bool {
		return len(es) >= 1 && es[0].Type == "node.connected" && es[0].Node == "gpu-1"
	}); err != nil {
		t.Errorf("N4, L5: no node.connected event for gpu-1: %v", err)
	}

	cases := []struct {
		name, model, upstreamPath string
		stream                    bool
	}{
		{"Q3 run path (ollama) non-stream", "tiny", "/api/chat", false},
		{"Q3 run path (ollama) stream", "tiny", "/api/chat", true},
		{"Q3 T2 tunnel path (openai_compat) non-stream", "tiny-oa", "/v1/chat/completions", false},
		{"Q3 T2 tunnel path (openai_compat) stream", "tiny-oa", "/v1/chat/completions", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := bp.ends.snapshot()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := api.chat(ctx, chatRequest{model: tc.model, stream: tc.stream})
			if err != nil {
				t.Fatal(err)
			}
			if res.status != http.StatusOK || res.text != answer || res.finish != "stop" || len(res.errs) > 0 {
				t.Fatalf("got status %d text %q finish %q errors %v, want 200 %q stop none; body:\n%s",
					res.status, res.text, res.finish, res.errs, answer, res.raw)
			}
			if tc.stream && (!res.done || res.chunks < 2) {
				t.Errorf("stream: [DONE]=%v chunks=%d, want [DONE] and one chunk per token", res.done, res.chunks)
			}
			got := bp.waitEnd(t, 5*time.Second, "backend request end", func(e backend.RequestEnd) bool { return e.Seq > uint64(len(before)) })
			if got.Path != tc.upstreamPath || got.Outcome != backend.OutcomeOK {
				t.Errorf("upstream request %s ended %s, want %s ok", got.Path, got.Outcome, tc.upstreamPath)
			}
		})
	}
	adm.waitGauges(t, 5*time.Second, 0, 0)

	// L8, N3: the node goes away → fenced → offline projection again, and
	// no provider is a candidate any more (503 after the wait timeout).
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "gpu-1 shown disconnected", func() (bool, string) {
		d, err := adm.status()
		if err != nil {
			return false, err.Error()
		}
		ns, _ := d.node("gpu-1")
		return !ns.Connected, "still connected"
	})
	checkOffline(t, adm.mustStatus(t), "gpu-1", "ollama", "oa")
	if _, err := events.waitFor(5*time.Second, func(es []nodeEvent) bool {
		return len(es) >= 2 && es[1].Type == "node.disconnected" && es[1].Node == "gpu-1"
	}); err != nil {
		t.Errorf("N4, L8: no node.disconnected event after the node left: %v", err)
	}
	res, err := api.chat(context.Background(), chatRequest{model: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if res.status != http.StatusServiceUnavailable || len(res.errs) != 1 {
		t.Errorf("Q3, Q4: request with no live provider: status %d body %s, want 503 with an error", res.status, res.raw)
	}
	adm.waitGauges(t, 5*time.Second, 0, 0)
}
