package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cmdFairness runs the shared-fleet workload of `./run.sh bench fairness`
// (the edge's fair share and priority classes, SPEC G1–G3) for -duration
// and prints one record (kind "fairness"):
//
//   - the probe: one short chat request (max_tokens -probe-max-tokens)
//     every -probe-every with -probe-key, its latency (p50, p95, p99) and
//     how many it sent, got answered and got 429;
//   - each -flood LABEL:KEY:STREAMS:MAX_TOKENS:WEIGHT: STREAMS closed-loop
//     request loops with KEY, each sending its next request when the last
//     one ended (after the Retry-After of a 429); per flood the requests
//     answered, the completion tokens the backend reported, the 429s and
//     other errors.
//
// From those: the total completion tokens/s, and for the floods -jain
// names (one priority class) each one's share of their tokens against its
// share of their weights, and Jain's fairness index of tokens/weight over
// them (1 = each got exactly its weight's share). Requests are not streamed; the model is -model.
func cmdFairness(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fairness", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the edge's /v1/chat/completions URL")
	model := fs.String("model", "", "model group")
	label := fs.String("label", "", "label of the record (alone, fifo, fair)")
	dur := fs.Duration("duration", 30*time.Second, "how long to measure")
	warm := fs.Duration("warmup", 3*time.Second, "how long the floods run before measuring")
	probeKey := fs.String("probe-key", "", "the probe's Bearer key")
	probeEvery := fs.Duration("probe-every", 500*time.Millisecond, "the probe's period")
	probeMax := fs.Int("probe-max-tokens", 5, "the probe's max_tokens")
	jainOf := fs.String("jain", "", "comma-separated flood labels of one class whose shares are held against their weights (empty = every flood)")
	var floods []floodSpec
	fs.Func("flood", "LABEL:KEY:STREAMS:MAX_TOKENS:WEIGHT (repeatable)", func(s string) error {
		f, err := parseFlood(s)
		if err == nil {
			floods = append(floods, f)
		}
		return err
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *model == "" || *dur <= 0 {
		return errors.New("-url and -model are required, -duration > 0")
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: 5 * time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var wg sync.WaitGroup
	var mu sync.Mutex // guards res, and the probe's results in runProbe
	res := make([]floodResult, len(floods))
	t0 := time.Now()
	measuring, end := t0.Add(*warm), t0.Add(*warm+*dur)
	if len(floods) == 0 {
		measuring, end = t0, t0.Add(*dur)
	}
	start := measuring
	inWindow := func(t time.Time) bool { return !measuring.IsZero() && !t.Before(measuring) && t.Before(end) }
	startFloods(ctx, client, *url, *model, floods, end, inWindow, &mu, res, &wg)
	probe, lat := runProbe(ctx, client, *url, *probeKey, chatRequest(*model, *probeMax), *probeEvery, measuring, end, &mu)
	cancel() // floods: stop at once (their requests in flight end with the context)
	wg.Wait()

	rec := fairnessOf(*label, end.Sub(start).Seconds(), probe, lat, floods, res, *jainOf)
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

// startFloods starts each flood's STREAMS closed-loop request loops (wg
// counts them): each sends its next request when the last one ended,
// after the Retry-After of a 429, until ctx ends or end passes; what
// ended inWindow is added to res[i] under mu.
func startFloods(ctx context.Context, client *http.Client, url, model string, floods []floodSpec, end time.Time,
	inWindow func(time.Time) bool, mu *sync.Mutex, res []floodResult, wg *sync.WaitGroup) {
	for i, f := range floods {
		body := chatRequest(model, f.maxTokens)
		for range f.streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil && time.Now().Before(end) {
					out := post(ctx, client, url, f.key, body)
					done := time.Now()
					mu.Lock()
					if inWindow(done) {
						res[i].add(out)
					}
					mu.Unlock()
					if out.retryAfter > 0 {
						select {
						case <-ctx.Done():
						case <-time.After(out.retryAfter):
						}
					}
				}
			}()
		}
	}
}

// runProbe is the probe: one request of body with key every every from
// measuring to end; it returns once each has ended, with their results
// and the latencies of those answered 200, sorted (added under mu).
func runProbe(ctx context.Context, client *http.Client, url, key string, body []byte, every time.Duration,
	measuring, end time.Time, mu *sync.Mutex) (floodResult, []time.Duration) {
	var probe floodResult
	var lat []time.Duration
	time.Sleep(time.Until(measuring))
	tick := time.NewTicker(every)
	var pwg sync.WaitGroup
	for now := time.Now(); now.Before(end); now = <-tick.C {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			t := time.Now()
			out := post(ctx, client, url, key, body)
			d := time.Since(t)
			mu.Lock()
			probe.add(out)
			if out.status == http.StatusOK {
				lat = append(lat, d)
			}
			mu.Unlock()
		}()
	}
	tick.Stop()
	pwg.Wait()
	slices.Sort(lat)
	return probe, lat
}

