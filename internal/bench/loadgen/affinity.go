package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// cmdAffinity runs the prefix-affinity (R1) multi-turn workload against one model group
// and prints one record (kind "affinity"): conversations × turns chat
// requests, each conversation's turns in order, -concurrency requests at a
// time round-robin over the open conversations (see run), every request
// streamed with include_usage. Every conversation
// starts with the same system prompt; each turn adds a user message of its
// own and, after the answer, the assistant message exactly as streamed (so
// the next turn's prompt starts with the previous one, as a chat client's
// does).
//
// Per request it records the time to the first content token (TTFT), the
// backend's own report of prompt tokens and cached prompt tokens
// (usage.prompt_tokens_details.cached_tokens, or timings.cache_n when the
// usage has no details) and the response's "model" — the provider's
// target, so that giving each replica its own target name (llama-server
// --alias; the demo backend's "tiny-loop" and "tiny-loop:latest") counts
// the requests per replica.
func cmdAffinity(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("affinity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the edge's /v1/chat/completions URL")
	model := fs.String("model", "", "model group")
	key := fs.String("key", "", "Bearer key (empty = none)")
	label := fs.String("label", "", "label of the record (the routing mode)")
	convs := fs.Int("conversations", 50, "conversations")
	turns := fs.Int("turns", 5, "turns per conversation")
	conc := fs.Int("concurrency", 8, "conversations in flight at once")
	sysBytes := fs.Int("system-bytes", 1536, "bytes of the shared system prompt")
	userBytes := fs.Int("user-bytes", 256, "bytes of each user message")
	maxTokens := fs.Int("max-tokens", 64, "max_tokens of each request")
	seed := fs.Uint64("seed", 1, "seed of the message texts")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	replicas := fs.String("replicas", "", "comma-separated replica names (response \"model\"), so that one sent nothing counts 0")
	trace := fs.String("trace", "", "file to write one JSON line per request to (start, TTFT and total in ms, replica, prompt and cached tokens, conversation, turn)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *model == "" || *convs < 1 || *turns < 1 || *conc < 1 {
		return errors.New("-url and -model are required; -conversations, -turns, -concurrency ≥ 1")
	}
	w := &workload{url: *url, model: *model, key: *key, turns: *turns, maxTokens: *maxTokens,
		system: filler(rand.New(rand.NewPCG(*seed, 0)), *sysBytes), userBytes: *userBytes, seed: *seed,
		cl: streamClient(*conc * 2)}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	res := w.run(ctx, *convs, *conc)
	rec := res.record(*label, time.Since(start))
	if *trace != "" {
		if err := res.writeTrace(*trace, *label, start); err != nil {
			return err
		}
	}
	for _, n := range strings.Split(*replicas, ",") {
		if n != "" {
			rec.Replicas[n] += 0
		}
	}
	return emit(stdout, rec)
}

// workload is one run's fixed parameters.
type workload struct {
	url, model, key, system string
	turns, maxTokens        int
	userBytes               int
	seed                    uint64
	cl                      *http.Client
}

// turnResult is one request's outcome.
type turnResult struct {
	conv, turn     int
	start          time.Time
	ttft, total    time.Duration
	prompt, cached int
	replica        string
	err            error
}

type affinityResults struct {
	mu    sync.Mutex
	turns []turnResult
}

