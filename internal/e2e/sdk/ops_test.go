package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// post sends a chat completion body with the demo key and an optional
// X-Request-Id, returning the response with its body unread.
func (s *stack) post(ctx context.Context, path, body, requestID, key string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.httpAddr+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	return s.hc.Do(req)
}

func chatBody(model string, stream bool, maxTokens int) string {
	m := map[string]any{"model": model, "stream": stream, "messages": []any{map[string]string{"role": "user", "content": "hi"}}}
	if maxTokens > 0 {
		m["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// scrape GETs /metrics and parses it with Prometheus' own text parser
// (strict legacy metric and label names).
func (s *stack) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := s.hc.Get("http://" + s.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); expfmt.ResponseFormat(resp.Header).FormatType() != expfmt.TypeTextPlain {
		t.Errorf("/metrics Content-Type %q is not the text format", ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse with expfmt: %v", err)
	}
	return fams
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// A1, A2: /metrics parses with Prometheus' own parser; every request is
// counted once in iop_edge_requests_total under bounded labels (configured
// models or _other, fixed surfaces, paths and outcomes); the histograms,
// tokens and in-flight families are there with the right types.
func TestMetricsExposition(t *testing.T) {
	s := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	from := s.edge.log.mark()
	sent := []struct {
		body, key string
		status    int
	}{
		{chatBody("tiny", false, 0), demoKey, 200},
		{chatBody("tiny-oa", true, 0), demoKey, 200},
		{chatBody("no-such-model", false, 0), demoKey, 404},
		{chatBody("tiny", false, 0), "wrong-key", 401},
	}
	for i, r := range sent {
		resp, err := s.post(ctx, "/v1/chat/completions", r.body, fmt.Sprintf("metrics-%d", i), r.key)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != r.status {
			t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, r.status)
		}
	}
	// The access record is written when the handler returns, just after the
	// client has the whole response: wait for the four access lines.
	for i := range sent {
		id := fmt.Sprintf(`"request_id":"metrics-%d"`, i)
		if _, err := s.edge.log.waitLine(ctx, from, func(l string) bool { return strings.Contains(l, `"msg":"access"`) && strings.Contains(l, id) }); err != nil {
			t.Fatalf("no access line for request %d: %v", i, err)
		}
	}
	fams := s.scrape(t)
	total := 0.0
	for _, m := range fams["iop_edge_requests_total"].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	if total != float64(len(sent)) {
		t.Errorf("iop_edge_requests_total sums to %v, want %d (one per request)", total, len(sent))
	}
	types := map[string]dto.MetricType{
		"iop_edge_requests_total":             dto.MetricType_COUNTER,
		"iop_edge_request_duration_seconds":   dto.MetricType_HISTOGRAM,
		"iop_edge_time_to_first_byte_seconds": dto.MetricType_HISTOGRAM,
		"iop_edge_queue_wait_seconds":         dto.MetricType_HISTOGRAM,
		"iop_edge_tokens_total":               dto.MetricType_COUNTER,
		"iop_edge_requests_in_flight":         dto.MetricType_GAUGE,
		"iop_edge_node_connected":             dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		f := fams[name]
		if f == nil || f.GetType() != typ {
			t.Errorf("family %s: %v, want type %v", name, f.GetType(), typ)
		}
	}
	models := append(slices.Clone(demoGroups), "_other")
	// The tiny group takes the run path on Ollama or the demo backend; with
	// only an OpenAI-compatible server (IOP_OPENAI_URL) every group tunnels.
	tinyPath := "run"
	if s.env.realServer() && s.env.ollamaURL == "" {
		tinyPath = "tunnel"
	}
	want := map[string]bool{
		"tiny|chat_completions|" + tinyPath + "|200|ok": false,
		"tiny-oa|chat_completions|tunnel|200|ok":        false,
		"_other|chat_completions|none|404|rejected":     false,
		"_other|chat_completions|none|401|rejected":     false,
	}
	for _, m := range fams["iop_edge_requests_total"].GetMetric() {
		l := labels(m)
		if !slices.Contains(models, l["model"]) {
			t.Errorf("unbounded model label %q", l["model"])
		}
		key := strings.Join([]string{l["model"], l["surface"], l["path"], l["code"], l["outcome"]}, "|")
		if _, ok := want[key]; !ok || m.GetCounter().GetValue() != 1 {
			t.Errorf("iop_edge_requests_total{%s} = %v, unexpected", key, m.GetCounter().GetValue())
		}
		want[key] = true
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no iop_edge_requests_total series %s", k)
		}
	}
	for _, m := range fams["iop_edge_request_duration_seconds"].GetMetric() {
		h := m.GetHistogram()
		if l := labels(m); l["model"] == "tiny" && (h.GetSampleCount() != 1 || len(h.GetBucket()) == 0) {
			t.Errorf("duration histogram for tiny: count %d, %d buckets", h.GetSampleCount(), len(h.GetBucket()))
		}
	}
	if len(fams["iop_edge_tokens_total"].GetMetric()) == 0 && !s.env.realServer() {
		t.Error("no iop_edge_tokens_total series after two answered requests")
	}
}

// chromium returns the browser binary ./run.sh e2e installs (IOP_CHROMIUM).
func chromium(t *testing.T) string {
	exe := os.Getenv("IOP_CHROMIUM")
	if exe == "" {
		if p, err := exec.LookPath("chromium"); err == nil {
			exe = p
		}
	}
	if exe == "" {
		t.Fatal("no Chromium: ./run.sh e2e installs Debian's chromium (or set IOP_CHROMIUM)")
	}
	return exe
}

// runDir is where artifacts go (.run/ of the repository).
func runDir(t *testing.T) string {
	d := os.Getenv("IOP_RUN_DIR")
	if d == "" {
		d = "../../../.run"
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// A2: the operator page works in a real headless browser: it shows
// the node row connected with its providers, has no script error (the CSP
// allows only its own inline code), follows a node's SIGTERM to
// "disconnected" by itself, draws the last 15 minutes of a burst of
// traffic (requests, time to first byte, tokens per model group, in-flight
// per provider: GET /series), and a screenshot is saved in
// .run/operator-page.png.
func TestOperatorPage(t *testing.T) {
	s := newStack(t)
	exe := chromium(t)
	// A burst of traffic for the charts of the last 15 minutes, with
	// failed requests so that "Last errors" has a row, and one long stream
	// held in flight while the page waits for its provider chart to show it.
	burst(t, s)
	long, err := s.post(context.Background(), "/v1/chat/completions", chatBody("tiny-loop", true, 400), "page-long", demoKey)
	if err != nil {
		t.Fatal(err)
	}
	longFirst, longDone := readStream(long)
	select {
	case <-longFirst:
	case <-time.After(requestTimeout):
		t.Fatal("the long stream sent nothing")
	}
	closeLong := sync.OnceFunc(func() {
		long.Body.Close()
		<-longDone
	})
	defer closeLong()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	var mu sync.Mutex
	var jsErrs []string
	// Listen's callback runs in the tab's read loop: it only appends.
	if err := chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			msg = fmt.Sprintf("%s at %d:%d", e.ExceptionDetails.Text, e.ExceptionDetails.LineNumber, e.ExceptionDetails.ColumnNumber)
			if ex := e.ExceptionDetails.Exception; ex != nil {
				msg += " " + ex.Description
			}
		case *runtime.EventConsoleAPICalled:
			if e.Type != runtime.ConsoleAPICalledTypeError {
				return
			}
			for _, a := range e.Args {
				msg += string(a.Value) + " "
			}
		default:
			return
		}
		mu.Lock()
		jsErrs = append(jsErrs, msg)
		mu.Unlock()
	}); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	node := chromedp.CSS(`tr.node[data-node="` + nodeID + `"]`)
	err = chromedp.Do(ctx,
		chromedp.Navigate("http://"+s.adminAddr+"/"),
		chromedp.WaitVisible(node),
		chromedp.WaitVisible(chromedp.CSS(`tr.provider[data-provider="oa"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.model[data-model="tiny"]`)),
	)
	if err != nil {
		t.Fatalf("load the operator page in %s: %v", exe, err)
	}
	// The charts have data: the model group's requests, time to first
	// byte and tokens, and a provider's in-flight peak (the sampler runs
	// every second; the page polls /series every 5 s).
	charts := `(function(){const q=(m,k)=>document.querySelector('svg.chart[data-model="'+m+'"][data-metric="'+k+'"]');` +
		`const n=(e,a)=>e!==null&&Number(e.dataset[a])>0;` +
		`return n(q("tiny","requests"),"points")&&n(q("tiny","ttfb"),"points")&&n(q("tiny","tokens"),"peak")&&` +
		`(` + strconv.FormatBool(s.env.realServer()) + `||[...document.querySelectorAll('svg.chart[data-metric="in_flight"]')].some(e=>n(e,"peak")));})()`
	// In flight is sampled once a second: the demo backend's paced tokens
	// hold the long stream for seconds, but a real server streams its 400
	// tokens (or stops at its context size) in well under one sample, so
	// with a real server only the model group's charts are required.
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](charts, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify([...document.querySelectorAll("svg.chart")].map(e=>Object.assign({},e.dataset)))`))
		t.Fatalf("the charts show no data after the burst: %v\n%s", err, state)
	}
	closeLong() // its provider chart has shown it; the node's drain below need not wait for it
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll("#model-charts .chart-row")].map(r=>r.dataset.model).join(",")`))
	// A group is charted once a request of it has ended; on a real server
	// tiny-loop's stream may have ended already (see above).
	if err != nil || (rows != "tiny,tiny-oa,_other" && !(s.env.realServer() && rows == "tiny,tiny-loop,tiny-oa,_other")) {
		t.Errorf("model groups charted %q (%v), want tiny,tiny-oa,_other (config order, then _other; tiny-loop's stream is still going)", rows, err)
	}
	nodeRow, err := chromedp.Run(ctx, chromedp.Text(node))
	if err != nil {
		t.Fatal(err)
	}
	errorsTable, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#errors`)))
	if err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(runDir(t), "operator-page.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator page screenshot: %s (%d bytes)", shot, len(png))
	if !strings.Contains(nodeRow, "connected") || strings.Contains(nodeRow, "disconnected") {
		t.Errorf("node row %q, want it connected", nodeRow)
	}
	if !strings.Contains(nodeRow, "current") { // N2: the config column
		t.Errorf("node row %q, want its config current", nodeRow)
	}
	if !strings.Contains(errorsTable, "page-404") {
		t.Errorf("last errors %q lack the 404's request id", errorsTable)
	}
	// The events list draws no list markers: its scroll box clipped them
	// to stray glyphs at the left edge ("!.", "ı.").
	marker, err := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector("#events li")).listStyleType`))
	if err != nil {
		t.Fatal(err)
	}
	if marker != "none" {
		t.Errorf("events list items have list-style-type %q, want none", marker)
	}

	// The page follows the fleet by itself: SIGTERM the node, the row turns.
	if code, err := s.node.stop(); err != nil || code != 0 {
		t.Fatalf("node stop: code %d, %v", code, err)
	}
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`(function(){const r=document.querySelector('tr.node[data-node="`+nodeID+`"]');`+
		`return r!==null && r.textContent.includes("disconnected");})()`, chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		t.Errorf("the node row did not turn disconnected: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(jsErrs) > 0 {
		t.Errorf("script errors on the page: %q", jsErrs)
	}
}

// burst sends the operator page's charts something to draw: ten plain
// answers on the run path and ten streams on the tunnel, four at a time,
// and three requests for an unknown model (one with request id page-404).
func burst(t *testing.T, s *stack) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	type req struct {
		body, id string
		status   int
	}
	var reqs []req
	for i := range 10 {
		reqs = append(reqs, req{chatBody("tiny", false, 0), fmt.Sprintf("burst-%d", i), 200},
			req{chatBody("tiny-oa", true, 0), fmt.Sprintf("burst-oa-%d", i), 200})
	}
	for i := range 3 {
		reqs = append(reqs, req{chatBody("no-such-model", false, 0), fmt.Sprintf("page-404-%d", i), 404})
	}
	reqs[len(reqs)-1].id = "page-404"
	var wg sync.WaitGroup
	errs := make(chan error, len(reqs))
	sem := make(chan struct{}, 4)
	for _, r := range reqs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			resp, err := s.post(ctx, "/v1/chat/completions", r.body, r.id, demoKey)
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != r.status {
				errs <- fmt.Errorf("%s: status %d, want %d", r.id, resp.StatusCode, r.status)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// readStream reads a streamed response on a goroutine: first is signalled
// at the first content chunk, the whole body is returned on done.
func readStream(resp *http.Response) (first <-chan struct{}, done <-chan string) {
	f, d := make(chan struct{}), make(chan string, 1)
	go func() {
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		var raw bytes.Buffer
		seen := false
		for {
			line, err := br.ReadString('\n')
			raw.WriteString(line)
			if !seen && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
				seen = true
				close(f)
			}
			if err != nil {
				break
			}
		}
		if !seen {
			close(f)
		}
		d <- raw.String()
	}()
	return f, d
}

func waitChan[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %v", what, d)
	}
	var zero T
	return zero
}

// A3 (SIGTERM drains and exits 0): bin/edge gets SIGTERM
// with a short and a long stream in flight: a new request gets 503 with
// Retry-After, the short stream completes, the long one ends with an
// edge_shutdown error event after shutdown.drain_timeout_ms, and the edge
// exits 0. The drain is the window in which the test must see the 503 and
// the short stream's end: 10 s, so that a loaded machine cannot close it
// first.
func TestEdgeSIGTERMDrain(t *testing.T) {
	if loadEnv(t).realServer() {
		t.Skip("needs the demo backend's paced tokens")
	}
	const drainMs = 10000
	s := newStack(t, withConfig(func(ec, _ map[string]any) { ec["shutdown"] = map[string]any{"drain_timeout_ms": drainMs} }))
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	longResp, err := s.post(ctx, "/v1/chat/completions", chatBody("tiny-loop", true, 100000), "sigterm-long", demoKey)
	if err != nil {
		t.Fatal(err)
	}
	longFirst, longDone := readStream(longResp)
	shortResp, err := s.post(ctx, "/v1/chat/completions", chatBody("tiny-oa", true, 0), "sigterm-short", demoKey)
	if err != nil {
		t.Fatal(err)
	}
	shortFirst, shortDone := readStream(shortResp)
	waitChan(t, longFirst, 20*time.Second, "long stream's first chunk")
	waitChan(t, shortFirst, 20*time.Second, "short stream's first chunk")
	from := s.edge.log.mark()
	began := time.Now() // before the signal: the edge's drain timer starts after it
	if err := s.edge.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if _, err := s.edge.log.waitLine(wctx, from, func(l string) bool { return strings.Contains(l, "edge draining") }); err != nil {
		t.Fatalf("edge did not log its drain: %v", err)
	}
	resp, err := s.post(ctx, "/v1/chat/completions", chatBody("tiny", false, 0), "sigterm-new", demoKey)
	if err != nil {
		t.Fatalf("a request during the drain was not answered: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "edge_draining") {
		t.Errorf("request during the drain: %d Retry-After %q %s; want 503 with Retry-After and code edge_draining",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	short := waitChan(t, shortDone, 20*time.Second, "short stream end")
	if !strings.Contains(short, "data: [DONE]") || strings.Contains(short, `"error"`) {
		t.Errorf("short stream did not complete cleanly:\n%s", short)
	}
	long := waitChan(t, longDone, 20*time.Second, "long stream end")
	if took := time.Since(began); took < drainMs*time.Millisecond {
		t.Errorf("long stream ended %v after SIGTERM, before the drain timeout", took)
	}
	if strings.Contains(long, "[DONE]") || strings.Count(long, `"code":"edge_shutdown"`) != 1 {
		t.Errorf("long stream: want exactly one edge_shutdown error event and no [DONE]; tail:\n%s", tailOf(long, 400))
	}
	code, err := s.edge.wait(15 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("edge after SIGTERM: exit %d, %v; want 0", code, err)
	}
	for id, outcome := range map[string]string{"sigterm-long": "timeout", "sigterm-short": "ok", "sigterm-new": "rejected"} {
		n := 0
		for _, l := range strings.Split(s.edge.log.tail(1000), "\n") {
			if strings.Contains(l, `"msg":"access"`) && strings.Contains(l, `"request_id":"`+id+`"`) {
				n++
				if !strings.Contains(l, `"outcome":"`+outcome+`"`) {
					t.Errorf("access line of %s: %s, want outcome %s", id, l, outcome)
				}
			}
		}
		if n != 1 {
			t.Errorf("%d access lines for %s, want 1", n, id)
		}
	}
}

// A3: bin/node gets SIGTERM with a stream in flight: the edge marks
// it draining at once, the stream completes, the node exits 0.
func TestNodeSIGTERMDrain(t *testing.T) {
	if loadEnv(t).realServer() {
		t.Skip("needs the demo backend's paced tokens")
	}
	s := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	// 60 tokens at the demo's 20 ms: about 1.2 s.
	resp, err := s.post(ctx, "/v1/chat/completions", chatBody("tiny-loop", true, 60), "node-drain", demoKey)
	if err != nil {
		t.Fatal(err)
	}
	first, done := readStream(resp)
	waitChan(t, first, 20*time.Second, "first chunk")
	from := s.edge.log.mark()
	if err := s.node.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if _, err := s.edge.log.waitLine(wctx, from, func(l string) bool { return strings.Contains(l, `"msg":"node draining"`) }); err != nil {
		t.Fatalf("edge did not log the node's drain: %v", err)
	}
	raw := waitChan(t, done, 20*time.Second, "stream end")
	if !strings.Contains(raw, "data: [DONE]") || strings.Contains(raw, `"error"`) || !strings.Contains(raw, `"finish_reason":"length"`) {
		t.Errorf("the stream on the draining node did not complete:\n%s", tailOf(raw, 400))
	}
	code, err := s.node.wait(15 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("node after SIGTERM: exit %d, %v; want 0", code, err)
	}
	// The node's output has ended (wait): the line is there or never comes.
	if _, err := s.node.log.waitLine(context.Background(), 0, func(l string) bool {
		return strings.Contains(l, `"msg":"run done"`) && strings.Contains(l, `"request_id":"node-drain"`)
	}); err != nil {
		t.Errorf("node's run line with the request id: %v", err)
	}
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
