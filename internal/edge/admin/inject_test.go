package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/batch"
	"iop/internal/edge/events"
	"iop/internal/edge/pool"
	iop "iop/proto/gen/iop"
)

// hostile is the payload each field carries, marked with the field's
// name: markup that would make an element (pwned-x, img, svg), run a
// script or an event handler, close the cell or the attribute it lands in,
// or break out of the page's JSON or SSE, if the page parsed it as HTML.
func hostile(field string) string {
	return `<pwned-x f="` + field + `"></pwned-x><img src=x onerror="document.body.dataset.pwned=1">` +
		`</td></tr><script>document.body.dataset.pwned=2</script>"'><svg onload="document.body.dataset.pwned=3">` +
		"\u2028\n\r\x00]]>-->`${1}`"
}

type onePayload struct{ state, err map[string]string }

func (p onePayload) NodePayloads() map[string]string { return p.state }
func (p onePayload) ConfigErrors() map[string]string { return p.err }

type rawSeries []byte

func (s rawSeries) JSON() []byte { return s }

// oneEvent sends its event to each subscriber and ends the stream (a
// stream left open would hold headless Chromium's virtual time).
type oneEvent struct{ ev events.Event }

func (o oneEvent) Subscribe(int) (<-chan events.Event, func()) {
	ch := make(chan events.Event, 1)
	ch <- o.ev
	close(ch)
	return ch, func() {}
}
func (oneEvent) Dropped() uint64 { return 0 }

// chromiumPath is Chromium's binary: IOP_CHROMIUM, else chromium on the
// PATH (Debian's chromium; ./run.sh e2e installs it), else "".
func chromiumPath() string {
	if p := os.Getenv("IOP_CHROMIUM"); p != "" {
		return p
	}
	p, _ := exec.LookPath("chromium")
	return p
}

// probe is appended to the operator page (with the response's CSP nonce,
// which the test reads from the header) so that headless Chromium's
// --dump-dom shows what the page's own script built: 4 s of virtual time
// after load (the first /status and /series renders and the /events
// event), it writes into #probe the elements no field may have made and
// the page's text.
const probe = `<pre id="probe"></pre><script nonce="%s">setTimeout(function () {
  document.getElementById("probe").textContent = JSON.stringify({
    made: document.querySelectorAll("pwned-x, img, svg:not(.chart), script:not([nonce]), [onerror], [onload]").length,
    pwned: document.body.dataset.pwned || "",
    text: document.body.innerText});
}, 4000);</script>`