// run keeps every conversation open at once, as users of a chat service
// are: a FIFO of conversations ready for their next turn, served by conc
// workers; a conversation goes to the back of the FIFO when its turn is
// answered, so about convs−conc other requests pass between two turns of
// one conversation (a user's think time), and a router cannot keep a
// conversation on its replica merely because that replica just freed a
// slot. A failed turn ends its conversation (its history would be wrong).
func (w *workload) run(ctx context.Context, convs, conc int) *affinityResults {
	res := &affinityResults{}
	type conv struct {
		id   int
		rng  *rand.Rand
		msgs []message
		turn int
	}
	ready := make(chan *conv, convs)
	for c := range convs {
		ready <- &conv{id: c, rng: rand.New(rand.NewPCG(w.seed, uint64(c)+1)), msgs: []message{{"system", w.system}}}
	}
	var open sync.WaitGroup
	open.Add(convs)
	go func() { open.Wait(); close(ready) }()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for cv := range ready {
				if ctx.Err() != nil {
					open.Done()
					continue
				}
				cv.turn++
				cv.msgs = append(cv.msgs, message{"user", fmt.Sprintf("Conversation %d, question %d: %s", cv.id, cv.turn, filler(cv.rng, w.userBytes))})
				tr, answer := w.turn(ctx, cv.msgs)
				tr.conv, tr.turn = cv.id, cv.turn
				res.mu.Lock()
				res.turns = append(res.turns, tr)
				res.mu.Unlock()
				if tr.err != nil || cv.turn == w.turns {
					open.Done()
					continue
				}
				cv.msgs = append(cv.msgs, message{"assistant", answer})
				ready <- cv
			}
		}()
	}
	wg.Wait()
	return res
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// turn sends one streamed request and reads it to the end.
func (w *workload) turn(ctx context.Context, msgs []message) (turnResult, string) {
	body, _ := json.Marshal(map[string]any{
		"model": w.model, "messages": msgs, "stream": true, "max_tokens": w.maxTokens,
		"stream_options": map[string]bool{"include_usage": true},
	})
	resp, start, err := postJSON(ctx, w.cl, w.url, w.key, body)
	if err != nil {
		return turnResult{start: start, err: err}, ""
	}
	defer resp.Body.Close()
	tr := turnResult{start: start}
	var answer strings.Builder
	done := false
	br := bufio.NewReaderSize(resp.Body, 16384)
	for {
		line, err := br.ReadBytes('\n')
		if p, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			p = bytes.TrimSpace(p)
			if string(p) == "[DONE]" {
				done = true
			} else if e := tr.chunk(p, &answer, start); e != nil {
				return turnResult{err: e}, ""
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return turnResult{err: err}, ""
		}
	}
	if !done || tr.ttft == 0 {
		return turnResult{err: fmt.Errorf("stream ended without [DONE] or without content")}, ""
	}
	tr.total = time.Since(start)
	return tr, answer.String()
}

