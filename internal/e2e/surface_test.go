package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// apiClient talks to the Edge's HTTP listener (open mode: no api_keys).
type apiClient struct {
	url string
	hc  *http.Client
}

func newAPIClient(t testing.TB, e *edgeProc) *apiClient {
	return &apiClient{url: e.httpURL, hc: newHTTPClient(t)}
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	model     string
	stream    bool
	content   string // user message; "hi" when empty
	maxTokens int    // 0 = omitted
}

func (r chatRequest) body() []byte {
	m := map[string]any{
		"model":    r.model,
		"messages": []map[string]string{{"role": "user", "content": orDefault(r.content, "hi")}},
		"stream":   r.stream,
	}
	if r.maxTokens > 0 {
		m["max_tokens"] = r.maxTokens
	}
	b, _ := json.Marshal(m)
	return b
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// post sends r and returns the response with its body unread.
func (c *apiClient) post(ctx context.Context, r chatRequest) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/chat/completions", bytes.NewReader(r.body()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.hc.Do(req)
}

// chatResult is a whole chat completion response, stream or not.
type chatResult struct {
	status int
	text   string   // assistant content (deltas joined for a stream)
	finish string   // the finish_reason seen
	done   bool     // "data: [DONE]" seen
	errs   []string // error objects: the body's, or each stream error event's
	chunks int      // stream chunks with choices
	raw    string
}

