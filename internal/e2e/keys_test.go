package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/edge/keystore"
	"iop/internal/leakcheck"
)

// keyCall is one authenticated request and its whole answer.
type keyCall struct {
	status int
	header http.Header
	body   string
}

func callWithKey(t testing.TB, hc *http.Client, method, url, key, body string) keyCall {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, url, err)
	}
	return keyCall{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// editStore changes the key store as `edge keys` does.
func editStore(t testing.TB, path string, change func(*keystore.Store) error) {
	t.Helper()
	if err := keystore.Update(path, change); err != nil {
		t.Fatal(err)
	}
}

func chatBody(model string, stream bool, maxTokens int) string {
	m := map[string]any{"model": model, "stream": stream, "messages": []map[string]string{{"role": "user", "content": "hi"}}}
	if maxTokens > 0 {
		m["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// K2, K4, K5, K6, K7: client keys from the key store through the whole
// stack (edge, node, demo backend, both paths): the scope's 404 and
// /v1/models, the rate-limit headers, a day budget a stream crosses, the
// usage in /status and /metrics, a revocation without SIGHUP, and the
// budget still spent after an edge restart.
func TestKeysEndToEnd(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	store := filepath.Join(t.TempDir(), "keys.json")
	var teamA, teamB string
	editStore(t, store, func(st *keystore.Store) (err error) {
		if teamA, err = st.Create(keystore.Spec{Name: "team-a", Models: []string{"tiny*"},
			Limits: keystore.Limits{RequestsPerMinute: 100, TokensPerDay: 120}}, time.Now()); err != nil {
			return err
		}
		teamB, err = st.Create(keystore.Spec{Name: "team-b"}, time.Now())
		return err
	})
	cfg := edgeConfig(t, p,
		[]config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4), compatAdapter("oa", url, 4)}}},
		[]config.Model{
			modelGroup("tiny", provider("gpu-1", "ollama", "tiny")),
			modelGroup("tiny-oa", provider("gpu-1", "oa", "tiny")),
			modelGroup("tiny-loop", provider("gpu-1", "ollama", "tiny-loop")),
			modelGroup("other", provider("gpu-1", "ollama", "tiny")),
		},
		func(c *config.Config) { c.Keys = config.Keys{StoreFile: store, UsageFlushMs: 1000} })
	e, adm, _ := startReady(t, p, cfg, logs)
	hc := newHTTPClient(t)
	chat := func(key, body string) keyCall {
		return callWithKey(t, hc, "POST", e.httpURL+"/v1/chat/completions", key, body)
	}

	// K1: a key store is never open mode.
	if c := chat("", chatBody("tiny", false, 0)); c.status != http.StatusUnauthorized {
		t.Fatalf("K1 no key: %d %s", c.status, c.body)
	}

	// K4: /v1/models lists the scope only.
	models := func(key string) []string {
		c := callWithKey(t, hc, "GET", e.httpURL+"/v1/models", key, "")
		var doc struct{ Data []struct{ ID string } }
		if c.status != 200 || json.Unmarshal([]byte(c.body), &doc) != nil {
			t.Fatalf("K4 /v1/models: %d %s", c.status, c.body)
		}
		var ids []string
		for _, d := range doc.Data {
			ids = append(ids, d.ID)
		}
		return ids
	}
	if got := strings.Join(models(teamA), ","); got != "tiny,tiny-oa,tiny-loop" {
		t.Errorf("K4 team-a's /v1/models: %s", got)
	}
	if got := strings.Join(models(teamB), ","); got != "tiny,tiny-oa,tiny-loop,other" {
		t.Errorf("K4 team-b's /v1/models: %s", got)
	}

	// K4: another model is the same 404 as one that does not exist.
	out, missing := chat(teamA, chatBody("other", false, 0)), chat(teamA, chatBody("nope", false, 0))
	if out.status != 404 || missing.status != 404 || strings.ReplaceAll(out.body, `\"other\"`, `\"nope\"`) != missing.body {
		t.Errorf("K4 out of scope vs missing:\n%d %s\n%d %s", out.status, out.body, missing.status, missing.body)
	}
	if c := chat(teamB, chatBody("other", false, 0)); c.status != 200 {
		t.Errorf("K4 team-b calls other: %d %s", c.status, c.body)
	}

	// K6: the headers against the limits, on both paths and on Messages.
	for _, model := range []string{"tiny", "tiny-oa"} {
		c := chat(teamA, chatBody(model, false, 5))
		if c.status != 200 || c.header.Get("X-Ratelimit-Limit-Requests") != "100" || c.header.Get("X-Ratelimit-Limit-Tokens") != "120" ||
			c.header.Get("X-Ratelimit-Remaining-Requests") == "" || c.header.Get("X-Ratelimit-Reset-Tokens") == "" {
			t.Errorf("K6 %s: %d %v %s", model, c.status, c.header, c.body)
		}
	}
	msg := callWithKey(t, hc, "POST", e.httpURL+"/v1/messages", teamA,
		`{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	if msg.status != 200 || msg.header.Get("Anthropic-Ratelimit-Requests-Limit") != "100" ||
		msg.header.Get("Anthropic-Ratelimit-Tokens-Limit") != "120" || msg.header.Get("X-Ratelimit-Limit-Requests") != "" {
		t.Errorf("K6 /v1/messages: %d %v %s", msg.status, msg.header, msg.body)
	}
	if c := chat(teamB, chatBody("tiny", false, 0)); c.header.Get("X-Ratelimit-Limit-Requests") != "" {
		t.Errorf("K6 a key without bounds got headers: %v", c.header)
	}

	// K5: a stream that crosses the day's budget finishes; the next
	// request is refused until 00:00 UTC.
	stream := chat(teamA, chatBody("tiny-loop", true, 200))
	if stream.status != 200 || !strings.Contains(stream.body, "data: [DONE]") {
		t.Fatalf("K5 the crossing stream: %d %s", stream.status, stream.body)
	}
	spent := chat(teamA, chatBody("tiny", false, 0))
	if spent.status != 429 || spent.header.Get("Retry-After") == "" || !strings.Contains(spent.body, "tokens_per_day 120") ||
		spent.header.Get("X-Ratelimit-Remaining-Tokens") != "0" {
		t.Fatalf("K5 after the crossing stream: %d %v %s", spent.status, spent.header, spent.body)
	}

	// K7: usage per key in /status and /metrics.
	var st struct {
		Keys []struct {
			Name        string `json:"name"`
			Requests    int64  `json:"requests"`
			TokensToday int64  `json:"tokens_today"`
			Refused     int64  `json:"refused"`
		} `json:"keys"`
	}
	b, err := adm.get("/status")
	if err != nil || json.Unmarshal(b, &st) != nil {
		t.Fatalf("K7 /status: %v %s", err, b)
	}
	var a struct{ requests, today, refused int64 }
	for _, k := range st.Keys {
		if k.Name == "team-a" {
			a.requests, a.today, a.refused = k.Requests, k.TokensToday, k.Refused
		}
	}
	if a.today <= 120 || a.refused != 1 || a.requests < 5 {
		t.Errorf("K7 team-a in /status: %+v", a)
	}
	m, err := adm.metrics()
	if err != nil || m[`iop_edge_key_requests_total{key="team-a"}`] < 5 || m[`iop_edge_key_refused_total{key="team-a"}`] != 1 {
		t.Errorf("K7 /metrics: %v", err)
	}
	for k := range m {
		if strings.Contains(k, teamA) || strings.Contains(k, teamB) {
			t.Fatal("P4: a key in /metrics")
		}
	}

	// K2: a revocation takes effect without SIGHUP; the edge polls the file.
	editStore(t, store, func(st *keystore.Store) error { return st.Revoke("team-b", time.Now()) })
	eventually(t, 5*time.Second, "K2 team-b refused after its revocation", func() (bool, string) {
		c := chat(teamB, chatBody("tiny", false, 0))
		return c.status == 401, c.body
	})

	// K7: after a restart the day is still spent.
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e2, _, _ := startReady(t, p, cfg, logs)
	again := callWithKey(t, hc, "POST", e2.httpURL+"/v1/chat/completions", teamA, chatBody("tiny", false, 0))
	if again.status != 429 || !strings.Contains(again.body, "tokens_per_day") {
		t.Fatalf("K7 after the restart: %d %s", again.status, again.body)
	}
	lines, _ := logs.recs.snapshot()
	if all := strings.Join(lines, "\n"); strings.Contains(all, teamA) || strings.Contains(all, teamB) {
		t.Fatal("P4: a key in the logs")
	}
}
