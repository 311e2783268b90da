package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/edge/fleet"
	"iop/internal/identity"
	nodeconfig "iop/internal/node/config"
	"iop/internal/node/enroll"
)

// fleetEdge is an edge with enrollment on, a node template for gpu-* whose
// adapters point at backendURL, the configured group "tiny" over every
// gpu-* node, and one group per model the nodes' backends report
// (model_discovery), polled every pollMs.
func fleetEdge(t testing.TB, backendURL string, ttlMs, pollMs int64) (dir string, cfg *config.Config) {
	t.Helper()
	dir = t.TempDir()
	if err := identity.InitPKI(filepath.Join(dir, "pki"), identity.PKIOptions{Edge: edgeName}); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{
		"http_listen": "127.0.0.1:0", "node_listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
		"tls":        map[string]any{"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt"},
		"enrollment": map[string]any{"ca_key_file": "pki/ca.key", "certificate_ttl_ms": ttlMs},
		"discovery":  map[string]any{"poll_interval_ms": pollMs},
		"node_templates": []any{map[string]any{"match": "gpu-*", "adapters": []any{
			map[string]any{"name": "ollama", "type": "ollama", "capacity": 16, "base_url": backendURL}}}},
		"models":          []any{map[string]any{"name": "tiny", "providers": []any{map[string]any{"node": "gpu-*", "provider": "ollama", "target": "tiny"}}}},
		"model_discovery": []any{map[string]any{"node": "gpu-*", "provider": "ollama"}},
	})
	path := filepath.Join(dir, "edge.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return dir, cfg
}

