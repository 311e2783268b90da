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
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cmdBatches runs one phase of `./run.sh bench batches` (the edge's Batch
// API, SPEC X5) against the edge at -base and prints one record (kind
// "batches"):
//
//   - -phase concurrent: -lines chat requests (max_tokens -max-tokens) sent
//     by this client, -concurrency at a time, under -key: lines/s from the
//     first send to the last answer;
//   - -phase batch: the same lines as one JSONL file, uploaded with
//     POST /v1/files, made a batch (POST /v1/batches) and polled every
//     -poll until it ended: lines/s from the create to the poll that saw
//     it completed; the output is downloaded and each custom_id must be
//     there exactly once with a 200;
//   - -phase probe: one streamed chat request (max_tokens -probe-max-tokens)
//     every -probe-every for -duration under -probe-key: time to first
//     token (the first SSE event with non-empty content) p50/p95/p99. With
//     -batch-key, a batch of -lines lines of that key is created first and
//     the probe starts once it is in_progress; the record says how many of
//     its lines were answered during the probe and whether it was still
//     running at the end (it must be, or the probe did not run beside it),
//     and the batch is cancelled.
func cmdBatches(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("batches", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("base", "", "the edge's base URL (http://host:port)")
	phase := fs.String("phase", "", "concurrent, batch or probe")
	label := fs.String("label", "", "label of the record (default: the phase)")
	model := fs.String("model", "", "model group")
	key := fs.String("key", "", "the Bearer key of the lines (phases concurrent and batch)")
	lines := fs.Int("lines", 10000, "lines of the batch / requests of the concurrent phase")
	maxTokens := fs.Int("max-tokens", 10, "max_tokens of each line")
	conc := fs.Int("concurrency", 16, "requests in flight (phase concurrent)")
	poll := fs.Duration("poll", 100*time.Millisecond, "how often the batch is polled")
	probeKey := fs.String("probe-key", "", "the probe's Bearer key (phase probe)")
	batchKey := fs.String("batch-key", "", "phase probe: run a batch of -lines lines of this key beside the probe")
	probeEvery := fs.Duration("probe-every", 200*time.Millisecond, "the probe's period")
	probeMax := fs.Int("probe-max-tokens", 5, "the probe's max_tokens")
	dur := fs.Duration("duration", 20*time.Second, "how long the probe runs")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound of the whole phase")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *base == "" || *model == "" || *lines < 1 {
		return errors.New("-base and -model are required, -lines > 0")
	}
	if *label == "" {
		*label = *phase
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := &batchClient{base: strings.TrimRight(*base, "/"),
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}}
	rec := batchesRecord{Kind: "batches", Phase: *phase, Label: *label, Lines: *lines, MaxTokens: *maxTokens}
	var err error
	switch *phase {
	case "concurrent":
		rec.Concurrency = *conc
		err = c.concurrent(ctx, &rec, *key, *model, *lines, *maxTokens, *conc)
	case "batch":
		err = c.batch(ctx, &rec, *key, *model, *lines, *maxTokens, *poll)
	case "probe":
		err = c.probe(ctx, &rec, *probeKey, *batchKey, *model, *lines, *maxTokens, *probeMax, *probeEvery, *dur, *poll)
	default:
		return fmt.Errorf("-phase %q: want concurrent, batch or probe", *phase)
	}
	if err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

type batchesRecord struct {
	Kind        string  `json:"kind"`
	Phase       string  `json:"phase"`
	Label       string  `json:"label"`
	Lines       int     `json:"lines"`
	MaxTokens   int     `json:"max_tokens"`
	Concurrency int     `json:"concurrency,omitempty"`
	Seconds     float64 `json:"seconds,omitempty"`
	LinesPerS   float64 `json:"lines_per_s,omitempty"`
	OK          int     `json:"ok,omitempty"`
	Failed      int     `json:"failed,omitempty"`
	Retried429  int     `json:"retried_429,omitempty"`
	// Phase probe.
	ProbeSent    int      `json:"probe_sent,omitempty"`
	ProbeOK      int      `json:"probe_ok,omitempty"`
	TTFTp50      float64  `json:"ttft_p50_ms,omitempty"`
	TTFTp95      float64  `json:"ttft_p95_ms,omitempty"`
	TTFTp99      float64  `json:"ttft_p99_ms,omitempty"`
	BatchLines   int64    `json:"batch_lines_during_probe,omitempty"`
	BatchRunning bool     `json:"batch_running_at_end,omitempty"`
	Errors       []string `json:"errors,omitempty"`
}

type batchClient struct {
	base string
	http *http.Client
}

func (c *batchClient) do(ctx context.Context, method, path, key, ctype string, body io.Reader) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return 0, nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	return resp.StatusCode, b, err
}

func lineBody(model string, maxTokens, i int) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"line %d"}]}`, model, maxTokens, i)
}

func (c *batchClient) concurrent(ctx context.Context, rec *batchesRecord, key, model string, n, maxTokens, conc int) error {
	var next, ok, failed, retried atomic.Int64
	var mu sync.Mutex
	var errs []string
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > n || ctx.Err() != nil {
					return
				}
				for {
					st, b, err := c.do(ctx, http.MethodPost, "/v1/chat/completions", key, "application/json", strings.NewReader(lineBody(model, maxTokens, i)))
					if err == nil && (st == http.StatusTooManyRequests || st == http.StatusServiceUnavailable) {
						retried.Add(1) // a client retries as the batch runner does
						select {
						case <-ctx.Done():
						case <-time.After(250 * time.Millisecond):
						}
						continue
					}
					if err == nil && st == http.StatusOK && bytes.Contains(b, []byte(`"chat.completion"`)) {
						ok.Add(1)
					} else {
						failed.Add(1)
						mu.Lock()
						if len(errs) < 3 {
							errs = append(errs, fmt.Sprintf("%d %v %.100s", st, err, b))
						}
						mu.Unlock()
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	rec.Seconds, rec.LinesPerS = round1(secs), round1(float64(ok.Load())/secs)
	rec.OK, rec.Failed, rec.Retried429, rec.Errors = int(ok.Load()), int(failed.Load()), int(retried.Load()), errs
	if rec.OK != n {
		return fmt.Errorf("concurrent: %d of %d answered 200 (%v)", rec.OK, n, errs)
	}
	return nil
}

type batchObject struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	OutputFileID  string `json:"output_file_id"`
	ErrorFileID   string `json:"error_file_id"`
	RequestCounts struct {
		Total, Completed, Failed int64
	} `json:"request_counts"`
}

// submit uploads n lines as a JSONL file of key and creates a batch of it.
func (c *batchClient) submit(ctx context.Context, key, model string, n, maxTokens int) (string, time.Time, error) {
	var in bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&in, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":%s}`+"\n", i, lineBody(model, maxTokens, i))
	}
	var mp bytes.Buffer
	w := multipart.NewWriter(&mp)
	_ = w.WriteField("purpose", "batch")
	fw, _ := w.CreateFormFile("file", "bench.jsonl")
	_, _ = fw.Write(in.Bytes())
	_ = w.Close()
	st, b, err := c.do(ctx, http.MethodPost, "/v1/files", key, w.FormDataContentType(), &mp)
	if err != nil || st != http.StatusOK {
		return "", time.Time{}, fmt.Errorf("upload: %d %v %.200s", st, err, b)
	}
	var f struct{ ID string }
	if err := json.Unmarshal(b, &f); err != nil {
		return "", time.Time{}, err
	}
	created := time.Now()
	st, b, err = c.do(ctx, http.MethodPost, "/v1/batches", key, "application/json",
		strings.NewReader(fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, f.ID)))
	if err != nil || st != http.StatusOK {
		return "", time.Time{}, fmt.Errorf("create: %d %v %.200s", st, err, b)
	}
	var o batchObject
	if err := json.Unmarshal(b, &o); err != nil {
		return "", time.Time{}, err
	}
	return o.ID, created, nil
}

