package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/edge/secretstore"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/node"
	nodeconfig "iop/internal/node/config"
)

// credKit is the credential plane's material for one test: the PKI's
// issuer and recipient keys, a store key and a store holding slot "demo".
type credKit struct {
	p         pkiDir
	storeFile string
	keyFile   string
	key       *secretstore.Key
}

func newCredKit(t *testing.T, p pkiDir, secret string) *credKit {
	t.Helper()
	k := &credKit{p: p, storeFile: p.file("secrets.json"), keyFile: p.file("store.key")}
	if err := secretstore.WriteNewKey(k.keyFile); err != nil {
		t.Fatal(err)
	}
	var err error
	if k.key, err = secretstore.LoadKey(k.keyFile); err != nil {
		t.Fatal(err)
	}
	k.set(t, secret)
	return k
}

// set is `edge secrets set -slot demo` with secret on stdin.
func (k *credKit) set(t *testing.T, secret string) {
	t.Helper()
	s, err := secretstore.LoadOrNew(k.storeFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(k.key, "demo", []byte(secret), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(k.storeFile); err != nil {
		t.Fatal(err)
	}
}

// tweak turns the plane on in an edge config whose adapters all use slot
// "demo".
func (k *credKit) tweak(t *testing.T) func(*config.Config) {
	pub, err := identity.LoadRecipientPublicKey(k.p.file(identity.RecipientPubFileName("gpu-1")))
	if err != nil {
		t.Fatal(err)
	}
	return func(c *config.Config) {
		c.Credentials = config.Credentials{Enabled: true, StoreFile: k.storeFile, StoreKeyFile: k.keyFile,
			IssuerKeyFile: k.p.file(identity.IssuerKeyFile)}
		for i := range c.Nodes {
			c.Nodes[i].LeaseRecipientPublicKey = identity.RecipientPublicKeyBase64(pub)
			for j := range c.Nodes[i].Adapters {
				c.Nodes[i].Adapters[j].CredentialSlot = "demo"
			}
		}
	}
}

// startCredNode runs gpu-1 with its lease keys; now, when set, is its
// clock.
func (k *credKit) startCredNode(t *testing.T, edgeAddr string, log *slog.Logger, now func() time.Time) {
	t.Helper()
	k.startCredNodeWithKey(t, edgeAddr, log, now, "gpu-1")
}

// startCredNodeWithKey runs gpu-1 with the lease recipient key of keyOf.
func (k *credKit) startCredNodeWithKey(t *testing.T, edgeAddr string, log *slog.Logger, now func() time.Time, keyOf string) {
	t.Helper()
	cfg, err := nodeConfigFor(k.p, "gpu-1", edgeAddr, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := identity.LoadIssuerPublicKey(k.p.file(identity.IssuerPubFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Credentials = nodeconfig.Credentials{RecipientPrivateKeyFile: k.p.file(identity.RecipientKeyFileName(keyOf)),
		IssuerPublicKey: identity.IssuerPublicKeyBase64(pub)}
	ctx, cancel := context.WithCancel(context.Background())
	n := &nodeProc{id: "gpu-1", cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- node.Run(ctx, cfg, node.Options{Logger: log, Version: "e2e", Now: now}) }()
	t.Cleanup(func() {
		if err := n.stop(); err != nil {
			t.Errorf("node: %v", err)
		}
	})
}

// needles are what must never appear outside the lease (SPEC C5, P4): the
// secret, its at-rest ciphertext and nonce, the store key, the issuer's and
// the node's private keys, each raw and in the encodings they are kept in.
func (k *credKit) needles(t *testing.T, secrets ...string) map[string]string {
	t.Helper()
	n := map[string]string{}
	add := func(name string, b []byte) {
		n[name+" raw"] = string(b)
		n[name+" base64"] = base64.StdEncoding.EncodeToString(b)
		n[name+" hex"] = hex.EncodeToString(b)
	}
	for i, s := range secrets {
		add(fmt.Sprintf("secret %d", i), []byte(s))
	}
	raw, err := os.ReadFile(k.storeFile)
	if err != nil {
		t.Fatal(err)
	}
	var store struct {
		Slots []struct{ Nonce, Ciphertext []byte } `json:"slots"`
	}
	if err := json.Unmarshal(raw, &store); err != nil {
		t.Fatal(err)
	}
	for i, s := range store.Slots {
		add(fmt.Sprintf("store ciphertext %d", i), s.Ciphertext)
		add(fmt.Sprintf("store nonce %d", i), s.Nonce)
	}
	keyRaw, _ := os.ReadFile(k.keyFile)
	add("store key", keyRaw)
	for _, f := range []string{identity.IssuerKeyFile, identity.RecipientKeyFileName("gpu-1"), identity.KeyFileName("gpu-1"), identity.KeyFileName(edgeName)} {
		b, _ := os.ReadFile(k.p.file(f))
		blk, _ := pem.Decode(b)
		if blk == nil {
			t.Fatalf("%s: no PEM block", f)
		}
		add(f, blk.Bytes)
		n[f+" PEM line"] = strings.Split(string(b), "\n")[1]
	}
	for name, v := range n {
		if len(v) < 8 {
			delete(n, name) // too short to search for without false hits
		}
	}
	return n
}

// scan fails t for every needle found in any of the named texts.
func scan(t *testing.T, needles map[string]string, texts map[string]string) {
	t.Helper()
	hits := 0
	for where, text := range texts {
		for name, needle := range needles {
			if strings.Contains(text, needle) {
				hits++
				t.Errorf("C5/P4: %s appears in %s", name, where)
			}
		}
	}
	t.Logf("scanned %d texts (%d bytes) for %d needles: %d hits", len(texts), totalLen(texts), len(needles), hits)
}

func totalLen(m map[string]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// rawEvents records GET /events verbatim.
func rawEvents(t *testing.T, adminURL string) func() string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/events", nil)
	hc := newHTTPClient(t)
	resp, err := hc.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET /events: %v", err)
	}
	var mu sync.Mutex
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			mu.Lock()
			buf.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

// allLines is every log line the sink saw.
func (s *logSink) allLines() string {
	items, _ := s.recs.snapshot()
	return strings.Join(items, "\n")
}

// C2–C5, P4: with the credential plane on, requests through both paths
// (normalized run to Ollama's /api/chat, raw tunnel to a llama-server-style
// backend that requires the key) are served with the secret from the
// store; then every log line (debug level included), /status, /metrics,
// /events and every response body, errors included, are searched for the
// secret, its at-rest ciphertext and every private key: zero hits.
func TestCredentialPlaneScan(t *testing.T) {
	leakcheck.Check(t)
	const secret = "sk-e2e-PLANE-7f3a9c1e5b2d4f60"
	p := newPKI(t, "gpu-1")
	k := newCredKit(t, p, secret)
	bp := startBackend(t, backend.Options{APIKey: secret})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4), compatAdapter("llama", url, 4)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny")), modelGroup("tiny-oa", provider("gpu-1", "llama", "tiny")),
			modelGroup("missing-oa", provider("gpu-1", "llama", "no-such-model"))}, k.tweak(t))
	logs := newLogSink(t)
	logs.level = slog.LevelDebug
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	events := rawEvents(t, e.adminURL)
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	k.startCredNode(t, e.nodeAddr, logs.logger("node"), nil)
	adm.waitConnected(t, 10*time.Second, "gpu-1")

	texts := map[string]string{}
	ctx := context.Background()
	for _, r := range []chatRequest{{model: "tiny"}, {model: "tiny", stream: true}, {model: "tiny-oa"}, {model: "tiny-oa", stream: true}} {
		res, err := api.chat(ctx, r)
		if err != nil || res.status != 200 || res.text != answer {
			t.Fatalf("C3 %s stream=%v: %d %q %v\n%s", r.model, r.stream, res.status, res.text, err, res.raw)
		}
		texts[fmt.Sprintf("response %s stream=%v", r.model, r.stream)] = res.raw
	}
	for _, r := range []chatRequest{{model: "missing-oa"}, {model: "no-such-group"}} {
		res, _ := api.chat(ctx, r)
		if res.status < 400 {
			t.Fatalf("%s: status %d, want an error", r.model, res.status)
		}
		texts["error body "+r.model] = res.raw
	}
	// The upstream saw every /v1 request authorized (no 401).
	items, _ := bp.ends.snapshot()
	for _, it := range items {
		if it.Status == http.StatusUnauthorized {
			t.Fatalf("C3: the backend refused a request for its key: %+v", it)
		}
	}
	for _, path := range []string{"/status", "/metrics"} {
		b, err := adm.get(path)
		if err != nil {
			t.Fatal(err)
		}
		texts[path] = string(b)
	}
	texts["/events"] = events()
	texts["logs"] = logs.allLines()
	if !strings.Contains(texts["/events"], "node.connected") {
		t.Fatalf("/events recorded nothing: %q", texts["/events"])
	}
	scan(t, k.needles(t, secret), texts)
}

// C3, C4: a node whose clock is 2 minutes ahead finds every lease expired:
// the request fails with a 502 naming the credential and nothing reaches
// the upstream.
func TestCredentialExpiredAtNode(t *testing.T) {
	leakcheck.Check(t)
	const secret = "sk-e2e-EXPIRED-0123456789"
	p := newPKI(t, "gpu-1")
	k := newCredKit(t, p, secret)
	bp := startBackend(t, backend.Options{APIKey: secret})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{compatAdapter("llama", url, 4)}}},
		[]config.Model{modelGroup("tiny-oa", provider("gpu-1", "llama", "tiny"))}, k.tweak(t))
	logs := newLogSink(t)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	k.startCredNode(t, e.nodeAddr, logs.logger("node"), func() time.Time { return time.Now().Add(2 * time.Minute) })
	adm.waitConnected(t, 10*time.Second, "gpu-1")
	res, err := api.chat(context.Background(), chatRequest{model: "tiny-oa"})
	if err != nil || res.status != http.StatusBadGateway || !strings.Contains(res.raw, `"code":"credential_rejected"`) ||
		!strings.Contains(res.raw, "credential lease expired") {
		t.Fatalf("got %d %s (%v), want 502 credential_rejected naming the expiry", res.status, res.raw, err)
	}
	if items, _ := bp.ends.snapshot(); len(items) != 0 {
		t.Fatalf("C4: %d requests reached the upstream", len(items))
	}
}

