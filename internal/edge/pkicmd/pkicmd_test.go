package pkicmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iop/internal/identity"
)

// I1: "edge pki" writes the dev PKI and reports it; usage errors exit 2,
// I/O errors and refused overwrites exit 1; no private key is printed.
func TestPKICommand(t *testing.T) {
	tests := []struct {
		name string
		// setup returns the args for dir (a fresh temp dir per row).
		args     func(dir string) []string
		setup    func(t *testing.T, dir string)
		wantCode int
		wantOut  []string // substrings of stdout; "$DIR" is replaced
		wantErr  []string // substrings of stderr
		check    func(t *testing.T, dir, stdout string)
	}{
		{name: "I1 no subcommand", args: func(string) []string { return nil }, wantCode: ExitUsage, wantErr: []string{"missing subcommand", "usage:"}},
		{name: "I1 unknown subcommand", args: func(string) []string { return []string{"make"} }, wantCode: ExitUsage, wantErr: []string{`unknown subcommand "make"`}},
		{name: "I1 init missing -dir", args: func(string) []string { return []string{"init", "-edge", "e", "-node", "n"} },
			wantCode: ExitUsage, wantErr: []string{"missing -dir"}},
		// J1: an edge whose nodes join with tokens needs no node certificate.
		{name: "I1 J1 init without -node writes the CA, the edge and the issuer", args: func(d string) []string { return []string{"init", "-dir", d, "-edge", "e"} },
			wantCode: ExitOK, wantOut: []string{"wrote $DIR/ca.crt", "wrote $DIR/e.crt", "wrote $DIR/issuer.pub"},
			check: func(t *testing.T, _, stdout string) {
				if strings.Contains(stdout, "lease_recipient_public_key") {
					t.Errorf("J1 without -node there is no nodes[] line to paste, but stdout names one:\n%s", stdout)
				}
			}},
		{name: "I1 init unknown flag", args: func(d string) []string { return []string{"init", "-dir", d, "-bogus"} },
			wantCode: ExitUsage, wantErr: []string{"-bogus"}},
		{name: "I1 init stray argument", args: func(d string) []string { return []string{"init", "-dir", d, "-edge", "e", "-node", "n", "extra"} },
			wantCode: ExitUsage, wantErr: []string{`unexpected argument "extra"`}},
		{name: "I1 init bad node name", args: func(d string) []string { return []string{"init", "-dir", d, "-edge", "e", "-node", "a/b"} },
			wantCode: ExitUsage, wantErr: []string{"a/b"}},
		{name: "I1 init bad trust domain", args: func(d string) []string {
			return []string{"init", "-dir", d, "-trust-domain", "Bad", "-edge", "e", "-node", "n"}
		}, wantCode: ExitUsage, wantErr: []string{"trust domain"}},
		{name: "I1 init help", args: func(string) []string { return []string{"init", "-h"} }, wantCode: ExitOK},
		{name: "I1 init success", args: func(d string) []string {
			return []string{"init", "-dir", d, "-trust-domain", "lab.example", "-edge", "edge-1", "-node", "gpu-1", "-node", "gpu-2"}
		}, wantCode: ExitOK,
			wantOut: []string{"wrote $DIR/ca.crt", "wrote $DIR/edge-1.key", "wrote $DIR/gpu-2.recipient.pub", "wrote $DIR/issuer.pub",
				"credentials.issuer_public_key", "lease_recipient_public_key"},
			check: func(t *testing.T, dir, stdout string) {
				for _, n := range []string{"gpu-1", "gpu-2"} {
					pub, err := identity.LoadRecipientPublicKey(filepath.Join(dir, identity.RecipientPubFileName(n)))
					if err != nil {
						t.Fatal(err)
					}
					line := n + `: "lease_recipient_public_key": "` + identity.RecipientPublicKeyBase64(pub) + `"`
					if !strings.Contains(stdout, line) {
						t.Errorf("stdout lacks %q", line)
					}
				}
				c := readCert(t, filepath.Join(dir, "gpu-1.crt"))
				if id, err := identity.FromCertificate(c); err != nil || id.String() != "spiffe://lab.example/node/gpu-1" {
					t.Errorf("gpu-1 SPIFFE ID %v, %v", id, err)
				}
			}},
		{name: "I1 init refuses overwrite", setup: initPKI, args: func(d string) []string {
			return []string{"init", "-dir", d, "-edge", "edge-1", "-node", "gpu-1"}
		}, wantCode: ExitError, wantErr: []string{"ca.crt", "-force"}},
		{name: "I1 init -force overwrites", setup: initPKI, args: func(d string) []string {
			return []string{"init", "-dir", d, "-edge", "edge-1", "-node", "gpu-1", "-force"}
		}, wantCode: ExitOK, wantOut: []string{"wrote $DIR/ca.key"}},
		// C3: a second lease issuer pair for rotation with overlap.
		{name: "C3 issuer new pair", setup: initPKI, args: func(d string) []string { return []string{"issuer", "-dir", d, "-name", "issuer-2"} },
			wantCode: ExitOK, wantOut: []string{"wrote $DIR/issuer-2.key", "wrote $DIR/issuer-2.pub", "credentials.issuer_public_keys"},
			check: func(t *testing.T, dir, stdout string) {
				if _, err := identity.LoadIssuerPrivateKey(filepath.Join(dir, "issuer-2.key")); err != nil {
					t.Error(err)
				}
				if strings.Contains(stdout, "PRIVATE KEY") {
					t.Error("printed private key material")
				}
			}},
		{name: "C3 issuer refuses overwrite", setup: initPKI, args: func(d string) []string { return []string{"issuer", "-dir", d, "-name", "issuer"} },
			wantCode: ExitError, wantErr: []string{"issuer.key", "-force"}},
		{name: "C3 issuer missing -name", args: func(d string) []string { return []string{"issuer", "-dir", d} },
			wantCode: ExitUsage, wantErr: []string{"missing -dir or -name"}},
		{name: "C3 issuer name of the CA refused", setup: initPKI, args: func(d string) []string { return []string{"issuer", "-dir", d, "-name", "ca", "-force"} },
			wantCode: ExitUsage, wantErr: []string{"would overwrite"}},
		{name: "I1 issue new node", setup: initPKI, args: func(d string) []string { return []string{"issue", "-dir", d, "-node", "gpu-9"} },
			wantCode: ExitOK, wantOut: []string{"wrote $DIR/gpu-9.crt", "wrote $DIR/gpu-9.recipient.key", `gpu-9: "lease_recipient_public_key": "`},
			check: func(t *testing.T, dir, _ string) {
				c := readCert(t, filepath.Join(dir, "gpu-9.crt"))
				if id, err := identity.FromCertificate(c); err != nil || id.String() != "spiffe://iop.local/node/gpu-9" {
					t.Errorf("gpu-9 SPIFFE ID %v, %v", id, err)
				}
			}},
		{name: "I1 issue existing node refused", setup: initPKI, args: func(d string) []string { return []string{"issue", "-dir", d, "-node", "gpu-1"} },
			wantCode: ExitError, wantErr: []string{"gpu-1.crt", "-force"}},
		{name: "I1 issue existing node with -force", setup: initPKI, args: func(d string) []string {
			return []string{"issue", "-dir", d, "-node", "gpu-1", "-force"}
		}, wantCode: ExitOK, wantOut: []string{"wrote $DIR/gpu-1.key"}},
		{name: "I1 issue missing -node", setup: initPKI, args: func(d string) []string { return []string{"issue", "-dir", d} },
			wantCode: ExitUsage, wantErr: []string{"exactly one -node"}},
		{name: "I1 issue missing -dir", args: func(string) []string { return []string{"issue", "-node", "n"} },
			wantCode: ExitUsage, wantErr: []string{"missing -dir"}},
		{name: "I1 init several edges, one CA", args: func(d string) []string {
			return []string{"init", "-dir", d, "-edge", "edge-1", "-edge", "edge-2", "-node", "gpu-1"}
		}, wantCode: ExitOK, wantOut: []string{"wrote $DIR/edge-1.crt", "wrote $DIR/edge-2.key"},
			check: func(t *testing.T, dir, _ string) {
				if id, err := identity.FromCertificate(readCert(t, filepath.Join(dir, "edge-2.crt"))); err != nil || id.String() != "spiffe://iop.local/edge/edge-2" {
					t.Errorf("edge-2 SPIFFE ID %v, %v", id, err)
				}
			}},
		{name: "I1 init one name for an edge and a node refused", args: func(d string) []string {
			return []string{"init", "-dir", d, "-edge", "gpu-1", "-node", "gpu-1"}
		}, wantCode: ExitUsage, wantErr: []string{`"gpu-1" named twice`}},
		{name: "I1 issue another edge", setup: initPKI, args: func(d string) []string { return []string{"issue", "-dir", d, "-edge", "edge-2"} },
			wantCode: ExitOK, wantOut: []string{"wrote $DIR/edge-2.crt", "wrote $DIR/edge-2.key"},
			check: func(t *testing.T, dir, _ string) {
				if id, err := identity.FromCertificate(readCert(t, filepath.Join(dir, "edge-2.crt"))); err != nil || id.String() != "spiffe://iop.local/edge/edge-2" {
					t.Errorf("edge-2 SPIFFE ID %v, %v", id, err)
				}
			}},
		{name: "I1 issue an edge under a node's name refused", setup: initPKI, args: func(d string) []string {
			return []string{"issue", "-dir", d, "-edge", "gpu-1", "-force"}
		}, wantCode: ExitUsage, wantErr: []string{"holds the node certificate"}},
		{name: "I1 issue -edge and -node refused", setup: initPKI, args: func(d string) []string {
			return []string{"issue", "-dir", d, "-edge", "e", "-node", "n"}
		}, wantCode: ExitUsage, wantErr: []string{"-edge or -node, not both"}},
		{name: "S3 issue without a CA", args: func(d string) []string { return []string{"issue", "-dir", d, "-node", "n"} },
			wantCode: ExitError, wantErr: []string{filepath.Join("ca.crt")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.setup != nil {
				tt.setup(t, dir)
			}
			var stdout, stderr bytes.Buffer
			code := Main(tt.args(dir), &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, &stdout, &stderr)
			}
			for _, w := range tt.wantOut {
				if w = strings.ReplaceAll(w, "$DIR", dir); !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, &stdout)
				}
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, &stderr)
				}
			}
			noPrivateKeys(t, dir, stdout.String()+stderr.String())
			if tt.check != nil {
				tt.check(t, dir, stdout.String())
			}
		})
	}
}

func initPKI(t *testing.T, dir string) {
	t.Helper()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
		t.Fatal(err)
	}
}

// noPrivateKeys fails if out holds a PEM private key header or any body
// line of a private key file in dir.
func noPrivateKeys(t *testing.T, dir, out string) {
	t.Helper()
	if strings.Contains(out, "PRIVATE KEY") {
		t.Fatalf("output contains a PEM private key:\n%s", out)
	}
	keys, _ := filepath.Glob(filepath.Join(dir, "*.key"))
	for _, k := range keys {
		b, err := os.ReadFile(k)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if len(line) > 16 && !strings.HasPrefix(line, "-----") && strings.Contains(out, line) {
				t.Fatalf("output contains key material of %s", k)
			}
		}
	}
}
