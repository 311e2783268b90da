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
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ErrStream: a stream's bytes were not the expected ones.
var ErrStream = errors.New("stream")

// loopTokens is the demo backend's tiny-loop cycle (internal/demo/backend
// doc): content token i is loopTokens[i%5].
var loopTokens = [...]string{" lorem", " ipsum", " dolor", " sit", " amet,"}

func expectedLoop(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(loopTokens[i%len(loopTokens)])
	}
	return b.String()
}

// streamSpec says how to read and check one stream.
type streamSpec struct {
	format string // sse (OpenAI chat.completion.chunk events) or ndjson (Ollama /api/chat)
	want   string // the whole content the stream must carry
}

type streamResult struct {
	first, total time.Duration // to the first complete event line; to EOF
	err          error
	kind         string // failure kind for counting
}

func streamClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}}
}

// doStream sends one streamed request and reads it to EOF. onOpen runs when
// the response headers arrived (200 only), onClose when the stream ended,
// whatever the outcome (only if onOpen ran). Lines are kept and checked
// after the clock stopped, so checking costs no measured time.
func doStream(ctx context.Context, cl *http.Client, t *target, spec streamSpec, onOpen, onClose func()) streamResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(t.body))
	if err != nil {
		return streamResult{err: err, kind: "request"}
	}
	req.Header = t.header()
	start := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		return streamResult{err: err, kind: "transport"}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return streamResult{err: fmt.Errorf("HTTP %d: %s", resp.StatusCode, b), kind: fmt.Sprintf("http_%d", resp.StatusCode)}
	}
	if onOpen != nil {
		onOpen()
		defer onClose()
	}
	var r streamResult
	var events [][]byte
	br := bufio.NewReaderSize(resp.Body, 8192)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			ev := bytes.TrimSpace(line)
			if spec.format == "sse" {
				if p, ok := bytes.CutPrefix(ev, []byte("data:")); ok {
					ev = bytes.TrimSpace(p)
				} else {
					ev = nil // blank separator, comment, event: line
				}
			}
			if len(ev) > 0 {
				if r.first == 0 {
					r.first = time.Since(start)
				}
				events = append(events, ev)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return streamResult{err: err, kind: "read"}
		}
	}
	r.total = time.Since(start)
	if err := checkStream(events, spec); err != nil {
		r.err, r.kind = err, "bytes"
	}
	return r
}

// checkStream verifies that the events carry exactly spec.want and end
// properly: [DONE] for SSE, "done":true for NDJSON.
func checkStream(events [][]byte, spec streamSpec) error {
	var got strings.Builder
	ended := false
	for _, ev := range events {
		if ended {
			return fmt.Errorf("%w: event after the end: %.80s", ErrStream, ev)
		}
		switch spec.format {
		case "sse":
			if string(ev) == "[DONE]" {
				ended = true
				continue
			}
			var c struct {
				Choices []struct {
					Delta struct {
						Content *string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Error json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(ev, &c); err != nil {
				return fmt.Errorf("%w: bad event %.80s: %v", ErrStream, ev, err)
			}
			if c.Error != nil {
				return fmt.Errorf("%w: error event %.120s", ErrStream, ev)
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != nil {
					got.WriteString(*ch.Delta.Content)
				}
			}
		default:
			var c struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				Done  bool   `json:"done"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(ev, &c); err != nil {
				return fmt.Errorf("%w: bad line %.80s: %v", ErrStream, ev, err)
			}
			if c.Error != "" {
				return fmt.Errorf("%w: error line %.120s", ErrStream, ev)
			}
			got.WriteString(c.Message.Content)
			ended = c.Done
		}
	}
	if !ended {
		return fmt.Errorf("%w: no terminal event after %d events", ErrStream, len(events))
	}
	if got.String() != spec.want {
		return fmt.Errorf("%w: content is %d bytes, want %d", ErrStream, got.Len(), len(spec.want))
	}
	return nil
}

func registerSpec(fs *flag.FlagSet, spec *streamSpec) *int {
	fs.StringVar(&spec.format, "format", "sse", "sse or ndjson")
	return fs.Int("tokens", 100, "content tokens the tiny-loop stream must carry")
}

// cmdStream starts streams at a fixed rate (one goroutine each, on
// schedule: open loop) and reports time to the first event and total time.
func cmdStream(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	var t target
	var spec streamSpec
	c.register(fs)
	t.register(fs)
	tokens := registerSpec(fs, &spec)
	rate := fs.Int("rate", 50, "streams started per second")
	dur := fs.Duration("duration", 5*time.Second, "how long to start streams")
	warm := fs.Int("warmup", 20, "unmeasured streams first, one after another")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := t.check(c.key); err != nil {
		return err
	}
	spec.want = expectedLoop(*tokens)
	cl := streamClient(1024)
	ctx, cancel := context.WithTimeout(context.Background(), *dur+2*time.Minute)
	defer cancel()
	for range *warm {
		if r := doStream(ctx, cl, &t, spec, nil, nil); r.err != nil {
			return fmt.Errorf("warm-up stream: %w", r.err)
		}
	}
	n := int(dur.Seconds() * float64(*rate))
	results := make([]streamResult, n)
	cpu, err := startCPU(c.pids)
	if err != nil {
		return err
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		sleepUntil(start.Add(time.Duration(i) * time.Second / time.Duration(*rate)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = doStream(ctx, cl, &t, spec, nil, nil)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sysPerReq := cpu.syscallsPerRequest(n)
	perReq, err := cpu.perRequest(n)
	if err != nil {
		return err
	}
	var firsts, totals []time.Duration
	var errs errSet
	for _, r := range results {
		if r.err != nil {
			errs.add(r.kind, r.err.Error())
			continue
		}
		firsts = append(firsts, r.first)
		totals = append(totals, r.total)
	}
	sortDurations(firsts)
	sortDurations(totals)
	return emit(stdout, record{
		Kind: "stream", Path: c.path, Round: c.round, Rate: *rate, Seconds: elapsed.Seconds(),
		Requests: n, OK: len(firsts), RPS: float64(n) / elapsed.Seconds(),
		FirstP50: us(quantile(firsts, 0.5)), FirstP99: us(quantile(firsts, 0.99)),
		TotalP50: us(quantile(totals, 0.5)), TotalP99: us(quantile(totals, 0.99)),
		CPUPerReq: perReq, SysPerReq: sysPerReq, Failures: errs.counts, Errors: errs.texts,
	})
}
