package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	nodeconfig "iop/internal/node/config"
	"iop/internal/proctest"
)

// managedModels are the demo backend's catalogue names used as managed
// models (the demo serves the model its -models flag names).
var managedModels = []string{"tiny", "tiny-tool", "tiny-loop"}

// managedEntry is a node config managed[] entry running the demo backend
// binary demo as a llama-server stand-in loading for loadDelay.
func managedEntry(t testing.TB, demo string, ports [2]int, loadDelay time.Duration, idleMs, maxLoaded int) map[string]any {
	dir := t.TempDir()
	models := map[string]string{}
	for _, m := range managedModels {
		f := filepath.Join(dir, m+".gguf")
		if err := os.WriteFile(f, []byte("GGUF"), 0o600); err != nil {
			t.Fatal(err)
		}
		models[m] = f
	}
	return map[string]any{
		"name":    "llama",
		"command": []string{demo, "-listen", "127.0.0.1:{port}", "-models", "{name}", "-token-delay", "1ms", "-load-delay", loadDelay.String()},
		"models":  models, "idle_unload_ms": idleMs, "max_loaded": maxLoaded, "ready_timeout_ms": 30000,
		"port_range": ports[:],
	}
}

// managedNodeJSON is node id's config with one managed backend.
func managedNodeJSON(t testing.TB, p pkiDir, id, edgeAddr string, entry map[string]any) []byte {
	raw, err := json.Marshal(map[string]any{
		"node_id": id, "edge_addr": edgeAddr,
		"tls": map[string]string{
			"cert_file": p.file(identity.CertFileName(id)), "key_file": p.file(identity.KeyFileName(id)),
			"ca_file": p.file(identity.CACertFile), "expected_edge_name": edgeName,
		},
		"reconnect": map[string]int{"interval_sec": 1, "max_attempts": 0},
		"managed":   []any{entry},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// managedEdge is an edge config whose node gpu-1 has adapter "llama"
// naming the node's managed backend, and one model group per model.
func managedEdge(t testing.TB, p pkiDir) *config.Config {
	a := compatAdapter("llama", "http://127.0.0.1:1", 8) // base_url unused: the processes' ports are the node's
	a.Managed = "llama"
	var groups []config.Model
	for _, m := range managedModels {
		groups = append(groups, modelGroup(m, provider("gpu-1", "llama", m)))
	}
	return edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{a}}}, groups, nil)
}

// demoProcs lists the live processes running binary bin (zombies not
// counted) with their -models argument.
func demoProcs(t testing.TB, bin string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) == 0 || args[0] != bin {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
		}
		for i, a := range args {
			if a == "-models" && i+1 < len(args) {
				out[pid] = args[i+1]
			}
		}
	}
	return out
}

