package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// concurrency records, per upstream server, the interval of every request
// from its arrival to the start of its last write (or the handler's return
// when it wrote nothing). Each interval lies inside the interval in which the
// node held the request's capacity slot (the node cannot have read the last
// bytes before they were written), so more than capacity overlapping
// intervals prove more than capacity requests in flight. (Counting until
// the handler returns would not: a client may have its whole answer, and
// start the next request, before the handler's epilogue ran.)
type concurrency struct {
	mu    sync.Mutex
	spans [][2]time.Time
	// active counts handlers running: a client can have its whole answer
	// (the last write flushed) before the handler returns and records its
	// span, so peak waits for them.
	active sync.WaitGroup
}

func (c *concurrency) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.active.Add(1)
		defer c.active.Done()
		lw := &lastWrite{ResponseWriter: w, start: time.Now()}
		h.ServeHTTP(lw, r)
		end := lw.last
		if end.IsZero() {
			end = time.Now()
		}
		c.mu.Lock()
		c.spans = append(c.spans, [2]time.Time{lw.start, end})
		c.mu.Unlock()
	})
}

// peak returns the most spans open at one instant and the span count,
// once every handler that started has returned.
func (c *concurrency) peak() (peak, total int) {
	c.active.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	type edge struct {
		at   time.Time
		open int
	}
	var es []edge
	for _, s := range c.spans {
		es = append(es, edge{s[0], 1}, edge{s[1], -1})
	}
	sort.Slice(es, func(i, j int) bool {
		if es[i].at.Equal(es[j].at) {
			return es[i].open < es[j].open // close before open at the same instant
		}
		return es[i].at.Before(es[j].at)
	})
	n := 0
	for _, e := range es {
		n += e.open
		peak = max(peak, n)
	}
	return peak, len(c.spans)
}

// lastWrite notes when the handler last started to write or flush.
type lastWrite struct {
	http.ResponseWriter
	start, last time.Time
}

func (w *lastWrite) Write(b []byte) (int, error) {
	w.last = time.Now()
	return w.ResponseWriter.Write(b)
}

