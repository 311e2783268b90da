package enroll

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/identity"
	"iop/internal/leakcheck"
	nodeconfig "iop/internal/node/config"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// fakeEdge serves join connections as the edge does (identity's join TLS
// config) and answers with answer; it counts connections and requests.
type fakeEdge struct {
	addr      string
	pki       string
	ca        *identity.CA
	conns     atomic.Int32
	requests  atomic.Int32
	mu        sync.Mutex
	answer    func(*iop.NodeJoinRequest) *iop.NodeJoinResponse
	lastTaken *iop.NodeJoinRequest
}

func newFakeEdge(t *testing.T) *fakeEdge {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: "edge-1"}); err != nil {
		t.Fatal(err)
	}
	ca, err := identity.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := identity.ServerConfig(identity.ServerOptions{CertFile: filepath.Join(dir, "edge-1.crt"), KeyFile: filepath.Join(dir, "edge-1.key"),
		CAFile: filepath.Join(dir, "ca.crt"), AllowNode: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	srv = identity.JoinServerConfig(srv, ca.Cert)
	f := &fakeEdge{pki: dir, ca: ca}
	f.answer = f.grant
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				tc := tls.Server(c, srv)
				if tc.Handshake() != nil {
					return
				}
				var env iop.Envelope
				if wire.NewReader(tc, 1<<16).ReadEnvelope(&env) != nil {
					return
				}
				f.requests.Add(1)
				f.mu.Lock()
				f.lastTaken = env.GetJoinRequest()
				answer := f.answer
				f.mu.Unlock()
				wire.NewWriter(tc, 1<<16).WriteEnvelope(&iop.Envelope{Kind: &iop.Envelope_JoinResponse{JoinResponse: answer(env.GetJoinRequest())}})
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return f
}

// grant signs the request's CSR as the edge does.
func (f *fakeEdge) grant(req *iop.NodeJoinRequest) *iop.NodeJoinResponse {
	id := identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: req.GetNodeName()}
	der, err := f.ca.SignNode(req.GetCsr(), id, time.Now(), time.Hour)
	if err != nil {
		return &iop.NodeJoinResponse{Error: err.Error()}
	}
	return &iop.NodeJoinResponse{Ok: true, NodeName: id.Name, TrustDomain: "iop.local", EdgeName: "edge-1",
		CertificatePem: identity.CertificatePEM(der), CaPem: identity.CertificatePEM(f.ca.Cert.Raw),
		IssuerPublicKey: make([]byte, 32), NotAfterUnixMs: time.Now().Add(time.Hour).UnixMilli()}
}

