package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// send posts body to the Edge's path with the given X-Request-Id ("" = none)
// and returns the response with its body unread.
func (c *apiClient) send(ctx context.Context, path string, body []byte, requestID string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	return c.hc.Do(req)
}

// waitLine waits for a log line holding every part.
func (s *logSink) waitLine(t *testing.T, what string, parts ...string) string {
	t.Helper()
	var found string
	_, err := s.recs.waitFor(10*time.Second, func(ls []string) bool {
		if i := indexOf(ls, parts...); i >= 0 {
			found = ls[i]
			return true
		}
		return false
	})
	if err != nil {
		t.Fatalf("%s: no log line with %q: %v", what, parts, err)
	}
	return found
}

// countLines counts the log lines holding every part.
func (s *logSink) countLines(parts ...string) int {
	ls, _ := s.recs.snapshot()
	n := 0
	for i := range ls {
		if indexOf(ls[i:i+1], parts...) == 0 {
			n++
		}
	}
	return n
}

// opsStack is a demo backend, an Edge and node gpu-1 with adapters
// "ollama" and "oa" (capacity 4 each) and the model groups tiny, tiny-oa
// (tunnel) and loop.
func opsStack(t *testing.T, tokenDelay time.Duration, tune ...func(*edge.Options)) (*logSink, *backendProc, *edgeProc, *adminClient, *apiClient) {
	t.Helper()
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{TokenDelay: tokenDelay, LoopTokens: 100000})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4), compatAdapter("oa", url, 4)}}},
		[]config.Model{
			modelGroup("tiny", provider("gpu-1", "ollama", "tiny")),
			modelGroup("tiny-oa", provider("gpu-1", "oa", "tiny")),
			modelGroup("loop", provider("gpu-1", "ollama", "tiny-loop")),
		}, nil)
	e, adm, api := startReady(t, p, cfg, logs, tune...)
	return logs, bp, e, adm, api
}

// A1: the client's X-Request-Id comes back on the response, is on the
// Edge's access line and the node's "run done" line, and reaches the
// backend as X-Request-Id — on both paths; an error response carries a
// minted id with its own access line.
func TestRequestIDEndToEnd(t *testing.T) {
	leakcheck.Check(t)
	logs, bp, _, _, api := opsStack(t, 0)
	for _, row := range []struct{ name, model, path, upstream string }{
		{"run", "tiny", "run", "/api/chat"},
		{"tunnel", "tiny-oa", "tunnel", "/v1/chat/completions"},
	} {
		t.Run(row.name, func(t *testing.T) {
			id := "e2e-" + row.name + "-42"
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := api.send(ctx, "/v1/chat/completions", chatRequest{model: row.model}.body(), id)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != id {
				t.Fatalf("status %d, X-Request-Id %q; want 200 and %q: %s", resp.StatusCode, resp.Header.Get("X-Request-Id"), id, raw)
			}
			logs.waitLine(t, "edge access line", "edge", " access ", "request_id="+id, "path="+row.path, "outcome=ok", "node=gpu-1")
			logs.waitLine(t, "node run line", "node", "run done", "request_id="+id)
			end := bp.waitEnd(t, 5*time.Second, "backend request", func(e backend.RequestEnd) bool { return e.RequestID == id })
			if end.Path != row.upstream {
				t.Errorf("upstream path %s, want %s", end.Path, row.upstream)
			}
			if n := logs.countLines(" access ", "request_id="+id); n != 1 {
				t.Errorf("%d access lines for %s, want 1", n, id)
			}
		})
	}
	t.Run("error response", func(t *testing.T) {
		resp, err := api.send(context.Background(), "/v1/chat/completions", chatRequest{model: "no-such-model"}.body(), "")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if resp.StatusCode != 404 || id == "" {
			t.Fatalf("status %d, X-Request-Id %q; want 404 and a minted id", resp.StatusCode, id)
		}
		logs.waitLine(t, "access line of the 404", " access ", "request_id="+id, "status=404", "outcome=rejected", "model=no-such-model")
	})
}

