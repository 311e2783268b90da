package sdk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The demo surface (scripts/demo.sh, README "Two commands").
const (
	demoKey  = "iop-demo-key"
	nodeID   = "gpu-1"
	edgeName = "edge-1"
	// heartbeatTimeout is the edge's heartbeat.timeout_ms written into the
	// config: the bound within which a dead node is fenced (SPEC L7).
	heartbeatTimeout = 20 * time.Second
	readyTimeout     = 30 * time.Second
)

// demoGroups are the six model groups of the demo surface (docs/config.md, "The demo's environment").
var demoGroups = []string{"tiny", "tiny-tool", "tiny-loop", "tiny-oa", "tiny-tool-oa", "tiny-loop-oa"}

// suiteEnv is the suite's configuration, read from the environment by the
// test entry points only (this package is the e2e suite's main).
type suiteEnv struct {
	bin       string // IOP_BIN: directory holding edge, node, demo-backend
	ollamaURL string // IOP_OLLAMA_URL: a real Ollama
	openaiURL string // IOP_OPENAI_URL: a real OpenAI-compatible server
	// IOP_OPENAI_TOOL_URL / IOP_OPENAI_LOOP_URL: the server of the tool and
	// the loop model when it is another one (llama-server serves one model
	// per port); default openaiURL.
	openaiToolURL string
	openaiLoopURL string
	openaiProfile string // IOP_OPENAI_PROFILE (default llamacpp; ollama when only IOP_OLLAMA_URL)
	target        string // IOP_DEMO_TARGET (default tiny)
	toolTarget    string // IOP_DEMO_TOOL_TARGET (default tiny-tool)
	loopTarget    string // IOP_DEMO_LOOP_TARGET (default tiny-loop)
	tokenDelay    string // IOP_DEMO_TOKEN_DELAY for the demo backend (default 20ms)
}

// realServer reports whether a real inference server replaces the demo backend.
func (e suiteEnv) realServer() bool { return e.ollamaURL != "" || e.openaiURL != "" }

// loadEnv skips t unless IOP_E2E=1 (a stray go test must not start
// processes) and returns the suite's settings.
func loadEnv(t *testing.T) suiteEnv {
	t.Helper()
	if os.Getenv("IOP_E2E") != "1" {
		t.Skip("end-to-end suite: set IOP_E2E=1 (./run.sh e2e does)")
	}
	get := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	e := suiteEnv{
		bin:        get("IOP_BIN", "../../../bin"),
		ollamaURL:  os.Getenv("IOP_OLLAMA_URL"),
		openaiURL:  os.Getenv("IOP_OPENAI_URL"),
		target:     get("IOP_DEMO_TARGET", "tiny"),
		toolTarget: get("IOP_DEMO_TOOL_TARGET", "tiny-tool"),
		loopTarget: get("IOP_DEMO_LOOP_TARGET", "tiny-loop"),
		tokenDelay: get("IOP_DEMO_TOKEN_DELAY", "20ms"),
	}
	e.openaiProfile = get("IOP_OPENAI_PROFILE", "llamacpp")
	e.openaiToolURL, e.openaiLoopURL = os.Getenv("IOP_OPENAI_TOOL_URL"), os.Getenv("IOP_OPENAI_LOOP_URL")
	if e.openaiURL == "" && (e.openaiToolURL != "" || e.openaiLoopURL != "") {
		t.Fatal("IOP_OPENAI_TOOL_URL and IOP_OPENAI_LOOP_URL need IOP_OPENAI_URL (the server of the plain model)")
	}
	if e.openaiURL == "" && e.ollamaURL != "" {
		e.openaiURL, e.openaiProfile = e.ollamaURL, "ollama"
	}
	if e.openaiToolURL == "" {
		e.openaiToolURL = e.openaiURL
	}
	if e.openaiLoopURL == "" {
		e.openaiLoopURL = e.openaiURL
	}
	abs, err := filepath.Abs(e.bin)
	if err != nil {
		t.Fatalf("IOP_BIN %q: %v", e.bin, err)
	}
	e.bin = abs
	for _, b := range []string{"edge", "node", "demo-backend"} {
		if b == "demo-backend" && e.realServer() {
			continue
		}
		if _, err := os.Stat(filepath.Join(e.bin, b)); err != nil {
			t.Fatalf("binary %s missing in IOP_BIN=%s (run ./run.sh build): %v", b, e.bin, err)
		}
	}
	return e
}

