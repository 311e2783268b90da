package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/node"
	nodeconfig "iop/internal/node/config"
	"iop/internal/protocol"
)

// edgeName is the Edge's certificate name; nodes expect it (SPEC I2).
const edgeName = "edge-1"

// answer is the demo backend's tiny reply (internal/demo/backend doc).
const answer = "Hello from tiny-gguf! This reply is deterministic."

// eventually polls cond every 5 ms until it holds or timeout passes, then
// fails t with what and cond's last explanation.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// poll is eventually without a testing.TB: nil once cond holds, else an
// error with cond's last explanation after timeout.
func poll(timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not true after %v: %s", timeout, why)
		}
		<-tick.C
	}
}

// recorder collects values from any goroutine and lets a test wait for a
// condition on them without sleeping.
type recorder[T any] struct {
	mu      sync.Mutex
	items   []T
	changed chan struct{} // closed and replaced on every add
}

func newRecorder[T any]() *recorder[T] { return &recorder[T]{changed: make(chan struct{})} }

func (r *recorder[T]) add(v T) {
	r.mu.Lock()
	r.items = append(r.items, v)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder[T]) snapshot() ([]T, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.items...), r.changed
}

// waitFor returns the items as soon as pred holds on them, or an error after
// timeout.
func (r *recorder[T]) waitFor(timeout time.Duration, pred func([]T) bool) ([]T, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		items, ch := r.snapshot()
		if pred(items) {
			return items, nil
		}
		select {
		case <-ch:
		case <-t.C:
			return items, fmt.Errorf("condition not met after %v (%d items)", timeout, len(items))
		}
	}
}

// logSink is an slog.Handler target shared by the Edge and Nodes of one
// test: it keeps the last lines for a failure report and counts messages.
type logSink struct {
	start time.Time
	level slog.Level
	mu    sync.Mutex
	lines []string
	count map[string]int
	recs  *recorder[string] // every line, in order
}

// newLogSink returns a sink whose last 80 lines are printed when t fails.
func newLogSink(t testing.TB) *logSink {
	s := &logSink{start: time.Now(), level: slog.LevelInfo, count: map[string]int{}, recs: newRecorder[string]()}
	t.Cleanup(func() {
		if t.Failed() {
			s.mu.Lock()
			lines := s.lines
			if len(lines) > 80 {
				lines = lines[len(lines)-80:]
			}
			t.Logf("last log lines:\n%s", strings.Join(lines, "\n"))
			s.mu.Unlock()
		}
	})
	return s
}

func (s *logSink) logger(component string) *slog.Logger {
	return slog.New(&sinkHandler{s: s, prefix: component})
}

// messages returns how many records had message msg.
func (s *logSink) messages(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count[msg]
}

type sinkHandler struct {
	s      *logSink
	prefix string
	attrs  string
}

func (h *sinkHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.s.level }

func (h *sinkHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%8.3fs %s %-5s %s%s", time.Since(h.s.start).Seconds(), h.prefix, r.Level, r.Message, h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	s := h.s
	s.mu.Lock()
	s.lines = append(s.lines, b.String())
	if len(s.lines) > 400 {
		s.lines = append(s.lines[:0:0], s.lines[200:]...)
	}
	s.count[r.Message]++
	s.mu.Unlock()
	s.recs.add(b.String())
	return nil
}

func (h *sinkHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range as {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	return &sinkHandler{s: h.s, prefix: h.prefix, attrs: b.String()}
}

func (h *sinkHandler) WithGroup(string) slog.Handler { return h }

// pkiDir holds a CA, the Edge's and the nodes' certificates (identity.InitPKI).
type pkiDir string

func newPKI(t testing.TB, nodes ...string) pkiDir {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: edgeName, Nodes: nodes}); err != nil {
		t.Fatalf("InitPKI: %v", err)
	}
	return pkiDir(dir)
}

func (p pkiDir) file(name string) string { return string(p) + "/" + name }

func ollamaAdapter(name, baseURL string, capacity int) config.Adapter {
	return config.Adapter{Name: name, Type: protocol.TypeOllama, Capacity: capacity, BaseURL: baseURL}
}

func compatAdapter(name, baseURL string, capacity int) config.Adapter {
	return config.Adapter{Name: name, Type: protocol.TypeOpenAICompat, Profile: protocol.ProfileLlamaCpp, Capacity: capacity, BaseURL: baseURL}
}

