package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/node/config"
	"iop/internal/node/session"
	"iop/internal/node/supervisor"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

const waitFor = 5 * time.Second

func newPKI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
		t.Fatalf("InitPKI: %v", err)
	}
	return dir
}

// nodeConfig is a node config for gpu-1 with the PKI in dir.
func nodeConfig(t *testing.T, dir, addr string, interval, maxAttempts int) *config.Config {
	t.Helper()
	js := fmt.Sprintf(`{"node_id":"gpu-1","edge_addr":%q,
		"tls":{"cert_file":%q,"key_file":%q,"ca_file":%q,"expected_edge_name":"edge-1"},
		"reconnect":{"interval_sec":%d,"max_attempts":%d}}`,
		addr, filepath.Join(dir, "gpu-1.crt"), filepath.Join(dir, "gpu-1.key"), filepath.Join(dir, "ca.crt"), interval, maxAttempts)
	cfg, err := config.Parse([]byte(js))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// closingListener accepts connections, counts them and closes them at once:
// every attempt fails in the TLS handshake.
type closingListener struct {
	ln      net.Listener
	accepts atomic.Int32
	first   chan struct{}
	done    chan struct{}
}

func listenAndClose(t *testing.T) *closingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &closingListener{ln: ln, first: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if l.accepts.Add(1) == 1 {
				close(l.first)
			}
			c.Close()
		}
	}()
	t.Cleanup(l.stop)
	return l
}

// stop closes the listener and waits for the accept loop, so accepts is final.
func (l *closingListener) stop() {
	l.ln.Close()
	<-l.done
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// S2, S3: finite exhaustion counts exactly max_attempts dials.
func TestRunExhausted(t *testing.T) {
	leakcheck.Check(t)
	dir := newPKI(t)
	l := listenAndClose(t)
	cfg := nodeConfig(t, dir, l.ln.Addr().String(), 0, 2)
	err := Run(context.Background(), cfg, Options{Logger: testLogger(t)})
	if !errors.Is(err, supervisor.ErrExhausted) || !errors.Is(err, session.ErrHandshake) {
		t.Fatalf("Run = %v, want ErrExhausted after handshake failures", err)
	}
	l.stop()
	if n := l.accepts.Load(); n != 2 {
		t.Errorf("S2: %d dials, want exactly 2", n)
	}
}

// S3: local credential errors are fatal at once, with no dial.
func TestRunFatalCredentials(t *testing.T) {
	tests := []struct {
		name     string
		breakCfg func(t *testing.T, cfg *config.Config)
	}{
		{"S3 key file missing", func(t *testing.T, cfg *config.Config) {
			cfg.TLS.KeyFile = filepath.Join(t.TempDir(), "missing.key")
		}},
		{"S3 key file is not a key", func(t *testing.T, cfg *config.Config) {
			p := filepath.Join(t.TempDir(), "bad.key")
			if err := os.WriteFile(p, []byte("not a PEM key"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg.TLS.KeyFile = p
		}},
		{"S3 key file is a directory", func(t *testing.T, cfg *config.Config) {
			cfg.TLS.KeyFile = t.TempDir()
		}},
		{"S3 CA file missing", func(t *testing.T, cfg *config.Config) {
			cfg.TLS.CAFile = filepath.Join(t.TempDir(), "missing-ca.crt")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			dir := newPKI(t)
			l := listenAndClose(t)
			cfg := nodeConfig(t, dir, l.ln.Addr().String(), 10, 0) // unlimited: only fatal can stop it
			tc.breakCfg(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			err := Run(ctx, cfg, Options{Logger: testLogger(t)})
			var fe *identity.FileError
			if !errors.Is(err, supervisor.ErrFatal) || !errors.As(err, &fe) {
				t.Fatalf("Run = %v, want a fatal *identity.FileError", err)
			}
			l.stop()
			if n := l.accepts.Load(); n != 0 {
				t.Errorf("S3: %d dials, want 0", n)
			}
		})
	}
}

// S4: SIGTERM (ctx done) mid-backoff in unlimited mode returns nil at once.
func TestRunShutdownMidBackoff(t *testing.T) {
	leakcheck.Check(t)
	dir := newPKI(t)
	l := listenAndClose(t)
	cfg := nodeConfig(t, dir, l.ln.Addr().String(), 3600, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: testLogger(t)}) }()
	select {
	case <-l.first:
	case <-time.After(waitFor):
		t.Fatal("no dial")
	}
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("S4: returned %v after shutdown, want < 1 s", d)
		}
	case <-time.After(waitFor):
		t.Fatal("S4: Run did not return after shutdown")
	}
}