func (f *fakeEdge) token(t *testing.T) string {
	tok, err := identity.NewJoinToken(identity.CAPin(f.ca.Cert))
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// J2 J3: a granted join leaves a directory a node starts from: node.json
// naming the certificate, key, CA and lease keys, private keys mode 0600;
// the private keys never travelled (the request carried a CSR and a
// public key only).
func TestJoinWritesANodeDirectory(t *testing.T) {
	leakcheck.Check(t)
	f := newFakeEdge(t)
	dir := filepath.Join(t.TempDir(), "hosts", "gpu-3")
	res, err := Join(context.Background(), JoinOptions{Edge: f.addr, Token: f.token(t), Dir: dir, Name: "gpu-3"})
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if res.Node != "gpu-3" || res.Edge != "edge-1" || !res.Credentials {
		t.Errorf("result %+v", res)
	}
	for name, want := range map[string]os.FileMode{CertFile: 0o644, KeyFile: 0o600, CAFile: 0o644, RecipientKeyFile: 0o600,
		IssuerPubFile: 0o644, ConfigFile: 0o644} {
		if got := mode(t, filepath.Join(dir, name)); got != want {
			t.Errorf("J2 %s mode %v, want %v", name, got, want)
		}
	}
	cfg, err := nodeconfig.Load(filepath.Join(dir, ConfigFile))
	if err != nil {
		t.Fatalf("J3 node.json: %v", err)
	}
	if cfg.NodeID != "gpu-3" || cfg.EdgeAddr != f.addr || cfg.TLS.ExpectedEdgeName != "edge-1" || cfg.MaxAttempts() != 0 {
		t.Errorf("node.json: %+v", cfg)
	}
	if _, err := identity.ClientConfig(identity.ClientOptions{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.CAFile,
		TrustDomain: cfg.TLS.TrustDomain, ExpectedEdgeName: cfg.TLS.ExpectedEdgeName, NodeName: cfg.NodeID}); err != nil {
		t.Errorf("J3 the written TLS files do not make a client config: %v", err)
	}
	if _, err := identity.LoadRecipientPrivateKey(cfg.Credentials.RecipientPrivateKeyFile); err != nil {
		t.Errorf("recipient key: %v", err)
	}
	key, _ := os.ReadFile(filepath.Join(dir, KeyFile))
	rkey, _ := os.ReadFile(filepath.Join(dir, RecipientKeyFile))
	f.mu.Lock()
	req := f.lastTaken
	f.mu.Unlock()
	for _, b := range [][]byte{req.GetCsr(), req.GetLeaseRecipientPublicKey(), []byte(req.GetTokenSecret())} {
		if strings.Contains(string(b), string(key)) || strings.Contains(string(b), string(rkey)) {
			t.Error("J2 a private key was sent")
		}
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".*"))
	if len(leftovers) > 0 {
		t.Errorf("J3 temporary files left: %v", leftovers)
	}
}

// J3: an empty directory that exists (made beforehand, as install.md's
// state directory is) is replaced by the joined one in the one rename; a
// join must not be granted, using the token, and then fail to write it.
func TestJoinIntoAnEmptyDirectory(t *testing.T) {
	leakcheck.Check(t)
	f := newFakeEdge(t)
	dir := filepath.Join(t.TempDir(), "gpu-3")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Join(context.Background(), JoinOptions{Edge: f.addr, Token: f.token(t), Dir: dir, Name: "gpu-3"}); err != nil {
		t.Fatalf("J3 Join into an existing empty directory: %v", err)
	}
	if _, err := nodeconfig.Load(filepath.Join(dir, ConfigFile)); err != nil {
		t.Errorf("J3 node.json: %v", err)
	}
	if got := mode(t, dir); got != 0o700 {
		t.Errorf("J3 the directory's mode is %v, want 0700 (it holds private keys)", got)
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".*"))
	if len(leftovers) > 0 {
		t.Errorf("J3 temporary files left: %v", leftovers)
	}
}