// mintToken is edge tokens create for node, against cfg's store.
func mintToken(t testing.TB, cfg *config.Config, node string) string {
	t.Helper()
	ca, err := identity.LoadCA(cfg.TLS.CAFile, cfg.Enrollment.CAKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := identity.NewJoinToken(identity.CAPin(ca.Cert))
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Update(cfg.Enrollment.StoreFile, func(st *fleet.Store) error {
		st.Tokens = append(st.Tokens, &fleet.Token{ID: tok.ID, SecretSHA256: tok.SecretSHA256(), Node: node,
			CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), Uses: 1})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

// joinAndStart is node join into a fresh directory, then node -config
// DIR/node.json (reconnecting every second).
func joinAndStart(t testing.TB, e *edgeProc, cfg *config.Config, name string, logs *logSink) (string, *nodeProc) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if _, err := enroll.Join(context.Background(), enroll.JoinOptions{Edge: e.nodeAddr, Token: mintToken(t, cfg, name), Dir: dir, Name: name}); err != nil {
		t.Fatalf("node join: %v", err)
	}
	return dir, startJoined(t, dir, logs)
}

func startJoined(t testing.TB, dir string, logs *logSink) *nodeProc {
	t.Helper()
	ncfg, err := nodeconfig.Load(filepath.Join(dir, enroll.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	one := 1
	ncfg.Reconnect.IntervalSec = &one
	n := launchNode(ncfg, nil, logs.logger(ncfg.NodeID))
	t.Cleanup(func() {
		if err := n.stop(); err != nil {
			t.Errorf("node %s: %v", ncfg.NodeID, err)
		}
	})
	return n
}

// modelIDs is GET /v1/models' ids.
func modelIDs(t testing.TB, api *apiClient) []string {
	t.Helper()
	resp, err := api.hc.Get(api.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Data []struct{ ID string } `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&doc)
	var ids []string
	for _, d := range doc.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

// J5: with the shortest certificate lifetime (1 minute) a joined node
// renews over its live session under steady load, three times without
// reconnecting (the edge keeps two serials: the third renewal is decided
// on the certificate the second one issued, not the one the session
// connected with): not one request fails, the renewed pair is in the
// node's files and the edge's store, and a new connection (the node
// restarted) comes up with it.
func TestRenewalUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for three renewals: about 110 s")
	}
	t.Parallel()
	logs := newLogSink(t)
	b := startBackend(t, backend.Options{TokenDelay: time.Millisecond})
	url := b.serve(t, nil)
	_, cfg := fleetEdge(t, url, 60000, 1000)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	dir, n := joinAndStart(t, e, cfg, "gpu-7", logs)
	adm.waitConnected(t, 10*time.Second, "gpu-7")
	certFile := filepath.Join(dir, enroll.CertFile)
	first, _ := os.ReadFile(certFile)

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				r, err := api.chat(ctx, chatRequest{model: "tiny", stream: true})
				cancel()
				if err != nil || r.status != 200 || r.text != answer {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%v %d %q %v", err, r.status, r.text, r.errs))
					continue
				}
				ok.Add(1)
			}
		}()
	}
	// Issued, backdated 15 s, renewed at two thirds of 75 s: every 35 s.
	const renewals = 3
	_, err := logs.recs.waitFor(160*time.Second, func(lines []string) bool {
		n := 0
		for _, l := range lines {
			if strings.Contains(l, "gpu-7 INFO  certificate renewed") { // the node's line: installed
				n++
			}
		}
		return n >= renewals
	})
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("J5 not %d renewals within 160 s of a 1-minute certificate: %v", renewals, err)
	}
	renewed, _ := os.ReadFile(certFile)
	loadFor(2*time.Second, stop)
	wg.Wait()
	if failed.Load() != 0 || ok.Load() == 0 {
		t.Fatalf("J5 during the renewal: %d ok, %d failed; first failure: %v", ok.Load(), failed.Load(), firstErr.Load())
	}
	t.Logf("J5 renewal under load: %d requests, 0 failed", ok.Load())
	if bytes.Equal(first, renewed) {
		t.Fatal("J5 the certificate file did not change")
	}
	c, _ := identity.ParseCertificatePEM(renewed)
	st, _ := fleet.LoadStore(cfg.Enrollment.StoreFile)
	if r := st.Node("gpu-7"); r == nil || len(r.Serials) != 2 || r.Serials[0] != c.SerialNumber.Text(16) {
		t.Fatalf("J5 the store after renewal: %+v", r)
	}
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "gpu-7 disconnected", func() (bool, string) {
		d, err := adm.status()
		g, _ := d.node("gpu-7")
		return err == nil && !g.Connected, fmt.Sprint(g, err)
	})
	startJoined(t, dir, logs)
	adm.waitConnected(t, 10*time.Second, "gpu-7")
	if r, err := api.chat(context.Background(), chatRequest{model: "tiny"}); err != nil || r.text != answer {
		t.Fatalf("J5 after a reconnect with the renewed certificate: %v %+v", err, r)
	}
}

// loadFor closes stop after d (the load goroutines then end).
func loadFor(d time.Duration, stop chan struct{}) {
	t := time.NewTimer(d)
	<-t.C
	close(stop)
}

// D1 D2 against a real Ollama (IOP_TEST_OLLAMA_URL): a model copied into
// it is served through the edge within one discovery poll, with no edit of
// the edge's config; once removed it is gone from /v1/models. The copy has
// a unique name and is removed at the end (the Ollama is shared).
func TestDiscoveryRealOllama(t *testing.T) {
	base := os.Getenv("IOP_TEST_OLLAMA_URL")
	if base == "" {
		t.Skip("IOP_TEST_OLLAMA_URL not set")
	}
	logs := newLogSink(t)
	const poll = 500 * time.Millisecond
	_, cfg := fleetEdge(t, base, 86400000, poll.Milliseconds())
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	joinAndStart(t, e, cfg, "gpu-ollama", logs)
	adm.waitConnected(t, 20*time.Second, "gpu-ollama")
	copyName := fmt.Sprintf("tiny-copy-%d", time.Now().UnixNano())
	ollama := func(method, path string, body any) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("ollama %s %s: %v", method, path, err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("ollama %s %s: %d %s", method, path, resp.StatusCode, msg)
		}
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			ollama(http.MethodDelete, "/api/delete", map[string]string{"model": copyName})
		}
	})
	ollama(http.MethodPost, "/api/copy", map[string]string{"source": "tiny", "destination": copyName})
	copied := time.Now()
	eventually(t, 2*poll+2*time.Second, "D2 the copy in /v1/models", func() (bool, string) {
		ids := modelIDs(t, api)
		return slices.Contains(ids, copyName), fmt.Sprint(ids)
	})
	t.Logf("D2 %s listed %v after the copy (poll %v)", copyName, time.Since(copied).Round(time.Millisecond), poll)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r, err := api.chat(ctx, chatRequest{model: copyName, maxTokens: 8})
	cancel()
	if err != nil || r.status != 200 {
		t.Fatalf("D2 a request for the copy: %v %d %s", err, r.status, r.raw)
	}
	ollama(http.MethodDelete, "/api/delete", map[string]string{"model": copyName})
	removed = true
	eventually(t, 2*poll+2*time.Second, "D2 the copy gone from /v1/models", func() (bool, string) {
		ids := modelIDs(t, api)
		return !slices.Contains(ids, copyName), fmt.Sprint(ids)
	})
	if !slices.Contains(modelIDs(t, api), "tiny") {
		t.Error("D2 the configured group tiny went with the copy")
	}
}

// J2: the time from `node join` (a fresh key, the join exchange, the files
// written) to the first request the new node answers: its session, ready,
// its first discovery report and the request (in process, loopback TLS,
// the demo backend).
func BenchmarkJoinToFirstAnswer(b *testing.B) {
	logs := newLogSink(b)
	logs.level = slog.LevelWarn
	bp := startBackend(b, backend.Options{})
	url := bp.serve(b, nil)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		_, cfg := fleetEdge(b, url, 86400000, 10000)
		e := startEdge(b, cfg, nil, logs.logger("edge"))
		api := newAPIClient(b, e)
		tok := mintToken(b, cfg, "gpu-1")
		dir := filepath.Join(b.TempDir(), "gpu-1")
		b.StartTimer()
		if _, err := enroll.Join(context.Background(), enroll.JoinOptions{Edge: e.nodeAddr, Token: tok, Dir: dir, Name: "gpu-1"}); err != nil {
			b.Fatal(err)
		}
		startJoined(b, dir, logs)
		if err := poll(10*time.Second, func() (bool, string) {
			r, err := api.chat(context.Background(), chatRequest{model: "tiny-tool"})
			return err == nil && r.text == answer, fmt.Sprint(r.status, err)
		}); err != nil {
			b.Fatal(err)
		}
	}
}