// chat sends r and reads the whole response; a transport error is an error.
func (c *apiClient) chat(ctx context.Context, r chatRequest) (chatResult, error) {
	resp, err := c.post(ctx, r)
	if err != nil {
		return chatResult{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	res := chatResult{status: resp.StatusCode, raw: string(raw)}
	if err != nil {
		return res, fmt.Errorf("read body: %w", err)
	}
	if r.stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return res, parseStream(&res, raw)
	}
	var doc struct {
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return res, fmt.Errorf("decode %q: %w", raw, err)
	}
	if len(doc.Error) > 0 {
		res.errs = append(res.errs, string(doc.Error))
	}
	if len(doc.Choices) > 0 {
		res.text, res.finish = doc.Choices[0].Message.Content, doc.Choices[0].FinishReason
	}
	return res, nil
}

func parseStream(res *chatResult, raw []byte) error {
	for _, data := range sseData(raw) {
		if data == "[DONE]" {
			res.done = true
			continue
		}
		var ch struct {
			Choices []struct {
				Delta        struct{ Content *string } `json:"delta"`
				FinishReason *string                   `json:"finish_reason"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return fmt.Errorf("decode chunk %q: %w", data, err)
		}
		if len(ch.Error) > 0 {
			res.errs = append(res.errs, string(ch.Error))
		}
		for _, c := range ch.Choices {
			res.chunks++
			if c.Delta.Content != nil {
				res.text += *c.Delta.Content
			}
			if c.FinishReason != nil {
				res.finish = *c.FinishReason
			}
		}
	}
	return nil
}

// sseData returns the data of each SSE event in raw.
func sseData(raw []byte) []string {
	var out []string
	for _, ev := range strings.Split(strings.ReplaceAll(string(raw), "\r\n", "\n"), "\n\n") {
		var data []string
		for _, line := range strings.Split(ev, "\n") {
			if v, ok := strings.CutPrefix(line, "data:"); ok {
				data = append(data, strings.TrimPrefix(v, " "))
			}
		}
		if len(data) > 0 {
			out = append(out, strings.Join(data, "\n"))
		}
	}
	return out
}

// adminClient reads the Edge's admin surface.
type adminClient struct {
	url string
	hc  *http.Client
}

func newAdminClient(t testing.TB, e *edgeProc) *adminClient {
	return &adminClient{url: e.adminURL, hc: newHTTPClient(t)}
}

// statusDoc is GET /status (SPEC N3; docs/operating.md, "Operator page").
type statusDoc struct {
	Nodes []nodeStatus `json:"nodes"`
}

type nodeStatus struct {
	ID         string           `json:"id"`
	Connected  bool             `json:"connected"`
	Draining   bool             `json:"draining"`
	Generation uint64           `json:"generation"`
	ReadySince string           `json:"ready_since"`
	Config     string           `json:"config"`       // SPEC N2: current, outdated, restart_required
	ConfigErr  string           `json:"config_error"` // why the node could not run this edge's config
	Providers  []providerStatus `json:"providers"`
}

type providerStatus struct {
	ProviderID   string `json:"provider_id"`
	Category     string `json:"category"`
	Status       string `json:"status"`
	Health       string `json:"health"`
	Capacity     int32  `json:"capacity"`
	LongCapacity int32  `json:"long_capacity"`
	InFlight     int32  `json:"in_flight"`
	LongInFlight int32  `json:"long_in_flight"`
	Queued       int32  `json:"queued"`
	LongQueued   int32  `json:"long_queued"`
}

func (d statusDoc) node(id string) (nodeStatus, bool) {
	for _, n := range d.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return nodeStatus{}, false
}

// connected counts connected nodes.
func (d statusDoc) connected() int {
	k := 0
	for _, n := range d.Nodes {
		if n.Connected {
			k++
		}
	}
	return k
}

func (a *adminClient) get(path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.url+path, nil)
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, b)
	}
	return b, err
}

func (a *adminClient) status() (statusDoc, error) {
	var d statusDoc
	b, err := a.get("/status")
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("decode /status %q: %w", b, err)
	}
	return d, nil
}

func (a *adminClient) mustStatus(t testing.TB) statusDoc {
	t.Helper()
	d, err := a.status()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// metrics returns GET /metrics samples keyed by "name{labels}" as written.
func (a *adminClient) metrics() (map[string]float64, error) {
	b, err := a.get("/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, nil
}

// gauges returns the iop_edge_leases and iop_edge_waiters gauges.
func (a *adminClient) gauges() (leases, waiters float64, err error) {
	m, err := a.metrics()
	if err != nil {
		return 0, 0, err
	}
	l, ok1 := m["iop_edge_leases"]
	w, ok2 := m["iop_edge_waiters"]
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("/metrics lacks iop_edge_leases or iop_edge_waiters: %v", m)
	}
	return l, w, nil
}

// waitGauges waits until the lease and waiter gauges have the given values.
func (a *adminClient) waitGauges(t testing.TB, timeout time.Duration, leases, waiters float64) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("iop_edge_leases=%v iop_edge_waiters=%v", leases, waiters), func() (bool, string) {
		l, w, err := a.gauges()
		if err != nil {
			return false, err.Error()
		}
		return l == leases && w == waiters, fmt.Sprintf("iop_edge_leases=%v iop_edge_waiters=%v", l, w)
	})
}

// waitConnected waits until every node in ids shows connected=true.
func (a *adminClient) waitConnected(t testing.TB, timeout time.Duration, ids ...string) statusDoc {
	t.Helper()
	var d statusDoc
	eventually(t, timeout, fmt.Sprintf("nodes %v connected", ids), func() (bool, string) {
		var err error
		if d, err = a.status(); err != nil {
			return false, err.Error()
		}
		for _, id := range ids {
			if n, ok := d.node(id); !ok || !n.Connected {
				return false, fmt.Sprintf("%s not connected in %+v", id, d)
			}
		}
		return true, ""
	})
	return d
}

// nodeEvent is one /events SSE event (SPEC N4).
type nodeEvent struct {
	Type   string `json:"type"`
	Node   string `json:"node"`
	Time   string `json:"time"`
	Reason string `json:"reason"`
	at     time.Time
}

// subscribeEvents reads GET /events into a recorder until cleanup, keeping
// the node lifecycle pair only (node.connected, node.disconnected; SPEC N4):
// node.draining and provider events are left out. The subscription is live
// when it returns (the Edge subscribes before it writes the response
// header).
func (a *adminClient) subscribeEvents(t testing.TB) *recorder[nodeEvent] {
	t.Helper()
	rec := newRecorder[nodeEvent]()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/events", nil)
	resp, err := a.hc.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET /events: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		resp.Body.Close()
		t.Fatalf("GET /events: status %d", resp.StatusCode)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev nodeEvent
			if json.Unmarshal([]byte(data), &ev) == nil && (ev.Type == "node.connected" || ev.Type == "node.disconnected") {
				ev.at = time.Now()
				rec.add(ev)
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return rec
}
