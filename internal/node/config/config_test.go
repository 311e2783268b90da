package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const base = `"node_id":"gpu-1","edge_addr":"127.0.0.1:7443","tls":{"cert_file":"n.crt","key_file":"n.key","ca_file":"ca.crt"}`

// S2: the reconnect rules exactly — omitted max_attempts = 10, 0 = unlimited,
// negative = error; interval omitted = 10, must be positive when unlimited.
func TestReconnectRules(t *testing.T) {
	tests := []struct {
		name         string
		reconnect    string
		wantErr      string
		wantInterval time.Duration
		wantAttempts int
	}{
		{"S2 omitted both", ``, "", 10 * time.Second, 10},
		{"S2 empty object", `,"reconnect":{}`, "", 10 * time.Second, 10},
		{"S2 zero attempts is unlimited", `,"reconnect":{"max_attempts":0}`, "", 10 * time.Second, 0},
		{"S2 positive attempts exact", `,"reconnect":{"max_attempts":2,"interval_sec":1}`, "", time.Second, 2},
		{"S2 negative attempts rejected", `,"reconnect":{"max_attempts":-1}`, "reconnect.max_attempts: must be ≥ 0", 0, 0},
		{"S2 unlimited needs positive interval", `,"reconnect":{"max_attempts":0,"interval_sec":0}`, "reconnect.interval_sec: must be positive when reconnect.max_attempts is 0", 0, 0},
		{"S2 finite allows zero interval", `,"reconnect":{"max_attempts":3,"interval_sec":0}`, "", 0, 3},
		{"S2 interval too large to be a duration", `,"reconnect":{"interval_sec":9223372036854775807}`, "reconnect.interval_sec: must be between 0 and 86400", 0, 0},
		{"S2 negative interval rejected", `,"reconnect":{"interval_sec":-5}`, "reconnect.interval_sec: must be between 0 and 86400", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte("{" + base + tt.reconnect + "}"))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got err %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got err %v, want nil", err)
			}
			if c.Interval() != tt.wantInterval || c.MaxAttempts() != tt.wantAttempts {
				t.Fatalf("got interval %v attempts %d, want %v %d", c.Interval(), c.MaxAttempts(), tt.wantInterval, tt.wantAttempts)
			}
		})
	}
}

func TestStrictDecoding(t *testing.T) {
	tests := []struct {
		name, json string
		want       []string
	}{
		{"unknown top-level key", `{` + base + `,"edge_adress":"x"}`, []string{"edge_adress: unknown field"}},
		{"unknown nested key with path", `{` + base + `,"reconnect":{"max_attemps":3}}`, []string{"reconnect.max_attemps: unknown field"}},
		{"every problem at once", `{"node_id":"","edge_addr":"nohost","tls":{}}`, []string{"node_id:", "edge_addr:", "tls.cert_file: required", "tls.key_file: required", "tls.ca_file: required"}},
		{"wrong type names the key", `{` + base + `,"reconnect":{"max_attempts":"ten"}}`, []string{"reconnect.max_attempts"}},
		{"syntax error gives position", "{\n  \"node_id\": \"a\",,\n}", []string{"line 2"}},
		{"truncated", `{"node_id":`, []string{"unexpected end"}},
		{"not an object", `[1]`, []string{"top level must be a JSON object"}},
		{"edge port out of range", `{"node_id":"gpu-1","edge_addr":"127.0.0.1:99999","tls":{"cert_file":"a","key_file":"b","ca_file":"c"}}`, []string{"edge_addr: want host:port with a port from 1 to 65535"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.json))
			if err == nil {
				t.Fatal("got nil error, want one")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "node.json")
	if err := os.WriteFile(p, []byte("{"+base+"}"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "n.crt"); c.TLS.CertFile != want {
		t.Fatalf("got cert_file %q, want %q", c.TLS.CertFile, want)
	}
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil {
		t.Fatal("got nil error for a missing file")
	}
}

// C3: the lease keys come as a pair; the issuer key is inline base64 or a
// file path resolved against the config's directory.
func TestCredentialKeys(t *testing.T) {
	dir := t.TempDir()
	const inline = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	rows := []struct {
		name, creds string
		wantErr     bool
		wantIssuer  string
	}{
		{"C3 neither", `{}`, false, ""},
		{"C3 only the private key", `{"recipient_private_key_file":"r.key"}`, true, ""},
		{"C3 only the issuer key", `{"issuer_public_key":"` + inline + `"}`, true, ""},
		{"C3 inline issuer key kept", `{"recipient_private_key_file":"r.key","issuer_public_key":"` + inline + `"}`, false, inline},
		{"C3 issuer key file resolved", `{"recipient_private_key_file":"r.key","issuer_public_key":"pki/issuer.pub"}`, false, filepath.Join(dir, "pki/issuer.pub")},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			p := filepath.Join(dir, "node.json")
			os.WriteFile(p, []byte("{"+base+`,"credentials":`+row.creds+"}"), 0o600)
			c, err := Load(p)
			if (err != nil) != row.wantErr {
				t.Fatalf("got %v, want error %v", err, row.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "credentials: set both") {
					t.Fatalf("error %v does not name the pair", err)
				}
				return
			}
			if c.Credentials.IssuerPublicKey != row.wantIssuer {
				t.Fatalf("issuer_public_key %q, want %q", c.Credentials.IssuerPublicKey, row.wantIssuer)
			}
			if row.wantIssuer != "" && c.Credentials.RecipientPrivateKeyFile != filepath.Join(dir, "r.key") {
				t.Fatalf("recipient key %q not resolved", c.Credentials.RecipientPrivateKeyFile)
			}
		})
	}
}