// SPEC A2, attacked: every name and string the operator page shows —
// node, provider and model names (configured, reported by a node, found
// by discovery), a node's config error, provider health and cooling
// reasons, residency targets, key names (batches), request ids, error
// codes and messages (which quote what clients send), event fields, the
// charts' groups, providers and classes — carries markup, script, event
// handlers, quotes, a closing </td>, U+2028, NUL and CR/LF. Rendered by
// the page's own script in headless Chromium (Debian's chromium, as
// ./run.sh e2e installs it; skipped without one), every payload shows as
// text, marker by marker, and the page holds no element, handler or
// script that a payload made.
func TestA2HostileNamesRenderAsText(t *testing.T) {
	exe := chromiumPath()
	if exe == "" {
		t.Skip("no Chromium: apt-get install chromium (./run.sh e2e does), or set IOP_CHROMIUM")
	}
	fields := []string{}
	h := func(f string) string { fields = append(fields, f); return hostile(f) }
	node, prov := h("node"), h("provider")
	st := fakeStatus{snaps: []pool.NodeSnapshot{{Node: node, Connected: true, ReadySince: since, Generation: 2,
		Providers: []*iop.ProviderSnapshot{{ProviderId: prov, Category: h("category"), Status: h("status"), Health: h("health"),
			CoolingUntil: "2026-11-29T12:00:00Z", CoolingReason: h("cooling_reason"), Capacity: 1, LongCapacity: 1,
			Residency: []*iop.ModelResidency{{Model: h("residency_model"), State: h("residency_state")}}}}}}}
	model := h("model")
	recent := fakeRecent{{Time: since, RequestID: h("request_id"), Model: h("error_model"), Node: h("error_node"), Provider: h("error_provider"),
		Status: 502, Outcome: access.Outcome(h("outcome")), Code: h("code"), Error: h("error")}}
	series := fmt.Sprintf(`{"step_ms":10000,"slots":2,"start_ms":%d,"now_ms":%d,"models":[{"name":%q,"requests_per_s":[1,1],"errors_per_s":[0,1],`+
		`"ttfb_p50_ms":[5,5],"ttfb_p99_ms":[9,9],"prompt_tokens_per_s":[1,1],"completion_tokens_per_s":[1,1]}],`+
		`"providers":[{"node":%q,"provider":%q,"in_flight_mean":[1,1],"in_flight_max":[1,1],"capacity":[1,1]}],`+
		`"classes":[{"name":%q,"requests_per_s":[1,1],"wait_p50_ms":[1,1],"wait_p99_ms":[2,2]}]}`,
		time.Now().Add(-10*time.Second).UnixMilli(), time.Now().UnixMilli(), h("chart_model"), h("chart_node"), h("chart_provider"), h("chart_class"))
	series = strings.ReplaceAll(series, `\x00`, `\u0000`) // %q's escape is Go's, not JSON's
	series = strings.ReplaceAll(series, `\u2028`, `\u2028`)
	adapter := h("discovered_adapter")
	opts := Options{
		Status:  st,
		Groups:  fakeGroups{{Name: model, Candidates: 1, Live: 1}},
		Routing: fakeRouting{{Model: model, Mode: h("routing")}},
		Recent:  recent,
		Payloads: onePayload{state: map[string]string{node: h("config_state")},
			err: map[string]string{node: h("config_error")}},
		Discovered: func() map[string]map[string][]string {
			return map[string]map[string][]string{node: {adapter: {h("discovered_model")}}}
		},
		Batches: fakeBatches{{Principal: h("batch_key"), Batches: 1, Lines: 2, Oldest: h("batch_id"), Status: batch.Status(h("batch_status"))}},
		Series:  rawSeries(series),
		Events:  oneEvent{events.Event{Type: events.TypeDisconnected, Node: h("event_node"), Provider: h("event_provider"), Time: since, Reason: h("event_reason")}},
	}
	admin := New(opts)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			admin.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, r)
		nonce := regexp.MustCompile(`script-src 'nonce-([A-Z2-7]+)'`).FindStringSubmatch(rec.Header().Get("Content-Security-Policy"))
		if nonce == nil {
			t.Errorf("no script nonce in the page's CSP %q", rec.Header().Get("Content-Security-Policy"))
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		page := bytes.Replace(rec.Body.Bytes(), []byte("</body>"), []byte(fmt.Sprintf(probe, nonce[1])+"</body>"), 1)
		w.WriteHeader(rec.Code)
		w.Write(page)
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-component-update", "--disable-sync", "--user-data-dir="+t.TempDir(),
		"--virtual-time-budget=6000", "--enable-logging=stderr", "--dump-dom", srv.URL+"/")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s --dump-dom: %v\n%s", exe, err, stderr.Bytes())
	}
	m := regexp.MustCompile(`(?s)<pre id="probe">(.*?)</pre>`).FindSubmatch(out)
	if m == nil || len(m[1]) == 0 {
		t.Fatalf("the probe did not run; the DOM:\n%s\nstderr:\n%s", out, stderr.Bytes())
	}
	var got struct {
		Made  int    `json:"made"`
		Pwned string `json:"pwned"`
		Text  string `json:"text"`
	}
	if err := json.Unmarshal([]byte(html.UnescapeString(string(m[1]))), &got); err != nil {
		t.Fatalf("probe: %v: %s", err, m[1])
	}
	if got.Made != 0 || got.Pwned != "" {
		t.Errorf("a payload was parsed as HTML: %d elements it made, body data-pwned %q", got.Made, got.Pwned)
	}
	for _, f := range fields {
		if !strings.Contains(got.Text, `<pwned-x f="`+f+`"></pwned-x><img src=x onerror=`) {
			t.Errorf("field %s: its payload is not on the page as text", f)
		}
	}
	if t.Failed() {
		t.Logf("page text:\n%s\nstderr:\n%s", got.Text, stderr.Bytes())
	}
	t.Logf("A2: %d fields with hostile markup rendered as text", len(fields))
}