// stream is one streamed chat completion read in the background.
type stream struct {
	id    string
	first chan error // the first content chunk arrived (nil) or not
	done  chan struct{}
	res   chatResult
	err   error
}

// startStream posts a streamed request with X-Request-Id id and reads it to
// its end on a goroutine.
func startStream(api *apiClient, id string, r chatRequest) *stream {
	r.stream = true
	s := &stream{id: id, first: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		resp, err := api.send(ctx, "/v1/chat/completions", r.body(), id)
		if err != nil {
			s.err = err
			s.first <- err
			return
		}
		defer resp.Body.Close()
		s.res.status = resp.StatusCode
		br := bufio.NewReader(resp.Body)
		var raw bytes.Buffer
		signalled := false
		for {
			line, err := br.ReadString('\n')
			raw.WriteString(line)
			if !signalled && strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
				signalled = true
				s.first <- nil
			}
			if err != nil {
				if err != io.EOF {
					s.err = err
				}
				break
			}
		}
		if !signalled {
			s.first <- fmt.Errorf("stream %s ended before any content: %s", id, raw.String())
		}
		s.res.raw = raw.String()
		if perr := parseStream(&s.res, raw.Bytes()); perr != nil && s.err == nil {
			s.err = perr
		}
	}()
	return s
}

func (s *stream) waitFirst(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("stream %s: no content within 20 s", s.id)
	}
}

func (s *stream) wait(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("stream %s did not end within 30 s", s.id)
	}
}

