package fleetcmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/fleet"
	"iop/internal/identity"
	"iop/internal/leakcheck"
)

// edgeDir writes a PKI and an edge config with enrollment on (off with
// off) and a template for gpu-*; it returns the config's path.
func edgeDir(t *testing.T, off bool) string {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(filepath.Join(dir, "pki"), identity.PKIOptions{Edge: "edge-1"}); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"node_listen": "0.0.0.0:7443",
		"tls":         map[string]any{"cert_file": "pki/edge-1.crt", "key_file": "pki/edge-1.key", "ca_file": "pki/ca.crt"},
		"node_templates": []any{map[string]any{"match": "gpu-*", "adapters": []any{
			map[string]any{"type": "ollama", "base_url": "http://127.0.0.1:11434"}}}},
		"models": []any{map[string]any{"name": "tiny", "providers": []any{map[string]any{"node": "gpu-*", "provider": "ollama", "target": "tiny"}}}},
	}
	if !off {
		cfg["enrollment"] = map[string]any{"ca_key_file": "pki/ca.key"}
	}
	b, _ := json.Marshal(cfg)
	p := filepath.Join(dir, "edge.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(fn func([]string, *bytes.Buffer, *bytes.Buffer) int, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := fn(args, &out, &errb)
	return out.String(), errb.String(), code
}

func tokens(args []string, o, e *bytes.Buffer) int { return Tokens(args, o, e, time.Now) }
func nodes(args []string, o, e *bytes.Buffer) int  { return Nodes(args, o, e, time.Now) }

// J1: edge tokens create prints the one line to run on the new host, keeps
// only the secret's hash, and refuses what could never be joined with;
// list and revoke act on the store; every command takes -config.
func TestTokens(t *testing.T) {
	cfg := edgeDir(t, false)
	store := filepath.Join(filepath.Dir(cfg), "enrollment.json")
	out, errText, code := run(tokens, "create", "-config", cfg, "-node", "gpu-3", "-edge", "edge.example:7443")
	if code != ExitOK {
		t.Fatalf("create: %d %s", code, errText)
	}
	fields := strings.Fields(out)
	if len(fields) != 8 || strings.Join(fields[:4], " ") != "node join -edge edge.example:7443" || fields[4] != "-token" ||
		fields[6] != "-dir" || fields[7] != "gpu-3" {
		t.Fatalf("J1 the printed line %q", out)
	}
	tok, err := identity.ParseJoinToken(fields[5])
	if err != nil {
		t.Fatal(err)
	}
	if tok.Node != "gpu-3" {
		t.Fatalf("J1 a -node token carries node %q, want gpu-3 (node join without -name joins as it)", tok.Node)
	}
	raw, _ := os.ReadFile(store)
	if bytes.Contains(raw, []byte(tok.Secret)) || !bytes.Contains(raw, []byte(tok.SecretSHA256())) {
		t.Error("J1 the store keeps the secret, or not its hash")
	}
	if strings.Contains(errText, tok.Secret) {
		t.Error("J1 stderr repeats the secret")
	}
	if out, _, _ := run(tokens, "create", "-config", cfg, "-prefix", "gpu-"); !strings.Contains(out, "-dir iop-node") ||
		strings.Contains(out, "-name") || !strings.Contains(out, "-edge "+advertised("0.0.0.0:7443")) {
		t.Errorf("J1 a prefix token's line %q (no -name; node_listen's wildcard becomes this host's name)", out)
	} else if tok, err := identity.ParseJoinToken(strings.Fields(out)[5]); err != nil || tok.Node != "" {
		t.Errorf("J1 a prefix token %+v, %v: it carries no node (the host's name joins)", tok, err)
	}
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"J1 -node and -prefix", []string{"create", "-config", cfg, "-node", "gpu-1", "-prefix", "gpu-"}, ExitUsage, "exclude each other"},
		{"J1 a ttl over 30 days", []string{"create", "-config", cfg, "-node", "gpu-1", "-ttl", "800h"}, ExitUsage, "-ttl"},
		{"J1 no uses", []string{"create", "-config", cfg, "-node", "gpu-1", "-uses", "0"}, ExitUsage, "-uses"},
		// J1: a token no node could join with is refused when it is made.
		{"J1 a -node longer than a node name", []string{"create", "-config", cfg, "-node", "gpu-" + strings.Repeat("a", 60)}, ExitUsage, "1-63"},
		{"J1 a -prefix longer than a node name", []string{"create", "-config", cfg, "-prefix", "gpu-" + strings.Repeat("a", 60)}, ExitUsage, "no name could join"},
		{"J1 a -prefix no name starts with", []string{"create", "-config", cfg, "-prefix", ".gpu"}, ExitUsage, "no name could join"},
		{"J1 a -node with a slash", []string{"create", "-config", cfg, "-node", "gpu/1"}, ExitUsage, "1-63"},
		{"J7 a name no template matches", []string{"create", "-config", cfg, "-node", "cpu-1"}, ExitError, "no node_templates entry"},
		{"J1 no -config", []string{"create", "-node", "gpu-1"}, ExitUsage, "missing -config"},
		{"J1 enrollment off", []string{"create", "-config", edgeDir(t, true), "-node", "gpu-1"}, ExitError, "enrollment is off"},
		{"J1 revoke an unknown token", []string{"revoke", "-config", cfg, "0000000000000000"}, ExitError, "no token"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := os.ReadFile(store)
			_, e, code := run(tokens, tt.args...)
			if code != tt.code || !strings.Contains(e, tt.want) {
				t.Fatalf("exit %d %q, want %d with %q", code, e, tt.code, tt.want)
			}
			if after, _ := os.ReadFile(store); !bytes.Equal(before, after) {
				t.Error("a refused command changed the store")
			}
		})
	}
	out, _, _ = run(tokens, "list", "-config", cfg)
	if !strings.Contains(out, tok.ID) || !strings.Contains(out, "node gpu-3") || !strings.Contains(out, "active") || strings.Contains(out, tok.Secret) {
		t.Errorf("J1 list:\n%s", out)
	}
	if out, _, code := run(tokens, "revoke", "-config", cfg, tok.ID); code != ExitOK || !strings.Contains(out, "revoked") {
		t.Errorf("J1 revoke: %d %s", code, out)
	}
	if out, _, _ := run(tokens, "list", "-config", cfg); !strings.Contains(out, "revoked") {
		t.Errorf("J1 list after revoke:\n%s", out)
	}
}

