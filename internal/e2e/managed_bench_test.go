package e2e

import (
	"encoding/json"
	"sort"
	"testing"
	"time"

	"iop/internal/leakcheck"
	nodeconfig "iop/internal/node/config"
	"iop/internal/proctest"
)

// statusStates is model → state of every provider's residency in /status.
func statusStates(adm *adminClient) map[string]string {
	b, err := adm.get("/status")
	if err != nil {
		return nil
	}
	var d struct {
		Nodes []struct {
			Providers []struct {
				Residency []struct{ Model, State string } `json:"residency"`
			} `json:"providers"`
		} `json:"nodes"`
	}
	if json.Unmarshal(b, &d) != nil {
		return nil
	}
	out := map[string]string{}
	for _, n := range d.Nodes {
		for _, p := range n.Providers {
			for _, r := range p.Residency {
				out[r.Model] = r.State
			}
		}
	}
	return out
}

// BenchmarkManagedSwitch (SPEC U2, U3, U6; ./run.sh bench managed): the
// demo backend as a managed process (a 300 ms load, max_loaded 1) through
// a real edge and node; each iteration asks for the model that is not
// loaded, so it loads one and evicts the other. Reported: the cold
// request's time to first token (cold-ttft-ms), a warm request's right
// after (warm-ttft-ms), and how long after the cold request's first
// token the edge's /status still had not shown the model loaded and the
// evicted one unloaded (status-lag-ms, /status read every millisecond;
// 0 = it already showed both when the first token arrived). Medians over
// the iterations.
func BenchmarkManagedSwitch(b *testing.B) {
	leakcheck.Check(b)
	demo := proctest.BuildPackage(b, "iop/internal/demo/backendcmd", "demo-backend")
	p := newPKI(b, "gpu-1")
	logs := newLogSink(b)
	e := startEdge(b, managedEdge(b, p), nil, logs.logger("edge"))
	adm, api := newAdminClient(b, e), newAPIClient(b, e)
	ncfg, err := nodeconfig.Parse(managedNodeJSON(b, p, "gpu-1", e.nodeAddr, managedEntry(b, demo, [2]int{21340, 21349}, 300*time.Millisecond, 600000, 1)))
	if err != nil {
		b.Fatal(err)
	}
	n := launchNode(ncfg, nil, logs.logger("node"))
	b.Cleanup(func() {
		if err := n.stop(); err != nil {
			b.Errorf("node: %v", err)
		}
	})
	adm.waitConnected(b, 10*time.Second, "gpu-1")
	if _, _, err := firstToken(api, "tiny-tool"); err != nil {
		b.Fatal(err)
	}
	var cold, warm, lag []float64
	b.ResetTimer()
	for i := range b.N {
		m, other := "tiny", "tiny-tool"
		if i%2 == 1 {
			m, other = other, m
		}
		c, _, err := firstToken(api, m)
		if err != nil {
			b.Fatal(err)
		}
		seen := time.Now()
		deadline := seen.Add(5 * time.Second)
		for {
			st := statusStates(adm)
			if st[m] == "loaded" && st[other] != "loaded" && st[other] != "stopping" {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("U6 /status never showed %s loaded and %s unloaded: %v", m, other, st)
			}
			time.Sleep(time.Millisecond) // the figure's resolution: /status read every ms
		}
		lag = append(lag, float64(time.Since(seen).Microseconds())/1000)
		w, _, err := firstToken(api, m)
		if err != nil {
			b.Fatal(err)
		}
		cold, warm = append(cold, float64(c.Microseconds())/1000), append(warm, float64(w.Microseconds())/1000)
	}
	b.StopTimer()
	med := func(v []float64) float64 { s := append([]float64(nil), v...); sort.Float64s(s); return s[len(s)/2] }
	b.ReportMetric(med(cold), "cold-ttft-ms")
	b.ReportMetric(med(warm), "warm-ttft-ms")
	b.ReportMetric(med(lag), "status-lag-ms")
	b.ReportMetric(0, "ns/op")
}
