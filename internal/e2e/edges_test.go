package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/node"
	nodeconfig "iop/internal/node/config"
)

// startMultiEdgeNode runs node id against every edge of addrs (node config
// edges[], each edge's certificate named edgeName), reconnecting every
// second without limit; it is stopped at cleanup.
func startMultiEdgeNode(t testing.TB, p pkiDir, id string, addrs []string, logs *logSink) *nodeProc {
	t.Helper()
	var edges []map[string]any
	for _, a := range addrs {
		edges = append(edges, map[string]any{"addr": a, "name": edgeName})
	}
	raw, err := json.Marshal(map[string]any{
		"node_id": id,
		"edges":   edges,
		"tls": map[string]string{
			"cert_file": p.file(identity.CertFileName(id)), "key_file": p.file(identity.KeyFileName(id)),
			"ca_file": p.file(identity.CACertFile),
		},
		"reconnect": map[string]int{"interval_sec": 1, "max_attempts": 0},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := nodeconfig.Parse(raw)
	if err != nil {
		t.Fatalf("node config: %v\n%s", err, raw)
	}
	n := launchNode(cfg, nil, logs.logger("node"))
	t.Cleanup(func() {
		if err := n.stop(); err != nil {
			t.Errorf("node %s: %v", id, err)
		}
	})
	return n
}

// inFlightCount counts the chat requests a backend is answering at once and
// the most it ever answered at once. A request counts from its arrival
// until the backend writes its last answer line (Ollama's "done":true) or
// its handler returns: the node releases the slot when it has read that
// line, possibly before the handler has returned (the server adds the
// chunked framing's end after), and the next request may then arrive.
type inFlightCount struct {
	now, most atomic.Int64
}

func (c *inFlightCount) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/chat" { // the node's own lookups (/api/show) are no request of a client
			h.ServeHTTP(w, r)
			return
		}
		n := c.now.Add(1)
		for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
		}
		dw := &doneWriter{ResponseWriter: w, done: func() { c.now.Add(-1) }}
		defer dw.end()
		h.ServeHTTP(dw, r)
	})
}

// doneWriter calls done once: just before the write that carries
// "done":true, or at end.
type doneWriter struct {
	http.ResponseWriter
	done  func()
	ended bool
}