// stack is one running backend + edge + node, owned by one test.
type stack struct {
	t                    *testing.T
	env                  suiteEnv
	dir                  string
	httpAddr, adminAddr  string
	nodeAddr             string
	backendAddr          string // demo backend; "" with a real server
	backend, edge, node  *proc
	hc                   *http.Client // every client of this stack, so idle conns can be closed
	edgeConfig, nodeConf string
	// secret is the upstream key the credential plane carries (stack
	// option withCredentials); "" with the plane off.
	secret string
}

// stackOptions tune newStack.
type stackOptions struct {
	// credentials turns the credential plane on (SPEC C1–C6): `edge
	// secrets` stores a random upstream key in slot "demo", every adapter
	// uses the slot, the node gets its lease keys, and the demo backend
	// requires the key on its /v1 routes (-api-key-file).
	credentials bool
	// configs edit the edge and node configs before they are written.
	configs []func(edgeCfg, nodeCfg map[string]any)
	// nodes are more node ids the PKI gets certificates for (a test starts
	// their processes itself: startExtraNode).
	nodes []string
}

// withNodes is the stack option that mints certificates for more nodes.
func withNodes(ids ...string) func(*stackOptions) {
	return func(o *stackOptions) { o.nodes = append(o.nodes, ids...) }
}

// withCredentials is the stack option that turns the credential plane on.
func withCredentials(o *stackOptions) { o.credentials = true }

// withConfig is the stack option that edits the configs (say, a shutdown
// key) before they are written.
func withConfig(f func(edgeCfg, nodeCfg map[string]any)) func(*stackOptions) {
	return func(o *stackOptions) { o.configs = append(o.configs, f) }
}

// newStack mints PKI, writes configs, starts the demo backend (unless a real
// server is configured), the edge and the node, and waits until /status
// shows the node connected. Cleanup stops everything (SIGTERM, then the
// process group is checked gone) and checks for goroutine leaks.
func newStack(t *testing.T, opts ...func(*stackOptions)) *stack {
	t.Helper()
	var o stackOptions
	for _, f := range opts {
		f(&o)
	}
	env := loadEnv(t)
	checkGoroutines(t)
	s := &stack{t: t, env: env, dir: t.TempDir()}
	s.hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	t.Cleanup(s.shutdown)
	ports := freePorts(t, 4)
	s.httpAddr, s.adminAddr, s.nodeAddr = ports[0], ports[1], ports[2]

	pkiArgs := []string{"pki", "init", "-dir", filepath.Join(s.dir, "pki"), "-edge", edgeName, "-node", nodeID}
	for _, id := range o.nodes {
		pkiArgs = append(pkiArgs, "-node", id)
	}
	if out, err := runOnce(filepath.Join(env.bin, "edge"), pkiArgs...); err != nil {
		t.Fatalf("edge pki init: %v\n%s", err, out)
	}
	ollamaURL, profile := env.ollamaURL, env.openaiProfile
	openaiURLs := compatURLs{plain: env.openaiURL, tool: env.openaiToolURL, loop: env.openaiLoopURL}
	var backendArgs []string
	if o.credentials {
		s.secret = s.storeSecret()
		keyFile := filepath.Join(s.dir, "backend.key")
		if err := os.WriteFile(keyFile, []byte(s.secret), 0o600); err != nil {
			t.Fatal(err)
		}
		backendArgs = []string{"-api-key-file", keyFile}
	}
	if !env.realServer() {
		s.backendAddr = ports[3]
		var err error
		s.backend, err = startProc("demo-backend", filepath.Join(env.bin, "demo-backend"),
			append([]string{"-listen", s.backendAddr, "-token-delay", env.tokenDelay,
				"-models", "tiny,tiny-tool,tiny-loop,tiny-think,tiny-agent"}, backendArgs...)...)
		if err != nil {
			t.Fatal(err)
		}
		ollamaURL, profile = "http://"+s.backendAddr, "llamacpp"
		openaiURLs = compatURLs{plain: ollamaURL, tool: ollamaURL, loop: ollamaURL}
		s.waitHTTP("http://"+s.backendAddr+"/api/tags", 10*time.Second)
	}
	s.edgeConfig = filepath.Join(s.dir, "edge.json")
	s.nodeConf = filepath.Join(s.dir, "node.json")
	ec, nc := edgeConfig(s.httpAddr, s.adminAddr, s.nodeAddr, ollamaURL, openaiURLs, profile, env), nodeConfig(s.nodeAddr)
	if o.credentials {
		s.planeOn(ec, nc)
	}
	for _, f := range o.configs {
		f(ec, nc)
	}
	writeJSON(t, s.edgeConfig, ec)
	writeJSON(t, s.nodeConf, nc)
	s.startEdge()
	s.startNode()
	s.waitConnected(true, readyTimeout)
	return s
}