// A3 (SIGTERM drains and exits 0): the Edge is stopped with
// four streams in flight. New requests get 503 with Retry-After at once;
// the three streams shorter than the drain timeout complete normally; the
// long one ends with exactly one error event (edge_shutdown) after the
// drain timeout; Run returns nil; each request has exactly one access line
// with its outcome.
func TestEdgeDrain(t *testing.T) {
	leakcheck.Check(t)
	const drain = 1500 * time.Millisecond
	logs, _, e, adm, api := opsStack(t, 20*time.Millisecond, func(o *edge.Options) { o.ShutdownGrace = drain })
	short := []*stream{
		startStream(api, "drain-run-1", chatRequest{model: "tiny"}),
		startStream(api, "drain-run-2", chatRequest{model: "tiny"}),
		startStream(api, "drain-tunnel", chatRequest{model: "tiny-oa"}),
	}
	long := startStream(api, "drain-long", chatRequest{model: "loop", maxTokens: 100000})
	for _, s := range append(short, long) {
		s.waitFirst(t)
	}
	stopped := make(chan error, 1)
	began := time.Now()
	go func() { stopped <- e.stop() }() // what SIGTERM does in main

	// New requests during the drain: 503 with Retry-After (the listener
	// stays open so clients are told, not refused).
	var refused *http.Response
	eventually(t, 5*time.Second, "a request refused while draining", func() (bool, string) {
		resp, err := api.send(context.Background(), "/v1/chat/completions", chatRequest{model: "tiny"}.body(), "drain-new")
		if err != nil {
			return false, err.Error()
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			refused = resp
			return true, ""
		}
		return false, fmt.Sprintf("status %d", resp.StatusCode)
	})
	if refused.Header.Get("Retry-After") == "" || refused.Header.Get("X-Request-Id") != "drain-new" {
		t.Errorf("refused request: Retry-After %q, X-Request-Id %q", refused.Header.Get("Retry-After"), refused.Header.Get("X-Request-Id"))
	}
	if st, err := adm.status(); err != nil || len(st.Nodes) != 1 || !st.Nodes[0].Connected {
		t.Errorf("nodes stay connected while the edge drains: %+v %v", st, err)
	}

	for _, s := range short {
		s.wait(t)
		if s.err != nil || s.res.status != 200 || s.res.text != answer || !s.res.done || len(s.res.errs) != 0 {
			t.Errorf("short stream %s: err %v status %d text %q [DONE] %v errors %v; want the whole answer",
				s.id, s.err, s.res.status, s.res.text, s.res.done, s.res.errs)
		}
	}
	long.wait(t)
	if took := time.Since(began); took < drain {
		t.Errorf("the long stream ended %v after the stop, before the drain timeout %v", took, drain)
	}
	if long.res.done || len(long.res.errs) != 1 || !strings.Contains(long.res.errs[0], `"code":"edge_shutdown"`) {
		t.Errorf("long stream: [DONE] %v errors %v; want exactly one edge_shutdown error event", long.res.done, long.res.errs)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("edge.Serve: %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("edge.Serve did not return")
	}
	for id, want := range map[string]string{"drain-run-1": "ok", "drain-run-2": "ok", "drain-tunnel": "ok",
		"drain-long": "timeout", "drain-new": "rejected"} {
		if n := logs.countLines(" access ", "request_id="+id+" "); n < 1 {
			t.Errorf("no access line for %s", id)
		}
		if n := logs.countLines(" access ", "request_id="+id+" ", "outcome="+want); n != 1 && id != "drain-new" {
			t.Errorf("%s: %d access lines with outcome %s, want exactly 1", id, n, want)
		}
	}
	if n := logs.countLines(" access ", "request_id=drain-long "); n != 1 {
		t.Errorf("%d access lines for the long stream, want 1", n)
	}
}

// A3: a node stopped with a stream in flight tells the Edge it is
// draining: the Edge dispatches nothing new to it at once (new requests go
// to the other node), the stream finishes normally, and node.Run returns
// nil once it is done.
func TestNodeDrain(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1", "gpu-2")
	bp := startBackend(t, backend.Options{TokenDelay: 20 * time.Millisecond, LoopTokens: 100000})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p,
		[]config.Node{
			{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}},
			{ID: "gpu-2", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}},
		},
		[]config.Model{modelGroup("loop", provider("gpu-1", "ollama", "tiny-loop"), provider("gpu-2", "ollama", "tiny-loop"))}, nil)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	n1 := startNodeNoCleanup(t, p, "gpu-1", e.nodeAddr, nodeOpts{log: logs.logger("node1")})
	t.Cleanup(func() { _ = n1.stop() })
	adm.waitConnected(t, 10*time.Second, "gpu-1")

	// 60 tokens × 20 ms: long enough to outlive the steps below. Started
	// while gpu-1 is the group's only node, so that it runs there (with
	// both connected, routing may pick either).
	s := startStream(api, "on-gpu-1", chatRequest{model: "loop", maxTokens: 60})
	s.waitFirst(t)
	startNode(t, p, "gpu-2", e.nodeAddr, nodeOpts{log: logs.logger("node2")})
	adm.waitConnected(t, 10*time.Second, "gpu-1", "gpu-2")
	var stopErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		stopErr = n1.stop() // SIGTERM: drains, returns once the stream is done
	}()
	eventually(t, 5*time.Second, "gpu-1 shown draining", func() (bool, string) {
		st, err := adm.status()
		if err != nil {
			return false, err.Error()
		}
		ns, _ := st.node("gpu-1")
		return ns.Draining, fmt.Sprintf("%+v", ns)
	})
	for i := range 3 {
		id := fmt.Sprintf("after-drain-%d", i)
		resp, err := api.send(context.Background(), "/v1/chat/completions", chatRequest{model: "loop", maxTokens: 2}.body(), id)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", id, resp.StatusCode)
		}
		logs.waitLine(t, id+" served", " access ", "request_id="+id, "node=gpu-2")
	}
	s.wait(t)
	if s.err != nil || s.res.status != 200 || !s.res.done || len(s.res.errs) != 0 || s.res.finish != "length" {
		t.Errorf("the stream on the draining node: err %v status %d [DONE] %v errors %v finish %q; want it complete",
			s.err, s.res.status, s.res.done, s.res.errs, s.res.finish)
	}
	wg.Wait()
	if stopErr != nil {
		t.Errorf("node.Run: %v, want nil after the drain", stopErr)
	}
	logs.waitLine(t, "stream on gpu-1", " access ", "request_id=on-gpu-1", "node=gpu-1", "outcome=ok")
	eventually(t, 5*time.Second, "gpu-1 disconnected", func() (bool, string) {
		st, err := adm.status()
		if err != nil {
			return false, err.Error()
		}
		ns, _ := st.node("gpu-1")
		return !ns.Connected, "still connected"
	})
}

