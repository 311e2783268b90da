package sdk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// siteKey is the local-only key of the fallback stack (SPEC V3).
const siteKey = "iop-site-key"

// bigNode is the fallback stack's second node, which the test kills.
const bigNode = "gpu-big"

// fallbackStack is a stack whose edge config adds, beside the demo groups
// (SPEC V1–V3):
//   - big-down on node gpu-down, which never connects (a node that is
//     down), falling back to small when unavailable;
//   - big on gpu-1's adapter "big" (capacity 1), falling back to small
//     when its predicted wait passes 200 ms; big-nofb on the same adapter
//     without a fallback;
//   - vault on gpu-down, falling back to hosted when unavailable; hosted on
//     the adapter "hosted", location remote, a second demo backend (the
//     fake hosted API, whose log counts what reaches it);
//   - big-k on node gpu-big (adapter "ollama", capacity 1, the loop model;
//     its node process started by the test, startExtraNode), falling back
//     to small when unavailable;
//   - the api_keys principal "site" with local_only.
//
// queue.wait_timeout_ms is 10 s.
func fallbackStack(t *testing.T) (*stack, *proc) {
	t.Helper()
	env := loadEnv(t)
	if env.realServer() {
		t.Skip("the fallback stack puts a second demo backend behind a remote adapter")
	}
	hostedAddr := freePorts(t, 1)[0]
	hosted, err := startProc("hosted-backend", filepath.Join(env.bin, "demo-backend"), "-listen", hostedAddr, "-token-delay", env.tokenDelay,
		"-models", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if code, err := hosted.stop(); err != nil || code != 0 {
			t.Errorf("hosted backend stop: exit %d, %v", code, err)
		}
	})
	(&stack{t: t, hc: &http.Client{}}).waitHTTP("http://"+hostedAddr+"/api/tags", 10*time.Second)
	s := newStack(t, withNodes(bigNode), withConfig(func(ec, _ map[string]any) {
		nodes := ec["nodes"].([]any)
		gpu := nodes[0].(map[string]any)
		ollama := gpu["adapters"].([]any)[0].(map[string]any)
		gpu["adapters"] = append(gpu["adapters"].([]any),
			map[string]any{"name": "big", "type": "ollama", "capacity": 1, "long_capacity": 1, "base_url": ollama["base_url"]},
			map[string]any{"name": "hosted", "type": "openai_compat", "profile": "llamacpp", "location": "remote", "capacity": 8,
				"long_capacity": 2, "base_url": "http://" + hostedAddr})
		ec["nodes"] = append(nodes, map[string]any{"id": "gpu-down", "adapters": []any{
			map[string]any{"name": "ollama", "type": "ollama", "capacity": 8, "long_capacity": 2, "base_url": ollama["base_url"]}}},
			map[string]any{"id": bigNode, "adapters": []any{
				map[string]any{"name": "ollama", "type": "ollama", "capacity": 1, "long_capacity": 1, "base_url": ollama["base_url"]}}})
		group := func(name, node, provider string, fallbacks ...any) map[string]any {
			g := map[string]any{"name": name, "providers": []any{map[string]any{"node": node, "provider": provider, "target": env.target}}}
			if len(fallbacks) > 0 {
				g["fallbacks"] = fallbacks
			}
			return g
		}
		ec["models"] = append(ec["models"].([]any),
			group("small", nodeID, "ollama"),
			group("big-down", "gpu-down", "ollama", map[string]any{"model": "small", "on": []any{"unavailable"}}),
			group("big", nodeID, "big", map[string]any{"model": "small", "wait_ms": 200}),
			group("big-nofb", nodeID, "big"),
			group("hosted", nodeID, "hosted"),
			group("vault", "gpu-down", "ollama", map[string]any{"model": "hosted", "on": []any{"unavailable"}}),
			map[string]any{"name": "big-k", "providers": []any{map[string]any{"node": bigNode, "provider": "ollama", "target": env.loopTarget}},
				"fallbacks": []any{map[string]any{"model": "small", "on": []any{"unavailable"}}}})
		sum := sha256.Sum256([]byte(siteKey))
		ec["api_keys"] = append(ec["api_keys"].([]any), map[string]any{"principal": "site", "key_sha256": hex.EncodeToString(sum[:]), "local_only": true})
		ec["queue"] = map[string]any{"wait_timeout_ms": 10000}
	}))
	return s, hosted
}

