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
	"strconv"
	"strings"
	"sync"
	"time"
)

// cmdSlots measures how one backend serves concurrent requests: for each
// concurrency c of -levels it runs three probes against the backend's
// /v1/chat/completions directly (no edge) and prints one Markdown row:
//
//   - together: c streams start at once, each with a fresh prompt of
//     -prompt-bytes (a nonce first, so no prefix cache serves it) and
//     -max-tokens: their mean time to first token (TTFT) and mean time
//     per output token after the first (TPOT);
//   - busy: c−1 long streams (4 × -max-tokens) are decoding, then one more
//     request with a fresh prompt arrives: its TTFT and TPOT.
//
// So the same command against the demo backend and against llama-server
// says how closely the demo's pacing follows the real server's slot
// scheduling (per-token time against busy slots, prefill against busy
// slots).
func cmdSlots(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("slots", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the backend's /v1/chat/completions URL")
	model := fs.String("model", "", "model")
	levels := fs.String("levels", "1,2,4,8", "comma-separated concurrencies")
	promptBytes := fs.Int("prompt-bytes", 2048, "bytes of each prompt")
	maxTokens := fs.Int("max-tokens", 64, "max_tokens of each measured request")
	label := fs.String("label", "", "label of the rows")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *model == "" {
		return errors.New("-url and -model are required")
	}
	var ls []int
	for _, s := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-levels: %q is not a positive integer", s)
		}
		ls = append(ls, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// A new connection per request: llama-server closes idle keep-alive
	// connections, and a request must not meet one it is closing.
	cl := streamClient(1)
	cl.Transport.(*http.Transport).DisableKeepAlives = true
	p := &slotProbe{url: *url, model: *model, promptBytes: *promptBytes, maxTokens: *maxTokens,
		cl: cl, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
	fmt.Fprintf(stdout, "| %s | c | together: TTFT ms | TPOT ms | busy (c−1 decoding): TTFT ms | TPOT ms |\n|---|---:|---:|---:|---:|---:|\n", "backend")
	for _, c := range ls {
		tt, tp, err := p.together(ctx, c)
		if err != nil {
			return fmt.Errorf("together c=%d: %w", c, err)
		}
		bt, bp, err := p.busy(ctx, c)
		if err != nil {
			return fmt.Errorf("busy c=%d: %w", c, err)
		}
		fmt.Fprintf(stdout, "| %s | %d | %.0f | %.1f | %.0f | %.1f |\n", *label, c, tt, tp, bt, bp)
	}
	return nil
}

type slotProbe struct {
	url, model             string
	promptBytes, maxTokens int
	cl                     *http.Client
	mu                     sync.Mutex
	rng                    *rand.Rand
}

// prompt returns a fresh prompt: a nonce, then filler.
func (p *slotProbe) prompt() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%016x %s", p.rng.Uint64(), filler(p.rng, p.promptBytes))
}

// together: c requests at once; mean TTFT and TPOT in ms.
func (p *slotProbe) together(ctx context.Context, c int) (float64, float64, error) {
	type res struct {
		ttft, tpot time.Duration
		err        error
	}
	out := make(chan res, c)
	for range c {
		go func() {
			ttft, tpot, err := p.stream(ctx, p.prompt(), p.maxTokens, nil)
			out <- res{ttft, tpot, err}
		}()
	}
	var st, sp time.Duration
	var errs []error
	for range c {
		r := <-out
		st += r.ttft
		sp += r.tpot
		errs = append(errs, r.err)
	}
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	return msOf(st / time.Duration(c)), msOf(sp / time.Duration(c)), nil
}

// busy: c−1 long streams decoding, then one request; its TTFT and TPOT.
func (p *slotProbe) busy(ctx context.Context, c int) (float64, float64, error) {
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	started := make(chan struct{}, c)
	for range c - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stream(bctx, p.prompt(), 4*p.maxTokens, started)
		}()
	}
	for range c - 1 {
		select {
		case <-started:
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	ttft, tpot, err := p.stream(ctx, p.prompt(), p.maxTokens, nil)
	cancel()
	wg.Wait()
	return msOf(ttft), msOf(tpot), err
}

// stream sends one streamed chat request and reads it to the end (or
// until ctx ends); first, if set, gets a value at the first content token.
func (p *slotProbe) stream(ctx context.Context, prompt string, maxTokens int, first chan<- struct{}) (ttft, tpot time.Duration, err error) {
	body, _ := json.Marshal(map[string]any{"model": p.model, "stream": true, "max_tokens": maxTokens,
		"messages": []message{{"user", prompt}}})
	resp, start, err := postJSON(ctx, p.cl, p.url, "", body)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var firstAt, last time.Time
	n := 0
	br := bufio.NewReader(resp.Body)
	for {
		line, rerr := br.ReadBytes('\n')
		if bytes.Contains(line, []byte(`"content":"`)) && !bytes.Contains(line, []byte(`"content":""`)) {
			now := time.Now()
			if n == 0 {
				firstAt = now
				if first != nil {
					first <- struct{}{}
				}
			}
			last = now
			n++
		}
		if rerr != nil {
			break
		}
	}
	if n == 0 {
		if ctx.Err() != nil {
			return 0, 0, nil
		}
		return 0, 0, errors.New("no content token")
	}
	ttft = firstAt.Sub(start)
	if n > 1 {
		tpot = last.Sub(firstAt) / time.Duration(n-1)
	}
	return ttft, tpot, nil
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