// startEdge starts bin/edge on the stack's config (and thus its ports).
func (s *stack) startEdge() {
	s.t.Helper()
	p, err := startProc("edge", filepath.Join(s.env.bin, "edge"), "-config", s.edgeConfig)
	if err != nil {
		s.t.Fatal(err)
	}
	s.edge = p
}

// startNode starts bin/node on the stack's node config.
func (s *stack) startNode() {
	s.t.Helper()
	p, err := startProc("node", filepath.Join(s.env.bin, "node"), "-config", s.nodeConf)
	if err != nil {
		s.t.Fatal(err)
	}
	s.node = p
}

// startExtraNode starts bin/node as node id (minted by withNodes) against
// the stack's edge, waits until /status shows it connected, and stops it
// at cleanup unless it already exited.
func (s *stack) startExtraNode(id string) *proc {
	s.t.Helper()
	nc := nodeConfig(s.nodeAddr)
	nc["node_id"] = id
	nc["tls"].(map[string]any)["cert_file"] = "pki/" + id + ".crt"
	nc["tls"].(map[string]any)["key_file"] = "pki/" + id + ".key"
	path := filepath.Join(s.dir, "node-"+id+".json")
	writeJSON(s.t, path, nc)
	p, err := startProc("node-"+id, filepath.Join(s.env.bin, "node"), "-config", path)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		if _, err := p.stop(); err != nil {
			s.t.Errorf("node %s: %v", id, err)
		}
		if !p.groupGone(5 * time.Second) {
			s.t.Errorf("node %s: processes of its group are still running after stop", id)
		}
		if s.t.Failed() {
			s.t.Logf("---- last lines of node %s ----\n%s", id, p.log.tail(40))
		}
	})
	s.waitStatus("node "+id+" connected", readyTimeout, func(doc statusDoc) bool {
		for _, n := range doc.Nodes {
			if n.ID == id && n.Connected {
				return true
			}
		}
		return false
	})
	return p
}

// shutdown stops node, edge and backend with SIGTERM (each must exit 0,
// S4: the node exits 0 on SIGINT/SIGTERM; A3: the edge drains on SIGTERM
// and exits 0), checks no process of their groups is left, and on
// failure prints each process's last log lines.
func (s *stack) shutdown() {
	t := s.t
	for _, p := range []*proc{s.node, s.edge, s.backend} {
		if p == nil {
			continue
		}
		wasRunning := !p.exited()
		code, err := p.stop()
		if err != nil {
			t.Errorf("stop: %v", err)
		} else if wasRunning && code != 0 {
			t.Errorf("%s exited %d on SIGTERM, want 0", p.name, code)
		}
		if !p.groupGone(5 * time.Second) {
			t.Errorf("%s: processes of its group are still running after stop", p.name)
		}
	}
	if t.Failed() {
		for _, p := range []*proc{s.backend, s.edge, s.node} {
			if p != nil {
				t.Logf("---- last lines of %s ----\n%s", p.name, p.log.tail(40))
			}
		}
	}
	s.hc.CloseIdleConnections()
}

