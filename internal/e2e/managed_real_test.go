package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/leakcheck"
	nodeconfig "iop/internal/node/config"
)

// realLlamaServer is the real-backends kit's llama-server and its models
// (IOP_LLAMA_SERVER and IOP_REAL_DIR override), or a reason to skip.
func realLlamaServer() (bin string, models map[string]string, skip string) {
	dir := os.Getenv("IOP_REAL_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "iop-real")
	}
	bin = os.Getenv("IOP_LLAMA_SERVER")
	if bin == "" {
		bin = filepath.Join(dir, "src", "llama.cpp", "build", "bin", "llama-server")
	}
	if _, err := os.Stat(bin); err != nil {
		return "", nil, "no llama-server built (" + bin + "): run the real-backends kit's build.sh, or set IOP_LLAMA_SERVER"
	}
	models = map[string]string{}
	for _, m := range managedModels {
		f := filepath.Join(dir, m+".gguf")
		if _, err := os.Stat(f); err != nil {
			return "", nil, "no model " + f
		}
		models[m] = f
	}
	return bin, models, ""
}

// firstToken posts a streamed chat request for model and returns the time
// to its first SSE data line and the whole request's time.
func firstToken(api *apiClient, model string) (ttft, total time.Duration, err error) {
	body := chatRequest{model: model, stream: true, maxTokens: 8}.body()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := api.hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, 0, fmt.Errorf("%s: status %d", model, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") && ttft == 0 {
			ttft = time.Since(start)
		}
		if sc.Text() == "data: [DONE]" {
			break
		}
	}
	return ttft, time.Since(start), sc.Err()
}

// beladyHits is the warm hits an offline-optimal cache of size k (evict
// the model used furthest in the future) gets on seq.
func beladyHits(seq []string, k int) int {
	cache := map[string]bool{}
	hits := 0
	for i, m := range seq {
		if cache[m] {
			hits++
			continue
		}
		if len(cache) == k {
			victim, far := "", -1
			for c := range cache {
				next := len(seq) + 1
				for j := i + 1; j < len(seq); j++ {
					if seq[j] == c {
						next = j
						break
					}
				}
				if next > far || next == far && c < victim {
					victim, far = c, next
				}
			}
			delete(cache, victim)
		}
		cache[m] = true
	}
	return hits
}