// fairnessOf is the record of a run of secs seconds: the probe's counts
// and latency quantiles (lat sorted), each flood's counts, the total
// completion tokens/s, and for the floods jainOf names (comma-separated;
// "" = every flood) their shares of tokens and weights and Jain's index
// of tokens/weight.
func fairnessOf(label string, secs float64, probe floodResult, lat []time.Duration, floods []floodSpec, res []floodResult, jainOf string) fairnessRecord {
	rec := fairnessRecord{Kind: "fairness", Label: label, Seconds: secs, Probe: probe.summary(), ProbeSent: probe.sent}
	if len(lat) > 0 {
		rec.ProbeP50 = fairMs(quantile(lat, 0.5))
		rec.ProbeP95 = fairMs(quantile(lat, 0.95))
		rec.ProbeP99 = fairMs(quantile(lat, 0.99))
		rec.ProbeMax = fairMs(lat[len(lat)-1])
	}
	member := func(label string) bool { return jainOf == "" || slices.Contains(strings.Split(jainOf, ","), label) }
	var tokens, weights float64
	for i, f := range floods {
		if member(f.label) {
			tokens += float64(res[i].tokens)
			weights += float64(f.weight)
		}
	}
	var xs []float64
	for i, f := range floods {
		fr := res[i].summary()
		fr.Label, fr.Weight, fr.Streams = f.label, f.weight, f.streams
		if member(f.label) {
			if tokens > 0 {
				fr.Share = float64(res[i].tokens) / tokens
			}
			fr.WeightShare = float64(f.weight) / weights
			xs = append(xs, float64(res[i].tokens)/float64(f.weight))
		}
		rec.Floods = append(rec.Floods, fr)
		rec.TokensPerS += float64(res[i].tokens) / secs
	}
	rec.TokensPerS += float64(probe.tokens) / secs
	rec.Jain = jain(xs)
	return rec
}

type floodSpec struct {
	label, key                 string
	streams, maxTokens, weight int
}

func parseFlood(s string) (floodSpec, error) {
	p := strings.Split(s, ":")
	if len(p) != 5 {
		return floodSpec{}, fmt.Errorf("-flood %q: want LABEL:KEY:STREAMS:MAX_TOKENS:WEIGHT", s)
	}
	var n [3]int
	for i, v := range p[2:] {
		x, err := strconv.Atoi(v)
		if err != nil || x < 1 {
			return floodSpec{}, fmt.Errorf("-flood %q: %q is not a positive integer", s, v)
		}
		n[i] = x
	}
	return floodSpec{label: p[0], key: p[1], streams: n[0], maxTokens: n[1], weight: n[2]}, nil
}

func chatRequest(model string, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": "count"}}})
	return b
}

type outcome struct {
	status     int
	tokens     int64
	retryAfter time.Duration
	err        string
}

func post(ctx context.Context, c *http.Client, url, key string, body []byte) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return outcome{err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return outcome{err: "cancelled"}
		}
		return outcome{err: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	o := outcome{status: resp.StatusCode}
	if resp.StatusCode == http.StatusTooManyRequests {
		o.retryAfter = time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			o.retryAfter = time.Duration(s) * time.Second
		}
		o.err = "429"
		return o
	}
	if resp.StatusCode != http.StatusOK {
		o.err = fmt.Sprintf("%d %.120s", resp.StatusCode, b)
		return o
	}
	var v struct {
		Usage struct {
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &v) != nil {
		o.err = "bad body"
		return o
	}
	o.tokens = v.Usage.CompletionTokens
	return o
}