// A3: shutdown.drain_timeout_ms defaults to 30000, bounded.
func TestDrainTimeout(t *testing.T) {
	rows := []struct {
		name, extra, wantErr string
		want                 time.Duration
	}{
		{"default", ``, "", 30 * time.Second},
		{"set", `,"shutdown":{"drain_timeout_ms":1500}`, "", 1500 * time.Millisecond},
		{"negative", `,"shutdown":{"drain_timeout_ms":-1}`, "shutdown.drain_timeout_ms: must be between", 0},
		{"too large", `,"shutdown":{"drain_timeout_ms":99999999999}`, "shutdown.drain_timeout_ms: must be between", 0},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			c, err := Parse([]byte("{" + base + r.extra + "}"))
			if r.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), r.wantErr) {
					t.Fatalf("got err %v, want %q", err, r.wantErr)
				}
				return
			}
			if err != nil || c.DrainTimeout() != r.want {
				t.Fatalf("got %v, %v; want %v", c, err, r.want)
			}
		})
	}
}

// T4 C5: api_key_env_allow is the node's opt-in to which environment
// variables an edge config's api_key_env may read: exact names and
// "PREFIX*" entries; omitted offers nothing; a bare "*" or a bad name is
// refused, naming the entry.
func TestAPIKeyEnvAllow(t *testing.T) {
	rows := []struct {
		name, extra, wantErr string
		allowed, refused     []string
	}{
		{"T4 omitted offers no variable", ``, "", nil, []string{"OPENAI_API_KEY", "PATH", ""}},
		{"T4 exact names", `,"api_key_env_allow":["OPENAI_API_KEY","VLLM_KEY"]`, "",
			[]string{"OPENAI_API_KEY", "VLLM_KEY"}, []string{"OPENAI_API_KEY_2", "OPENAI", "NODE_UNRELATED_SECRET"}},
		{"T4 prefix", `,"api_key_env_allow":["IOP_KEY_*"]`, "",
			[]string{"IOP_KEY_OPENAI", "IOP_KEY_"}, []string{"IOP_KEYX", "NODE_UNRELATED_SECRET", "iop_key_a"}},
		{"T4 bare star refused", `,"api_key_env_allow":["*"]`, "api_key_env_allow[0]: want an environment variable name", nil, nil},
		{"T4 bad name refused", `,"api_key_env_allow":["OK","BAD-NAME"]`, "api_key_env_allow[1]:", nil, nil},
		{"T4 star inside refused", `,"api_key_env_allow":["A*B"]`, "api_key_env_allow[0]:", nil, nil},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			c, err := Parse([]byte("{" + base + r.extra + "}"))
			if r.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), r.wantErr) {
					t.Fatalf("got err %v, want %q", err, r.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range r.allowed {
				if !c.APIKeyEnvAllowed(n) {
					t.Errorf("%q refused, want offered", n)
				}
			}
			for _, n := range r.refused {
				if c.APIKeyEnvAllowed(n) {
					t.Errorf("%q offered, want refused", n)
				}
			}
		})
	}
}