func (w *lastWrite) Flush() {
	w.last = time.Now()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer (the reset
// fault hijacks through it).
func (w *lastWrite) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// arrivals records, in upstream arrival order, the user message of every
// request whose message starts with "req-".
func arrivals(rec *recorder[string], h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var doc struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if json.Unmarshal(body, &doc) == nil {
			for _, m := range doc.Messages {
				if strings.HasPrefix(m.Content, "req-") {
					rec.add(m.Content)
				}
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

// TestThousandConcurrentRequests sends 1,000 concurrent chat requests to one
// model group over 3 providers of capacity 4 (two ollama adapters on the run
// path, one openai_compat adapter on the tunnel path, each on its own node
// and upstream server): all complete, and neither the Edge's lease counts
// nor the upstream servers ever see a provider above 4 (Q2, Q3, Q4, Q8).
func TestThousandConcurrentRequests(t *testing.T) {
	leakcheck.Check(t)
	const (
		requests = 1000
		capacity = 4
	)
	logs := newLogSink(t)
	ids := []string{"n1", "n2", "n3"}
	p := newPKI(t, ids...)
	bp := startBackend(t, backend.Options{TokenDelay: time.Millisecond})
	var conc [3]concurrency
	var nodes []config.Node
	var cands []config.ModelProvider
	for i, id := range ids {
		url := bp.serve(t, conc[i].wrap(bp.b))
		a := ollamaAdapter("p"+id, url, capacity)
		if i == 1 {
			a = compatAdapter("p"+id, url, capacity)
		}
		nodes = append(nodes, config.Node{ID: id, Adapters: []config.Adapter{a}})
		cands = append(cands, provider(id, "p"+id, "tiny"))
	}
	cfg := edgeConfig(t, p, nodes, []config.Model{modelGroup("tiny", cands...)}, func(c *config.Config) {
		n := 2 * requests
		c.Queue.MaxWaiters, c.Queue.WaitTimeoutMs = &n, 60000
	})
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm := newAdminClient(t, e)
	api := newAPIClient(t, e)
	for _, id := range ids {
		startNode(t, p, id, e.nodeAddr, nodeOpts{log: logs.logger("node")})
	}
	adm.waitConnected(t, 10*time.Second, ids...)

	// Sample /status while the load runs: in_flight never above capacity.
	stop := make(chan struct{})
	sampled := make(chan error, 1)
	var samples, peakSeen int
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sampled <- nil
				return
			case <-tick.C:
			}
			d, err := adm.status()
			if err != nil {
				sampled <- err
				return
			}
			samples++
			for _, n := range d.Nodes {
				for _, p := range n.Providers {
					peakSeen = max(peakSeen, int(p.InFlight))
					if p.InFlight > capacity {
						sampled <- fmt.Errorf("Q2: /status shows %s/%s in_flight=%d over capacity %d", n.ID, p.ProviderID, p.InFlight, capacity)
						return
					}
				}
			}
		}
	}()

	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	errs := make(chan string, requests)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := api.chat(ctx, chatRequest{model: "tiny", stream: i%2 == 1})
			if err == nil && (res.status != http.StatusOK || res.text != answer || len(res.errs) > 0) {
				err = fmt.Errorf("status %d text %q errors %v", res.status, res.text, res.errs)
			}
			if err != nil {
				failed.Add(1)
				errs <- fmt.Sprintf("request %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	if err := <-sampled; err != nil {
		t.Error(err)
	}
	close(errs)
	for msg := range errs {
		t.Error(msg)
		if failed.Load() > 5 {
			t.Errorf("... %d requests failed in all", failed.Load())
			break
		}
	}
	var total int
	peaks := make([]int, len(conc))
	totals := make([]int, len(conc))
	for i := range conc {
		peaks[i], totals[i] = conc[i].peak()
		total += totals[i]
		if peaks[i] > capacity {
			t.Errorf("Q2, E4: upstream of provider p%s had %d requests in flight at once, capacity %d", ids[i], peaks[i], capacity)
		}
		if totals[i] == 0 {
			t.Errorf("Q3: provider p%s got no request: every live candidate should take load", ids[i])
		}
	}
	if total != requests {
		t.Errorf("upstream servers saw %d requests, want %d", total, requests)
	}
	t.Logf("%d requests in %v; upstream peaks %v, totals %v; %d /status samples, peak in_flight seen %d",
		requests, elapsed.Round(time.Millisecond), peaks, totals, samples, peakSeen)
	adm.waitGauges(t, 5*time.Second, 0, 0)
}

// TestQueueFIFO proves Q4's FIFO order within a model group: with one
// provider of capacity 1 held by a stalled stream, requests enqueued one
// after another reach the upstream in the order they arrived, on both
// dispatch paths.
func TestQueueFIFO(t *testing.T) {
	leakcheck.Check(t)
	const waiters = 16
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{TokenDelay: time.Millisecond})
	order := newRecorder[string]()
	url := bp.serve(t, arrivals(order, bp.b))
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("solo", url, 1), compatAdapter("solo-oa", url, 1)}}},
		[]config.Model{
			modelGroup("fifo", provider("gpu-1", "solo", "tiny")),
			modelGroup("hold", provider("gpu-1", "solo", "tiny+stall=1")),
			modelGroup("fifo-oa", provider("gpu-1", "solo-oa", "tiny")),
			modelGroup("hold-oa", provider("gpu-1", "solo-oa", "tiny+stall=1")),
		}, nil)
	_, adm, api := startReady(t, p, cfg, logs)

	for _, path := range []struct{ name, suffix string }{{"run", ""}, {"tunnel", "-oa"}} {
		t.Run("Q4 FIFO within a group/"+path.name, func(t *testing.T) {
			base, _ := order.snapshot()
			holdCtx, holdCancel := context.WithCancel(context.Background())
			defer holdCancel()
			hold, err := api.post(holdCtx, chatRequest{model: "hold" + path.suffix, stream: true})
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Body.Close()
			if err := readChunks(hold, 1); err != nil {
				t.Fatalf("holder: %v", err)
			}
			results := make(chan string, waiters)
			for i := range waiters {
				msg := fmt.Sprintf("req-%s-%02d", path.name, i)
				go func() {
					res, err := api.chat(context.Background(), chatRequest{model: "fifo" + path.suffix, content: msg})
					if err == nil && (res.status != http.StatusOK || res.text != answer) {
						err = fmt.Errorf("status %d body %s", res.status, strings.TrimSpace(res.raw))
					}
					if err != nil {
						results <- msg + ": " + err.Error()
						return
					}
					results <- ""
				}()
				// Enqueue strictly one after another.
				adm.waitGauges(t, 5*time.Second, 1, float64(i+1))
			}
			holdCancel()
			for range waiters {
				if r := <-results; r != "" {
					// A 503 over_capacity here comes from the node's
					// capacity gate (E4): the Edge returned the previous
					// lease (at its client's cancel, or at the terminal)
					// and pumped this request while the node still held
					// the adapter's only slot. The gate is defense in
					// depth, not a second queue: it must never refuse
					// what the Edge's lease admitted.
					t.Errorf("Q2, E4: refused by the node's capacity gate after the Edge returned the previous lease: %s", r)
				}
			}
			// Q4: whatever reached the upstream arrived in queue order.
			got, _ := order.snapshot()
			got = got[len(base):]
			last := -1
			for _, m := range got {
				var i int
				if _, err := fmt.Sscanf(m[len("req-"+path.name+"-"):], "%d", &i); err != nil || i <= last {
					t.Fatalf("Q4: upstream arrival order %v, want ascending req-%s-NN", got, path.name)
				}
				last = i
			}
			adm.waitGauges(t, 5*time.Second, 0, 0)
		})
	}
}