type floodResult struct {
	sent, ok, refused, failed int
	tokens                    int64
	errs                      []string
}

func (r *floodResult) add(o outcome) {
	if o.err == "cancelled" {
		return
	}
	r.sent++
	switch {
	case o.status == http.StatusOK && o.err == "":
		r.ok++
		r.tokens += o.tokens
	case o.status == http.StatusTooManyRequests:
		r.refused++
	default:
		r.failed++
		if len(r.errs) < 3 && !slices.Contains(r.errs, o.err) {
			r.errs = append(r.errs, o.err)
		}
	}
}

func (r *floodResult) summary() floodRecord {
	return floodRecord{OK: r.ok, Refused429: r.refused, Failed: r.failed, Tokens: r.tokens, Errors: r.errs}
}

type floodRecord struct {
	Label       string   `json:"label,omitempty"`
	Weight      int      `json:"weight,omitempty"`
	Streams     int      `json:"streams,omitempty"`
	OK          int      `json:"ok"`
	Refused429  int      `json:"refused_429"`
	Failed      int      `json:"failed"`
	Tokens      int64    `json:"completion_tokens"`
	Share       float64  `json:"share,omitempty"`        // of the -jain floods' tokens
	WeightShare float64  `json:"weight_share,omitempty"` // of the -jain floods' weights
	Errors      []string `json:"errors,omitempty"`
}

type fairnessRecord struct {
	Kind       string        `json:"kind"`
	Label      string        `json:"label,omitempty"`
	Seconds    float64       `json:"seconds"`
	ProbeSent  int           `json:"probe_sent"`
	Probe      floodRecord   `json:"probe"`
	ProbeP50   float64       `json:"probe_p50_ms"`
	ProbeP95   float64       `json:"probe_p95_ms"`
	ProbeP99   float64       `json:"probe_p99_ms"`
	ProbeMax   float64       `json:"probe_max_ms"`
	Floods     []floodRecord `json:"floods,omitempty"`
	TokensPerS float64       `json:"completion_tokens_per_s"`
	Jain       float64       `json:"jain_tokens_per_weight,omitempty"`
}

func fairMs(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*10) / 10 }

// jain is Jain's fairness index (Σx)² / (n·Σx²): 1 when every x is equal,
// 1/n when one takes everything; 0 without values.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if len(xs) == 0 || s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

// cmdFairnessReport turns the fairness records of -in (JSON lines) into
// Markdown: one row per record (phase), then one row per flood of each.
func cmdFairnessReport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fairness-report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "", "the fairness.jsonl of ./run.sh bench fairness")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var recs []fairnessRecord
	for _, line := range bytes.Split(b, []byte("\n")) {
		var r fairnessRecord
		if len(bytes.TrimSpace(line)) == 0 || json.Unmarshal(line, &r) != nil || r.Kind != "fairness" {
			continue
		}
		recs = append(recs, r)
	}
	w := &strings.Builder{}
	fmt.Fprintln(w, "| phase | probe p50 | probe p95 | probe p99 | probe ok / sent | probe 429 | completion tokens/s | Jain (tokens/weight) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range recs {
		fmt.Fprintf(w, "| %s | %.0f ms | %.0f ms | %.0f ms | %d / %d | %d | %.0f | %.3f |\n", r.Label, r.ProbeP50, r.ProbeP95, r.ProbeP99,
			r.Probe.OK, r.ProbeSent, r.Probe.Refused429, r.TokensPerS, r.Jain)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| phase | flood | streams | weight | answered | 429 | other errors | completion tokens | share | weight share |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range recs {
		for _, f := range r.Floods {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %.1f %% | %.1f %% |\n", r.Label, f.Label, f.Streams, f.Weight, f.OK,
				f.Refused429, f.Failed, f.Tokens, 100*f.Share, 100*f.WeightShare)
		}
	}
	_, err = io.WriteString(stdout, w.String())
	return err
}