func (c *batchClient) get(ctx context.Context, key, id string) (batchObject, error) {
	var o batchObject
	st, b, err := c.do(ctx, http.MethodGet, "/v1/batches/"+id, key, "", nil)
	if err != nil || st != http.StatusOK {
		return o, fmt.Errorf("get %s: %d %v %.200s", id, st, err, b)
	}
	return o, json.Unmarshal(b, &o)
}

func (c *batchClient) batch(ctx context.Context, rec *batchesRecord, key, model string, n, maxTokens int, poll time.Duration) error {
	id, created, err := c.submit(ctx, key, model, n, maxTokens)
	if err != nil {
		return err
	}
	var o batchObject
	for {
		if o, err = c.get(ctx, key, id); err != nil {
			return err
		}
		if o.Status == "completed" || o.Status == "failed" || o.Status == "cancelled" || o.Status == "expired" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("batch %s: %s after the timeout (%+v)", id, o.Status, o.RequestCounts)
		case <-time.After(poll):
		}
	}
	secs := time.Since(created).Seconds()
	if o.Status != "completed" {
		return fmt.Errorf("batch %s ended %s", id, o.Status)
	}
	// Every custom_id exactly once, each a 200.
	st, b, err := c.do(ctx, http.MethodGet, "/v1/files/"+o.OutputFileID+"/content", key, "", nil)
	if err != nil || st != http.StatusOK {
		return fmt.Errorf("output: %d %v", st, err)
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
			} `json:"response"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || seen[l.CustomID] {
			rec.Failed++
			continue
		}
		seen[l.CustomID] = true
		if l.Response.StatusCode == http.StatusOK {
			rec.OK++
		} else {
			rec.Failed++
		}
	}
	rec.Failed += int(o.RequestCounts.Failed)
	rec.Seconds, rec.LinesPerS = round1(secs), round1(float64(rec.OK)/secs)
	if rec.OK != n || rec.Failed != 0 {
		return fmt.Errorf("batch %s: %d of %d lines answered 200 once, %d failed or twice", id, rec.OK, n, rec.Failed)
	}
	return nil
}

func (c *batchClient) probe(ctx context.Context, rec *batchesRecord, probeKey, batchKey, model string, n, maxTokens, probeMax int,
	every, dur, poll time.Duration) error {
	var id string
	var before int64
	if batchKey != "" {
		var err error
		if id, _, err = c.submit(ctx, batchKey, model, n, maxTokens); err != nil {
			return err
		}
		defer func() {
			_, _, _ = c.do(context.Background(), http.MethodPost, "/v1/batches/"+id+"/cancel", batchKey, "", nil)
		}()
		// Start once the batch's lines run (and a second more, to be at its pace).
		for {
			o, err := c.get(ctx, batchKey, id)
			if err != nil {
				return err
			}
			if o.Status == "in_progress" && o.RequestCounts.Completed > 0 {
				break
			}
			if o.Status != "validating" && o.Status != "in_progress" {
				return fmt.Errorf("batch %s is %s before the probe", id, o.Status)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(poll):
			}
		}
		time.Sleep(time.Second)
		o, err := c.get(ctx, batchKey, id)
		if err != nil {
			return err
		}
		before = o.RequestCounts.Completed + o.RequestCounts.Failed
	}
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"probe"}]}`, model, probeMax)
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	end := time.Now().Add(dur)
	tick := time.NewTicker(every)
	for now := time.Now(); now.Before(end); now = <-tick.C {
		rec.ProbeSent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := c.ttft(ctx, probeKey, body)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if len(rec.Errors) < 3 {
					rec.Errors = append(rec.Errors, err.Error())
				}
				return
			}
			lat = append(lat, d)
		}()
	}
	tick.Stop()
	wg.Wait()
	rec.ProbeOK = len(lat)
	slices.Sort(lat)
	if len(lat) > 0 {
		rec.TTFTp50, rec.TTFTp95, rec.TTFTp99 = fairMs(quantile(lat, 0.5)), fairMs(quantile(lat, 0.95)), fairMs(quantile(lat, 0.99))
	}
	rec.Seconds = round1(dur.Seconds())
	if id != "" {
		o, err := c.get(ctx, batchKey, id)
		if err != nil {
			return err
		}
		rec.BatchLines = o.RequestCounts.Completed + o.RequestCounts.Failed - before
		rec.BatchRunning = o.Status == "in_progress"
		rec.LinesPerS = round1(float64(rec.BatchLines) / dur.Seconds())
		if !rec.BatchRunning {
			return fmt.Errorf("batch %s was %s at the probe's end: the probe did not run beside it the whole time (more -lines)", id, o.Status)
		}
	}
	if rec.ProbeOK != rec.ProbeSent {
		return fmt.Errorf("probe: %d of %d answered (%v)", rec.ProbeOK, rec.ProbeSent, rec.Errors)
	}
	return nil
}

