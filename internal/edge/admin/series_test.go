package admin

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/access"
)

// GET /series serves the rings as JSON on the admin listener, and the page
// carries the charts that poll it (no external asset: TestPage); without
// a source it is a 404.
func TestSeriesEndpoint(t *testing.T) {
	now := time.Unix(1767225605, 0)
	s := access.NewSeries(func() time.Time { return now })
	s.Sample(now, []string{"tiny"}, []access.ProviderSample{{ProviderKey: access.ProviderKey{Node: "gpu-1", Provider: "ollama"}, InFlight: 2, Capacity: 8}})
	s.Observe(&access.Record{Start: now.Add(-time.Second), Duration: 500 * time.Millisecond, Model: "tiny", Known: true,
		Outcome: access.OK, TTFB: 20 * time.Millisecond, CompletionTokens: 5})
	srv := httptest.NewServer(New(Options{Status: status(), Series: s}))
	defer srv.Close()
	resp, body := get(t, srv.URL+"/series")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("GET /series: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"))
	}
	var v struct {
		NowMs  int64 `json:"now_ms"`
		Models []struct {
			Name     string     `json:"name"`
			Requests []*float64 `json:"requests_per_s"`
		} `json:"models"`
		Providers []struct {
			Provider string     `json:"provider"`
			Capacity []*float64 `json:"capacity"`
		} `json:"providers"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/series: %v\n%s", err, body)
	}
	if v.NowMs != now.UnixMilli() || len(v.Models) != 1 || v.Models[0].Name != "tiny" || len(v.Providers) != 1 {
		t.Fatalf("/series: %s", body)
	}
	if r := v.Models[0].Requests[access.SeriesSlots-1]; r == nil || *r != 0.2 { // 1 request over the 5 s of the slot
		t.Errorf("requests/s of the newest slot: %v", r)
	}
	if c := v.Providers[0].Capacity[access.SeriesSlots-1]; c == nil || *c != 8 {
		t.Errorf("capacity: %v", c)
	}
	_, page := get(t, srv.URL+"/")
	for _, want := range []string{`id="charts"`, `fetch("series"`, `class: "chart"`, "dataset.points", `id="provider-charts"`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	bare := httptest.NewServer(New(Options{Status: status()}))
	defer bare.Close()
	if r, _ := get(t, bare.URL+"/series"); r.StatusCode != 404 {
		t.Errorf("GET /series without a source: %d, want 404", r.StatusCode)
	}
}
