package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// routingRun is what one routing mode's run measured: the backends' own
// reports, summed over the later turns (turn 2 on) of every conversation.
type routingRun struct {
	cached, prompt int     // later turns' usage prompt_tokens and cached_tokens
	promptMs       float64 // later turns' timings.prompt_ms (the demo's prefill time)
	exact          int     // later turns cached through the previous answer
	later          int     // later turns
	status         []byte  // /status after the run
	metrics        map[string]float64
}

// TestRoutingModesThroughEdgeAndNode: R1 — through the real edge and
// node, three demo instances (each its own prefix cache, 2 ms of prefill
// per uncached token) serve the same multi-turn workload under
// least_loaded and prefix_affinity. Each turn of the six conversations
// starts only once the previous one was admitted, in an order that
// rotates every turn, so least_loaded (the least in-flight replica) puts
// a conversation's turns on different replicas while prefix_affinity keeps
// each on the replica holding its history: every later turn is cached up to
// the previous answer, the cached tokens are at least twice, the uncached
// (prefilled) tokens at most half and the measured prefill time lower, and
// /status and /metrics say so.
func TestRoutingModesThroughEdgeAndNode(t *testing.T) {
	leakcheck.Check(t)
	runs := map[string]routingRun{}
	for _, mode := range []string{"least_loaded", "prefix_affinity"} {
		t.Run("issue16 "+mode, func(t *testing.T) { runs[mode] = routingWorkload(t, mode) })
	}
	ll, pa := runs["least_loaded"], runs["prefix_affinity"]
	if t.Failed() {
		return
	}
	if pa.exact != pa.later {
		t.Errorf("prefix_affinity: %d of %d later turns cached through the previous answer, want all", pa.exact, pa.later)
	}
	if pa.cached < 2*ll.cached {
		t.Errorf("cached prompt tokens: prefix_affinity %d, least_loaded %d; want at least twice", pa.cached, ll.cached)
	}
	// Prefill: the demo waits 2 ms per uncached token; the measured
	// prompt_ms adds scheduling delay, which a loaded machine inflates, so
	// the halving is asserted on the uncached tokens and the measured time
	// only has to be lower.
	if pu, lu := pa.prompt-pa.cached, ll.prompt-ll.cached; 2*pu > lu {
		t.Errorf("uncached prompt tokens: prefix_affinity %d, least_loaded %d; want at most half", pu, lu)
	}
	if pa.promptMs >= ll.promptMs {
		t.Errorf("prefill time: prefix_affinity %.0f ms, least_loaded %.0f ms; want less", pa.promptMs, ll.promptMs)
	}
	t.Logf("R1 e2e: later turns cached tokens least_loaded %d/%d (%.0f ms prefill), prefix_affinity %d/%d (%.0f ms prefill)",
		ll.cached, ll.prompt, ll.promptMs, pa.cached, pa.prompt, pa.promptMs)
	var st struct {
		Models []struct {
			Name      string            `json:"name"`
			Routing   string            `json:"routing"`
			Decisions map[string]uint64 `json:"decisions"`
			HitRatio  float64           `json:"hit_ratio"`
		} `json:"models"`
	}
	if err := json.Unmarshal(pa.status, &st); err != nil || len(st.Models) != 1 {
		t.Fatalf("/status models: %v: %s", err, pa.status)
	}
	if m := st.Models[0]; m.Routing != "prefix_affinity" || m.Decisions["prefix_hit"] != uint64(pa.later) || m.Decisions["hash"] != 6 || m.HitRatio < 0.74 {
		t.Errorf("/status models[0] = %+v, want prefix_affinity with %d prefix hits and 6 hash decisions", m, pa.later)
	}
	if got := pa.metrics[`iop_edge_routing_decisions_total{model="conv",result="prefix_hit"}`]; got != float64(pa.later) {
		t.Errorf("iop_edge_routing_decisions_total prefix_hit = %v, want %d", got, pa.later)
	}
}

