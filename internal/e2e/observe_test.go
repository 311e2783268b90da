package e2e

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge"
	"iop/internal/edge/access"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// O3: caller-controlled values never reach a metric label or a general
// log line, and the label sets stay bounded. Through the real Edge and
// Node (debug logging on): 20 requests naming models that are no
// configured group (one of them 10 KB), then a request to "pair" carrying
// a 10 KB header, a 10 KB X-Request-Id and an API key, whose first provider
// stalls (the node's stall line, the Edge's health and recovery events)
// and which is re-dispatched to the second. /metrics carries none of those
// values, and has as many series after the 20 unknown models as after 1;
// no log line but the access line (the per-request record, whose model
// field is the client's word cut to 128 bytes, by design) carries the
// model names, the header or the key, and the request id, the correlation
// id every line carries, appears only sanitized and cut to
// access.MaxRequestIDLen.
func TestO3HostileCallerValuesStayOutOfLabelsAndLogs(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	logs.level = slog.LevelDebug
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	sick := &sickBackend{held: newRecorder[string](), next: bp.b}
	sickURL, wellURL := bp.serve(t, sick), bp.serve(t, nil)
	sickProv := provider("gpu-1", "sick", "tiny")
	sickProv.ResponseStallTimeoutMs = 300
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("sick", sickURL, 2), ollamaAdapter("well", wellURL, 2)}}},
		[]config.Model{modelGroup("pair", sickProv, provider("gpu-1", "well", "tiny"))}, nil)
	_, adm, api := startReady(t, p, cfg, logs, func(o *edge.Options) { o.HealthProbeInterval = 100 * time.Millisecond })

	const (
		evilModel = "evil-model-QX7"
		evilHdr   = "evil-header-QX7"
		evilID    = "evil-request-id-QX7"
		evilKey   = "sk-evil-KEY-QX7-0123456789abcdef"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	send := func(model string, hdr map[string]string) (int, string) {
		t.Helper()
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.url+"/v1/chat/completions", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := api.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	series := func() int {
		t.Helper()
		b, err := adm.get("/metrics")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				n++
			}
		}
		return n
	}

	if st, raw := send(evilModel+"-0", nil); st != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s, want 404", st, raw)
	}
	after1 := series()
	for i := 1; i < 20; i++ {
		model := evilModel + "-" + strings.Repeat("m", i)
		if i == 19 {
			model = evilModel + "-" + strings.Repeat("M", 10<<10)
		}
		if st, raw := send(model, nil); st != http.StatusNotFound {
			t.Fatalf("unknown model %d: %d %.300s, want 404", i, st, raw)
		}
	}
	if n := series(); n != after1 {
		t.Errorf("O3 /metrics has %d series after 20 unknown models, %d after 1: a label follows the caller", n, after1)
	}

	sick.stall.Store(true)
	sick.tagsDown.Store(true)
	st, raw := send("pair", map[string]string{"X-Evil": evilHdr + strings.Repeat("h", 10<<10), "X-Request-Id": evilID + strings.Repeat("i", 10<<10),
		"Authorization": "Bearer " + evilKey, "X-Api-Key": evilKey})
	if st != http.StatusOK {
		t.Fatalf("pair after a stall on sick: %d %.500s, want 200 from well", st, raw)
	}
	eventually(t, 10*time.Second, "the stall's observations", func() (bool, string) {
		return logs.messages("edge_liveness_recovery_observation") >= 2 && logs.messages("response stalled") >= 1, "waiting"
	})
	sick.stall.Store(false)
	adm.waitGauges(t, 10*time.Second, 0, 0)

	b, err := adm.get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var general []string
	for _, l := range strings.Split(logs.allLines(), "\n") {
		if !strings.Contains(l, " access ") {
			general = append(general, l)
		}
	}
	for what, text := range map[string]string{"/metrics": string(b), "general logs": strings.Join(general, "\n")} {
		banned := []string{evilModel, evilHdr, evilKey, strings.Repeat("M", 64), strings.Repeat("h", 64), strings.Repeat("i", access.MaxRequestIDLen)}
		if what == "/metrics" {
			banned = append(banned, evilID)
		}
		for _, banned := range banned {
			if i := strings.Index(text, banned); i >= 0 {
				lo := strings.LastIndex(text[:i], "\n") + 1
				t.Errorf("O3 %s carry the caller's %.40q: %.300s", what, banned, text[lo:])
			}
		}
	}
}
