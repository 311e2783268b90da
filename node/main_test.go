package main

import (
	"bytes"
	"fmt"
	"iop/internal/proctest"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/internal/identity"
)

// countingListener accepts TCP connections and closes them at once, like an
// edge that is down behind a port that still answers; it counts dials.
func countingListener(t *testing.T) (addr string, accepts *atomic.Int32, first <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepts = new(atomic.Int32)
	firstc := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if accepts.Add(1) == 1 {
				close(firstc)
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), accepts, firstc
}

func writeConfig(t *testing.T, dir, edgeAddr, reconnect, keyFile string) string {
	t.Helper()
	cfg := fmt.Sprintf(`{"node_id":"gpu-1","edge_addr":%q,"tls":{"cert_file":"pki/gpu-1.crt","key_file":%q,"ca_file":"pki/ca.crt"},"reconnect":%s}`,
		edgeAddr, keyFile, reconnect)
	p := filepath.Join(dir, "node.json")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func pki(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(filepath.Join(dir, "pki"), identity.PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// S2, S3, S4 on the built binary.
func TestNodeBinary(t *testing.T) {
	bin := proctest.Build(t, "node")

	t.Run("S4 finite attempts exhausted exit 1 after exactly 2 dials", func(t *testing.T) {
		dir := pki(t)
		addr, accepts, _ := countingListener(t)
		cfg := writeConfig(t, dir, addr, `{"max_attempts":2,"interval_sec":0}`, "pki/gpu-1.key")
		var stderr bytes.Buffer
		cmd := exec.Command(bin, "-config", cfg)
		cmd.Stderr = &stderr
		if code := proctest.ExitCode(cmd.Run()); code != 1 {
			t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
		}
		if n := accepts.Load(); n != 2 {
			t.Errorf("S2: %d dials, want exactly 2", n)
		}
	})

	t.Run("S4 unlimited until SIGTERM exit 0 within 1s mid-backoff", func(t *testing.T) {
		dir := pki(t)
		addr, _, first := countingListener(t)
		cfg := writeConfig(t, dir, addr, `{"max_attempts":0,"interval_sec":30}`, "pki/gpu-1.key")
		cmd := exec.Command(bin, "-config", cfg)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-first: // the node dialed once and is now in its 30 s backoff
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("node never dialed; stderr:\n%s", stderr.String())
		}
		start := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		if code := proctest.ExitCode(err); code != 0 {
			t.Fatalf("exit code %d, want 0; stderr:\n%s", code, stderr.String())
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("S4: exited %v after SIGTERM, want ≤ 1s", d)
		}
	})

	t.Run("S3 unreadable key exit 1 at once without dialing", func(t *testing.T) {
		dir := pki(t)
		addr, accepts, _ := countingListener(t)
		cfg := writeConfig(t, dir, addr, `{"max_attempts":0,"interval_sec":1}`, "pki/missing.key")
		var stderr bytes.Buffer
		cmd := exec.Command(bin, "-config", cfg)
		cmd.Stderr = &stderr
		if code := proctest.ExitCode(cmd.Run()); code != 1 {
			t.Fatalf("exit code %d, want 1", code)
		}
		if n := accepts.Load(); n != 0 {
			t.Errorf("S3: %d dials, want 0", n)
		}
		if !strings.Contains(stderr.String(), "missing.key") {
			t.Errorf("S3: stderr does not name the key file:\n%s", stderr.String())
		}
	})

	t.Run("check and version", func(t *testing.T) {
		dir := pki(t)
		good := writeConfig(t, dir, "127.0.0.1:7443", `{}`, "pki/gpu-1.key")
		if out, err := exec.Command(bin, "-config", good, "-check").CombinedOutput(); err != nil || !strings.Contains(string(out), "ok") {
			t.Errorf("-check good: %v %s", err, out)
		}
		bad := filepath.Join(dir, "bad.json")
		os.WriteFile(bad, []byte(`{"node_id":"gpu-1","edge_addr":"x:1","tls":{},"reconect":{}}`), 0o600)
		out, err := exec.Command(bin, "-config", bad, "-check").CombinedOutput()
		if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "reconect: unknown field") || !strings.Contains(string(out), "tls.cert_file: required") {
			t.Errorf("-check bad: exit %d\n%s", proctest.ExitCode(err), out)
		}
		nokey := writeConfig(t, dir, "127.0.0.1:7443", `{}`, "pki/absent.key")
		out, err = exec.Command(bin, "-config", nokey, "-check").CombinedOutput()
		if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "absent.key") {
			t.Errorf("S3 -check with a missing key: exit %d, want 1 naming the file:\n%s", proctest.ExitCode(err), out)
		}
		// S3: a TLS key or lease recipient key that group or others can
		// read is refused by -check, naming the file and the fix.
		good = writeConfig(t, dir, "127.0.0.1:7443", `{}`, "pki/gpu-1.key")
		if err := os.Chmod(filepath.Join(dir, "pki", "gpu-1.key"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err = exec.Command(bin, "-config", good, "-check").CombinedOutput()
		if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "gpu-1.key") || !strings.Contains(string(out), "chmod 600") {
			t.Errorf("S3 -check with a 0644 TLS key: exit %d, want 1 naming the file:\n%s", proctest.ExitCode(err), out)
		}
		os.Chmod(filepath.Join(dir, "pki", "gpu-1.key"), 0o600)
		creds := filepath.Join(dir, "creds.json")
		os.WriteFile(creds, []byte(`{"node_id":"gpu-1","edge_addr":"127.0.0.1:7443","tls":{"cert_file":"pki/gpu-1.crt","key_file":"pki/gpu-1.key","ca_file":"pki/ca.crt","expected_edge_name":"edge-1"},
 "credentials":{"recipient_private_key_file":"pki/gpu-1.recipient.key","issuer_public_key":"pki/issuer.pub"}}`), 0o600)
		if out, err := exec.Command(bin, "-config", creds, "-check").CombinedOutput(); err != nil {
			t.Errorf("-check with lease keys: %v\n%s", err, out)
		}
		os.Chmod(filepath.Join(dir, "pki", "gpu-1.recipient.key"), 0o640)
		out, err = exec.Command(bin, "-config", creds, "-check").CombinedOutput()
		if proctest.ExitCode(err) != 1 || !strings.Contains(string(out), "gpu-1.recipient.key") || !strings.Contains(string(out), "chmod 600") {
			t.Errorf("S3 -check with a 0640 recipient key: exit %d, want 1 naming the file:\n%s", proctest.ExitCode(err), out)
		}
		for _, args := range [][]string{{"version"}, {"-version"}} {
			out, err := exec.Command(bin, args...).CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), "node dev commit ") || !strings.Contains(string(out), " "+runtime.Version()+" ") {
				t.Errorf("%v: %v %q", args, err, out)
			}
		}
		if code := proctest.ExitCode(exec.Command(bin).Run()); code != 2 {
			t.Errorf("no -config: exit %d, want 2", code)
		}
	})
}