// J1: concurrent edge tokens create lose no token (the store's lock).
func TestConcurrentCreates(t *testing.T) {
	leakcheck.Check(t)
	cfg := edgeDir(t, false)
	const n = 12
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, e, code := run(tokens, "create", "-config", cfg, "-prefix", "gpu-"); code != ExitOK {
				t.Errorf("create: %d %s", code, e)
			}
		}()
	}
	wg.Wait()
	st, err := fleet.LoadStore(filepath.Join(filepath.Dir(cfg), "enrollment.json"))
	if err != nil || len(st.Tokens) != n {
		t.Fatalf("J1 %d tokens after %d concurrent creates (%v)", len(st.Tokens), n, err)
	}
}

// J6: edge nodes revoke writes a revoked record (for a node that never
// joined too) and list shows it.
func TestNodes(t *testing.T) {
	cfg := edgeDir(t, false)
	store := filepath.Join(filepath.Dir(cfg), "enrollment.json")
	// J6: a name that never joined (a typo of the one meant) is refused,
	// not reported revoked while the node meant stays connected.
	if out, e, code := run(nodes, "revoke", "-config", cfg, "gpu-9"); code != ExitError || !strings.Contains(e, "nothing revoked") || out != "" {
		t.Fatalf("J6 revoke of a name that never joined: %d %q %q", code, out, e)
	}
	if err := fleet.Update(store, func(st *fleet.Store) error {
		st.Nodes = append(st.Nodes, &fleet.NodeRecord{Name: "gpu-9", Serials: []string{"0a"}, NotAfter: time.Now().Add(time.Hour), EnrolledAt: time.Now()})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out, e, code := run(nodes, "revoke", "-config", cfg, "gpu-9"); code != ExitOK || !strings.Contains(out, "revoked") {
		t.Fatalf("J6 revoke: %d %s%s", code, out, e)
	}
	if out, _, _ := run(nodes, "revoke", "-config", cfg, "gpu-9"); !strings.Contains(out, "already revoked") {
		t.Errorf("J6 revoke twice: %s", out)
	}
	if out, _, _ := run(nodes, "list", "-config", cfg); !strings.Contains(out, "gpu-9") || !strings.Contains(out, "revoked") {
		t.Errorf("J6 list:\n%s", out)
	}
	if _, e, code := run(nodes, "revoke", "-config", cfg, "bad/name"); code != ExitError || e == "" {
		t.Errorf("revoke of an invalid name: %d %s", code, e)
	}
	if _, _, code := run(nodes, "revoke", "-config", cfg); code != ExitUsage {
		t.Errorf("revoke without a name: %d", code)
	}
}
