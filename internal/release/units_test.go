package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/edge"
	edgeconfig "iop/internal/edge/config"
	"iop/internal/node/config"
	"iop/internal/node/session"
)

// unit is a parsed systemd unit file: section → key → values in order (a
// key may repeat: ExecReload=, SystemCallFilter=).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	sec := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			sec = line[1 : len(line)-1]
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n, line)
			}
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

func (u unit) get(sec, key string) string {
	v := u[sec][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func deployDir(t *testing.T) string { return filepath.Join(repoRoot(t), "deploy") }

// The units' sandbox and lifecycle, per service: a dedicated user that the
// sysusers file creates, the strict sandbox, the state and configuration
// directories, SIGTERM with a stop timeout above the drain (the edge's
// shutdown.drain_timeout_ms + edge.StopOverhead; the node's
// drain_timeout_ms + its cancel grace and write deadline), the edge's
// reload checking the config and then sending SIGHUP (SPEC N2), and
// Restart=on-failure, which S5 makes an availability measure only (the
// node exits 1 on exhaustion, SPEC S4; a clean exit is not restarted).
func TestUnitFiles(t *testing.T) {
	dir := deployDir(t)
	users, err := os.ReadFile(filepath.Join(dir, "sysusers.d", "iop.conf"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file, user, bin string
		drain           time.Duration
		overhead        time.Duration
		reload          bool
	}{
		{"iop-edge.service", "iop-edge", "/opt/iop/current/bin/edge", edgeconfig.DefaultDrainTimeoutMs * time.Millisecond, edge.StopOverhead, true},
		{"iop-node.service", "iop-node", "/opt/iop/current/bin/node", config.DefaultDrainTimeoutMs * time.Millisecond,
			session.DrainCancelGrace + session.DefaultWriteTimeout, false},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			u := parseUnit(t, filepath.Join(dir, "systemd", tc.file))
			want := map[string]string{
				"Type": "exec", "User": tc.user, "Group": tc.user,
				"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
				"PrivateDevices": "yes", "CapabilityBoundingSet": "", "RestrictSUIDSGID": "yes",
				"MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native",
				"ConfigurationDirectory": tc.user, "StateDirectory": tc.user, "StateDirectoryMode": "0700",
				"WorkingDirectory": "/var/lib/" + tc.user, "UMask": "0077",
				"KillSignal": "SIGTERM", "KillMode": "mixed", "Restart": "on-failure",
			}
			for k, w := range want {
				if _, ok := u["Service"][k]; !ok || u.get("Service", k) != w {
					t.Errorf("[Service] %s=%q, want %q", k, u.get("Service", k), w)
				}
			}
			if !strings.HasPrefix(u.get("Service", "ExecStart"), tc.bin+" -config /etc/"+tc.user+"/") {
				t.Errorf("ExecStart=%q, want %s -config /etc/%s/…", u.get("Service", "ExecStart"), tc.bin, tc.user)
			}
			stop, err := time.ParseDuration(u.get("Service", "TimeoutStopSec"))
			if err != nil || stop <= tc.drain+tc.overhead {
				t.Errorf("TimeoutStopSec=%q: want above the drain %v + %v, or systemd kills a drain that would finish", u.get("Service", "TimeoutStopSec"), tc.drain, tc.overhead)
			}
			reload := u["Service"]["ExecReload"]
			if tc.reload {
				wantReload := []string{tc.bin + " -config /etc/" + tc.user + "/edge.json -check", "/bin/kill -HUP $MAINPID"}
				if !slices.Equal(reload, wantReload) {
					t.Errorf("ExecReload=%q, want %q (check, then SIGHUP)", reload, wantReload)
				}
			} else if len(reload) > 0 {
				t.Errorf("ExecReload=%q: the node has no SIGHUP handler (the signal would kill it)", reload)
			}
			if u.get("Unit", "StartLimitIntervalSec") != "300" || u.get("Unit", "StartLimitBurst") != "5" {
				t.Errorf("start limit %q/%q, want 5 in 300 s (a broken config stops restarting)", u.get("Unit", "StartLimitBurst"), u.get("Unit", "StartLimitIntervalSec"))
			}
			if u.get("Install", "WantedBy") != "multi-user.target" {
				t.Errorf("WantedBy=%q", u.get("Install", "WantedBy"))
			}
			if !bytes.Contains(users, []byte("u     "+tc.user+" ")) {
				t.Errorf("sysusers.d/iop.conf does not create %s", tc.user)
			}
		})
	}
}

// systemd itself accepts the units: `systemd-analyze verify` reports
// nothing (it warns about an unknown key on stderr yet exits 0, so any
// output fails). ExecStart names /opt/iop/current, which exists only on an
// installed host: the test points it at stand-in executables and changes
// nothing else.
func TestUnitFilesVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: apt-get install systemd); the unit files were not verified")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range programs {
		if err := os.WriteFile(filepath.Join(bin, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var units []string
	for _, name := range []string{"iop-edge.service", "iop-node.service"} {
		b, err := os.ReadFile(filepath.Join(deployDir(t), "systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("/opt/iop/current/bin/"), []byte(bin+"/"))
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, p)
	}
	out, err := exec.Command(sa, append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The exposure score, for the install page (informational: its scale
	// moves between systemd versions).
	for _, p := range units {
		out, err := exec.Command(sa, "security", "--offline=true", p).CombinedOutput()
		if err != nil {
			t.Logf("systemd-analyze security %s: %v", filepath.Base(p), err)
			continue
		}
		if i := bytes.Index(out, []byte("Overall exposure level")); i >= 0 {
			t.Logf("%s", bytes.TrimSpace(out[i:]))
		}
	}
}

// The example configs in the archive load once the operator has put in
// what only they can (only the files they name are missing until the
// operator copies them): the edge's client key is a placeholder the edge
// refuses, naming it, so an edge started from the example as shipped
// never accepts a key anyone could read in the archive (P4: no secret
// anywhere observable; K9: bad input is named).
func TestExampleConfigs(t *testing.T) {
	dir := filepath.Join(deployDir(t), "examples")
	shipped, err := os.ReadFile(filepath.Join(dir, "edge.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := edgeconfig.Parse(shipped); err == nil || !strings.Contains(err.Error(), "api_keys[0].key_sha256: want 64 lowercase hex") {
		t.Errorf("examples/edge.json as shipped: %v, want its placeholder key refused by name", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(shipped, &doc); err != nil {
		t.Fatal(err)
	}
	doc["api_keys"].([]any)[0].(map[string]any)["key_sha256"] = strings.Repeat("ab", 32) // the operator's hash
	filled, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := edgeconfig.Parse(filled)
	if err != nil {
		t.Fatalf("examples/edge.json with a key hash: %v", err)
	}
	if ec.Shutdown.DrainTimeoutMs != edgeconfig.DefaultDrainTimeoutMs {
		t.Errorf("edge drain %d ms, want %d (the unit's TimeoutStopSec assumes it)", ec.Shutdown.DrainTimeoutMs, edgeconfig.DefaultDrainTimeoutMs)
	}
	nc, err := config.Load(filepath.Join(dir, "node.json"))
	if err != nil {
		t.Fatalf("examples/node.json: %v", err)
	}
	if got := fmt.Sprint(nc.DrainTimeout()); got != "30s" {
		t.Errorf("node drain %s, want 30s (the unit's TimeoutStopSec assumes it)", got)
	}
}