// chunk reads one chat.completion.chunk: content (the first one stamps
// TTFT), model, usage, llama-server's timings.
func (tr *turnResult) chunk(p []byte, answer *strings.Builder, start time.Time) error {
	var ch struct {
		Model   string `json:"model"`
		Choices []struct {
			Delta struct {
				Content *string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Timings *struct {
			CacheN int `json:"cache_n"`
		} `json:"timings"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(p, &ch); err != nil {
		return fmt.Errorf("chunk is not JSON: %v", err)
	}
	if len(ch.Error) > 0 {
		return fmt.Errorf("error event: %s", ch.Error)
	}
	if ch.Model != "" {
		tr.replica = ch.Model
	}
	for _, c := range ch.Choices {
		if c.Delta.Content != nil && *c.Delta.Content != "" {
			if tr.ttft == 0 {
				tr.ttft = time.Since(start)
			}
			answer.WriteString(*c.Delta.Content)
		}
	}
	if ch.Usage != nil {
		tr.prompt = ch.Usage.PromptTokens
		if ch.Usage.PromptTokensDetails != nil {
			tr.cached = ch.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if ch.Timings != nil && (ch.Usage == nil || ch.Usage.PromptTokensDetails == nil) {
		tr.cached = ch.Timings.CacheN
	}
	return nil
}

func (r *affinityResults) record(label string, took time.Duration) record {
	rec := record{Kind: "affinity", Label: label, Seconds: took.Seconds(), Replicas: map[string]int{}}
	var ttft []time.Duration
	errs := map[string]bool{}
	for _, t := range r.turns {
		rec.Requests++
		if t.err != nil {
			if len(errs) < 5 {
				errs[t.err.Error()] = true
			}
			continue
		}
		rec.OK++
		ttft = append(ttft, t.ttft)
		rec.PromptTokens += int64(t.prompt)
		rec.CachedTokens += int64(t.cached)
		rec.Replicas[t.replica]++
	}
	for e := range errs {
		rec.Errors = append(rec.Errors, e)
	}
	slices.Sort(ttft)
	if len(ttft) > 0 {
		rec.FirstP50, rec.FirstP90, rec.FirstP99 = us(quantile(ttft, 0.5)), us(quantile(ttft, 0.9)), us(quantile(ttft, 0.99))
		var sum time.Duration
		for _, d := range ttft {
			sum += d
		}
		rec.FirstAvg = us(sum / time.Duration(len(ttft)))
	}
	return rec
}

// postJSON posts body to url (with a Bearer key unless key is empty) and
// returns the 200 response and when the request was sent; another status
// is an error quoting the start of its body (the response is closed).
func postJSON(ctx context.Context, cl *http.Client, url, key string, body []byte) (*http.Response, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, time.Time{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	start := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		return nil, start, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		resp.Body.Close()
		return nil, start, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	return resp, start, nil
}

// writeTrace writes one JSON line per request to path, in the order the
// requests ended.
func (r *affinityResults) writeTrace(path, label string, start time.Time) error {
	var b bytes.Buffer
	for _, t := range r.turns {
		line, _ := json.Marshal(map[string]any{"label": label, "conv": t.conv, "turn": t.turn,
			"start_ms": float64(t.start.Sub(start)) / 1e6, "ttft_ms": float64(t.ttft) / 1e6, "total_ms": float64(t.total) / 1e6,
			"replica": t.replica, "prompt": t.prompt, "cached": t.cached, "ok": t.err == nil})
		b.Write(append(line, '\n'))
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// filler returns n bytes of lowercase words (no JSON escaping needed).
func filler(rng *rand.Rand, n int) string {
	words := [...]string{"cache", "prefix", "route", "token", "model", "node", "edge", "lease", "queue", "reply",
		"batch", "slot", "prompt", "turn", "answer", "river", "stone", "light", "paper", "green"}
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

// reportAffinity writes one row per affinity record, in the order given,
// with cached tokens and TTFT p50 compared with the least_loaded row.
func reportAffinity(w io.Writer, recs []record) {
	if len(recs) == 0 {
		return
	}
	var base *record
	for i := range recs {
		if recs[i].Label == "least_loaded" {
			base = &recs[i]
		}
	}
	fmt.Fprintln(w, "\n### Cache-aware routing")
	fmt.Fprintln(w, "\n| routing | requests ok | cached prompt tokens | cached share | vs least_loaded | prefilled (uncached) tokens | vs least_loaded | TTFT p50 ms | p90 | p99 | mean | TTFT p50 / mean vs least_loaded | requests per replica | max / mean |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range recs {
		share := 0.0
		if r.PromptTokens > 0 {
			share = float64(r.CachedTokens) / float64(r.PromptTokens)
		}
		vsCached, vsTTFT, vsPrefill := "", "", ""
		prefilled := r.PromptTokens - r.CachedTokens
		if base != nil && base.PromptTokens > base.CachedTokens {
			vsPrefill = fmt.Sprintf("%.2f×", float64(prefilled)/float64(base.PromptTokens-base.CachedTokens))
		}
		if base != nil && base.CachedTokens > 0 && base.FirstP50 > 0 {
			vsCached = fmt.Sprintf("%.2f×", float64(r.CachedTokens)/float64(base.CachedTokens))
			vsTTFT = fmt.Sprintf("%+.0f %% / %+.0f %%", (r.FirstP50/base.FirstP50-1)*100, (r.FirstAvg/base.FirstAvg-1)*100)
		}
		names := make([]string, 0, len(r.Replicas))
		total, most := 0, 0
		for n, c := range r.Replicas {
			names = append(names, n)
			total += c
			most = max(most, c)
		}
		slices.Sort(names)
		var per []string
		for _, n := range names {
			per = append(per, fmt.Sprintf("%s %d", n, r.Replicas[n]))
		}
		imbalance := 0.0
		if len(names) > 0 && total > 0 {
			imbalance = float64(most) / (float64(total) / float64(len(names)))
		}
		fmt.Fprintf(w, "| %s | %d/%d | %d | %.0f %% | %s | %d | %s | %s | %s | %s | %s | %s | %s | %.2f |\n", r.Label, r.OK, r.Requests,
			r.CachedTokens, share*100, vsCached, prefilled, vsPrefill, ms(r.FirstP50), ms(r.FirstP90), ms(r.FirstP99), ms(r.FirstAvg), vsTTFT,
			strings.Join(per, ", "), imbalance)
	}
}