// A3: what a node's drain timeout cuts says so. gpu-1 is stopped with
// two requests in flight that outlive its shutdown.drain_timeout_ms: a
// stream of a group only gpu-1 serves ends with one error event of code
// node_shutdown (outcome timeout, not upstream_error "the provider failed
// to answer"); a non-stream request of a group gpu-2 serves too, cut before
// any byte reached its client, is re-dispatched to gpu-2 and answered.
func TestNodeDrainTimeout(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1", "gpu-2")
	bp := startBackend(t, backend.Options{TokenDelay: 20 * time.Millisecond, LoopTokens: 100000})
	url := bp.serve(t, nil)
	both := modelGroup("loop", provider("gpu-1", "ollama", "tiny-loop"), provider("gpu-2", "ollama", "tiny-loop"))
	both.Routing = "ordered" // gpu-1 first
	cfg := edgeConfig(t, p,
		[]config.Node{
			{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}},
			{ID: "gpu-2", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}},
		},
		[]config.Model{both, modelGroup("loop-1", provider("gpu-1", "ollama", "tiny-loop"))}, nil)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	n1 := startNodeNoCleanup(t, p, "gpu-1", e.nodeAddr, nodeOpts{log: logs.logger("node1"), drainMs: 300})
	t.Cleanup(func() { _ = n1.stop() })
	adm.waitConnected(t, 10*time.Second, "gpu-1")
	startNode(t, p, "gpu-2", e.nodeAddr, nodeOpts{log: logs.logger("node2")})
	adm.waitConnected(t, 10*time.Second, "gpu-1", "gpu-2")

	// 200 tokens × 20 ms: far longer than the node's 300 ms drain.
	s := startStream(api, "cut-stream", chatRequest{model: "loop-1", maxTokens: 200})
	s.waitFirst(t)
	type answer struct {
		status int
		body   string
		err    error
	}
	plain := make(chan answer, 1)
	go func() {
		resp, err := api.send(context.Background(), "/v1/chat/completions", chatRequest{model: "loop", maxTokens: 100}.body(), "cut-plain")
		if err != nil {
			plain <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		plain <- answer{resp.StatusCode, string(b), err}
	}()
	eventually(t, 10*time.Second, "both requests on gpu-1", func() (bool, string) {
		st, err := adm.status()
		if err != nil {
			return false, err.Error()
		}
		ns, _ := st.node("gpu-1")
		return len(ns.Providers) == 1 && ns.Providers[0].InFlight == 2, fmt.Sprintf("%+v", ns)
	})
	if err := n1.stop(); err != nil {
		t.Fatalf("node.Run: %v, want nil after the drain", err)
	}

	s.wait(t)
	if s.res.done || len(s.res.errs) != 1 || !strings.Contains(s.res.errs[0], `"code":"node_shutdown"`) {
		t.Errorf("stream cut by the node's drain: [DONE] %v errors %v; want exactly one node_shutdown error event", s.res.done, s.res.errs)
	}
	logs.waitLine(t, "access line of the cut stream", " access ", "request_id=cut-stream", "outcome=timeout", "code=node_shutdown")
	var a answer
	select {
	case a = <-plain:
	case <-time.After(30 * time.Second):
		t.Fatal("the plain request got no answer")
	}
	if a.err != nil || a.status != 200 || !strings.Contains(a.body, `"finish_reason":"length"`) {
		t.Fatalf("plain request cut by gpu-1's drain: %d %v %s; want gpu-2's whole answer", a.status, a.err, a.body)
	}
	logs.waitLine(t, "access line of the re-dispatched request", " access ", "request_id=cut-plain", "outcome=ok", "node=gpu-2", "retries=1")
}