func modelGroup(name string, providers ...config.ModelProvider) config.Model {
	return config.Model{Name: name, Providers: providers}
}

func provider(nodeID, adapter, target string) config.ModelProvider {
	return config.ModelProvider{Node: nodeID, Provider: adapter, Target: target}
}

// edgeConfig builds the Edge config as JSON and parses it with
// config.Parse (defaults and validation included). tweak, if set, edits
// the value before it is encoded.
func edgeConfig(t testing.TB, p pkiDir, nodes []config.Node, models []config.Model, tweak func(*config.Config)) *config.Config {
	t.Helper()
	c := config.Config{
		HTTPListen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		TLS:   config.TLS{CertFile: p.file(identity.CertFileName(edgeName)), KeyFile: p.file(identity.KeyFileName(edgeName)), CAFile: p.file(identity.CACertFile)},
		Nodes: nodes, Models: models,
	}
	if tweak != nil {
		tweak(&c)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("encode edge config: %v", err)
	}
	cfg, err := config.Parse(b)
	if err != nil {
		t.Fatalf("edge config: %v\n%s", err, b)
	}
	return cfg
}

// edgeProc is one running edge.Serve.
type edgeProc struct {
	cfg               *config.Config
	httpURL, adminURL string
	nodeAddr          string
	cancel            context.CancelFunc
	done              chan error
	stopOnce          sync.Once
	stopErr           error
}

// startEdge runs the Edge on fresh 127.0.0.1 listeners (nodeLn, when set,
// is the node listener) and returns once every listener serves. It is
// stopped at cleanup. tune, when given, adjusts the edge.Options first.
func startEdge(t testing.TB, cfg *config.Config, nodeLn net.Listener, log *slog.Logger, tune ...func(*edge.Options)) *edgeProc {
	t.Helper()
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		return ln
	}
	if nodeLn == nil {
		nodeLn = listen()
	}
	httpLn, adminLn := listen(), listen()
	ctx, cancel := context.WithCancel(context.Background())
	e := &edgeProc{cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	started := make(chan edge.Addrs, 1)
	o := edge.Options{
		Logger: log, Version: "e2e",
		HTTPListener: httpLn, NodeListener: nodeLn, AdminListener: adminLn,
		Started:       func(a edge.Addrs) { started <- a },
		ShutdownGrace: 2 * time.Second,
	}
	for _, f := range tune {
		f(&o)
	}
	go func() { e.done <- edge.Serve(ctx, cfg, o) }()
	select {
	case a := <-started:
		e.httpURL, e.adminURL, e.nodeAddr = "http://"+a.HTTP.String(), "http://"+a.Admin.String(), a.Node.String()
	case err := <-e.done:
		cancel()
		t.Fatalf("edge.Serve returned before serving: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("edge did not start serving within 10 s")
	}
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Errorf("edge stop: %v", err)
		}
	})
	return e
}

// stop cancels the Edge and waits (≤ 15 s) for Run to return; idempotent.
func (e *edgeProc) stop() error {
	e.stopOnce.Do(func() {
		e.cancel()
		select {
		case err := <-e.done:
			e.stopErr = err
		case <-time.After(15 * time.Second):
			e.stopErr = errors.New("edge.Serve did not return within 15 s of cancel")
		}
	})
	return e.stopErr
}

// nodeProc is one running node.Run.
type nodeProc struct {
	id       string
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
	stopErr  error
}

// nodeOpts tune startNode; zero values: reconnect every 1 s without limit.
type nodeOpts struct {
	intervalSec *int
	maxAttempts int
	client      *http.Client // upstream client; nil = a fresh one closed at cleanup
	log         *slog.Logger
	// drainMs is the node's shutdown.drain_timeout_ms; 0 = its default.
	// A test that "kills" a node mid-stream sets 1: stop then cancels the
	// work at once.
	drainMs int
}

// startReady starts an edge for cfg and node gpu-1 against it, and waits
// until the node is connected: the stack most tests begin with.
func startReady(t testing.TB, p pkiDir, cfg *config.Config, logs *logSink, tune ...func(*edge.Options)) (*edgeProc, *adminClient, *apiClient) {
	t.Helper()
	e := startEdge(t, cfg, nil, logs.logger("edge"), tune...)
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	startNode(t, p, "gpu-1", e.nodeAddr, nodeOpts{log: logs.logger("node")})
	adm.waitConnected(t, 10*time.Second, "gpu-1")
	return e, adm, api
}