func (w *doneWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"done":true`)) {
		w.end() // before the node can have read it
	}
	return w.ResponseWriter.Write(p)
}

func (w *doneWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *doneWriter) end() {
	if !w.ended {
		w.ended = true
		w.done()
	}
}

// metricSum adds every sample of family whose labels contain label.
func metricSum(t testing.TB, a *adminClient, family, label string) float64 {
	t.Helper()
	m, err := a.metrics()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, family) && strings.Contains(k, label) {
			sum += v
		}
	}
	return sum
}

// E4: a node serving two edges has one capacity per adapter: both edges
// offered twice the provider's capacity, the backend never serves more
// than the capacity at once, every request is answered, the node's
// over-capacity refusals are re-queued (counted as retries) and no
// provider cools for them.
func TestTwoEdgesOneCapacity(t *testing.T) {
	leakcheck.Check(t)
	const capacity, perEdge, rounds = 2, 2 * 2, 8
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	bp := startBackend(t, backend.Options{TokenDelay: 3 * time.Millisecond})
	var cc inFlightCount
	url := bp.serve(t, cc.wrap(bp.b))
	cfg := func() *config.Config {
		return edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, capacity)}}},
			[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
	}
	e1 := startEdge(t, cfg(), nil, logs.logger("edge-a"))
	e2 := startEdge(t, cfg(), nil, logs.logger("edge-b"))
	startMultiEdgeNode(t, p, "gpu-1", []string{e1.nodeAddr, e2.nodeAddr}, logs)
	adms := []*adminClient{newAdminClient(t, e1), newAdminClient(t, e2)}
	apis := []*apiClient{newAPIClient(t, e1), newAPIClient(t, e2)}
	for _, a := range adms {
		a.waitConnected(t, 10*time.Second, "gpu-1")
	}

	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for i := range 2 * perEdge {
		api := apis[i%2]
		wg.Go(func() {
			for range rounds {
				res, err := api.chat(context.Background(), chatRequest{model: "tiny"})
				if err != nil || res.status != 200 || res.text != answer {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %v %s", res.status, err, res.raw))
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("E4: %d of %d requests failed, first: %v", n, 2*perEdge*rounds, firstErr.Load())
	}
	if m := cc.most.Load(); m > capacity {
		t.Fatalf("E4: the backend served %d requests at once, want at most the capacity %d", m, capacity)
	}
	refusals := 0.0
	for _, a := range adms {
		refusals += metricSum(t, a, "iop_edge_request_retries_total", `reason="over_capacity"`)
		if ej := metricSum(t, a, "iop_edge_provider_ejections_total", ""); ej != 0 {
			t.Errorf("E4: %v ejections: a provider cooled", ej)
		}
		for _, n := range a.mustStatus(t).Nodes {
			for _, pr := range n.Providers {
				if pr.Health == "cooling" {
					t.Errorf("E4: %s/%s is cooling after capacity refusals", n.ID, pr.ProviderID)
				}
			}
		}
	}
	if refusals == 0 {
		t.Errorf("E4: no over-capacity refusal with both edges offered twice the capacity: the test did not load the node")
	}
	t.Logf("%d requests, %v over-capacity refusals re-queued, at most %d at the backend", 2*perEdge*rounds, refusals, cc.most.Load())
}

// E4: an edge whose pool keeps a node's adapter full — its queue refills
// every slot the moment one of its requests ends — does not starve a
// second edge: the second edge's refused requests are retried (due, below
// their fair share) and the node holds the slot the first frees for that
// retry, so every one of them is answered (a gate that gave every free
// slot to whichever request came first answered some 503 over_capacity
// after the edge's 32 refusals).
func TestE4SecondEdgeNotStarvedByAFullQueue(t *testing.T) {
	leakcheck.Check(t)
	const capacity, queued, requests = 2, 6, 10
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	bp := startBackend(t, backend.Options{TokenDelay: 20 * time.Millisecond})
	url := bp.serve(t, bp.b)
	cfg := func() *config.Config {
		c := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, capacity)}}},
			[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
		n := 2 * queued
		c.Queue.MaxWaiters, c.Queue.WaitTimeoutMs = &n, 30000
		return c
	}
	e1 := startEdge(t, cfg(), nil, logs.logger("edge-a"))
	e2 := startEdge(t, cfg(), nil, logs.logger("edge-b"))
	startMultiEdgeNode(t, p, "gpu-1", []string{e1.nodeAddr, e2.nodeAddr}, logs)
	for _, e := range []*edgeProc{e1, e2} {
		newAdminClient(t, e).waitConnected(t, 10*time.Second, "gpu-1")
	}
	full, second := newAPIClient(t, e1), newAPIClient(t, e2)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var served atomic.Int64
	busy := make(chan struct{})
	var once sync.Once
	for range queued { // more than the capacity: edge a's queue is never empty
		wg.Go(func() {
			for ctx.Err() == nil {
				if res, err := full.chat(ctx, chatRequest{model: "tiny"}); err == nil && res.status == 200 && served.Add(1) == 2*capacity {
					once.Do(func() { close(busy) })
				}
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	select {
	case <-busy:
	case <-time.After(30 * time.Second):
		t.Fatal("edge a's load did not start")
	}
	for i := range requests {
		res, err := second.chat(context.Background(), chatRequest{model: "tiny"})
		if err != nil || res.status != 200 || res.text != answer {
			t.Fatalf("E4: edge b's request %d while edge a's queue keeps the adapter full: %d %v %s", i, res.status, err, res.raw)
		}
	}
}

// E4, N2: one adapter name is one backend on a node. An edge whose config
// names another base URL under an adapter name than the edge the node
// already serves is refused, with the reason — both edges and the field —
// in that edge's /status; the other edge goes on serving.
func TestAdapterConflictShownOnTheEdgeThatSentIt(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	bp := startBackend(t, backend.Options{})
	urlA, urlB := bp.serve(t, nil), bp.serve(t, nil)
	cfg := func(url string) *config.Config {
		return edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 2)}}},
			[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
	}
	e1 := startEdge(t, cfg(urlA), nil, logs.logger("edge-a"))
	ln2, err := net.Listen("tcp", "127.0.0.1:0") // edge 2 serves it once the node runs edge 1's config
	if err != nil {
		t.Fatal(err)
	}
	startMultiEdgeNode(t, p, "gpu-1", []string{e1.nodeAddr, ln2.Addr().String()}, logs)
	adm1, api1 := newAdminClient(t, e1), newAPIClient(t, e1)
	adm1.waitConnected(t, 10*time.Second, "gpu-1")
	e2 := startEdge(t, cfg(urlB), ln2, logs.logger("edge-b"))
	adm2 := newAdminClient(t, e2)
	want := []string{`adapter "ollama"`, "base_url", "edge edge-1 at " + ln2.Addr().String() + " sent base_url " + fmt.Sprintf("%q", urlB),
		"edge edge-1 at " + e1.nodeAddr + " runs " + fmt.Sprintf("%q", urlA)}
	eventually(t, 10*time.Second, "edge 2's /status names the conflict", func() (bool, string) {
		d, err := adm2.status()
		if err != nil {
			return false, err.Error()
		}
		n, _ := d.node("gpu-1")
		for _, w := range want {
			if !strings.Contains(n.ConfigErr, w) {
				return false, fmt.Sprintf("config_error %q lacks %q", n.ConfigErr, w)
			}
		}
		return !n.Connected, fmt.Sprintf("connected %v", n.Connected)
	})
	if res, err := api1.chat(context.Background(), chatRequest{model: "tiny"}); err != nil || res.status != 200 {
		t.Fatalf("edge 1 after the conflict: %d %v %s", res.status, err, res.raw)
	}
	if n, _ := adm1.mustStatus(t).node("gpu-1"); !n.Connected || n.Generation != 1 || n.ConfigErr != "" {
		t.Fatalf("edge 1: %+v, want the node connected in its first generation, no config error", n)
	}
}

// N2, L5: operators copy one config to every edge and reload them one
// after another. A rolling reload that changes a model group and the
// node's payload (a capacity) under load fails no request, and the node
// stays ready on both edges in its first generation throughout: each
// edge's requests run on the payload that edge sent.
func TestRollingReloadTwoEdges(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	bp := startBackend(t, backend.Options{TokenDelay: 2 * time.Millisecond})
	url := bp.serve(t, nil)
	cfg := func(capacity int, models ...config.Model) *config.Config {
		return edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, capacity)}}},
			models, nil)
	}
	before := []config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}
	after := []config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny")), modelGroup("tiny-2", provider("gpu-1", "ollama", "tiny"))}
	after[0].Routing = "ordered"
	reloads := []chan *config.Config{make(chan *config.Config), make(chan *config.Config)}
	var edges []*edgeProc
	for i := range 2 {
		edges = append(edges, startEdge(t, cfg(4, before...), nil, logs.logger(fmt.Sprint("edge-", i)),
			func(o *edge.Options) { o.Reload = reloads[i] }))
	}
	startMultiEdgeNode(t, p, "gpu-1", []string{edges[0].nodeAddr, edges[1].nodeAddr}, logs)
	adms := []*adminClient{newAdminClient(t, edges[0]), newAdminClient(t, edges[1])}
	apis := []*apiClient{newAPIClient(t, edges[0]), newAPIClient(t, edges[1])}
	for _, a := range adms {
		a.waitConnected(t, 10*time.Second, "gpu-1")
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	for i := range 6 {
		api := apis[i%2]
		wg.Go(func() {
			for ctx.Err() == nil {
				sent.Add(1)
				res, err := api.chat(context.Background(), chatRequest{model: "tiny"})
				if err != nil || res.status != 200 || res.text != answer {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %v %s", res.status, err, res.raw))
				}
			}
		})
	}
	// The node's readiness on both edges, watched throughout.
	var notReady atomic.Value
	wg.Go(func() {
		for ctx.Err() == nil {
			for i, a := range adms {
				d, err := a.status()
				if err != nil {
					continue
				}
				if n, _ := d.node("gpu-1"); !n.Connected || n.Generation != 1 {
					notReady.CompareAndSwap(nil, fmt.Sprintf("edge %d: %+v", i, n))
				}
			}
		}
	})
	for i := range 2 {
		refreshed := logs.messages("config refreshed")
		reloads[i] <- cfg(6, after...)
		eventually(t, 10*time.Second, fmt.Sprintf("edge %d's refresh applied", i), func() (bool, string) {
			return logs.messages("config refreshed") > refreshed, "not yet"
		})
		if res, err := apis[i].chat(context.Background(), chatRequest{model: "tiny-2"}); err != nil || res.status != 200 {
			t.Errorf("edge %d after its reload: the new group: %d %v %s", i, res.status, err, res.raw)
		}
	}
	stop()
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("N2: %d of %d requests failed during the rolling reload, first: %v", n, sent.Load(), firstErr.Load())
	}
	if v := notReady.Load(); v != nil {
		t.Fatalf("N2: the node was not ready throughout: %v", v)
	}
	for i, a := range adms {
		if n, _ := a.mustStatus(t).node("gpu-1"); n.Config != "current" || len(n.Providers) == 0 || n.Providers[0].Capacity != 6 {
			t.Errorf("edge %d: %+v, want the node on the current payload with capacity 6", i, n)
		}
	}
	t.Logf("%d requests during the rolling reload, none failed", sent.Load())
}

// affinityRun is what a prefix_affinity workload through n edges measured.
type affinityRun struct {
	cached, prompt, exact, later int
	hits, decisions              float64 // the edges' routing decisions, summed
}

// affinityThroughEdges runs six conversations of four turns against three
// demo replicas (each its own prefix cache) in one prefix_affinity group,
// through n edges; route says which edge request k of a turn, of
// conversation c, goes to. The conversations' order rotates every turn, so
// a round-robin balancer (k mod n) sends each conversation's turns to the
// edges in turn, a sticky one (c mod n) keeps it on one.
func affinityThroughEdges(t *testing.T, n int, route func(k, c int) int) affinityRun {
	const convs, turns = 6, 4
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	var bps []*backendProc
	var adapters []config.Adapter
	var providers []config.ModelProvider
	for i := range 3 {
		bp := startBackend(t, backend.Options{PrefixCache: 4096, PrefillPerToken: time.Millisecond})
		bps = append(bps, bp)
		name := fmt.Sprintf("r%d", i+1)
		adapters = append(adapters, compatAdapter(name, bp.serve(t, nil), 8))
		providers = append(providers, provider("gpu-1", name, "tiny"))
	}
	m := modelGroup("conv", providers...)
	m.Routing = "prefix_affinity"
	var addrs []string
	var apis []*apiClient
	var adms []*adminClient
	for i := range n {
		e := startEdge(t, edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: adapters}}, []config.Model{m}, nil), nil,
			logs.logger(fmt.Sprint("edge-", i)))
		addrs, apis, adms = append(addrs, e.nodeAddr), append(apis, newAPIClient(t, e)), append(adms, newAdminClient(t, e))
	}
	startMultiEdgeNode(t, p, "gpu-1", addrs, logs)
	for _, a := range adms {
		a.waitConnected(t, 10*time.Second, "gpu-1")
	}
	started := func() (k uint64) {
		for _, bp := range bps {
			k += bp.b.Stats().Started
		}
		return k
	}
	history := make([][]map[string]string, convs)
	for c := range history {
		history[c] = []map[string]string{{"role": "system", "content": "You are the affinity test. Answer briefly."}}
	}
	var run affinityRun
	for turn := range turns {
		type answer struct {
			c    int
			text string
			rep  turnReport
			err  error
		}
		out := make(chan answer, convs)
		var wg sync.WaitGroup
		for k := range convs {
			c := (k + turn) % convs
			history[c] = append(history[c], map[string]string{"role": "user",
				"content": fmt.Sprintf("conversation %d turn %d: %s", c, turn, strings.Repeat("tell me more about prefix caches. ", 12))})
			body, _ := json.Marshal(map[string]any{"model": "conv", "messages": history[c], "stream": true,
				"stream_options": map[string]bool{"include_usage": true}})
			before := started()
			api := apis[route(k, c)]
			wg.Go(func() {
				text, rep, err := api.streamReport(body)
				out <- answer{c, text, rep, err}
			})
			eventually(t, 10*time.Second, "request admitted", func() (bool, string) { return started() > before, "not yet" })
		}
		wg.Wait()
		close(out)
		for a := range out {
			if a.err != nil {
				t.Fatalf("conversation %d turn %d: %v", a.c, turn, a.err)
			}
			history[a.c] = append(history[a.c], map[string]string{"role": "assistant", "content": a.text})
			if turn == 0 {
				continue
			}
			run.later++
			run.cached += a.rep.cached
			run.prompt += a.rep.prompt
			if last := history[a.c][len(history[a.c])-2]["content"]; a.rep.cached == a.rep.prompt-(4+(len(last)+3)/4) {
				run.exact++
			}
		}
	}
	for _, a := range adms {
		run.hits += metricSum(t, a, "iop_edge_routing_decisions_total", `result="prefix_hit"`)
		run.decisions += metricSum(t, a, "iop_edge_routing_decisions_total", "")
	}
	return run
}

// Prefix affinity behind a balancer of two edges (docs/operating.md,
// "Several edges"). Each edge routes
// from its own table: behind round robin, a conversation's turn on the
// edge that did not serve its previous turn finds no prefix there and
// goes where the conversation's first turn hashes on that edge's load, so
// some turns land away from their history (the figures). A balancer that
// keeps a conversation on one edge (sticky) closes the gap: every later
// turn is cached through the previous answer, as with one edge.
func TestPrefixAffinityTwoEdges(t *testing.T) {
	leakcheck.Check(t)
	one := affinityThroughEdges(t, 1, func(int, int) int { return 0 })
	rr := affinityThroughEdges(t, 2, func(k, _ int) int { return k % 2 })
	sticky := affinityThroughEdges(t, 2, func(_, c int) int { return c % 2 })
	for _, r := range []struct {
		name string
		run  affinityRun
	}{{"one edge", one}, {"two sticky edges", sticky}} {
		if r.run.exact != r.run.later {
			t.Errorf("%s: %d of %d later turns cached through the previous answer, want all", r.name, r.run.exact, r.run.later)
		}
	}
	f := func(r affinityRun) string {
		return fmt.Sprintf("hit ratio %.2f, later turns cached %d/%d tokens, %d/%d turns through the previous answer",
			r.hits/r.decisions, r.cached, r.prompt, r.exact, r.later)
	}
	t.Logf("FIGURES prefix affinity: one edge %s; two edges round robin %s; two edges sticky by conversation %s", f(one), f(rr), f(sticky))
}

// S4, L8 per edge: draining with two edges. The node stopped (SIGTERM)
// with a stream on each edge sends every edge its draining notice: both
// show it draining and both streams finish. An edge stopped with a stream
// in flight answers /healthz 503 while it drains (a balancer moves away)
// and the node's session with the other edge stays as it was, serving.
func TestDrainWithTwoEdges(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	bp := startBackend(t, backend.Options{TokenDelay: 20 * time.Millisecond, LoopTokens: 100000})
	url := bp.serve(t, nil)
	cfg := func() *config.Config {
		return edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}}},
			[]config.Model{modelGroup("loop", provider("gpu-1", "ollama", "tiny-loop")), modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
	}

	t.Run("S4 the node's drain reaches every edge", func(t *testing.T) {
		e1, e2 := startEdge(t, cfg(), nil, logs.logger("edge-a")), startEdge(t, cfg(), nil, logs.logger("edge-b"))
		n := startMultiEdgeNode(t, p, "gpu-1", []string{e1.nodeAddr, e2.nodeAddr}, logs)
		adms := []*adminClient{newAdminClient(t, e1), newAdminClient(t, e2)}
		var streams []*stream
		for i, e := range []*edgeProc{e1, e2} {
			adms[i].waitConnected(t, 10*time.Second, "gpu-1")
			s := startStream(newAPIClient(t, e), fmt.Sprint("drain-", i), chatRequest{model: "loop", maxTokens: 40})
			s.waitFirst(t)
			streams = append(streams, s)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- n.stop() }()
		for i, a := range adms {
			eventually(t, 5*time.Second, fmt.Sprintf("edge %d shows gpu-1 draining", i+1), func() (bool, string) {
				st, err := a.status()
				if err != nil {
					return false, err.Error()
				}
				ns, _ := st.node("gpu-1")
				return ns.Draining, fmt.Sprintf("%+v", ns)
			})
		}
		for _, s := range streams {
			s.wait(t)
			if s.err != nil || s.res.status != 200 || !s.res.done || len(s.res.errs) != 0 {
				t.Errorf("stream %s on the draining node: err %v status %d [DONE] %v errors %v; want it complete", s.id, s.err, s.res.status, s.res.done, s.res.errs)
			}
		}
		if err := <-stopped; err != nil {
			t.Errorf("node.Run: %v", err)
		}
	})

	t.Run("L8 an edge's drain leaves the node's other session alone", func(t *testing.T) {
		e1 := startEdge(t, cfg(), nil, logs.logger("edge-a"), func(o *edge.Options) { o.ShutdownGrace = 3 * time.Second })
		e2 := startEdge(t, cfg(), nil, logs.logger("edge-b"))
		startMultiEdgeNode(t, p, "gpu-1", []string{e1.nodeAddr, e2.nodeAddr}, logs)
		adm1, adm2 := newAdminClient(t, e1), newAdminClient(t, e2)
		adm1.waitConnected(t, 10*time.Second, "gpu-1")
		before := adm2.waitConnected(t, 10*time.Second, "gpu-1")
		gen := before.Nodes[0].Generation
		s := startStream(newAPIClient(t, e1), "on-edge-1", chatRequest{model: "loop", maxTokens: 40})
		s.waitFirst(t)
		stopped := make(chan error, 1)
		go func() { stopped <- e1.stop() }() // what SIGTERM does in main
		hc := newHTTPClient(t)
		eventually(t, 5*time.Second, "edge 1's /healthz turns 503", func() (bool, string) {
			resp, err := hc.Get(e1.httpURL + "/healthz")
			if err != nil {
				return false, err.Error()
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode == http.StatusServiceUnavailable, fmt.Sprintf("status %d", resp.StatusCode)
		})
		api2 := newAPIClient(t, e2)
		if res, err := api2.chat(context.Background(), chatRequest{model: "tiny"}); err != nil || res.status != 200 {
			t.Fatalf("edge 2 while edge 1 drains: %d %v %s", res.status, err, res.raw)
		}
		s.wait(t)
		if s.err != nil || s.res.status != 200 || !s.res.done {
			t.Errorf("the stream on the draining edge: err %v status %d [DONE] %v; want it complete", s.err, s.res.status, s.res.done)
		}
		if err := <-stopped; err != nil {
			t.Errorf("edge.Serve: %v", err)
		}
		if ns, _ := adm2.mustStatus(t).node("gpu-1"); !ns.Connected || ns.Generation != gen {
			t.Errorf("edge 2 after edge 1 stopped: %+v, want gpu-1 connected in generation %d", ns, gen)
		}
		if res, err := api2.chat(context.Background(), chatRequest{model: "tiny"}); err != nil || res.status != 200 {
			t.Fatalf("edge 2 after edge 1 stopped: %d %v %s", res.status, err, res.raw)
		}
	})
}

// S1, L4: two entries of a node's edges[] that reach one edge (a name and
// an address of the same host) are one edge: the second connection to that
// edge address is not made while the first is up, so the node's two
// sessions never take the node's identity from each other (each takeover
// fenced the other and failed its requests, every reconnect interval).
func TestS1OneEdgeListedTwice(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	_, port, err := net.SplitHostPort(e.nodeAddr)
	if err != nil {
		t.Fatal(err)
	}
	startMultiEdgeNode(t, p, "gpu-1", []string{e.nodeAddr, net.JoinHostPort("localhost", port)}, logs)
	adm := newAdminClient(t, e)
	adm.waitConnected(t, 10*time.Second, "gpu-1")
	// The other entry's attempts after the first session is up: each one
	// says why it does not connect (the supervisor retries it every second).
	logs.waitLine(t, "the other entry's attempt", "connect attempt failed", "reaches the edge address")
	eventually(t, 10*time.Second, "a second attempt of the other entry", func() (bool, string) {
		n := logs.countLines("connect attempt failed", "reaches the edge address")
		return n >= 2, fmt.Sprint(n, " lines")
	})
	if ns, _ := adm.mustStatus(t).node("gpu-1"); !ns.Connected || ns.Generation != 1 {
		t.Fatalf("S1: gpu-1 %+v, want connected in generation 1 (no takeover by its own other session)", ns)
	}
	if n := logs.countLines("node fenced"); n != 0 {
		t.Errorf("L4: the edge fenced gpu-1 %d times", n)
	}
	if res, err := newAPIClient(t, e).chat(context.Background(), chatRequest{model: "tiny"}); err != nil || res.status != 200 {
		t.Fatalf("chat: %d %v %s", res.status, err, res.raw)
	}
}

// N2 (RESTART_REQUIRED is not APPLIED), by the real reload path: a reload
// that adds an adapter whose api_key_env the node does not offer
// (api_key_env_allow) is answered RESTART_REQUIRED, and the node keeps
// running the payload its registration got. The new adapter's group is
// then not routed to that node — its request waits and gets the group's
// no-provider answer (503 after queue.wait_timeout_ms), never the 502 of
// a node answering unknown_adapter — while the unchanged group serves and
// /status shows the node restart_required with the new provider
// unavailable. Restarted with the variable offered, the node registers
// with the current payload and the new group serves.
func TestN2RestartRequiredNotRouted(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1")
	logs := newLogSink(t)
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	const env = "IOP_E2E_N2_KEY"
	cfg := func(adapters []config.Adapter, models ...config.Model) *config.Config {
		return edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: adapters}}, models,
			func(c *config.Config) { c.Queue.WaitTimeoutMs = 300 })
	}
	keyed := compatAdapter("keyed", url, 2)
	keyed.APIKeyEnv = env
	reload := make(chan *config.Config)
	e := startEdge(t, cfg([]config.Adapter{ollamaAdapter("ollama", url, 2)}, modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))),
		nil, logs.logger("edge"), func(o *edge.Options) { o.Reload = reload })
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	n := startNodeNoCleanup(t, p, "gpu-1", e.nodeAddr, nodeOpts{log: logs.logger("node")})
	adm.waitConnected(t, 10*time.Second, "gpu-1")

	reload <- cfg([]config.Adapter{ollamaAdapter("ollama", url, 2), keyed},
		modelGroup("tiny", provider("gpu-1", "ollama", "tiny")), modelGroup("keyed", provider("gpu-1", "keyed", "tiny")))
	eventually(t, 10*time.Second, "the node answered the refresh RESTART_REQUIRED", func() (bool, string) {
		d, err := adm.status()
		st, _ := d.node("gpu-1")
		return err == nil && st.Config == "restart_required", fmt.Sprintf("%+v %v", st, err)
	})
	res, err := api.chat(context.Background(), chatRequest{model: "keyed"})
	if err != nil || res.status != http.StatusServiceUnavailable || strings.Contains(res.raw, "unknown_adapter") {
		t.Errorf("N2: the new group on a node that runs the older payload: %d %v %s, want 503 (no provider), never unknown_adapter", res.status, err, res.raw)
	}
	if res, err := api.chat(context.Background(), chatRequest{model: "tiny"}); err != nil || res.status != 200 || res.text != answer {
		t.Errorf("N2: the unchanged group: %d %v %s", res.status, err, res.raw)
	}
	st, _ := adm.mustStatus(t).node("gpu-1")
	for _, ps := range st.Providers {
		if want := map[string]string{"ollama": "available", "keyed": "unavailable"}[ps.ProviderID]; ps.Status != want {
			t.Errorf("N3: /status provider %s: %s, want %s", ps.ProviderID, ps.Status, want)
		}
	}
	if !strings.Contains(st.ConfigErr, "RESTART_REQUIRED") {
		t.Errorf("N2: config_error %q, want the RESTART_REQUIRED answer", st.ConfigErr)
	}

	// The operator offers the variable and restarts the node.
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	ncfg, err := nodeConfigFor(p, "gpu-1", e.nodeAddr, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	ncfg.APIKeyEnvAllow = []string{env}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, ncfg, node.Options{Logger: logs.logger("node"), Version: "e2e",
			LookupEnv: func(k string) (string, bool) { return "sk-n2", k == env }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node after restart: %v", err)
		}
	})
	eventually(t, 10*time.Second, "the restarted node on the current payload", func() (bool, string) {
		d, err := adm.status()
		st, _ := d.node("gpu-1")
		return err == nil && st.Connected && st.Generation == 2 && st.Config == "current", fmt.Sprintf("%+v %v", st, err)
	})
	if res, err := api.chat(context.Background(), chatRequest{model: "keyed"}); err != nil || res.status != 200 || res.text != answer {
		t.Errorf("N2: the new group after the restart: %d %v %s", res.status, err, res.raw)
	}
}
