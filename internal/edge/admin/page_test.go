package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/events"
	"iop/internal/edge/pool"
)

type fakeGroups []pool.GroupSnapshot

func (f fakeGroups) Groups() []pool.GroupSnapshot { return f }

type fakeRecent []access.RecentError

func (f fakeRecent) List() []access.RecentError { return f }

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A2: the operator page is one self-contained HTML document: no
// external script, style or image, inline code allowed only by this
// response's CSP nonce, the version escaped by html/template, and the
// tables the script fills.
func TestPage(t *testing.T) {
	srv := httptest.NewServer(New(Options{Status: status(), Version: `v1<script>alert(1)</script>`}))
	defer srv.Close()
	resp, body := get(t, srv.URL+"/")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	csp := resp.Header.Get("Content-Security-Policy")
	m := regexp.MustCompile(`script-src 'nonce-([A-Z2-7]+)'`).FindStringSubmatch(csp)
	if m == nil || !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Fatalf("CSP %q: want default-src 'none', connect-src 'self' and a script nonce", csp)
	}
	if !strings.Contains(body, `<script nonce="`+m[1]+`">`) || !strings.Contains(body, `<style nonce="`+m[1]+`">`) {
		t.Error("the inline script and style do not carry the response's nonce")
	}
	_, again := get(t, srv.URL+"/")
	if strings.Contains(again, m[1]) {
		t.Error("the nonce is reused across responses")
	}
	for _, id := range []string{`id="nodes"`, `id="providers"`, `id="models"`, `id="errors"`, `id="events"`, `fetch("status"`, `new EventSource("events")`} {
		if !strings.Contains(body, id) {
			t.Errorf("page lacks %s", id)
		}
	}
	// N2, E4: a node's config state and why it cannot run this edge's
	// config (say an adapter another edge runs under that name) are on the
	// page, not only in /status.
	for _, f := range []string{"<th>config</th>", "n.config ===", "n.config_error"} {
		if !strings.Contains(body, f) {
			t.Errorf("page lacks the nodes' config column: %s", f)
		}
	}
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "v1&lt;script&gt;") {
		t.Error("the version is not HTML-escaped")
	}
	if regexp.MustCompile(`(src|href)="(https?:)?//`).MatchString(body) || strings.Contains(body, "innerHTML") {
		t.Error("the page loads an external asset or writes innerHTML")
	}
	if r, _ := get(t, srv.URL+"/nope"); r.StatusCode != 404 {
		t.Errorf("GET /nope: %d, want 404", r.StatusCode)
	}
}

// N3, N2: /status adds the generation, the draining flag and the config
// payload state of a connected node, the model groups' queues and the last
// errors.
func TestStatusOperatorFields(t *testing.T) {
	st := status()
	st.snaps[0].Generation, st.snaps[0].Draining = 3, true
	st.snaps[1].Generation = 9 // not connected: not shown
	recent := fakeRecent{{Time: since, RequestID: "r1", Model: "tiny", Status: 504, Outcome: access.Stalled, Code: "response_stalled"}}
	srv := httptest.NewServer(New(Options{Status: st, Groups: fakeGroups{{Name: "tiny", Waiters: 2, LongWaiters: 1, Candidates: 2, Live: 1}},
		Recent: recent, Payloads: fakePayloads{"gpu-1": "restart_required", "gpu-2": "current"}}))
	defer srv.Close()
	_, body := get(t, srv.URL+"/status")
	var got struct {
		Nodes []struct {
			Generation *uint64 `json:"generation"`
			Draining   *bool   `json:"draining"`
			Config     *string `json:"config"`
		} `json:"nodes"`
		Models []pool.GroupSnapshot `json:"models"`
		Recent []access.RecentError `json:"recent_errors"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if g := got.Nodes[0]; g.Generation == nil || *g.Generation != 3 || g.Draining == nil || !*g.Draining {
		t.Errorf("gpu-1: %s", body)
	}
	// N2: a node that answered RESTART_REQUIRED shows it runs an older
	// payload.
	if g := got.Nodes[0]; g.Config == nil || *g.Config != "restart_required" {
		t.Errorf("N2: gpu-1 config: %s", body)
	}
	if g := got.Nodes[1]; g.Generation != nil || g.Draining != nil || g.Config != nil {
		t.Errorf("gpu-2 (not connected) shows generation or draining: %s", body)
	}
	if len(got.Models) != 1 || got.Models[0].Waiters != 2 || got.Models[0].Live != 1 {
		t.Errorf("models: %s", body)
	}
	if len(got.Recent) != 1 || got.Recent[0].RequestID != "r1" || got.Recent[0].Outcome != access.Stalled {
		t.Errorf("recent_errors: %s", body)
	}
}

type fakePayloads map[string]string

func (f fakePayloads) NodePayloads() map[string]string { return f }

// A2: collectors' families follow the built-in ones on /metrics.
func TestMetricsCollectors(t *testing.T) {
	m := access.NewMetrics()
	m.Observe(&access.Record{Model: "tiny", Known: true, Surface: "chat_completions", Path: access.PathRun, Status: 200,
		Outcome: access.OK, Duration: time.Second})
	srv := httptest.NewServer(New(Options{Status: status(), Collectors: []Collector{m}}))
	defer srv.Close()
	_, body := get(t, srv.URL+"/metrics")
	if !strings.Contains(body, `iop_edge_requests_total{model="tiny",surface="chat_completions",path="run",code="200",outcome="ok"} 1`+"\n") {
		t.Errorf("metrics lack the collector's sample:\n%s", body)
	}
}

// N4: provider events carry the provider id.
func TestProviderEvent(t *testing.T) {
	bus := &events.Bus{}
	srv := httptest.NewServer(New(Options{Status: status(), Events: bus}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// serveEvents subscribes before it sends the header: live once Get returned.
	bus.Publish(events.Event{Type: events.TypeProviderUnavailable, Node: "gpu-1", Provider: "ollama", Time: since})
	buf := make([]byte, 512)
	n, err := io.ReadAtLeast(resp.Body, buf, 40)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:n]); !strings.HasPrefix(got, `event: provider.unavailable`+"\n"+`data: {"type":"provider.unavailable","node":"gpu-1","provider":"ollama"`) {
		t.Errorf("event: %q", got)
	}
}

// A2: "models" joins each group's queue and its routing, in the
// groups' config order; a routed model the group source lacks still shows.
func TestStatusModelsMerged(t *testing.T) {
	srv := httptest.NewServer(New(Options{Status: status(),
		Groups:  fakeGroups{{Name: "tiny", Waiters: 1, Candidates: 2, Live: 2}, {Name: "big", Candidates: 1}},
		Routing: fakeRouting{{Model: "big", Mode: "prefix_affinity", PrefixHit: 3, Hash: 1}, {Model: "ghost", Mode: "ordered"}}}))
	defer srv.Close()
	_, body := get(t, srv.URL+"/status")
	want := `"models":[{"name":"tiny","waiters":1,"long_waiters":0,"candidates":2,"live":2},` +
		`{"name":"big","waiters":0,"long_waiters":0,"candidates":1,"live":0,"routing":"prefix_affinity","decisions":{"prefix_hit":3,"hash":1,"fallback":0,"yield":0},"hit_ratio":0.75},` +
		`{"name":"ghost","routing":"ordered","decisions":{"prefix_hit":0,"hash":0,"fallback":0,"yield":0},"hit_ratio":0}]`
	if !strings.Contains(body, want) {
		t.Errorf("status models:\n%s\nwant %s", body, want)
	}
}