// J1 J3: every failed join leaves nothing at the directory (an empty one
// that existed stays empty): the edge refusing, an edge whose CA is not
// the pinned one (nothing is even sent), an answer for another key, a
// directory in use (nothing is even dialled).
func TestJoinFailsCleanly(t *testing.T) {
	leakcheck.Check(t)
	f := newFakeEdge(t)
	other := newFakeEdge(t)
	for _, tt := range []struct {
		name      string
		token     func() string
		answer    func(*iop.NodeJoinRequest) *iop.NodeJoinResponse
		prepare   func(dir string)
		want      error
		wantText  string
		noRequest bool
		noDial    bool
		dir       string // the directory's name; "" = gpu-3
	}{
		{name: "J1 the edge refuses", answer: func(*iop.NodeJoinRequest) *iop.NodeJoinResponse {
			return &iop.NodeJoinResponse{Error: "join token expired (token x)"}
		}, want: ErrRefused, wantText: "join token expired"},
		{name: "J1 a token pinned to another CA sends nothing", token: func() string { return other.token(t) },
			want: identity.ErrPinMismatch, noRequest: true},
		{name: "J2 an answer for another key", answer: func(req *iop.NodeJoinRequest) *iop.NodeJoinResponse {
			k, _ := identity.NewNodeKey(identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: req.GetNodeName()})
			req.Csr = k.CSR
			return f.grant(req)
		}, want: ErrAnswer, wantText: "not for this node's key"},
		{name: "J3 an empty directory that exists stays empty", prepare: func(dir string) { os.Mkdir(dir, 0o700) },
			answer: func(*iop.NodeJoinRequest) *iop.NodeJoinResponse { return &iop.NodeJoinResponse{Error: "no"} }, want: ErrRefused},
		{name: "J3 a directory in use is refused before dialling", prepare: func(dir string) {
			os.Mkdir(dir, 0o700)
			os.WriteFile(filepath.Join(dir, "node.json"), []byte("{}"), 0o600)
		}, want: ErrBadDir, noDial: true},
		{name: "J1 a malformed token is refused before dialling", token: func() string { return "iop1.abc" },
			want: identity.ErrBadJoinToken, noDial: true},
		// The temporary directory beside Dir cannot be made (its name,
		// "."+Dir's+".join-…", is over the 255 bytes a name may have): the
		// failure comes before the request, so the token is not used and
		// the edge records no node that has no files.
		{name: "J3 a directory the node cannot write fails before the request", dir: strings.Repeat("g", 245),
			want: ErrBadDir, noDial: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f.mu.Lock()
			f.answer = f.grant
			if tt.answer != nil {
				f.answer = tt.answer
			}
			f.mu.Unlock()
			dir := filepath.Join(t.TempDir(), cmp.Or(tt.dir, "gpu-3"))
			if tt.prepare != nil {
				tt.prepare(dir)
			}
			before, _ := os.ReadDir(dir)
			tok := f.token(t)
			if tt.token != nil {
				tok = tt.token()
			}
			conns, reqs := f.conns.Load()+other.conns.Load(), f.requests.Load()+other.requests.Load()
			_, err := Join(context.Background(), JoinOptions{Edge: f.addr, Token: tok, Dir: dir, Name: "gpu-3"})
			if !errors.Is(err, tt.want) || !strings.Contains(errString(err), tt.wantText) {
				t.Fatalf("got %v, want %v with %q", err, tt.want, tt.wantText)
			}
			after, statErr := os.ReadDir(dir)
			if len(after) != len(before) || (len(before) == 0 && tt.prepare == nil && statErr == nil) {
				t.Errorf("J3 the directory changed: %d entries before, %d after (%v)", len(before), len(after), statErr)
			}
			leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".*"))
			if len(leftovers) > 0 {
				t.Errorf("J3 temporary files left: %v", leftovers)
			}
			if tt.noRequest && f.requests.Load()+other.requests.Load() != reqs {
				t.Error("J1 the node sent its request to an edge that failed the pin")
			}
			if tt.noDial && f.conns.Load()+other.conns.Load() != conns {
				t.Error("the node dialled although it could tell the join would fail")
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// J5: Install writes the pair the renewal answered, refuses a certificate
// for another key without touching the files, and Recover finishes an
// install a crash cut between the certificate and the key.
func TestRenewer(t *testing.T) {
	f := newFakeEdge(t)
	dir := filepath.Join(t.TempDir(), "n")
	if _, err := Join(context.Background(), JoinOptions{Edge: f.addr, Token: f.token(t), Dir: dir, Name: "gpu-3"}); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	id := identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: "gpu-3"}
	r := NewRenewer(id, certFile, keyFile)
	at, err := r.RenewAt()
	if err != nil {
		t.Fatal(err)
	}
	notAfter, _ := r.NotAfter()
	if d := notAfter.Sub(at); d < 19*time.Minute || d > 26*time.Minute {
		t.Errorf("J5 an hour's certificate is due %v before it expires, want about a third of its validity", d)
	}
	oldCert, _ := os.ReadFile(certFile)
	oldKey, _ := os.ReadFile(keyFile)
	if err := r.Install(oldCert); !errors.Is(err, ErrNoRequest) {
		t.Errorf("Install without a request: %v", err)
	}
	csr, err := r.NewRequest()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Install(oldCert); err == nil {
		t.Fatal("J5 a certificate for the old key was installed with the new key")
	}
	if c, _ := os.ReadFile(certFile); string(c) != string(oldCert) {
		t.Fatal("J5 a refused install changed the certificate")
	}
	der, err := f.ca.SignNode(csr, id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Install(identity.CertificatePEM(der)); err != nil {
		t.Fatalf("J5 Install: %v", err)
	}
	newCert, _ := os.ReadFile(certFile)
	newKey, _ := os.ReadFile(keyFile)
	if _, err := tls.X509KeyPair(newCert, newKey); err != nil || string(newKey) == string(oldKey) {
		t.Fatalf("J5 after Install: pair %v, key replaced %v", err, string(newKey) != string(oldKey))
	}
	if mode(t, keyFile) != 0o600 {
		t.Error("J5 the renewed key is not mode 0600")
	}

	// A crash after the certificate, before the key: Recover completes it.
	os.WriteFile(keyFile+".next", newKey, 0o600)
	os.WriteFile(keyFile, oldKey, 0o600)
	if err := Recover(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	if k, _ := os.ReadFile(keyFile); string(k) != string(newKey) {
		t.Error("J5 Recover did not put the key that belongs to the certificate in place")
	}
	// A crash before the certificate: the stray key goes.
	os.WriteFile(keyFile+".next", oldKey, 0o600)
	if err := Recover(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(keyFile + ".next"); !errors.Is(err, os.ErrNotExist) {
		t.Error("J5 Recover left a key that belongs to no certificate")
	}
	if k, _ := os.ReadFile(keyFile); string(k) != string(newKey) {
		t.Error("J5 Recover replaced a good key")
	}
}

// J1: without -name a node joins as the node its token is for (edge tokens
// create -node); a -name that disagrees is refused before anything is
// dialled, naming both; a token for a prefix (no node in it) keeps the
// host's name.
func TestJoinNameFromToken(t *testing.T) {
	leakcheck.Check(t)
	f := newFakeEdge(t)
	tok, err := identity.NewJoinToken(identity.CAPin(f.ca.Cert))
	if err != nil {
		t.Fatal(err)
	}
	forNode := tok
	forNode.Node = "gpu-9"
	host := HostName()
	cases := []struct {
		name, token, flag, want, wantErr string
	}{
		{"J1 a -node token without -name joins as its node", forNode.String(), "", "gpu-9", ""},
		{"J1 a -node token with the same -name", forNode.String(), "gpu-9", "gpu-9", ""},
		{"J1 a -name that disagrees with the token is refused naming both", forNode.String(), "gpu-1", "", `-name "gpu-1" disagrees with the token, which is for node "gpu-9"`},
		{"J1 a -prefix token without -name keeps the host name", tok.String(), "", host, ""},
		{"J1 a -prefix token with -name", tok.String(), "gpu-4", "gpu-4", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := f.conns.Load()
			dir := filepath.Join(t.TempDir(), "node")
			res, err := Join(context.Background(), JoinOptions{Edge: f.addr, Token: tc.token, Dir: dir, Name: tc.flag})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("J1: %v, want an error with %s", err, tc.wantErr)
				}
				if f.conns.Load() != before {
					t.Errorf("J1: the refused name was dialled")
				}
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("J3: %s exists after a refused join", dir)
				}
				return
			}
			if err != nil {
				t.Fatalf("J1: %v", err)
			}
			f.mu.Lock()
			asked := f.lastTaken.GetNodeName()
			f.mu.Unlock()
			if res.Node != tc.want || asked != tc.want {
				t.Fatalf("J1: joined as %q (asked %q), want %q", res.Node, asked, tc.want)
			}
		})
	}
}