// S1: the edges a node serves — edges[] for several, edge_addr and
// tls.expected_edge_name for one, never both — each a host:port once,
// with a certificate name and an optional capacity share.
func TestEdges(t *testing.T) {
	const tlsKeys = `"cert_file":"n.crt","key_file":"n.key","ca_file":"ca.crt"`
	rows := []struct {
		name, json string
		want       []Edge
		wantErr    []string
	}{
		{"S1 one edge, the legacy keys", `"edge_addr":"10.0.0.1:7443","tls":{` + tlsKeys + `,"expected_edge_name":"e1"}`,
			[]Edge{{Addr: "10.0.0.1:7443", Name: "e1"}}, nil},
		{"S1 one edge, the default name", `"edge_addr":"10.0.0.1:7443","tls":{` + tlsKeys + `}`,
			[]Edge{{Addr: "10.0.0.1:7443", Name: "edge-1"}}, nil},
		{"S1 two edges", `"edges":[{"addr":"10.0.0.1:7443","name":"edge-1"},{"addr":"10.0.0.2:7443","name":"edge-2","capacity_share":0.5}],"tls":{` + tlsKeys + `}`,
			[]Edge{{Addr: "10.0.0.1:7443", Name: "edge-1"}, {Addr: "10.0.0.2:7443", Name: "edge-2", CapacityShare: 0.5}}, nil},
		{"S1 one certificate name on both edges", `"edges":[{"addr":"a:1"},{"addr":"b:1"}],"tls":{` + tlsKeys + `}`,
			[]Edge{{Addr: "a:1", Name: "edge-1"}, {Addr: "b:1", Name: "edge-1"}}, nil},
		{"S1 both forms name the keys", `"edge_addr":"a:1","edges":[{"addr":"b:1"}],"tls":{` + tlsKeys + `}`,
			nil, []string{"edges: set either edges or edge_addr and tls.expected_edge_name, not both"}},
		{"S1 edges with expected_edge_name", `"edges":[{"addr":"b:1"}],"tls":{` + tlsKeys + `,"expected_edge_name":"e1"}`,
			nil, []string{"edges: set either edges or edge_addr and tls.expected_edge_name"}},
		{"S1 neither form", `"tls":{` + tlsKeys + `}`, nil, []string{"edge_addr: required (or edges"}},
		{"S1 every bad entry named", `"edges":[{"addr":"nohost"},{"addr":"b:1","name":"bad name"},{"addr":"b:1","capacity_share":1.5}],"tls":{` + tlsKeys + `}`,
			nil, []string{"edges[0].addr: want host:port", "edges[1].name: invalid edge name", `edges[2].addr: "b:1" is edges[1].addr too`, "edges[2].capacity_share: want a share in (0, 1]"}},
		{"S1 a negative share", `"edges":[{"addr":"a:1","capacity_share":-0.1}],"tls":{` + tlsKeys + `}`,
			nil, []string{"edges[0].capacity_share"}},
		{"S1 unknown key in an entry", `"edges":[{"addr":"a:1","adress":"x"}],"tls":{` + tlsKeys + `}`,
			nil, []string{"edges[0].adress: unknown field"}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			c, err := Parse([]byte(`{"node_id":"gpu-1",` + row.json + `}`))
			if len(row.wantErr) > 0 {
				if err == nil {
					t.Fatalf("got nil error, want %q", row.wantErr)
				}
				for _, w := range row.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Edges) != len(row.want) {
				t.Fatalf("got edges %+v, want %+v", c.Edges, row.want)
			}
			for i := range row.want {
				if c.Edges[i] != row.want[i] {
					t.Errorf("edges[%d] = %+v, want %+v", i, c.Edges[i], row.want[i])
				}
			}
		})
	}
	many := `"edges":[`
	for i := range MaxEdges + 1 {
		if i > 0 {
			many += ","
		}
		many += fmt.Sprintf(`{"addr":"10.0.0.%d:7443"}`, i+1)
	}
	if _, err := Parse([]byte(`{"node_id":"gpu-1",` + many + `],"tls":{` + tlsKeys + `}}`)); err == nil || !strings.Contains(err.Error(), "edges: at most 16 edges") {
		t.Errorf("got %v, want the bound on edges", err)
	}
}

