package node

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/node/config"
	"iop/internal/node/managed"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// The test binary doubles as a managed model server
// (IOP_NODE_HELPER=serve): it writes its argv and environment to -record,
// then serves /health and an OpenAI chat answer on -port.
func TestMain(m *testing.M) {
	if os.Getenv("IOP_NODE_HELPER") == "serve" {
		os.Exit(helperServe(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func helperServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	record := fs.String("record", "", "")
	port := fs.Int("port", 0, "")
	fs.String("model", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rec, _ := json.Marshal(map[string][]string{"argv": os.Args, "env": os.Environ()})
	if err := os.WriteFile(*record, rec, 0o600); err != nil {
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, `{"status":"ok"}`) })
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(*port))
	if err != nil {
		return 1
	}
	_ = http.Serve(ln, mux)
	return 0
}

// U1 (an attacker's view: a compromised or lying edge): nothing an edge
// sends makes a node run a program, choose its arguments or its
// environment, or open a file. A payload can only name a managed backend
// the node declares, on an openai_compat adapter; a request's target can
// only pick one of that backend's models — a path, a flag, shell syntax, a
// placeholder, a NUL, another case, a tag, an over-long name, an empty one
// start nothing, by tunnel, run, probe or listing; the one real model
// starts exactly the node's command line, with the node's environment
// allow-list (a secret in the node's environment stays there), whatever
// base_url, path and headers the edge sent.
func TestEdgeCannotMakeTheNodeRunAProgram(t *testing.T) {
	leakcheck.Check(t)
	t.Setenv("IOP_TEST_UPSTREAM_SECRET", "sk-never-in-a-child")
	dir := t.TempDir()
	record := filepath.Join(dir, "argv.json")
	model := filepath.Join(dir, "tiny.gguf")
	if err := os.WriteFile(model, []byte("GGUF"), 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	command := []string{self, "-record", record, "-port", "{port}", "-model", "{model}"}
	b, err := managed.New(managed.Config{Name: "llama", Command: command, Models: map[string]string{"tiny": model},
		HealthPath: "/health", ReadyTimeout: 20 * time.Second, IdleUnload: time.Hour, MaxLoaded: 1,
		PortFirst: 21250, PortLast: 21259, HealthPoll: 5 * time.Millisecond, StopGrace: 5 * time.Second,
		Env: map[string]string{"IOP_NODE_HELPER": "serve"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	env := map[string]string{"IOP_TEST_UPSTREAM_SECRET": "sk-never-in-a-child"}
	o := Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	newExec := adapterExecutor(o, slog.New(slog.DiscardHandler), "gpu-1", nil, func(string) bool { return true },
		adapter.NewCapacity(), config.Edge{Name: "edge-1", Addr: "127.0.0.1:7443"}, map[string]adapter.ManagedBackend{"llama": b}, adapter.NewSignal(), nil)
	compat := func(typ, name string) *iop.AdapterConfig {
		return &iop.AdapterConfig{Name: "l", Type: typ, BaseUrl: "http://127.0.0.1:9", Capacity: 4, Managed: name,
			ApiKeyEnv: "IOP_TEST_UPSTREAM_SECRET",
			OpenaiCompat: &iop.OpenAICompatAdapterConfig{ProtocolProfile: &iop.ConcreteProtocolProfile{Name: "llamacpp",
				BaseUrl: "http://127.0.0.1:9", ChatCompletionsPath: "/v1/chat/completions", ModelsPath: "/v1/models", HealthPath: "/health",
				AuthHeader: "Authorization", AuthScheme: "Bearer"}}}
	}
	for _, bad := range []struct{ typ, name string }{
		{protocol.TypeOpenAICompat, "/bin/sh"}, {protocol.TypeOpenAICompat, "../llama"}, {protocol.TypeOpenAICompat, "LLAMA"},
		{protocol.TypeOpenAICompat, "llama\x00"}, {protocol.TypeOllama, "llama"},
	} {
		ex, err := newExec(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{compat(bad.typ, bad.name)}})
		if err == nil {
			ex.Close()
			t.Errorf("U1 a payload naming managed %q on %s was applied", bad.name, bad.typ)
		}
	}
	ex, err := newExec(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{compat(protocol.TypeOpenAICompat, "llama")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ex.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tunnel := func(target, path string) *iop.ProviderTunnelFrame {
		var last *iop.ProviderTunnelFrame
		ex.Tunnel(ctx, "r-"+strconv.Itoa(len(target)), &iop.ProviderTunnelRequest{Adapter: "l", Target: target, Method: "POST",
			Path: path, Operation: protocol.OpChatCompletions, Body: []byte(`{"model":"x","messages":[{"role":"user","content":"hi"}]}`),
			Headers: []*iop.Header{{Name: "X-Cmd", Value: "/bin/sh -c id"}}, TimeoutSec: 20},
			func(f *iop.ProviderTunnelFrame) { last = f })
		return last
	}
	started := func() bool { _, err := os.Stat(record); return err == nil }
	for _, target := range []string{"/bin/sh", "../../../../bin/sh", "tiny/../tiny", "./tiny", "tiny; touch " + filepath.Join(dir, "pwned"),
		"$(id)", "`id`", "{port}", "{model}", "--help", "-m", "tiny\x00", "TINY", "tiny:latest", "tiny.gguf", model,
		strings.Repeat("a", 300), "", "tiny\n-m /etc/passwd"} {
		f := tunnel(target, "/../../bin/sh")
		if f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_END {
			t.Errorf("U1 target %q served", target)
		}
		if got := ex.Probe(ctx, "l", target, nil, nil); got == protocol.HealthAvailable {
			t.Errorf("U1 probe of target %q: %s", target, got)
		}
		ev := &iop.RunEvent{}
		ex.Run(ctx, "run", &iop.RunRequest{Adapter: "l", Target: target, Input: &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "user", Content: "hi"}}}},
			func(e *iop.RunEvent) { ev = e })
		if ev.GetType() == iop.RunEventType_RUN_EVENT_COMPLETE {
			t.Errorf("U1 run of target %q completed", target)
		}
		if started() {
			t.Fatalf("U1 target %q started a process", target)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
		t.Fatal("U1 a target ran a shell")
	}
	if models, err := ex.(*adapter.Set).ListModels(ctx, "l"); err != nil || !slices.Equal(models, []string{"tiny"}) || started() {
		t.Fatalf("U1 listing: %v %v, started %v", models, err, started())
	}

	// The one model the node declares: its own command line, its own
	// environment allow-list.
	if f := tunnel("tiny", "/../../bin/sh"); f.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END {
		t.Fatalf("U1 tiny: %v %s %q", f.GetKind(), f.GetFailureCode(), f.GetError())
	}
	raw, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ Argv, Env []string }
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Argv) != len(command) || rec.Argv[0] != self || rec.Argv[2] != record || rec.Argv[6] != model {
		t.Fatalf("U1 argv %q, want the node's command %q", rec.Argv, command)
	}
	if p, err := strconv.Atoi(rec.Argv[4]); err != nil || p < 21250 || p > 21259 {
		t.Errorf("U1 port %q outside port_range", rec.Argv[4])
	}
	for _, kv := range rec.Env {
		if strings.Contains(kv, "sk-never-in-a-child") || strings.HasPrefix(kv, "IOP_TEST_") {
			t.Errorf("U1 U5 the child inherited %q", kv)
		}
	}
}