// served is one answer: its status, the Iop-Served-Model header, the
// response's model, the time to its answer.
type served struct {
	status      int
	servedModel string
	model       string
	took        time.Duration
}

// ask sends one chat completion for model through the official SDK.
func ask(ctx context.Context, c *openai.Client, model string) served {
	var resp *http.Response
	start := time.Now()
	out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: shared.ChatModel(model),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(4)}, option.WithResponseInto(&resp))
	a := served{took: time.Since(start)}
	var apiErr *openai.Error
	switch {
	case err == nil:
		a.status, a.model = 200, out.Model
	case errors.As(err, &apiErr):
		a.status = apiErr.StatusCode
	default:
		a.status = -1
	}
	if resp != nil {
		a.servedModel = resp.Header.Get("Iop-Served-Model")
	}
	return a
}

// hostedRequests counts the requests the fake hosted API ended.
func hostedRequests(p *proc) int {
	n := 0
	for _, l := range strings.Split(p.log.tail(100000), "\n") {
		var e backendEnd
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "request end" {
			n++
		}
	}
	return n
}

// TestFallbacks (SPEC V1, V3, L8) through the binaries and the official OpenAI
// SDK: a group whose only node is down is answered by its fallback at
// once, the SDK seeing the model it asked for and Iop-Served-Model the
// group that served; a group at capacity overflows to its fallback when
// the predicted wait passes wait_ms; a local-only key never reaches the
// remote adapter (the fake hosted API counts 0 of its requests) while
// another key does, through the same chain; a group's node killed with
// a stream started and requests queued: the stream ends with its error,
// every queued request is answered by the fallback (after admission). It
// logs the figures (BENCHMARKS.md "Fallbacks").
func TestFallbacks(t *testing.T) {
	s, hosted := fallbackStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := s.openai()

	t.Run("V1 unavailable: every request answered by small", func(t *testing.T) {
		const n = 20
		var viaFallback, direct []time.Duration
		for range n {
			a := ask(ctx, c, "big-down")
			if a.status != 200 || a.model != "big-down" || a.servedModel != "small" {
				t.Fatalf("big-down with its node down: %+v, want 200, model big-down, Iop-Served-Model small", a)
			}
			viaFallback = append(viaFallback, a.took)
			d := ask(ctx, c, "small")
			if d.status != 200 || d.servedModel != "small" {
				t.Fatalf("small: %+v", d)
			}
			direct = append(direct, d.took)
		}
		t.Logf("FIGURE big-down (node down) -> small: %d/%d answered 200; p50 %v p95 %v; small called directly p50 %v p95 %v (loaded)",
			n, n, percentile(viaFallback, 0.5), percentile(viaFallback, 0.95), percentile(direct, 0.5), percentile(direct, 0.95))
	})

	t.Run("V1 wait_ms: a full group overflows to small", func(t *testing.T) {
		// big twice: first on the 1 s prior (nothing measured yet), then on
		// the service time its leases measured.
		for round, model := range []string{"big", "big", "big-nofb"} {
			const n = 20 // big's capacity is 1
			var mu sync.Mutex
			var took []time.Duration
			bySrv := map[string]int{}
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					a := ask(ctx, c, model)
					mu.Lock()
					defer mu.Unlock()
					if a.status != 200 {
						bySrv["status "+http.StatusText(a.status)]++
						return
					}
					took = append(took, a.took)
					bySrv[a.servedModel]++
				})
			}
			wg.Wait()
			t.Logf("FIGURE round %d: %s, %d concurrent at capacity 1: served by %v; time to answer p50 %v p95 %v max %v (loaded)",
				round+1, model, n, bySrv, percentile(took, 0.5), percentile(took, 0.95), percentile(took, 1))
			switch model {
			case "big":
				if bySrv["small"] == 0 || bySrv["big"] == 0 || bySrv["big"]+bySrv["small"] != n {
					t.Errorf("big with wait_ms 200: served by %v, want big and small, all %d answered", bySrv, n)
				}
			case "big-nofb":
				if bySrv["small"] != 0 {
					t.Errorf("big-nofb has no fallback, yet small served %d", bySrv["small"])
				}
			}
		}
	})

	t.Run("V1 L8 big's node killed mid-load: every request not yet started answered by small", func(t *testing.T) {
		node := s.startExtraNode(bigNode)
		c0 := s.openai(option.WithMaxRetries(0)) // every answer is the edge's first
		// One stream holds big-k's only slot and has started on the client.
		stream := c0.Chat.Completions.NewStreaming(ctx, longLoopParams("big-k"))
		defer stream.Close()
		firstContent(t, stream)
		const n = 8
		results := make(chan served, n)
		for range n {
			go func() { results <- ask(ctx, c0, "big-k") }()
		}
		deadline := time.Now().Add(10 * time.Second)
		for waiting := 0.0; waiting != n; {
			if time.Now().After(deadline) {
				t.Fatalf("%v requests waiting for big-k, want %d", waiting, n)
			}
			time.Sleep(20 * time.Millisecond) // poll interval while the requests queue
			if f := s.scrape(t)["iop_edge_waiters"]; f != nil && len(f.Metric) == 1 {
				waiting = f.Metric[0].GetGauge().GetValue()
			}
		}
		if err := node.signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		for stream.Next() {
		}
		if err := stream.Err(); err == nil {
			t.Errorf("the started stream ended cleanly after its node died; want the surface's error")
		}
		var took []time.Duration
		bySrv := map[string]int{}
		for range n {
			a := <-results
			if a.status != 200 || a.model != "big-k" {
				t.Errorf("a queued request for big-k after its node died: %+v, want 200 naming big-k", a)
			}
			bySrv[a.servedModel]++
			took = append(took, time.Since(killed))
		}
		if bySrv["small"] != n {
			t.Errorf("served by %v, want all %d by small", bySrv, n)
		}
		if _, err := node.wait(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		var moved float64
		for _, m := range s.scrape(t)["iop_edge_fallbacks_total"].GetMetric() {
			if l := labels(m); l["from"] == "big-k" && l["to"] == "small" && l["reason"] == "unavailable" {
				moved = m.GetCounter().GetValue()
			}
		}
		if moved != n {
			t.Errorf(`iop_edge_fallbacks_total{from="big-k",to="small",reason="unavailable"} = %v, want %d`, moved, n)
		}
		t.Logf("FIGURE big-k's node killed (kill -9) with 1 stream started and %d queued: the stream ended with an error; %d/%d queued answered 200 by small; last answer %v after the kill (loaded)",
			n, bySrv["small"], n, percentile(took, 1))
	})

	t.Run("V3 a local-only key never reaches the hosted API", func(t *testing.T) {
		site := s.openai(option.WithAPIKey(siteKey))
		before := hostedRequests(hosted)
		if a := ask(ctx, site, "hosted"); a.status != 400 {
			t.Errorf("site key on hosted (remote only): %+v, want 400", a)
		}
		if a := ask(ctx, site, "big-down"); a.status != 200 || a.servedModel != "small" {
			t.Errorf("site key on big-down: %+v, want small's answer", a)
		}
		if got := hostedRequests(hosted); got != before {
			t.Fatalf("the hosted API got %d requests of the local-only key", got-before)
		}
		page, err := site.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page.Data {
			if m.ID == "hosted" {
				t.Errorf("/v1/models for the local-only key lists hosted")
			}
		}
		if a := ask(ctx, c, "vault"); a.status != 200 || a.servedModel != "hosted" {
			t.Errorf("demo key on vault (node down, fallback hosted): %+v, want 200 served by hosted", a)
		}
		if got := hostedRequests(hosted) - before; got != 1 {
			t.Errorf("the hosted API ended %d requests, want the demo key's 1", got)
		}
	})
}