// listeningSockets returns the TCP sockets in LISTEN state that process pid
// holds, from /proc (Linux).
func listeningSockets(t *testing.T, pid int) []string {
	t.Helper()
	listen := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) > 9 && fs[3] == "0A" { // 0A = TCP_LISTEN
				listen["socket:["+fs[9]+"]"] = true
			}
		}
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Skipf("cannot read %s: %v", fdDir, err)
	}
	var held []string
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && listen[target] {
			held = append(held, target)
		}
	}
	return held
}

// P1: a node never listens: clients and control planes cannot connect to
// it; it only dials out to the edge.
func TestNodeNeverListens(t *testing.T) {
	bin := proctest.Build(t, "node")
	dir := pki(t)
	addr, _, first := countingListener(t)
	cfg := writeConfig(t, dir, addr, `{"max_attempts":0,"interval_sec":30}`, "pki/gpu-1.key")
	cmd := exec.Command(bin, "-config", cfg)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("node never dialed")
	}
	if held := listeningSockets(t, cmd.Process.Pid); len(held) != 0 {
		t.Errorf("P1: the node holds listening sockets %v", held)
	}
	// The check can fail: this test process itself listens (countingListener).
	if held := listeningSockets(t, os.Getpid()); len(held) == 0 {
		t.Error("the /proc check found no listener in the test process, which has one")
	}
}
