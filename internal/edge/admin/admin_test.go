package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/events"
	"iop/internal/edge/pool"
	iop "iop/proto/gen/iop"
)

type fakeStatus struct{ snaps []pool.NodeSnapshot }

func (f fakeStatus) Snapshot() []pool.NodeSnapshot { return f.snaps }
func (f fakeStatus) Stats() (int, int)             { return 3, 1 }

var since = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func status() fakeStatus {
	return fakeStatus{snaps: []pool.NodeSnapshot{
		{Node: "gpu-1", Connected: true, ReadySince: since, Providers: []*iop.ProviderSnapshot{
			{ProviderId: "ollama", Category: "local_inference", Status: "available", Health: "healthy", Capacity: 4, LongCapacity: 1, InFlight: 3},
		}},
		{Node: "gpu-2", Providers: []*iop.ProviderSnapshot{
			{ProviderId: "vllm", Category: "local_inference", Status: "unavailable", Health: "offline"},
		}},
	}}
}

// N3: /status lists every configured node with connected, ready_since only
// while connected, and ProviderSnapshots under their protobuf field names,
// zeros included; never an address or token.
func TestStatus(t *testing.T) {
	srv := httptest.NewServer(New(Options{Status: status()}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var got struct {
		Nodes []struct {
			ID         string           `json:"id"`
			Connected  bool             `json:"connected"`
			ReadySince *string          `json:"ready_since"`
			Providers  []map[string]any `json:"providers"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("status is not JSON: %v: %s", err, body)
	}
	if len(got.Nodes) != 2 {
		t.Fatalf("got %d nodes, want 2: %s", len(got.Nodes), body)
	}
	n1, n2 := got.Nodes[0], got.Nodes[1]
	if !n1.Connected || n1.ReadySince == nil || *n1.ReadySince != "2026-11-29T12:00:00Z" {
		t.Errorf("N3 gpu-1: got connected=%v ready_since=%v", n1.Connected, n1.ReadySince)
	}
	if n2.Connected || n2.ReadySince != nil {
		t.Errorf("N3 gpu-2: got connected=%v ready_since=%v, want false and absent", n2.Connected, n2.ReadySince)
	}
	p := n1.Providers[0]
	for k, want := range map[string]any{"provider_id": "ollama", "capacity": 4.0, "in_flight": 3.0, "long_in_flight": 0.0, "queued": 0.0, "health": "healthy"} {
		if p[k] != want {
			t.Errorf("N3 provider field %s: got %v, want %v", k, p[k], want)
		}
	}
	if off := n2.Providers[0]; off["status"] != "unavailable" || off["health"] != "offline" || off["capacity"] != 0.0 {
		t.Errorf("N3 offline provider: %v", off)
	}
	for _, banned := range []string{"127.0.0.1", "addr", "token", "key"} {
		if strings.Contains(string(body), banned) {
			t.Errorf("N3: status mentions %q: %s", banned, body)
		}
	}
}

func TestMetrics(t *testing.T) {
	bus := &events.Bus{}
	srv := httptest.NewServer(New(Options{Status: status(), Events: bus, Metrics: []Counter{
		{Name: "iop_edge_requests_total", Help: "Requests by status.", Samples: func() map[string]float64 { return map[string]float64{`code="200"`: 7} }},
	}}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("content type %q", ct)
	}
	for _, want := range []string{
		`iop_edge_node_connected{node="gpu-1"} 1`, `iop_edge_node_connected{node="gpu-2"} 0`,
		`iop_edge_provider_in_flight{node="gpu-1",provider="ollama"} 3`,
		"iop_edge_leases 3", "iop_edge_waiters 1", "iop_edge_events_dropped_total 0",
		"# TYPE iop_edge_requests_total counter", `iop_edge_requests_total{code="200"} 7`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// N4: /events streams node events as SSE; the subscription ends with the
// client.
func TestEvents(t *testing.T) {
	bus := &events.Bus{}
	srv := httptest.NewServer(New(Options{Status: status(), Events: bus}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for bus.Subscribers() == 0 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	bus.Publish(events.Event{Type: events.TypeConnected, Node: "gpu-1", Time: since})
	buf := make([]byte, 256)
	n, err := io.ReadAtLeast(resp.Body, buf, 20)
	if err != nil {
		t.Fatal(err)
	}
	got := string(buf[:n])
	if !strings.HasPrefix(got, "event: node.connected\ndata: {\"type\":\"node.connected\",\"node\":\"gpu-1\"") {
		t.Errorf("event: %q", got)
	}
	resp.Body.Close()
	srv.Close()
	if s := bus.Subscribers(); s != 0 {
		t.Errorf("subscribers after the client left: %d, want 0", s)
	}
}

type fakeRouting []pool.GroupRouting

func (f fakeRouting) Routing() []pool.GroupRouting { return f }

var routes = fakeRouting{
	{Model: "tiny", Mode: "prefix_affinity", PrefixHit: 6, Hash: 3, Fallback: 1, Yield: 2},
	{Model: "plain", Mode: "least_loaded"},
}

// A2, R1: /status shows per model group the routing mode and its hit
// ratio; /metrics counts prefix_affinity decisions by result.
func TestRoutingStatusAndMetrics(t *testing.T) {
	srv := httptest.NewServer(New(Options{Status: status(), Routing: routes}))
	defer srv.Close()
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	var st struct {
		Nodes  []json.RawMessage `json:"nodes"`
		Models []struct {
			Name      string            `json:"name"`
			Routing   string            `json:"routing"`
			Decisions map[string]uint64 `json:"decisions"`
			HitRatio  float64           `json:"hit_ratio"`
		} `json:"models"`
	}
	body := get("/status")
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status is not JSON: %v: %s", err, body)
	}
	if len(st.Nodes) != 2 || len(st.Models) != 2 {
		t.Fatalf("status: %d nodes, %d models; want 2, 2: %s", len(st.Nodes), len(st.Models), body)
	}
	m := st.Models[0]
	if m.Name != "tiny" || m.Routing != "prefix_affinity" || m.HitRatio != 0.5 ||
		m.Decisions["prefix_hit"] != 6 || m.Decisions["hash"] != 3 || m.Decisions["fallback"] != 1 || m.Decisions["yield"] != 2 {
		t.Errorf("status models[0] = %+v, want tiny prefix_affinity 6/3/1/2, hit ratio 0.5", m)
	}
	if p := st.Models[1]; p.Routing != "least_loaded" || p.HitRatio != 0 {
		t.Errorf("status models[1] = %+v, want least_loaded, hit ratio 0", p)
	}
	metrics := get("/metrics")
	for _, want := range []string{
		"# TYPE iop_edge_routing_decisions_total counter",
		`iop_edge_routing_decisions_total{model="tiny",result="prefix_hit"} 6`,
		`iop_edge_routing_decisions_total{model="tiny",result="hash"} 3`,
		`iop_edge_routing_decisions_total{model="tiny",result="fallback"} 1`,
		`iop_edge_routing_decisions_total{model="tiny",result="yield"} 2`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, metrics)
		}
	}
	if strings.Contains(metrics, `model="plain"`) {
		t.Errorf("metrics count decisions of a least_loaded group without any:\n%s", metrics)
	}
}

// U8: /metrics shows each reported model that was loaded or counted
// anything — loaded or not, its loads, failures, crashes, evictions, idle
// unloads and summed load seconds — and leaves out a model never touched.
func TestModelMetrics(t *testing.T) {
	st := status()
	st.snaps[0].Providers = append(st.snaps[0].Providers, &iop.ProviderSnapshot{ProviderId: "llama", Residency: []*iop.ModelResidency{
		{Model: "tiny", State: "loaded", LoadMs: 140, Loads: 3, LoadMsTotal: 420, Evictions: 2, IdleUnloads: 1},
		{Model: "tiny-tool", State: "failed", LoadFailures: 4, Crashes: 1},
		{Model: "never-used", State: "unloaded"},
	}})
	srv := httptest.NewServer(New(Options{Status: st}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	const l, lt = `{node="gpu-1",provider="llama",model="tiny"}`, `{node="gpu-1",provider="llama",model="tiny-tool"}`
	for _, want := range []string{
		"# TYPE iop_edge_model_loaded gauge", "iop_edge_model_loaded" + l + " 1", "iop_edge_model_loaded" + lt + " 0",
		"# TYPE iop_edge_model_loads_total counter", "iop_edge_model_loads_total" + l + " 3",
		"iop_edge_model_load_seconds_total" + l + " 0.420", "iop_edge_model_evictions_total" + l + " 2",
		"iop_edge_model_idle_unloads_total" + l + " 1", "iop_edge_model_load_failures_total" + lt + " 4",
		"iop_edge_model_crashes_total" + lt + " 1",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("U8 metrics lack %q:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), "never-used") {
		t.Errorf("U8 an untouched model is listed")
	}
}
