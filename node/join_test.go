package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/proctest"
)

// freePort returns a 127.0.0.1 address nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// J1 J2 J3 J6 J7 D1 D2, through the binaries, as docs/operating.md tells
// an operator: `edge tokens create` prints one line; that line (`node
// join …`) writes an empty directory; `node -config DIR/node.json` turns
// ready and answers a model its backend lists, with no edit of edge.json;
// `edge nodes revoke` disconnects it within a second and its next handshake
// is refused.
func TestJoinThroughTheBinaries(t *testing.T) {
	nodeBin := proctest.Build(t, "node")
	edgeBin := proctest.BuildPackage(t, "iop/edge", "edge")
	b, err := backend.New(backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b)
	defer srv.Close()

	dir := t.TempDir()
	run := func(bin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		code := proctest.ExitCode(cmd.Run())
		return out.String(), errb.String(), code
	}
	if _, e, code := run(edgeBin, "pki", "init", "-dir", "pki", "-edge", "edge-1"); code != 0 {
		t.Fatalf("edge pki init: %d %s", code, e)
	}
	httpAddr, nodeAddr := freePort(t), freePort(t)
	edgeJSON, _ := json.Marshal(map[string]any{
		"http_listen": httpAddr, "node_listen": nodeAddr, "admin_listen": freePort(t),
		"tls":        map[string]any{"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt"},
		"enrollment": map[string]any{"ca_key_file": "pki/ca.key"},
		"discovery":  map[string]any{"poll_interval_ms": 200},
		"node_templates": []any{map[string]any{"match": "gpu-*", "adapters": []any{
			map[string]any{"name": "ollama", "type": "ollama", "base_url": srv.URL}}}},
		"models":          []any{map[string]any{"name": "tiny", "providers": []any{map[string]any{"node": "gpu-*", "provider": "ollama", "target": "tiny"}}}},
		"model_discovery": []any{map[string]any{"node": "gpu-*", "provider": "ollama"}},
	})
	if err := os.WriteFile(filepath.Join(dir, "edge.json"), edgeJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	edgeCfg, _ := os.ReadFile(filepath.Join(dir, "edge.json"))

	var edgeLog proctest.Log
	edge := exec.Command(edgeBin, "-config", "edge.json")
	edge.Dir, edge.Stderr = dir, &edgeLog
	if err := edge.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { edge.Process.Signal(syscall.SIGTERM); edge.Wait() }()
	if !edgeLog.WaitFor("edge serving", 10*time.Second) {
		t.Fatalf("edge did not serve:\n%s", edgeLog.String())
	}

	line, e, code := run(edgeBin, "tokens", "create", "-config", "edge.json", "-node", "gpu-5")
	if code != 0 || !strings.HasPrefix(line, "node join -edge "+nodeAddr+" -token iop1.") {
		t.Fatalf("J1 edge tokens create: %d %q %s", code, line, e)
	}
	args := strings.Fields(line)[1:] // the printed line, run as printed (-dir gpu-5 relative to dir)
	joinStart := time.Now()
	out, e, code := run(nodeBin, args...)
	if code != 0 || !strings.Contains(out, "start it: node -config gpu-5/node.json") {
		t.Fatalf("J2 node join: %d\n%s%s", code, out, e)
	}
	if _, e, code := run(nodeBin, args...); code != 1 || !strings.Contains(e, "not empty") {
		t.Errorf("J3 the same line again: %d %s", code, e)
	}

	var nodeLog proctest.Log
	node := exec.Command(nodeBin, "-config", "gpu-5/node.json")
	node.Dir, node.Stderr = dir, &nodeLog
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { node.Process.Signal(syscall.SIGTERM); node.Wait() }()
	var answered string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) { // the first request the node answers
		if !edgeLog.WaitFor(`"msg":"node models"`, time.Until(deadline)) {
			break
		}
		answered = chat(t, httpAddr, "tiny-tool")
		if answered != "" {
			break
		}
	}
	if answered == "" {
		t.Fatalf("J7 D2 the discovered model tiny-tool was not served:\nedge:\n%s\nnode:\n%s", edgeLog.String(), nodeLog.String())
	}
	t.Logf("J2 from node join to the first answered request: %v", time.Since(joinStart).Round(time.Millisecond))
	if got, _ := os.ReadFile(filepath.Join(dir, "edge.json")); string(got) != string(edgeCfg) {
		t.Error("J7 edge.json changed")
	}

	before := len(nodeLog.String())
	out, e, code = run(edgeBin, "nodes", "revoke", "-config", "edge.json", "gpu-5")
	revoked := time.Now()
	if code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("J6 edge nodes revoke: %d %s%s", code, out, e)
	}
	if !nodeLog.WaitFor(`"msg":"session ended"`, time.Second) || !strings.Contains(nodeLog.String()[before:], "session ended") {
		t.Fatalf("J6 the node was not disconnected within a second:\n%s", nodeLog.String()[before:])
	}
	t.Logf("J6 disconnected %v after edge nodes revoke returned", time.Since(revoked).Round(time.Millisecond))
	if !edgeLog.WaitFor("node TLS handshake refused", 10*time.Second) || !strings.Contains(edgeLog.String(), "node revoked") {
		t.Fatalf("J6 the next handshake was not refused as revoked:\n%s", edgeLog.String())
	}
	if a := chat(t, httpAddr, "tiny"); a != "" {
		t.Errorf("J6 a revoked node still answers: %q", a)
	}
}

// chat sends one chat completion for model and returns the answer's text,
// "" when the edge did not answer 200.
func chat(t *testing.T, addr, model string) string {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return ""
	}
	var doc struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if json.Unmarshal(raw, &doc) != nil || len(doc.Choices) == 0 {
		return ""
	}
	return doc.Choices[0].Message.Content
}
