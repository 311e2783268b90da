package sdk

import (
	"crypto/ecdh"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// storeSecret makes a random upstream key and stores it in slot "demo" of
// a new secret store with the edge binary, as an operator would: `edge
// secrets init`, then `edge secrets set` with the key on standard input.
func (s *stack) storeSecret() string {
	t := s.t
	t.Helper()
	var b [16]byte
	_, _ = rand.Read(b[:])
	secret := "sk-e2e-" + hex.EncodeToString(b[:])
	edge := filepath.Join(s.env.bin, "edge")
	if out, err := exec.Command(edge, "secrets", "init", "-key", filepath.Join(s.dir, "store.key")).CombinedOutput(); err != nil {
		t.Fatalf("edge secrets init: %v\n%s", err, out)
	}
	cmd := exec.Command(edge, "secrets", "set", "-store", filepath.Join(s.dir, "secrets.json"),
		"-key", filepath.Join(s.dir, "store.key"), "-slot", "demo")
	cmd.Stdin = strings.NewReader(secret + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "slot demo: revision 1") {
		t.Fatalf("edge secrets set: %v\n%s", err, out)
	}
	if strings.Contains(string(out), secret) {
		t.Fatal("C1: edge secrets set printed the secret")
	}
	return secret
}

// planeOn turns the credential plane on in the stack's configs (README
// "Deploying"): credentials on the edge with every adapter on slot "demo",
// the node's recipient key in nodes[], the lease keys in the node config.
func (s *stack) planeOn(edgeCfg, nodeCfg map[string]any) {
	t := s.t
	t.Helper()
	edgeCfg["credentials"] = map[string]any{"enabled": true, "store_file": "secrets.json", "store_key_file": "store.key",
		"issuer_key_file": "pki/issuer.key"}
	n := edgeCfg["nodes"].([]any)[0].(map[string]any)
	n["lease_recipient_public_key"] = recipientKey(t, filepath.Join(s.dir, "pki", nodeID+".recipient.pub"))
	for _, a := range n["adapters"].([]any) {
		a.(map[string]any)["credential_slot"] = "demo"
	}
	nodeCfg["credentials"] = map[string]any{"recipient_private_key_file": "pki/" + nodeID + ".recipient.key",
		"issuer_public_key": "pki/issuer.pub"}
}

// recipientKey is the base64 of the raw X25519 key in a PEM public key
// file (what `edge pki init` prints for lease_recipient_public_key).
func recipientKey(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: not PEM", path)
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pub, ok := k.(*ecdh.PublicKey)
	if !ok {
		t.Fatalf("%s: %T, want X25519", path, k)
	}
	return base64.StdEncoding.EncodeToString(pub.Bytes())
}

// scanSecrets fails t for every appearance of the secret or a private key
// in the processes' logs, /status and /metrics (SPEC C5, P4).
func (s *stack) scanSecrets(t *testing.T) {
	t.Helper()
	needles := map[string]string{"secret": s.secret, "secret base64": base64.StdEncoding.EncodeToString([]byte(s.secret))}
	for _, f := range []string{"pki/issuer.key", "pki/" + nodeID + ".recipient.key", "pki/" + nodeID + ".key", "pki/" + edgeName + ".key", "store.key"} {
		b, err := os.ReadFile(filepath.Join(s.dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if blk, _ := pem.Decode(b); blk != nil {
			b = blk.Bytes
		}
		needles[f+" base64"] = base64.StdEncoding.EncodeToString(b)
		needles[f+" hex"] = hex.EncodeToString(b)
	}
	texts := map[string]string{}
	for _, p := range []*proc{s.edge, s.node, s.backend} {
		if p != nil {
			texts[p.name+" log"] = p.log.tail(1 << 30)
		}
	}
	for _, path := range []string{"/status", "/metrics", "/"} {
		resp, err := s.hc.Get("http://" + s.adminAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			texts[path] = string(b)
		}
	}
	n := 0
	for where, text := range texts {
		for what, needle := range needles {
			if strings.Contains(text, needle) {
				n++
				t.Errorf("C5/P4: %s appears in %s", what, where)
			}
		}
	}
	t.Logf("scanned %d texts for %d needles: %d hits", len(texts), len(needles), n)
}
