package sdk

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Several edges through the binaries (SPEC S1–S5 and L1–L10 per edge, E4,
// N2; docs/operating.md "Several edges"): two bin/edge, one or two bin/node
// each serving both edges (node config edges[]), and a client that behaves
// like an L4 balancer with health checks.

// haEdge is one edge process of an haStack.
type haEdge struct {
	name                  string // certificate name, edge-1 / edge-2
	http, admin, nodeAddr string
	config                string
	p                     *proc
}

// haStack is two edges and nodes serving both, owned by one test.
type haStack struct {
	t       *testing.T
	env     suiteEnv
	dir     string
	edges   []*haEdge
	nodes   []*proc
	nodeIDs []string
	hc      *http.Client
	// edgeCfg builds edge i's config (its addresses and certificate
	// filled in by newHAStack).
	edgeCfg func(e *haEdge) map[string]any
}

// haAdapters is every node's adapters: native Ollama and the
// OpenAI-compatible tunnel, both on backend.
func haAdapters(backend string, capacity int) []any {
	return []any{
		map[string]any{"name": "ollama", "type": "ollama", "capacity": capacity, "base_url": backend},
		map[string]any{"name": "oa", "type": "openai_compat", "profile": "llamacpp", "capacity": capacity, "base_url": backend},
	}
}

// haEdgeConfig is edge e's config: the demo key, nodes with adapters, and
// models (each a name and its providers as node/adapter pairs, target
// "tiny").
func haEdgeConfig(e *haEdge, nodes map[string][]any, models [][]string) map[string]any {
	sum := sha256.Sum256([]byte(demoKey))
	var ns, ms []any
	ids := make([]string, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ns = append(ns, map[string]any{"id": id, "adapters": nodes[id]})
	}
	for _, m := range models {
		var ps []any
		for _, p := range m[1:] {
			node, adapter, _ := strings.Cut(p, "/")
			ps = append(ps, map[string]any{"node": node, "provider": adapter, "target": "tiny"})
		}
		ms = append(ms, map[string]any{"name": m[0], "providers": ps})
	}
	return map[string]any{
		"http_listen": e.http, "node_listen": e.nodeAddr, "admin_listen": e.admin,
		"tls":      map[string]any{"cert_file": "pki/" + e.name + ".crt", "key_file": "pki/" + e.name + ".key", "ca_file": "pki/ca.crt"},
		"api_keys": []any{map[string]any{"principal": "demo", "key_sha256": hex.EncodeToString(sum[:])}},
		"nodes":    ns, "models": ms,
		"shutdown": map[string]any{"drain_timeout_ms": 3000},
	}
}

// newHAStack mints a PKI with two edge certificates, starts both edges on
// edgeCfg and every node of nodeIDs against both, and waits until every
// node is connected on both edges.
func newHAStack(t *testing.T, nodeIDs []string, edgeCfg func(e *haEdge) map[string]any) *haStack {
	t.Helper()
	env := loadEnv(t)
	checkGoroutines(t)
	s := &haStack{t: t, env: env, dir: t.TempDir(), nodeIDs: nodeIDs, edgeCfg: edgeCfg,
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Second}}
	t.Cleanup(s.shutdown)
	args := []string{"pki", "init", "-dir", filepath.Join(s.dir, "pki"), "-edge", "edge-1", "-edge", "edge-2"}
	for _, n := range nodeIDs {
		args = append(args, "-node", n)
	}
	if out, err := runOnce(filepath.Join(env.bin, "edge"), args...); err != nil {
		t.Fatalf("edge pki init: %v\n%s", err, out)
	}
	ports := freePorts(t, 6)
	for i := range 2 {
		e := &haEdge{name: fmt.Sprint("edge-", i+1), http: ports[3*i], admin: ports[3*i+1], nodeAddr: ports[3*i+2],
			config: filepath.Join(s.dir, fmt.Sprintf("edge-%d.json", i+1))}
		writeJSON(t, e.config, edgeCfg(e))
		s.edges = append(s.edges, e)
		s.startEdge(i)
	}
	for _, id := range nodeIDs {
		cfg := filepath.Join(s.dir, id+".json")
		writeJSON(t, cfg, map[string]any{
			"node_id": id,
			"edges": []any{map[string]any{"addr": s.edges[0].nodeAddr, "name": "edge-1"},
				map[string]any{"addr": s.edges[1].nodeAddr, "name": "edge-2"}},
			"tls":       map[string]any{"cert_file": "pki/" + id + ".crt", "key_file": "pki/" + id + ".key", "ca_file": "pki/ca.crt"},
			"reconnect": map[string]any{"interval_sec": 1, "max_attempts": 0},
		})
		p, err := startProc(id, filepath.Join(env.bin, "node"), "-config", cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.nodes = append(s.nodes, p)
	}
	for i := range s.edges {
		s.waitNodes(i, readyTimeout)
	}
	return s
}

func (s *haStack) startEdge(i int) {
	s.t.Helper()
	e := s.edges[i]
	p, err := startProc(e.name, filepath.Join(s.env.bin, "edge"), "-config", e.config)
	if err != nil {
		s.t.Fatal(err)
	}
	e.p = p
}

// shutdown stops the nodes, the edges and the backend (each exits 0 on
// SIGTERM) and checks their groups are gone.
func (s *haStack) shutdown() {
	t := s.t
	procs := append([]*proc(nil), s.nodes...)
	for _, e := range s.edges {
		procs = append(procs, e.p)
	}
	for _, p := range procs {
		if p == nil {
			continue
		}
		wasRunning := !p.exited()
		code, err := p.stop()
		switch {
		case err != nil:
			t.Errorf("stop: %v", err)
		case wasRunning && code != 0:
			t.Errorf("%s exited %d on SIGTERM, want 0", p.name, code)
		}
		if !p.groupGone(5 * time.Second) {
			t.Errorf("%s: processes of its group are still running after stop", p.name)
		}
	}
	if t.Failed() {
		for _, p := range procs {
			if p != nil {
				t.Logf("---- last lines of %s ----\n%s", p.name, p.log.tail(30))
			}
		}
	}
	s.hc.CloseIdleConnections()
}

// haStatus is the part of an edge's /status these tests read.
type haStatus struct {
	Nodes []struct {
		ID          string `json:"id"`
		Connected   bool   `json:"connected"`
		Generation  uint64 `json:"generation"`
		Config      string `json:"config"`
		ConfigError string `json:"config_error"`
		Providers   []struct {
			ProviderID string `json:"provider_id"`
			Health     string `json:"health"`
			Capacity   int    `json:"capacity"`
		} `json:"providers"`
	} `json:"nodes"`
}

// generations maps each connected node to its generation (0: not connected).
func (d haStatus) generations() map[string]uint64 {
	out := map[string]uint64{}
	for _, n := range d.Nodes {
		if n.Connected {
			out[n.ID] = n.Generation
		} else {
			out[n.ID] = 0
		}
	}
	return out
}

func (s *haStack) status(i int) (haStatus, error) {
	var d haStatus
	resp, err := s.hc.Get("http://" + s.edges[i].admin + "/status")
	if err != nil {
		return d, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return d, err
	}
	if resp.StatusCode != http.StatusOK {
		return d, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return d, json.Unmarshal(b, &d)
}

// waitStatus polls edge i's /status until cond holds or d passes.
func (s *haStack) waitStatus(i int, what string, d time.Duration, cond func(haStatus) bool) haStatus {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for {
		doc, err := s.status(i)
		if err == nil && cond(doc) {
			return doc
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("edge %d: %s: not within %v (last %+v, %v)", i+1, what, d, doc, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval of an HTTP endpoint
	}
}

// waitNodes waits until every node is connected on edge i.
func (s *haStack) waitNodes(i int, d time.Duration) haStatus {
	return s.waitStatus(i, "every node connected", d, func(doc haStatus) bool {
		g := doc.generations()
		for _, id := range s.nodeIDs {
			if g[id] == 0 {
				return false
			}
		}
		return true
	})
}

// metric sums edge i's /metrics samples of family whose labels contain label.
func (s *haStack) metric(i int, family, label string) float64 {
	s.t.Helper()
	resp, err := s.hc.Get("http://" + s.edges[i].admin + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, family) || !strings.Contains(line, label) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// balancer is a client that behaves like an L4 balancer with health
// checks in front of the edges: round robin over the edges whose /healthz
// answered 200 at the last check (every 100 ms); a connection that cannot
// be opened marks the edge down and the request goes to the next edge. A
// connection per request, as a balancer proxies each client connection.
type balancer struct {
	addrs   []string
	healthy []atomic.Bool
	next    atomic.Uint64
	client  *http.Client
	checker *http.Client
}

func newBalancer(addrs []string) *balancer {
	b := &balancer{addrs: addrs, healthy: make([]atomic.Bool, len(addrs)),
		client:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second},
		checker: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 200 * time.Millisecond}}
	for i := range b.healthy {
		b.healthy[i].Store(true)
	}
	return b
}

// check runs the health checks until ctx ends.
func (b *balancer) check(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		for i, a := range b.addrs {
			resp, err := b.checker.Get("http://" + a + "/healthz")
			ok := err == nil && resp.StatusCode == http.StatusOK
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			b.healthy[i].Store(ok)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// outcome is one request through the balancer.
type outcome struct {
	start, end time.Time
	edge       int       // the edge that answered, or the last one tried
	connected  time.Time // when the connection to edge was opened; zero if never
	status     int
	err        error
	body       string
}

func (o outcome) ok() bool {
	return o.err == nil && o.status == http.StatusOK && strings.Contains(o.body, "deterministic")
}

// do sends body to the next healthy edge, and on a failed connect to the
// next one, each edge at most once.
func (b *balancer) do(body string) outcome {
	o := outcome{start: time.Now()}
	first := int(b.next.Add(1))
	for k := range len(b.addrs) {
		i := (first + k) % len(b.addrs)
		if !b.healthy[i].Load() && k < len(b.addrs)-1 {
			continue
		}
		var connected time.Time
		trace := &httptrace.ClientTrace{ConnectDone: func(_, _ string, err error) {
			if err == nil {
				connected = time.Now()
			}
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost,
			"http://"+b.addrs[i]+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+demoKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := b.client.Do(req)
		o.edge, o.connected, o.err = i, connected, err
		if err == nil {
			raw, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			o.status, o.body, o.err = resp.StatusCode, string(raw), rerr
			break
		}
		if !connected.IsZero() {
			break // it reached the edge
		}
		b.healthy[i].Store(false) // a failed connect: the next edge
	}
	o.end = time.Now()
	return o
}

// load sends rate requests a second through b until ctx ends and returns
// every outcome once the last has ended.
func (b *balancer) load(ctx context.Context, rate int, body string) []outcome {
	var mu sync.Mutex
	var out []outcome
	var wg sync.WaitGroup
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return out
		case <-t.C:
			wg.Go(func() {
				o := b.do(body)
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			})
		}
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

const haBody = `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`

// startDemoBackend starts bin/demo-backend with a short token delay (a
// short answer, so 200 requests a second fit the nodes' capacity) and
// returns its URL; it is stopped at cleanup, after the stack.
func startDemoBackend(t *testing.T) string {
	t.Helper()
	env := loadEnv(t)
	if env.realServer() {
		t.Skip("several-edge load tests run against the demo backend (200 requests a second)")
	}
	addr := freePorts(t, 1)[0]
	p, err := startProc("demo-backend", filepath.Join(env.bin, "demo-backend"), "-listen", addr, "-token-delay", "1ms")
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{}
	t.Cleanup(func() {
		hc.CloseIdleConnections()
		if code, err := p.stop(); err != nil || code != 0 {
			t.Errorf("demo-backend stop: exit %d, %v", code, err)
		}
		if !p.groupGone(5 * time.Second) {
			t.Error("demo-backend: processes of its group are still running after stop")
		}
	})
	(&stack{t: t, hc: hc}).waitHTTP("http://"+addr+"/api/tags", 10*time.Second)
	return "http://" + addr
}

// S1–S5, L4, L7, L8 per edge: two edges, two nodes, 200 requests a second
// through an L4-like balancer. kill -9 one edge: no request fails that had
// not reached it (only those whose connection it had accepted); the other
// edge keeps its node sessions (same generations, never disconnected);
// every request after the kill is served by it within 1 s. Restarted, the
// edge gets both nodes back and its share of the traffic.
func TestHAEdgeKill(t *testing.T) {
	backend := startDemoBackend(t)
	s := newHAStack(t, []string{"gpu-1", "gpu-2"}, func(e *haEdge) map[string]any {
		return haEdgeConfig(e, map[string][]any{"gpu-1": haAdapters(backend, 32), "gpu-2": haAdapters(backend, 32)},
			[][]string{{"tiny", "gpu-1/ollama", "gpu-2/ollama"}})
	})
	before := s.waitNodes(1, readyTimeout).generations()

	b := newBalancer([]string{s.edges[0].http, s.edges[1].http})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var bg sync.WaitGroup
	bg.Go(func() { b.check(ctx) })
	results := make(chan []outcome, 1)
	bg.Go(func() { results <- b.load(ctx, 200, haBody) })
	// The survivor's sessions, watched from before the kill to the end.
	var lost atomic.Value
	bg.Go(func() {
		for ctx.Err() == nil {
			if d, err := s.status(1); err == nil {
				for id, g := range d.generations() {
					if g != before[id] {
						lost.CompareAndSwap(nil, fmt.Sprintf("%s generation %d, was %d", id, g, before[id]))
					}
				}
			}
			time.Sleep(50 * time.Millisecond) // poll interval of an HTTP endpoint
		}
	})

	time.Sleep(2500 * time.Millisecond) // load before the kill: the test's schedule, not a wait for an event
	killStart := time.Now()
	s.edges[0].p.signal(syscall.SIGKILL)
	<-s.edges[0].p.done
	killed := time.Now()
	time.Sleep(2500 * time.Millisecond) // the survivor alone
	restart := time.Now()
	s.startEdge(0)
	s.waitNodes(0, 10*time.Second)
	rejoined := time.Now()
	time.Sleep(2500 * time.Millisecond) // both again
	stop()
	bg.Wait()
	out := <-results

	var reached, wrong, slow, afterRejoin, onRestarted int
	var window []time.Duration
	var lastNotSurvivor time.Time
	for _, o := range out {
		if o.start.After(killStart.Add(-2500*time.Millisecond)) && o.start.Before(killStart.Add(2500*time.Millisecond)) && o.ok() {
			window = append(window, o.end.Sub(o.start))
		}
		switch {
		case !o.ok() && o.edge == 0 && !o.connected.IsZero() && o.connected.Before(killed):
			reached++ // it had reached the edge that was killed
		case !o.ok():
			wrong++
			if wrong <= 3 {
				t.Errorf("a request that had not reached the killed edge failed: edge %d, started %v after the kill, status %d, err %v, %s",
					o.edge+1, o.start.Sub(killStart), o.status, o.err, short(o.body))
			}
		}
		if o.start.After(killed) && o.start.Before(restart) {
			if o.end.Sub(o.start) > time.Second {
				slow++
			}
			if !o.ok() || o.edge != 1 {
				lastNotSurvivor = o.end
			}
		}
		if o.start.After(rejoined.Add(500 * time.Millisecond)) {
			afterRejoin++
			if o.ok() && o.edge == 0 {
				onRestarted++
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d requests failed that had not reached the killed edge", wrong, len(out))
	}
	if slow > 0 {
		t.Errorf("%d requests after the kill took over 1 s", slow)
	}
	if v := lost.Load(); v != nil {
		t.Errorf("the surviving edge lost a node session: %v", v)
	}
	if afterRejoin == 0 || onRestarted*4 < afterRejoin {
		t.Errorf("after the restart %d of %d requests went to the restarted edge, want about half", onRestarted, afterRejoin)
	}
	failover := time.Duration(0)
	if !lastNotSurvivor.IsZero() {
		failover = lastNotSurvivor.Sub(killStart)
	}
	t.Logf("FIGURES edge kill at 200 req/s: %d requests; failed %d (all had reached the killed edge); every new request on the survivor %v after the kill; "+
		"p50 %v p99 %v max %v in the 5 s around the kill; nodes back on the restarted edge %v after its start; %d of %d later requests on it",
		len(out), reached, failover.Round(time.Millisecond), percentile(window, 0.5).Round(time.Millisecond), percentile(window, 0.99).Round(time.Millisecond),
		percentile(window, 1).Round(time.Millisecond), rejoined.Sub(restart).Round(time.Millisecond), onRestarted, afterRejoin)
	if len(out) < 1000 {
		t.Errorf("only %d requests in 7.5 s: the load generator fell behind 200 a second", len(out))
	}
}

// countingBackend is an OpenAI-compatible backend in the test process
// that holds each chat completion for hold and counts how many it serves
// at once (the count ends as it starts writing the answer, before the
// node can have read it).
type countingBackend struct {
	now, most atomic.Int64
	hold      time.Duration
}

func (c *countingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		w.Write([]byte(`{"status":"ok","data":[{"id":"tiny"}]}`))
		return
	}
	io.Copy(io.Discard, r.Body)
	n := c.now.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	t := time.NewTimer(c.hold) // the model's work
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
	t.Stop()
	c.now.Add(-1)
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"deterministic"},"finish_reason":"stop"}]}`))
}

// closedLoop runs workers that each send n requests to addr one after
// another; it returns every latency and the failures.
func closedLoop(addr string, workers, n int) (lat []time.Duration, failed []string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range n {
				start := time.Now()
				req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions",
					strings.NewReader(`{"model":"tiny-oa","messages":[{"role":"user","content":"hi"}]}`))
				req.Header.Set("Authorization", "Bearer "+demoKey)
				resp, err := client.Do(req)
				var body []byte
				if err == nil {
					body, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				if err != nil || resp.StatusCode != 200 || !bytes.Contains(body, []byte("deterministic")) {
					failed = append(failed, fmt.Sprintf("%v %s", err, short(string(body))))
				} else {
					lat = append(lat, time.Since(start))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat, failed
}

// E4: one node serving two edges, each offered twice the provider's
// capacity (closed loop): the backend never serves more than the capacity
// at once, every request is answered, the node's over-capacity refusals
// are queued again by the edge that got them and no provider cools.
// Figures: refusals per 1,000 requests and p50 against one edge offered
// the same total.
func TestHATwoEdgesCapacity(t *testing.T) {
	const capacity, perRequest = 4, 20
	cb := &countingBackend{hold: perRequest * time.Millisecond}
	srv := httptest.NewServer(cb)
	defer srv.Close()
	s := newHAStack(t, []string{"gpu-1"}, func(e *haEdge) map[string]any {
		return haEdgeConfig(e, map[string][]any{"gpu-1": {map[string]any{"name": "oa", "type": "openai_compat", "profile": "llamacpp",
			"capacity": capacity, "base_url": srv.URL}}}, [][]string{{"tiny-oa", "gpu-1/oa"}})
	})
	const workers, n = 2 * capacity, 25 // per edge: twice the capacity
	var lat []time.Duration
	var failed []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			l, f := closedLoop(s.edges[i].http, workers, n)
			mu.Lock()
			lat, failed = append(lat, l...), append(failed, f...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("E4: %d of %d requests failed, first: %s", len(failed), 2*workers*n, failed[0])
	}
	if m := cb.most.Load(); m > capacity {
		t.Fatalf("E4: the backend served %d requests at once, want at most %d", m, capacity)
	}
	refusals := 0.0
	for i := range 2 {
		refusals += s.metric(i, "iop_edge_request_retries_total", `reason="over_capacity"`)
		if ej := s.metric(i, "iop_edge_provider_ejections_total", ""); ej != 0 {
			t.Errorf("E4: edge %d ejected a provider %v times", i+1, ej)
		}
		for _, nd := range s.waitNodes(i, time.Second).Nodes {
			for _, p := range nd.Providers {
				if p.Health == "cooling" {
					t.Errorf("E4: edge %d: %s/%s cooling", i+1, nd.ID, p.ProviderID)
				}
			}
		}
	}
	// One edge offered the same total, for the added latency.
	one, oneFailed := closedLoop(s.edges[0].http, 2*workers, n)
	if len(oneFailed) > 0 {
		t.Fatalf("one edge: %d requests failed, first: %s", len(oneFailed), oneFailed[0])
	}
	t.Logf("FIGURES two edges at twice the capacity (%d, %d ms a request): %d requests, %.0f capacity refusals per 1,000, at most %d at the backend; "+
		"p50 %v (one edge offered the same: %v), p99 %v (one edge: %v)",
		capacity, perRequest, len(lat), 1000*refusals/float64(len(lat)), cb.most.Load(),
		percentile(lat, 0.5).Round(time.Millisecond), percentile(one, 0.5).Round(time.Millisecond),
		percentile(lat, 0.99).Round(time.Millisecond), percentile(one, 0.99).Round(time.Millisecond))
}

// N2, L5: one config copied to both edges, reloaded one after the other
// (SIGHUP) with a changed model group and a changed capacity, under load
// through the balancer: no request fails, and both nodes stay ready on
// both edges in their first generation throughout.
func TestHARollingReload(t *testing.T) {
	backend := startDemoBackend(t)
	capacity := 16
	groups := [][]string{{"tiny", "gpu-1/ollama", "gpu-2/ollama"}}
	cfg := func(e *haEdge) map[string]any {
		return haEdgeConfig(e, map[string][]any{"gpu-1": haAdapters(backend, capacity), "gpu-2": haAdapters(backend, capacity)}, groups)
	}
	s := newHAStack(t, []string{"gpu-1", "gpu-2"}, cfg)
	before := []map[string]uint64{s.waitNodes(0, readyTimeout).generations(), s.waitNodes(1, readyTimeout).generations()}

	b := newBalancer([]string{s.edges[0].http, s.edges[1].http})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var bg sync.WaitGroup
	bg.Go(func() { b.check(ctx) })
	results := make(chan []outcome, 1)
	bg.Go(func() { results <- b.load(ctx, 100, haBody) })
	var notReady atomic.Value
	bg.Go(func() {
		for ctx.Err() == nil {
			for i := range 2 {
				if d, err := s.status(i); err == nil {
					for id, g := range d.generations() {
						if g != before[i][id] {
							notReady.CompareAndSwap(nil, fmt.Sprintf("edge %d: %s generation %d, was %d", i+1, id, g, before[i][id]))
						}
					}
				}
			}
			time.Sleep(50 * time.Millisecond) // poll interval of an HTTP endpoint
		}
	})
	time.Sleep(time.Second) // load before the reload: the test's schedule
	capacity = 24
	groups = [][]string{{"tiny", "gpu-2/ollama", "gpu-1/ollama"}, {"tiny-2", "gpu-1/oa", "gpu-2/oa"}}
	for i, e := range s.edges {
		writeJSON(t, e.config, cfg(e))
		if err := e.p.signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		s.waitStatus(i, "both nodes on the reloaded payload", 10*time.Second, func(d haStatus) bool {
			k := 0
			for _, n := range d.Nodes {
				if n.Connected && n.Config == "current" && len(n.Providers) > 0 && n.Providers[0].Capacity == 24 {
					k++
				}
			}
			return k == 2
		})
		time.Sleep(500 * time.Millisecond) // one edge on the new config, the other on the old, under load
	}
	stop()
	bg.Wait()
	out := <-results
	failed := 0
	for _, o := range out {
		if !o.ok() {
			failed++
			if failed <= 3 {
				t.Errorf("N2: a request failed during the rolling reload: edge %d, status %d, err %v, %s", o.edge+1, o.status, o.err, short(o.body))
			}
		}
	}
	if failed > 0 {
		t.Errorf("N2: %d of %d requests failed during the rolling reload", failed, len(out))
	}
	if v := notReady.Load(); v != nil {
		t.Errorf("N2: a node was not ready on an edge throughout: %v", v)
	}
	t.Logf("%d requests through the rolling reload of two edges, %d failed", len(out), failed)
}