// openai returns an OpenAI client for the edge: base URL http://edge/v1/,
// the demo key, no retries (a retry would hide the behaviour under test).
func (s *stack) openai(opts ...option.RequestOption) *openai.Client {
	base := []option.RequestOption{
		option.WithBaseURL("http://" + s.httpAddr + "/v1/"),
		option.WithAPIKey(demoKey),
		option.WithHTTPClient(s.hc),
		option.WithMaxRetries(0),
	}
	c := openai.NewClient(append(base, opts...)...)
	return &c
}

// anthropic returns an Anthropic client for the edge that authenticates with
// the demo key in x-api-key (how Anthropic clients send keys; the edge also
// accepts it as a Bearer token). Environment credentials are ignored.
func (s *stack) anthropic(opts ...aoption.RequestOption) *anthropic.Client {
	base := []aoption.RequestOption{
		aoption.WithoutEnvironmentDefaults(),
		aoption.WithBaseURL("http://" + s.httpAddr + "/"),
		aoption.WithHeader("x-api-key", demoKey),
		aoption.WithHTTPClient(s.hc),
		aoption.WithMaxRetries(0),
	}
	c := anthropic.NewClient(append(base, opts...)...)
	return &c
}

// statusDoc is the admin /status document (SPEC N3, A2).
type statusDoc struct {
	Nodes []struct {
		ID         string `json:"id"`
		Connected  bool   `json:"connected"`
		ReadySince string `json:"ready_since"`
		Providers  []struct {
			ProviderID string `json:"provider_id"`
			Status     string `json:"status"`
			InFlight   int    `json:"in_flight"`
		} `json:"providers"`
	} `json:"nodes"`
}

// status fetches /status.
func (s *stack) status(ctx context.Context) (statusDoc, error) {
	var doc statusDoc
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.adminAddr+"/status", nil)
	if err != nil {
		return doc, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return doc, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return doc, err
	}
	if resp.StatusCode != http.StatusOK {
		return doc, fmt.Errorf("GET /status: %s: %s", resp.Status, body)
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return doc, fmt.Errorf("GET /status: %w: %s", err, body)
	}
	return doc, nil
}

// nodeConnected reports gpu-1's "connected" in a /status document.
func (d statusDoc) nodeConnected() bool {
	for _, n := range d.Nodes {
		if n.ID == nodeID {
			return n.Connected
		}
	}
	return false
}

// inFlight sums in_flight over gpu-1's providers.
func (d statusDoc) inFlight() int {
	sum := 0
	for _, n := range d.Nodes {
		if n.ID == nodeID {
			for _, p := range n.Providers {
				sum += p.InFlight
			}
		}
	}
	return sum
}

// waitStatus polls /status until cond holds or d passes; it fails t then.
func (s *stack) waitStatus(what string, d time.Duration, cond func(statusDoc) bool) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last string
	for {
		doc, err := s.status(ctx)
		if err == nil && cond(doc) {
			return
		}
		if err != nil {
			last = err.Error()
		} else {
			b, _ := json.Marshal(doc)
			last = string(b)
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("%s: not reached within %v; last /status: %s", what, d, last)
		case <-time.After(50 * time.Millisecond): // poll interval
		}
	}
}

// waitConnected waits until /status shows gpu-1 connected (or not).
func (s *stack) waitConnected(want bool, d time.Duration) {
	s.t.Helper()
	s.waitStatus(fmt.Sprintf("node %s connected=%t", nodeID, want), d,
		func(doc statusDoc) bool { return doc.nodeConnected() == want })
}

// waitHTTP polls url until it answers 2xx or d passes.
func (s *stack) waitHTTP(url string, d time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for {
		resp, err := s.hc.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s did not answer 2xx within %v (last error %v)", url, d, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval while a process starts
	}
}

// compatURLs are the OpenAI-compatible servers of the plain, the tool and
// the loop model (one server for all, or one per model as llama-server runs
// them).
type compatURLs struct{ plain, tool, loop string }