// mixedSequence is a workload over the three models: runs of 1-4 turns
// of one model (a conversation's turns), the models chosen 50/30/20 by a
// fixed generator.
func mixedSequence(n int) []string {
	rnd := uint64(7)
	next := func(k int) int { rnd = rnd*6364136223846793005 + 1442695040888963407; return int(rnd>>33) % k }
	var seq []string
	for len(seq) < n {
		m := managedModels[0]
		switch r := next(10); {
		case r >= 8:
			m = managedModels[2]
		case r >= 5:
			m = managedModels[1]
		}
		for k := 1 + next(4); k > 0 && len(seq) < n; k-- {
			seq = append(seq, m)
		}
	}
	return seq
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// U2, U3, U6 with the real llama-server as the managed process (skipped
// with the reason when the kit did not build it): cold start → first token
// against a warm request; a mixed workload over three models with room for
// two, every request answered, its warm hits against an offline-optimal
// (Belady) cache of two; and what the managed path adds per warm request
// against an unmanaged adapter on an already running llama-server of the
// same model (IOP_OPENAI_URL, the kit's :18080 tiny). The figures are
// logged (BENCHMARKS.md, "Managed models").
func TestManagedRealLlamaServer(t *testing.T) {
	bin, models, skip := realLlamaServer()
	if skip != "" {
		t.Skip(skip)
	}
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	a := compatAdapter("llama", "http://127.0.0.1:1", 4)
	a.Managed = "llama"
	nodes := []config.Adapter{a}
	groups := []config.Model{}
	for _, m := range managedModels {
		groups = append(groups, modelGroup(m, provider("gpu-1", "llama", m)))
	}
	unmanagedURL := os.Getenv("IOP_OPENAI_URL")
	if unmanagedURL == "" {
		unmanagedURL = "http://127.0.0.1:18080"
	}
	if resp, err := http.Get(unmanagedURL + "/health"); err == nil {
		resp.Body.Close()
		nodes = append(nodes, compatAdapter("plain", unmanagedURL, 4))
		groups = append(groups, modelGroup("tiny-plain", provider("gpu-1", "plain", "tiny")))
	} else {
		unmanagedURL = ""
	}
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: nodes}}, groups, nil)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	entry := map[string]any{
		"name":    "llama",
		"command": []string{bin, "-m", "{model}", "-a", "{name}", "--jinja", "--host", "127.0.0.1", "--port", "{port}", "-c", "2048", "-t", "1", "-np", "1"},
		"models":  models, "idle_unload_ms": 600000, "max_loaded": 2, "ready_timeout_ms": 60000,
		"port_range": []int{21360, 21369},
	}
	ncfg, err := nodeconfig.Parse(managedNodeJSON(t, p, "gpu-1", e.nodeAddr, entry))
	if err != nil {
		t.Fatal(err)
	}
	n := launchNode(ncfg, nil, logs.logger("node"))
	t.Cleanup(func() {
		if err := n.stop(); err != nil {
			t.Errorf("node: %v", err)
		}
		if left := demoProcs(t, bin); len(left) > 0 {
			t.Errorf("U5: llama-server processes left after the node stopped: %v", left)
		}
	})
	adm.waitConnected(t, 10*time.Second, "gpu-1")

	// Cold start → first token, then warm.
	cold, _, err := firstToken(api, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	var warm []time.Duration
	for i := 0; i < 10; i++ {
		d, _, err := firstToken(api, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		warm = append(warm, d)
	}
	t.Logf("FIGURE cold start to first token %v; warm first token median %v (10 requests)", cold.Round(time.Millisecond), median(warm).Round(time.Millisecond))
	if cold <= median(warm) {
		t.Errorf("U2: the cold request (%v) was not slower than the warm ones (%v): did it load?", cold, median(warm))
	}

	// Mixed workload, three models, room for two.
	seq := mixedSequence(60)
	loadsBefore := countLines(logs, "managed model loaded")
	failed := 0
	for _, m := range seq {
		if _, _, err := firstToken(api, m); err != nil {
			failed++
			t.Errorf("U3: %s: %v", m, err)
		}
	}
	loads := countLines(logs, "managed model loaded") - loadsBefore
	// The sequence starts with tiny loaded (and nothing else): an offline
	// cache of two starting the same way.
	best := beladyHits(append([]string{"tiny"}, seq...), 2) - 1 // its first hit is the warm-up's tiny
	hits := len(seq) - loads
	t.Logf("FIGURE mixed workload: %d requests over 3 models, max_loaded 2: %d failed, %d loads, %d warm hits; offline-optimal (Belady) %d warm hits: %.1f%%",
		len(seq), failed, loads, hits, best, 100*float64(hits)/float64(best))
	if failed != 0 {
		t.Fatalf("U3: %d failed", failed)
	}
	if 10*hits < 9*best {
		t.Errorf("U3: %d warm hits, below 90%% of the offline-optimal %d", hits, best)
	}

	// Per-request overhead of the managed path on a warm model.
	if unmanagedURL == "" {
		t.Logf("no unmanaged llama-server at IOP_OPENAI_URL: overhead not measured")
		return
	}
	var mg, um []time.Duration
	for i := 0; i < 20; i++ {
		_, d1, err1 := firstToken(api, "tiny")
		_, d2, err2 := firstToken(api, "tiny-plain")
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		mg, um = append(mg, d1), append(um, d2)
	}
	t.Logf("FIGURE warm request (stream, 8 tokens) median: managed %v, unmanaged %v (20 each, interleaved)", median(mg).Round(100*time.Microsecond), median(um).Round(100*time.Microsecond))
}