// U1: managed[] is validated with errors naming the key path; defaults
// fill the omitted keys; command[0] is resolved at load.
func TestManaged(t *testing.T) {
	ok := `,"managed":[{"name":"llama","command":["true","-m","{model}","--port","{port}"],"models":{"tiny":"tiny.gguf"},"port_range":[21300,21399]}]`
	tests := []struct {
		name, managed string
		want          []string
	}{
		{"U1 minimal entry is valid", ok, nil},
		{"U1 command must carry {port}", `,"managed":[{"name":"l","command":["true","-m","{model}"],"models":{"a":"a.gguf"},"port_range":[21300,21301]}]`,
			[]string{"managed[0].command: no element contains {port}"}},
		{"U1 command required", `,"managed":[{"name":"l","models":{"a":"a"},"port_range":[21300,21301]}]`, []string{"managed[0].command: required"}},
		{"U1 models required", `,"managed":[{"name":"l","command":["x","{port}"],"port_range":[21300,21301]}]`, []string{"managed[0]: set models_dir or models"}},
		{"U1 bad model name", `,"managed":[{"name":"l","command":["x","{port}"],"models":{"../x":"a"},"port_range":[21300,21301]}]`, []string{`managed[0].models: invalid model name "../x"`}},
		{"U1 port range", `,"managed":[{"name":"l","command":["x","{port}"],"models":{"a":"a"},"port_range":[80,70]}]`, []string{"managed[0].port_range: want [first, last] with 1024"}},
		{"U1 port range too small for max_loaded", `,"managed":[{"name":"l","command":["x","{port}"],"models":{"a":"a"},"max_loaded":3,"port_range":[21300,21301]}]`, []string{"managed[0].port_range: holds 2 ports, fewer than max_loaded (3)"}},
		{"U1 overlapping ranges and duplicate names", `,"managed":[{"name":"l","command":["x","{port}"],"models":{"a":"a"},"port_range":[21300,21301]},{"name":"l","command":["x","{port}"],"models":{"a":"a"},"port_range":[21301,21302]}]`,
			[]string{`managed[1].name: "l" is managed[0].name too`, "managed[1].port_range: overlaps managed[0].port_range"}},
		{"U1 negative budget and timeouts", `,"managed":[{"name":"l","command":["x","{port}"],"models":{"a":"a"},"port_range":[21300,21301],"memory_budget_mb":-1,"ready_timeout_ms":-5,"idle_unload_ms":-1}]`,
			[]string{"managed[0].memory_budget_mb: must be ≥ 0", "managed[0].ready_timeout_ms: must be between 1", "managed[0].idle_unload_ms: must be between 1"}},
		{"U1 preload more than max_loaded", `,"managed":[{"name":"l","command":["x","{port}"],"models":{"a":"a","b":"b"},"preload":["a","b"],"port_range":[21300,21301]}]`,
			[]string{"managed[0].preload: 2 models, more than max_loaded (1)"}},
		{"U1 unknown key named", `,"managed":[{"name":"l","command":["x","{port}"],"models":{"a":"a"},"port_range":[21300,21301],"shell":"sh -c"}]`, []string{"managed[0].shell: unknown field"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte("{" + base + tt.managed + "}"))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				m := c.Managed[0]
				if m.HealthPath != "/health" || m.ReadyTimeoutMs != DefaultManagedReadyTimeoutMs || m.IdleUnloadMs != DefaultManagedIdleUnloadMs || m.MaxLoaded != 1 {
					t.Fatalf("defaults not applied: %+v", m)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("U1 load resolves the program and relative model paths", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, "node.json")
		if err := os.WriteFile(p, []byte("{"+base+ok+"}"), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		m := c.Managed[0]
		if !filepath.IsAbs(m.Command[0]) || m.Models["tiny"] != filepath.Join(dir, "tiny.gguf") {
			t.Fatalf("%+v", m)
		}
		bad := strings.Replace(ok, `"true"`, `"./no-such-program"`, 1)
		if err := os.WriteFile(p, []byte("{"+base+bad+"}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "managed[0].command[0]:") {
			t.Fatalf("err %v", err)
		}
	})
}
