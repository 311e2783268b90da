package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/proctest"
)

// C1, C2: the built edge binary with the credential plane on: `edge
// secrets` stores a key read from stdin, `-check` validates the store, the
// keys and every route's slot, and a SIGHUP after `secrets rm` is accepted
// and revokes the slot's routes — all without printing the secret.
func TestEdgeSecretsBinary(t *testing.T) {
	bin := proctest.Build(t, "edge")
	dir := t.TempDir()
	run := func(stdin string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), proctest.ExitCode(err)
	}
	out, code := run("", "pki", "init", "-dir", filepath.Join(dir, "pki"), "-edge", "edge-1", "-node", "gpu-1")
	if code != 0 {
		t.Fatalf("pki init: %d\n%s", code, out)
	}
	recipient := regexp.MustCompile(`gpu-1: "lease_recipient_public_key": "([^"]+)"`).FindStringSubmatch(out)
	if recipient == nil {
		t.Fatalf("pki init printed no recipient key:\n%s", out)
	}
	const secret = "sk-binary-SECRET-5a5a5a5a"
	steps := []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"secrets", "init", "-key", filepath.Join(dir, "store.key")}, "wrote"},
		{secret + "\n", []string{"secrets", "set", "-store", filepath.Join(dir, "secrets.json"), "-key", filepath.Join(dir, "store.key"), "-slot", "llama"}, "slot llama: revision 1"},
		{"", []string{"secrets", "list", "-store", filepath.Join(dir, "secrets.json")}, "llama"},
	}
	for _, st := range steps {
		out, code := run(st.stdin, st.args...)
		if code != 0 || !strings.Contains(out, st.want) || strings.Contains(out, secret) {
			t.Fatalf("edge %s: exit %d\n%s", strings.Join(st.args[:2], " "), code, out)
		}
	}
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	cfg := filepath.Join(dir, "edge.json")
	plane := strings.Replace(edgeConfig(httpAddr, freeAddr(t), adminAddr), `"nodes":[{"id":"gpu-1",`,
		`"credentials":{"enabled":true,"store_file":"secrets.json","store_key_file":"store.key","issuer_key_file":"pki/issuer.key"},
 "nodes":[{"id":"gpu-1","lease_recipient_public_key":"`+recipient[1]+`",`, 1)
	plane = strings.Replace(plane, `"type":"ollama",`, `"type":"ollama","credential_slot":"llama",`, 1)
	os.WriteFile(cfg, []byte(plane), 0o600)
	if out, code := run("", "-config", cfg, "-check"); code != 0 {
		t.Fatalf("C1 -check with the plane on: exit %d\n%s", code, out)
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
	if out, code := run("", "secrets", "rm", "-store", filepath.Join(dir, "secrets.json"), "-slot", "llama"); code != 0 {
		t.Fatalf("secrets rm: %d\n%s", code, out)
	}
	// C6: removal revokes. The reload is accepted (not "keeping the
	// running config", which would go on issuing the removed secret) and
	// warns naming the revoked route; -check says the same and passes.
	cmd.Process.Signal(syscall.SIGHUP)
	if !stderr.WaitFor(`config reloaded`, 10*time.Second) || !strings.Contains(stderr.String(), `credential route revoked`) ||
		!strings.Contains(stderr.String(), `slot \"llama\": model tiny`) || strings.Contains(stderr.String(), "config reload rejected") {
		t.Errorf("C6: a reload after secrets rm was not accepted with the route revoked:\n%s", stderr.String())
	}
	if out, code := run("", "-config", cfg, "-check"); code != 0 || !strings.Contains(out, `warning: credential route revoked`) || !strings.Contains(out, `slot "llama"`) {
		t.Errorf("C6 -check after secrets rm: exit %d, want 0 with a warning naming the slot\n%s", code, out)
	}
	// A slot the store never held is still an error naming it.
	os.WriteFile(cfg, []byte(strings.Replace(plane, `"credential_slot":"llama"`, `"credential_slot":"nope"`, 1)), 0o600)
	if out, code := run("", "-config", cfg, "-check"); code != 1 || !strings.Contains(out, `credential slot "nope"`) {
		t.Errorf("C1 -check with a slot never set: exit %d, want 1 naming the slot\n%s", code, out)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if code := proctest.ExitCode(cmd.Wait()); code != 0 {
		t.Errorf("SIGTERM: exit %d\n%s", code, stderr.String())
	}
	if strings.Contains(stderr.String(), secret) {
		t.Error("C5: the edge logged the secret")
	}
}