// C3: a node given another node's lease recipient key refuses the edge's
// payload, naming both key ids, and never becomes ready, so the edge routes
// nothing to it (before, it became ready and refused every lease with a
// 502).
func TestCredentialWrongNodeKey(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1", "gpu-2")
	k := newCredKit(t, p, "sk-e2e-WRONGKEY-4444")
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{compatAdapter("llama", url, 4)}}},
		[]config.Model{modelGroup("tiny-oa", provider("gpu-1", "llama", "tiny"))}, k.tweak(t))
	logs := newLogSink(t)
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm := newAdminClient(t, e)
	k.startCredNodeWithKey(t, e.nodeAddr, logs.logger("node"), nil, "gpu-2")
	logs.waitLine(t, "the node names the key mismatch", "not pairs", "recipient key", "credentials.recipient_private_key_file")
	if d, err := adm.status(); err != nil || d.connected() != 0 {
		t.Fatalf("C3: %d nodes connected (%v), want the node with the wrong key never ready", d.connected(), err)
	}
}

// C6, C2: rotation: `edge secrets set` and a reload make new leases carry
// the new revision; the node gets the new revision in its refreshed
// payload and the upstream sees only the new secret from then on.
func TestCredentialRotation(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1")
	k := newCredKit(t, p, "sk-rotation-OLD-000000")
	bp := startBackend(t, backend.Options{})
	var mu sync.Mutex
	var seen []string
	url := bp.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		bp.b.ServeHTTP(w, r)
	}))
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{compatAdapter("llama", url, 4)}}},
		[]config.Model{modelGroup("tiny-oa", provider("gpu-1", "llama", "tiny"))}, k.tweak(t))
	logs := newLogSink(t)
	reload := make(chan *config.Config)
	e := startEdge(t, cfg, nil, logs.logger("edge"), func(o *edge.Options) { o.Reload = reload })
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	k.startCredNode(t, e.nodeAddr, logs.logger("node"), nil)
	adm.waitConnected(t, 10*time.Second, "gpu-1")
	ask := func() {
		t.Helper()
		if res, err := api.chat(context.Background(), chatRequest{model: "tiny-oa"}); err != nil || res.status != 200 {
			t.Fatalf("chat: %d %v %s", res.status, err, res.raw)
		}
	}
	ask()
	k.set(t, "sk-rotation-NEW-111111") // revision 2
	refreshed := logs.messages("config refreshed")
	reload <- edgeConfig(t, p, cfg.Nodes, cfg.Models, k.tweak(t))
	eventually(t, 10*time.Second, "the node applies the refreshed payload", func() (bool, string) {
		return logs.messages("config refreshed") > refreshed, "no refresh yet"
	})
	ask()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] != "Bearer sk-rotation-OLD-000000" || seen[1] != "Bearer sk-rotation-NEW-111111" {
		t.Fatalf("C6: the upstream saw %q, want the old secret then the new one", seen)
	}
}