// U2, U3, U4: the demo backend run as a managed process: the first request
// for a model starts its process (the request waits out its load), three
// models with room for two are served in turn with no failed request (a
// model with a request in flight is never stopped: its requests would
// fail), never more than two processes at once, and a model without
// requests for idle_unload_ms is stopped.
func TestManagedDemoBackend(t *testing.T) {
	leakcheck.Check(t)
	demo := proctest.BuildPackage(t, "iop/internal/demo/backendcmd", "demo-backend")
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	cfg := managedEdge(t, p)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	ncfg, err := nodeconfig.Parse(managedNodeJSON(t, p, "gpu-1", e.nodeAddr, managedEntry(t, demo, [2]int{21300, 21309}, 300*time.Millisecond, 1500, 2)))
	if err != nil {
		t.Fatal(err)
	}
	n := launchNode(ncfg, nil, logs.logger("node"))
	t.Cleanup(func() {
		if err := n.stop(); err != nil {
			t.Errorf("node: %v", err)
		}
		if left := demoProcs(t, demo); len(left) > 0 {
			t.Errorf("U5: processes left after the node stopped: %v", left)
		}
	})
	adm.waitConnected(t, 10*time.Second, "gpu-1")
	if got := demoProcs(t, demo); len(got) != 0 {
		t.Fatalf("processes before any request: %v", got)
	}

	// U2: the first request starts the model and waits for its load.
	start := time.Now()
	res, err := api.chat(context.Background(), chatRequest{model: "tiny", maxTokens: 4})
	if err != nil || res.status != 200 {
		t.Fatalf("first request: %v %d %s", err, res.status, res.raw)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("U2: the first request took %v, less than the model's 300 ms load", d)
	}
	if got := demoProcs(t, demo); len(got) != 1 || !containsValue(got, "tiny") {
		t.Fatalf("U2: processes after the first request: %v", got)
	}
	// U6: the edge learns that tiny is loaded (and its load time) and the others are not.
	residency := func(want map[string]string) {
		t.Helper()
		eventually(t, 10*time.Second, "residency in /status", func() (bool, string) {
			b, err := adm.get("/status")
			if err != nil {
				return false, err.Error()
			}
			var d struct {
				Nodes []struct {
					Providers []struct {
						Residency []struct {
							Model, State string
							LoadMs       string `json:"load_ms"` // protojson: int64 as a string
						} `json:"residency"`
					} `json:"providers"`
				} `json:"nodes"`
			}
			if err := json.Unmarshal(b, &d); err != nil || len(d.Nodes) != 1 {
				return false, fmt.Sprint(err, string(b))
			}
			got := map[string]string{}
			for _, p := range d.Nodes[0].Providers {
				for _, r := range p.Residency {
					got[r.Model] = r.State
					if r.Model == "tiny" && r.State == "loaded" && (r.LoadMs == "" || r.LoadMs == "0") {
						return false, "tiny loaded without a load time"
					}
				}
			}
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
		})
	}
	residency(map[string]string{"tiny": "loaded", "tiny-loop": "unloaded", "tiny-tool": "unloaded"})

	// U3: three models, room for two, served in turn by concurrent clients.
	var mu sync.Mutex
	failed, served, maxProcs := 0, 0, 0
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() { // samples the process count while the clients run
		defer close(watched)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stopWatch:
				return
			case <-tk.C:
				n := len(demoProcs(t, demo))
				mu.Lock()
				maxProcs = max(maxProcs, n)
				mu.Unlock()
			}
		}
	}()
	var wg sync.WaitGroup
	for c := 0; c < 6; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 6; i++ {
				m := managedModels[(c+i)%3]
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				r, err := api.chat(ctx, chatRequest{model: m, maxTokens: 8, stream: i%2 == 0})
				cancel()
				mu.Lock()
				if err != nil || r.status != 200 || len(r.errs) > 0 {
					failed++
					t.Errorf("U3: %s: %v %d %s", m, err, r.status, r.raw)
				} else {
					served++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stopWatch)
	<-watched
	if failed != 0 || served != 36 {
		t.Fatalf("U3: %d served, %d failed", served, failed)
	}
	if maxProcs > 2 {
		t.Fatalf("U3: %d processes at once with max_loaded 2", maxProcs)
	}
	evictions := countLines(logs, "managed model stopping", "reason=evict")
	if evictions == 0 {
		t.Fatalf("U3: three models in turn with room for two evicted nothing")
	}
	t.Logf("U3: 36 requests over 3 models, room for 2: 0 failed, %d evictions, at most %d processes", evictions, maxProcs)

	// U4: idle for idle_unload_ms (1.5 s), every model is stopped.
	if _, err := logs.recs.waitFor(20*time.Second, func(lines []string) bool {
		return countIn(lines, "managed model stopped") >= countIn(lines, "managed model loaded")
	}); err != nil {
		t.Fatalf("U4: the idle models were not stopped: %v", err)
	}
	if countLines(logs, "managed model stopping", "reason=idle") == 0 {
		t.Fatal("U4: no idle unload")
	}
	if got := demoProcs(t, demo); len(got) != 0 {
		t.Fatalf("U4: processes after the idle unload: %v", got)
	}
	residency(map[string]string{"tiny": "unloaded", "tiny-loop": "unloaded", "tiny-tool": "unloaded"})

	// U8: the edge's /metrics counts what the node's log says happened.
	eventually(t, 10*time.Second, "model counters in /metrics", func() (bool, string) {
		b, err := adm.get("/metrics")
		if err != nil {
			return false, err.Error()
		}
		sum := func(name string) (n int) {
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, name+"{") {
					var v int
					fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
					n += v
				}
			}
			return n
		}
		loads, evicted, idle := sum("iop_edge_model_loads_total"), sum("iop_edge_model_evictions_total"), sum("iop_edge_model_idle_unloads_total")
		wantLoads := countLines(logs, "managed model loaded")
		got := fmt.Sprintf("loads %d (log %d) evictions %d (log %d) idle %d (log %d)", loads, wantLoads, evicted, evictions,
			idle, countLines(logs, "managed model stopping", "reason=idle"))
		return loads == wantLoads && evicted == evictions && idle == countLines(logs, "managed model stopping", "reason=idle") &&
			strings.Contains(string(b), "iop_edge_model_load_seconds_total{"), got
	})
}

