package main

import (
	"fmt"
	"iop/internal/proctest"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func edgeConfig(httpAddr, nodeAddr, adminAddr string) string {
	return fmt.Sprintf(`{"http_listen":%q,"node_listen":%q,"admin_listen":%q,
 "tls":{"cert_file":"pki/edge-1.crt","key_file":"pki/edge-1.key","ca_file":"pki/ca.crt"},
 "nodes":[{"id":"gpu-1","adapters":[{"type":"ollama","base_url":"http://127.0.0.1:1"}]}],
 "models":[{"name":"tiny","providers":[{"node":"gpu-1","provider":"ollama","target":"tiny"}]}]}`, httpAddr, nodeAddr, adminAddr)
}

// The built edge binary: pki, -check, -version, serve, SIGHUP reload and a
// SIGTERM drain with exit 0.
func TestEdgeBinary(t *testing.T) {
	bin := proctest.Build(t, "edge")
	dir := t.TempDir()
	out, err := exec.Command(bin, "pki", "init", "-dir", filepath.Join(dir, "pki"), "-edge", "edge-1", "-node", "gpu-1").CombinedOutput()
	if err != nil {
		t.Fatalf("pki init: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "PRIVATE KEY") {
		t.Fatalf("pki init printed private key material:\n%s", out)
	}
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	cfg := filepath.Join(dir, "edge.json")
	os.WriteFile(cfg, []byte(edgeConfig(httpAddr, freeAddr(t), adminAddr)), 0o600)

	if out, err := exec.Command(bin, "-config", cfg, "-check").CombinedOutput(); err != nil {
		t.Fatalf("-check: %v\n%s", err, out)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"nodes":[{"id":"gpu-1","adapters":[{"type":"ollama","capacty":2,"base_url":"http://x"}]}]}`), 0o600)
	out, err = exec.Command(bin, "-config", bad, "-check").CombinedOutput()
	if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "nodes[0].adapters[0].capacty: unknown field") || !strings.Contains(string(out), "models: at least one model") {
		t.Errorf("-check bad: exit %d, want 1 naming every problem:\n%s", proctest.ExitCode(err), out)
	}
	nocert := filepath.Join(dir, "nocert.json")
	os.WriteFile(nocert, []byte(strings.Replace(edgeConfig(freeAddr(t), freeAddr(t), freeAddr(t)), "pki/edge-1.crt", "pki/gpu-1.crt", 1)), 0o600)
	out, err = exec.Command(bin, "-config", nocert, "-check").CombinedOutput()
	if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "edge tls") {
		t.Errorf("-check with a node certificate as the edge's: exit %d, want 1:\n%s", proctest.ExitCode(err), out)
	}
	// P4: pprof on an admin listener open beyond loopback without a token
	// is refused by -check; such a listener without pprof is a warning.
	wide := filepath.Join(dir, "wide.json")
	os.WriteFile(wide, []byte(strings.Replace(edgeConfig(freeAddr(t), freeAddr(t), "0.0.0.0:0"), `"tls"`, `"admin":{"pprof":true},"tls"`, 1)), 0o600)
	out, err = exec.Command(bin, "-config", wide, "-check").CombinedOutput()
	if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "admin.pprof") {
		t.Errorf("-check with pprof on 0.0.0.0 and no token: exit %d, want 1 naming admin.pprof:\n%s", proctest.ExitCode(err), out)
	}
	os.WriteFile(wide, []byte(edgeConfig(freeAddr(t), freeAddr(t), "0.0.0.0:0")), 0o600)
	out, err = exec.Command(bin, "-config", wide, "-check").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "warning: admin_listen 0.0.0.0:0 is not loopback-only") {
		t.Errorf("-check with admin on 0.0.0.0 and no token: %v, want ok with a warning:\n%s", err, out)
	}
	// S3: a TLS private key that group or others can read is refused by
	// -check (and at start: the same loader), as the store key is.
	os.Chmod(filepath.Join(dir, "pki", "edge-1.key"), 0o644)
	out, err = exec.Command(bin, "-config", cfg, "-check").CombinedOutput()
	if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "edge-1.key") || !strings.Contains(string(out), "chmod 600") {
		t.Errorf("-check with a 0644 TLS key: exit %d, want 1 naming the file:\n%s", proctest.ExitCode(err), out)
	}
	out, err = exec.Command(bin, "-config", cfg).CombinedOutput()
	if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "edge-1.key") {
		t.Errorf("start with a 0644 TLS key: exit %d, want 1 naming the file:\n%s", proctest.ExitCode(err), out)
	}
	os.Chmod(filepath.Join(dir, "pki", "edge-1.key"), 0o600)
	// `edge version` and -version: version, commit and Go version (a go
	// build: "dev", the VCS stamp or "unknown", runtime.Version()).
	for _, args := range [][]string{{"version"}, {"-version"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "edge dev commit ") || !strings.Contains(string(out), " "+runtime.Version()+" ") {
			t.Errorf("%v: %v %q", args, err, out)
		}
	}

	var stderr proctest.Log
	cmd := exec.Command(bin, "-config", cfg)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if !stderr.WaitFor("edge serving", 10*time.Second) {
		t.Fatalf("edge never served:\n%s", stderr.String())
	}
	resp, err := http.Get("http://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatalf("healthz after \"edge serving\": %v", err)
	}
	resp.Body.Close()
	if !strings.Contains(stderr.String(), "open to anyone") {
		t.Errorf("open mode not warned at startup:\n%s", stderr.String())
	}
	// N2: SIGHUP with a broken file keeps the running config.
	os.WriteFile(cfg, []byte(`{"oops":1}`), 0o600)
	cmd.Process.Signal(syscall.SIGHUP)
	if !stderr.WaitFor("config reload rejected", 10*time.Second) {
		t.Errorf("a reload of a broken file was not reported:\n%s", stderr.String())
	}
	if resp, err := http.Get("http://" + adminAddr + "/status"); err != nil {
		t.Errorf("admin after a rejected reload: %v", err)
	} else {
		resp.Body.Close()
	}
	// A1: the access lines are held in the process (logbuf) and none is
	// lost when it stops: each of these requests' lines is on stderr
	// after the SIGTERM exit.
	const lines = 50
	for i := range lines {
		req, _ := http.NewRequest("POST", "http://"+httpAddr+"/v1/chat/completions", strings.NewReader(`{"model":"nope","messages":[]}`))
		req.Header.Set("X-Request-Id", fmt.Sprintf("held-%02d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if code := proctest.ExitCode(cmd.Wait()); code != 0 {
		t.Errorf("SIGTERM: exit %d, want 0\n%s", code, stderr.String())
	}
	for i := range lines {
		if id := fmt.Sprintf(`"request_id":"held-%02d"`, i); strings.Count(stderr.String(), id) != 1 {
			t.Errorf("A1: %d access lines with %s after a graceful stop, want 1", strings.Count(stderr.String(), id), id)
		}
	}
}
