package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/proctest"
)

// daemonConfig is an open-mode edge config on fresh loopback ports with
// the development PKI in dir; adminListen replaces the admin address.
func daemonConfig(t *testing.T, dir, adminListen string) *config.Config {
	t.Helper()
	f := func(name string) string { return strings.ReplaceAll(filepath.Join(dir, name), `\`, `\\`) }
	cfg, err := config.Parse([]byte(fmt.Sprintf(`{
  "http_listen": "127.0.0.1:0", "node_listen": "127.0.0.1:0", "admin_listen": %q,
  "tls": {"cert_file": %q, "key_file": %q, "ca_file": %q},
  "nodes": [{"id": "gpu-1", "adapters": [{"type": "ollama", "base_url": "http://127.0.0.1:1"}]}],
  "models": [{"name": "tiny", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"}]}]
}`, adminListen, f(identity.CertFileName("edge-1")), f(identity.KeyFileName("edge-1")), f(identity.CACertFile))))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newDaemonPKI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// M2 (no goroutine outlives its owner), N2 (a reload reaches the running
// edge): Serve starts its goroutines, serves HTTP and admin, applies a
// reload, and once ctx is done returns nil with every goroutine it
// started (background loops, servers, the transport) ended.
func TestServeLeavesNoGoroutine(t *testing.T) {
	leakcheck.Check(t)
	dir := newDaemonPKI(t)
	logs := &proctest.Log{}
	reload := make(chan *config.Config)
	started := make(chan Addrs, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, daemonConfig(t, dir, "127.0.0.1:0"), Options{Logger: slog.New(slog.NewJSONHandler(logs, nil)),
			Reload: reload, ShutdownGrace: 100 * time.Millisecond, Started: func(a Addrs) { started <- a }})
	}()
	var a Addrs
	select {
	case a = <-started:
	case err := <-done:
		t.Fatalf("Serve returned before serving: %v", err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for _, u := range []string{"http://" + a.HTTP.String() + "/v1/models", "http://" + a.Admin.String() + "/healthz"} {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		resp.Body.Close()
	}
	reload <- daemonConfig(t, dir, "127.0.0.1:0")
	if !logs.WaitFor(`"msg":"config reloaded"`, 10*time.Second) {
		t.Fatalf("no config reloaded line; log:\n%s", logs.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return within 15 s of cancel")
	}
	if !strings.Contains(logs.String(), `"msg":"edge stopped"`) {
		t.Errorf("no edge stopped line; log:\n%s", logs.String())
	}
}

// M2: a build that fails (here the admin listener) starts no goroutine and
// closes the listeners it was given, naming the listener that failed.
func TestServeBuildFailureLeavesNothing(t *testing.T) {
	leakcheck.Check(t)
	dir := newDaemonPKI(t)
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer httpLn.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0") // the admin address, already taken
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	err = Serve(context.Background(), daemonConfig(t, dir, busy.Addr().String()), Options{HTTPListener: httpLn})
	if err == nil || !strings.HasPrefix(err.Error(), "admin_listen: ") {
		t.Fatalf("Serve: %v, want an admin_listen error", err)
	}
	if _, err := httpLn.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the given HTTP listener is still open (Accept: %v)", err)
	}
}