// S1, L5: Run reaches ready against a minimal edge over real TLS, with the
// node's name checked by the edge, and serves a command.
func TestRunReachesReady(t *testing.T) {
	leakcheck.Check(t)
	dir := newPKI(t)
	scfg, err := identity.ServerConfig(identity.ServerOptions{
		CertFile: filepath.Join(dir, "edge-1.crt"), KeyFile: filepath.Join(dir, "edge-1.key"), CAFile: filepath.Join(dir, "ca.crt"),
		EdgeName: "edge-1", AllowNode: func(n string) bool { return n == "gpu-1" },
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := nodeConfig(t, dir, ln.Addr().String(), 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: testLogger(t)}) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil after shutdown", err)
			}
		case <-time.After(waitFor):
			t.Error("Run did not return after shutdown")
		}
	}()

	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	r, w := wire.NewReader(c, 0), wire.NewWriter(c, 0)
	recv := func() *iop.Envelope {
		t.Helper()
		for {
			env := new(iop.Envelope)
			if err := r.ReadEnvelope(env); err != nil {
				t.Fatalf("edge read: %v", err)
			}
			if env.GetPing() == nil {
				return env
			}
		}
	}
	send := func(env *iop.Envelope) {
		t.Helper()
		if err := w.WriteEnvelope(env); err != nil {
			t.Fatalf("edge write: %v", err)
		}
	}
	if env := recv(); env.GetRegisterRequest().GetNodeId() != "gpu-1" {
		t.Fatalf("got %v, want RegisterRequest{gpu-1}", env)
	}
	if id, err := identity.PeerID(c.(*tls.Conn).ConnectionState()); err != nil || id.Name != "gpu-1" {
		t.Fatalf("I3: peer %v (%v), want node gpu-1", id, err)
	}
	send(&iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: &iop.NodeConfigPayload{Revision: "r1"}}}})
	if env := recv(); env.GetReadyRequest().GetNodeId() != "gpu-1" {
		t.Fatalf("got %v, want NodeReadyRequest{gpu-1}", env)
	}
	send(&iop.Envelope{Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Ready: true}}})
	send(&iop.Envelope{RequestId: "q1", Kind: &iop.Envelope_CommandRequest{CommandRequest: &iop.NodeCommandRequest{Type: iop.NodeCommandType_NODE_COMMAND_TRANSPORT}}})
	env := recv()
	if env.GetRequestId() != "q1" || env.GetCommandResponse().GetResult()["config_revision"] != "r1" {
		t.Fatalf("got %v, want the TRANSPORT response for q1", env)
	}
}

// N2: a payload the node could run only after a restart — lease keys it
// lacks, an api_key_env it does not offer or does not have — is refused
// with session.ErrRestartRequired (a refresh answers RESTART_REQUIRED); a
// payload that is wrong in itself is not (FAILED).
func TestExecutorRestartRequired(t *testing.T) {
	env := map[string]string{"IOP_KEY_A": "sk"}
	o := Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	allow := func(k string) bool { return strings.HasPrefix(k, "IOP_KEY_") }
	backends := map[string]adapter.ManagedBackend{"llama": nil}
	newExec := adapterExecutor(o, slog.New(slog.DiscardHandler), "gpu-1", nil, allow, adapter.NewCapacity(), config.Edge{Name: "edge-1", Addr: "127.0.0.1:7443"}, backends, adapter.NewSignal(), nil)
	compat := func(managed string) *iop.AdapterConfig {
		return &iop.AdapterConfig{Name: "l", Type: "openai_compat", BaseUrl: "http://127.0.0.1:1", Capacity: 1, Managed: managed,
			OpenaiCompat: &iop.OpenAICompatAdapterConfig{ProtocolProfile: &iop.ConcreteProtocolProfile{Name: "llamacpp", ChatCompletionsPath: "/v1/chat/completions"}}}
	}
	ollama := func(envName string) *iop.AdapterConfig {
		return &iop.AdapterConfig{Name: "o", Type: "ollama", BaseUrl: "http://127.0.0.1:1", Capacity: 1, ApiKeyEnv: envName}
	}
	rows := []struct {
		name    string
		payload *iop.NodeConfigPayload
		restart bool
		ok      bool
	}{
		{"N2 applies", &iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ollama("IOP_KEY_A")}}, false, true},
		{"N2 restart: credential plane on, node has no lease keys",
			&iop.NodeConfigPayload{Runtime: &iop.NodeRuntimeConfig{CredentialsEnabled: true}}, true, false},
		{"N2 restart: api_key_env not offered", &iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ollama("OTHER")}}, true, false},
		{"N2 restart: api_key_env offered but unset", &iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ollama("IOP_KEY_B")}}, true, false},
		{"N2 failed: unknown adapter type", &iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{{Name: "x", Type: "vllm"}}}, false, false},
		// U1: an edge can name only a managed backend the node's config declares.
		{"U1 restart: managed backend not declared by the node", &iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{compat("/bin/sh")}}, true, false},
		{"U1 failed: managed on an ollama adapter", &iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{{Name: "o", Type: "ollama", BaseUrl: "http://127.0.0.1:1", Managed: "llama"}}}, false, false},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			ex, err := newExec(r.payload)
			if ex != nil {
				ex.Close()
			}
			if (err == nil) != r.ok || errors.Is(err, session.ErrRestartRequired) != r.restart {
				t.Fatalf("err = %v, want ok=%v restart=%v", err, r.ok, r.restart)
			}
		})
	}
}