// routingWorkload runs six conversations of four turns against a fresh
// stack in routing mode and returns what the backends reported.
func routingWorkload(t *testing.T, mode string) routingRun {
	const (
		convs, turns = 6, 4
		system       = "You are the routing test. Answer briefly."
	)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	var bps []*backendProc
	var adapters []config.Adapter
	var providers []config.ModelProvider
	for i := range 3 {
		bp := startBackend(t, backend.Options{PrefixCache: 4096, PrefillPerToken: 2 * time.Millisecond})
		bps = append(bps, bp)
		name := fmt.Sprintf("r%d", i+1)
		adapters = append(adapters, compatAdapter(name, bp.serve(t, nil), 8))
		providers = append(providers, provider("gpu-1", name, "tiny"))
	}
	m := modelGroup("conv", providers...)
	m.Routing = mode // the default affinity_epsilon
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: adapters}}, []config.Model{m}, nil)
	_, adm, api := startReady(t, p, cfg, logs)

	started := func() int {
		n := 0
		for _, bp := range bps {
			n += int(bp.b.Stats().Started)
		}
		return n
	}
	history := make([][]map[string]string, convs)
	for c := range history {
		history[c] = []map[string]string{{"role": "system", "content": system}}
	}
	var run routingRun
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
			c := (k + turn) % convs // a different arrival order each turn
			history[c] = append(history[c], map[string]string{"role": "user",
				"content": fmt.Sprintf("conversation %d turn %d: %s", c, turn, strings.Repeat("tell me more about prefix caches. ", 12))})
			body, _ := json.Marshal(map[string]any{"model": "conv", "messages": history[c], "stream": true,
				"stream_options": map[string]bool{"include_usage": true}})
			before := started()
			wg.Add(1)
			go func() {
				defer wg.Done()
				text, rep, err := api.streamReport(body)
				out <- answer{c, text, rep, err}
			}()
			// The next request arrives once this one reached its backend,
			// so the routing sees it in flight (it holds the backend for
			// its prefill: ≥ 2 ms per uncached prompt token).
			eventually(t, 10*time.Second, "request admitted", func() (bool, string) {
				return started() > before, fmt.Sprintf("backends started %d requests", started())
			})
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
			run.promptMs += a.rep.promptMs
			// Cached through the previous answer: all but the new user
			// message (4 + ⌈bytes/4⌉ tokens by the demo's estimate).
			last := history[a.c][len(history[a.c])-2]["content"]
			if a.rep.cached == a.rep.prompt-(4+(len(last)+3)/4) {
				run.exact++
			}
		}
	}
	var err error
	if run.status, err = adm.get("/status"); err != nil {
		t.Fatal(err)
	}
	if run.metrics, err = adm.metrics(); err != nil {
		t.Fatal(err)
	}
	return run
}

// turnReport is what the backend reported about one streamed answer.
type turnReport struct {
	prompt, cached int
	promptMs       float64
}

// streamReport posts a streamed chat request and returns the answer text
// and the usage chunk's prompt and cached tokens and timings.prompt_ms.
func (c *apiClient) streamReport(body []byte) (string, turnReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", turnReport{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", turnReport{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", turnReport{}, fmt.Errorf("status %d, %v: %s", resp.StatusCode, err, raw)
	}
	var text strings.Builder
	var rep turnReport
	for _, data := range sseData(raw) {
		if data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct{ Content *string } `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Timings *struct {
				PromptMs float64 `json:"prompt_ms"`
			} `json:"timings"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return "", rep, fmt.Errorf("chunk %q: %w", data, err)
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != nil {
				text.WriteString(*c.Delta.Content)
			}
		}
		if ch.Usage != nil {
			rep.prompt, rep.cached = ch.Usage.PromptTokens, ch.Usage.PromptTokensDetails.CachedTokens
		}
		if ch.Timings != nil {
			rep.promptMs = ch.Timings.PromptMs
		}
	}
	if rep.prompt == 0 {
		return "", rep, fmt.Errorf("no usage chunk in %s", raw)
	}
	return text.String(), rep, nil
}