func containsValue(m map[int]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

func countIn(lines []string, subs ...string) int {
	n := 0
	for _, l := range lines {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			n++
		}
	}
	return n
}

func countLines(logs *logSink, subs ...string) int {
	lines, _ := logs.recs.snapshot()
	return countIn(lines, subs...)
}

// U5: kill -9 of the node binary leaves no model process behind (the
// parent-death signal of the managed processes).
func TestManagedNodeKill9LeavesNoChild(t *testing.T) {
	leakcheck.Check(t)
	demo := proctest.BuildPackage(t, "iop/internal/demo/backendcmd", "demo-backend")
	nodeBin := proctest.BuildPackage(t, "iop/node", "node")
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	e := startEdge(t, managedEdge(t, p), nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	cfgFile := filepath.Join(t.TempDir(), "node.json")
	if err := os.WriteFile(cfgFile, managedNodeJSON(t, p, "gpu-1", e.nodeAddr, managedEntry(t, demo, [2]int{21350, 21359}, 50*time.Millisecond, 600000, 2)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nodeBin, "-config", cfgFile)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // the node's log, into the sink (ends when the node dies)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.logger("node-bin").Info(sc.Text())
		}
	}()
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	adm.waitConnected(t, 20*time.Second, "gpu-1")
	for _, m := range managedModels[:2] {
		if res, err := api.chat(context.Background(), chatRequest{model: m, maxTokens: 4}); err != nil || res.status != 200 {
			t.Fatalf("%s: %v %d %s", m, err, res.status, res.raw)
		}
	}
	children := demoProcs(t, demo)
	if len(children) != 2 {
		t.Fatalf("model processes: %v, want 2", children)
	}
	for pid := range children {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) < 2 || f[1] != strconv.Itoa(cmd.Process.Pid) {
			t.Fatalf("process %d's parent is not the node %d: %q", pid, cmd.Process.Pid, st)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	killed = true
	// No event tells a non-parent that a process ended: poll /proc, bounded.
	err := poll(10*time.Second, func() (bool, string) {
		left := demoProcs(t, demo)
		return len(left) == 0, fmt.Sprint(left)
	})
	if err != nil {
		for pid := range demoProcs(t, demo) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Fatalf("U5: model processes outlived kill -9 of the node: %v", err)
	}
}

// U6, U7, U8 through a real edge and node, the demo backend speaking
// Ollama's /api/tags, /api/ps and /api/chat: the edge learns the models
// (unloaded), then that tiny is loaded after a request whose keep_alive
// is the adapter's (a 1 s one here), then that it is unloaded again when
// its expires_at passed — nothing asked — with the idle unload counted on
// /metrics.
func TestOllamaResidencyThroughTheEdge(t *testing.T) {
	leakcheck.Check(t)
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	p := newPKI(t, "gpu-1")
	a := ollamaAdapter("ollama", url, 4)
	a.KeepAlive = "1s"
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{a}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, func(c *config.Config) {
			c.ModelDiscovery = []config.ModelDiscovery{{Node: "gpu-1", Provider: "ollama"}} // residency comes with discovery (U7)
		})
	e := startEdge(t, cfg, nil, nil)
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	startNode(t, p, "gpu-1", e.nodeAddr, nodeOpts{})
	adm.waitConnected(t, 10*time.Second, "gpu-1")
	states := func(want string) {
		t.Helper()
		eventually(t, 10*time.Second, "tiny "+want+" in /status", func() (bool, string) {
			st := statusStates(adm)
			return st["tiny"] == want && st["tiny:latest"] == want, fmt.Sprint(st)
		})
	}
	states("unloaded")
	if res, err := api.chat(context.Background(), chatRequest{model: "tiny", maxTokens: 4}); err != nil || res.status != 200 {
		t.Fatalf("chat: %v %d %s", err, res.status, res.raw)
	}
	states("loaded")
	states("unloaded")
	eventually(t, 10*time.Second, "the idle unload on /metrics", func() (bool, string) {
		b, err := adm.get("/metrics")
		if err != nil {
			return false, err.Error()
		}
		want := `iop_edge_model_idle_unloads_total{node="gpu-1",provider="ollama",model="tiny"} 1`
		return strings.Contains(string(b), want+"\n"), "no " + want
	})
}