// edgeConfig builds the edge config the way scripts/demo.sh writes it: the
// adapters ollama (native) and oa (openai_compat), plus oa-tool / oa-loop
// when the tool / loop model has a server of its own, and the six groups.
func edgeConfig(httpAddr, adminAddr, nodeAddr, ollamaURL string, oaURLs compatURLs, profile string, env suiteEnv) map[string]any {
	sum := sha256.Sum256([]byte(demoKey))
	var adapters []any
	if ollamaURL != "" {
		adapters = append(adapters, map[string]any{"name": "ollama", "type": "ollama", "capacity": 8, "long_capacity": 2, "base_url": ollamaURL})
	}
	compat := func(name, url string) string {
		adapters = append(adapters, map[string]any{"name": name, "type": "openai_compat", "profile": profile,
			"capacity": 8, "long_capacity": 2, "base_url": url})
		return name
	}
	oa, oaTool, oaLoop := compat("oa", oaURLs.plain), "oa", "oa"
	if oaURLs.tool != oaURLs.plain {
		oaTool = compat("oa-tool", oaURLs.tool)
	}
	if oaURLs.loop != oaURLs.plain {
		oaLoop = compat("oa-loop", oaURLs.loop)
	}
	native, nativeTool, nativeLoop := "ollama", "ollama", "ollama"
	if ollamaURL == "" { // no native Ollama: every group uses the OpenAI-compatible providers
		native, nativeTool, nativeLoop = oa, oaTool, oaLoop
	}
	group := func(name, provider, target string) any {
		return map[string]any{"name": name, "providers": []any{map[string]any{"node": nodeID, "provider": provider, "target": target}}}
	}
	return map[string]any{
		"http_listen":  httpAddr,
		"node_listen":  nodeAddr,
		"admin_listen": adminAddr,
		"tls": map[string]any{"cert_file": "pki/" + edgeName + ".crt", "key_file": "pki/" + edgeName + ".key",
			"ca_file": "pki/ca.crt", "trust_domain": "iop.local"},
		"heartbeat": map[string]any{"interval_ms": 5000, "timeout_ms": heartbeatTimeout.Milliseconds()},
		"api_keys":  []any{map[string]any{"principal": "demo", "key_sha256": hex.EncodeToString(sum[:])}},
		"nodes":     []any{map[string]any{"id": nodeID, "adapters": adapters}},
		"models": []any{
			group("tiny", native, env.target),
			group("tiny-tool", nativeTool, env.toolTarget),
			group("tiny-loop", nativeLoop, env.loopTarget),
			group("tiny-oa", oa, env.target),
			group("tiny-tool-oa", oaTool, env.toolTarget),
			group("tiny-loop-oa", oaLoop, env.loopTarget),
		},
	}
}

// nodeConfig is testdata/demo/node.json with the edge address filled in:
// reconnect every 1 s, forever (S2 max_attempts 0).
func nodeConfig(edgeAddr string) map[string]any {
	return map[string]any{
		"node_id":   nodeID,
		"edge_addr": edgeAddr,
		"tls": map[string]any{"cert_file": "pki/" + nodeID + ".crt", "key_file": "pki/" + nodeID + ".key",
			"ca_file": "pki/ca.crt", "expected_edge_name": edgeName},
		"reconnect": map[string]any{"interval_sec": 1, "max_attempts": 0},
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// runOnce runs a short command to completion and returns its output.
func runOnce(bin string, args ...string) (string, error) {
	p, err := startProc(filepath.Base(bin), bin, args...)
	if err != nil {
		return "", err
	}
	code, err := p.wait(30 * time.Second)
	if err != nil {
		p.signal(syscall.SIGKILL)
		<-p.done
		return p.log.tail(20), err
	}
	if code != 0 {
		return p.log.tail(20), fmt.Errorf("exit code %d", code)
	}
	return p.log.tail(20), nil
}

// freePorts reserves n distinct loopback ports and releases them for the
// processes to bind (the kernel does not hand them out again at once).
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var lns []net.Listener
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return addrs
}

// checkGoroutines registers a cleanup (run after all later ones) that fails t
// if more goroutines are alive than when it was called, retrying until a
// deadline so goroutines that are on their way out may finish.
func checkGoroutines(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutine leak: %d goroutines, want ≤ %d\n%s", n, before, buf)
				return
			}
			time.Sleep(20 * time.Millisecond) // no event marks a goroutine's exit
		}
	})
}

// short trims s for messages.
func short(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return strings.TrimSpace(s)
}