// startNode runs node id against edgeAddr; it is stopped at cleanup.
func startNode(t testing.TB, p pkiDir, id, edgeAddr string, o nodeOpts) *nodeProc {
	t.Helper()
	n := startNodeNoCleanup(t, p, id, edgeAddr, o)
	t.Cleanup(func() {
		if err := n.stop(); err != nil {
			t.Errorf("node %s: %v", id, err)
		}
	})
	return n
}

func startNodeNoCleanup(t testing.TB, p pkiDir, id, edgeAddr string, o nodeOpts) *nodeProc {
	t.Helper()
	interval := 1
	if o.intervalSec != nil {
		interval = *o.intervalSec
	}
	cfg, err := nodeConfigFor(p, id, edgeAddr, interval, o.maxAttempts)
	if err == nil && o.drainMs > 0 {
		cfg.Shutdown.DrainTimeoutMs = int64(o.drainMs)
	}
	if err != nil {
		t.Fatal(err)
	}
	// nil: the node's own upstream client, as the binary runs it.
	return launchNode(cfg, o.client, o.log)
}

// nodeConfigFor builds node id's config as JSON and parses it with
// nodeconfig.Parse.
func nodeConfigFor(p pkiDir, id, edgeAddr string, intervalSec, maxAttempts int) (*nodeconfig.Config, error) {
	raw, err := json.Marshal(map[string]any{
		"node_id":   id,
		"edge_addr": edgeAddr,
		"tls": map[string]string{
			"cert_file": p.file(identity.CertFileName(id)), "key_file": p.file(identity.KeyFileName(id)),
			"ca_file": p.file(identity.CACertFile), "expected_edge_name": edgeName,
		},
		"reconnect": map[string]int{"interval_sec": intervalSec, "max_attempts": maxAttempts},
	})
	if err != nil {
		return nil, fmt.Errorf("encode node config: %w", err)
	}
	cfg, err := nodeconfig.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("node config: %w\n%s", err, raw)
	}
	return cfg, nil
}

// launchNode runs node.Run for cfg on a new goroutine.
func launchNode(cfg *nodeconfig.Config, hc *http.Client, log *slog.Logger) *nodeProc {
	ctx, cancel := context.WithCancel(context.Background())
	n := &nodeProc{id: cfg.NodeID, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- node.Run(ctx, cfg, node.Options{Logger: log, Version: "e2e", HTTPClient: hc}) }()
	return n
}

// stop cancels the node and waits (≤ 10 s) for Run to return nil; idempotent.
func (n *nodeProc) stop() error {
	n.stopOnce.Do(func() {
		n.cancel()
		select {
		case err := <-n.done:
			if err != nil {
				n.stopErr = fmt.Errorf("node.Run after cancel: %w", err)
			}
		case <-time.After(10 * time.Second):
			n.stopErr = errors.New("node.Run did not return within 10 s of cancel")
		}
	})
	return n.stopErr
}

// newHTTPClient returns a client with its own transport whose idle
// connections are closed at cleanup (so its goroutines end).
func newHTTPClient(t testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 1024, DisableCompression: true,
		IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// backendProc is the demo backend behind one or more httptest servers.
type backendProc struct {
	b    *backend.Backend
	ends *recorder[backend.RequestEnd]
}

// startBackend builds a demo backend; opts.OnRequestEnd is replaced by the
// recorder.
func startBackend(t testing.TB, opts backend.Options) *backendProc {
	t.Helper()
	bp := &backendProc{ends: newRecorder[backend.RequestEnd]()}
	opts.OnRequestEnd = bp.ends.add
	b, err := backend.New(opts)
	if err != nil {
		t.Fatalf("backend.New: %v", err)
	}
	bp.b = b
	return bp
}

// serve starts an httptest server for h (the backend itself when nil) and
// returns its base URL; the server is closed at cleanup.
func (bp *backendProc) serve(t testing.TB, h http.Handler) string {
	if h == nil {
		h = bp.b
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// waitEnd waits for a request end matching pred.
func (bp *backendProc) waitEnd(t testing.TB, timeout time.Duration, what string, pred func(backend.RequestEnd) bool) backend.RequestEnd {
	t.Helper()
	var got backend.RequestEnd
	items, err := bp.ends.waitFor(timeout, func(es []backend.RequestEnd) bool {
		for _, e := range es {
			if pred(e) {
				got = e
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("%s: %v; ends so far: %+v", what, err, items)
	}
	return got
}