// ttft sends one streamed chat request and returns the time to its first
// SSE event with non-empty content; the stream is read to its end.
func (c *batchClient) ttft(ctx context.Context, key, body string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var first time.Duration
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadBytes('\n')
		if p, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok && first == 0 {
			var ch struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal(bytes.TrimSpace(p), &ch) == nil && len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
				first = time.Since(start)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if first == 0 {
		return 0, errors.New("no content event in the stream")
	}
	return first, nil
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }

// cmdBatchesReport turns the batches records of -in (JSON lines) into
// Markdown: throughput per phase, then the probe's TTFT with and without a
// batch beside it.
func cmdBatchesReport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("batches-report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "", "the batches.jsonl of ./run.sh bench batches")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var recs []batchesRecord
	for _, line := range bytes.Split(b, []byte("\n")) {
		var r batchesRecord
		if len(bytes.TrimSpace(line)) == 0 || json.Unmarshal(line, &r) != nil || r.Kind != "batches" {
			continue
		}
		recs = append(recs, r)
	}
	w := &strings.Builder{}
	fmt.Fprintln(w, "| run | lines | max_tokens | seconds | lines/s | answered 200 | failed | client retries (429/503) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range recs {
		if r.Phase == "probe" {
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %d | %.1f | %.1f | %d | %d | %d |\n", r.Label, r.Lines, r.MaxTokens, r.Seconds, r.LinesPerS, r.OK, r.Failed, r.Retried429)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| probe | TTFT p50 | TTFT p95 | TTFT p99 | ok / sent | batch lines/s during the probe | batch still running at the end |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	var alone float64
	for _, r := range recs {
		if r.Phase != "probe" {
			continue
		}
		delta := ""
		if r.BatchLines == 0 {
			alone = r.TTFTp95
		} else if alone > 0 {
			delta = fmt.Sprintf(" (%+.0f %%)", 100*(r.TTFTp95-alone)/alone)
		}
		running := "—"
		if r.BatchLines > 0 {
			running = fmt.Sprint(r.BatchRunning)
		}
		fmt.Fprintf(w, "| %s | %.1f ms | %.1f ms%s | %.1f ms | %d / %d | %.1f | %s |\n", r.Label, r.TTFTp50, r.TTFTp95, delta, r.TTFTp99,
			r.ProbeOK, r.ProbeSent, r.LinesPerS, running)
	}
	_, err = io.WriteString(stdout, w.String())
	return err
}
