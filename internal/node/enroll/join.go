// Package enroll is the node's side of joining and certificate renewal
// (SPEC J1-J5): `node join` makes the node's own TLS key and lease
// recipient key, checks the edge against the CA its join token pins
// before sending anything, sends a CSR with the token, and writes the
// answer — node.json, the certificate, the CA, the issuer public key and
// the keys — into a new directory in one step; Renewer renews the
// certificate over the live session.
//
// Private keys are made here and never leave the node: only a CSR and a
// public key are sent. It never prints a token's secret or a key, and a
// failed join leaves no file behind.
package enroll

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"iop/internal/identity"
	"iop/internal/storefile"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// Files of a joined node's directory.
const (
	ConfigFile       = "node.json"
	CertFile         = "node.crt"
	KeyFile          = "node.key"
	CAFile           = "ca.crt"
	RecipientKeyFile = "recipient.key"
	IssuerPubFile    = "issuer.pub"
)

// Bounds of a join (SPEC J4 on the node's side).
const (
	DialTimeout      = 10 * time.Second
	HandshakeTimeout = 5 * time.Second
	// AnswerTimeout bounds the wait for the edge's answer after the request.
	AnswerTimeout = 20 * time.Second
	// MaxAnswer caps the answer frame.
	MaxAnswer = 64 << 10
)

// JoinOptions configure Join.
type JoinOptions struct {
	// Edge is the edge's node_listen, host:port.
	Edge string
	// Token is the line `edge tokens create` printed (its -token value).
	Token string
	// Dir is written: it must not exist or be an empty directory.
	Dir string
	// Name is the node name to ask for; "" = the name a token for one
	// node carries (edge tokens create -node), else this host's name
	// (letters, digits, '.', '_', '-'; other characters become '-'). A
	// Name that disagrees with the token's is refused before dialling.
	Name string
	// Version is sent to the edge (informational).
	Version string
	// Now is the clock the edge's certificate is checked at; nil = time.Now.
	Now func() time.Time
	// Dial overrides the TCP dial (tests); nil = net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Result is what a join wrote.
type Result struct {
	Node, Edge, TrustDomain string
	ConfigPath              string
	NotAfter                time.Time
	// Credentials: the edge sent a lease issuer key, so node.json names
	// the credential plane's keys.
	Credentials bool
}

// Errors of Join; test with errors.Is. The edge's own refusal comes as
// ErrRefused with its reason.
var (
	ErrBadDir  = errors.New("join: target directory")
	ErrRefused = errors.New("join: the edge refused")
	ErrConnect = errors.New("join: connecting to the edge")
	ErrAnswer  = errors.New("join: the edge's answer")
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// HostName is this host's name as a node name: characters outside
// letters, digits, '.', '_', '-' become '-', at most 63.
func HostName() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	b := []byte(h)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b[:min(len(b), 63)]), ".-_")
}

// Join enrolls this host as a node (SPEC J1-J3). In order: the token is
// parsed and Dir checked (absent or empty; its parent is created), the
// temporary directory beside Dir that will become it is made, the edge is
// dialled offering identity.JoinALPN and accepted only if its CA matches
// the token's pin, the node's keys are made and written into the temporary
// directory, the request is sent and the answer checked (the certificate
// is for this key and name, the CA is the one the handshake showed), and
// the other files are written there before it is renamed to Dir. A
// directory the node cannot write therefore fails before the request
// uses the token. On any error nothing is left at Dir (an empty Dir that
// existed stays empty) and the temporary directory is removed.
func Join(ctx context.Context, o JoinOptions) (Result, error) {
	tok, err := identity.ParseJoinToken(o.Token)
	if err != nil {
		return Result{}, err
	}
	switch {
	case o.Name != "" && tok.Node != "" && o.Name != tok.Node: // J1: the edge would refuse it too, after a dial
		return Result{}, fmt.Errorf("join: -name %q disagrees with the token, which is for node %q: drop -name, or make a token with -node %q",
			o.Name, tok.Node, o.Name)
	case o.Name == "" && tok.Node != "":
		o.Name = tok.Node
	case o.Name == "":
		o.Name = HostName()
	}
	if !nameRE.MatchString(o.Name) {
		return Result{}, fmt.Errorf("join: invalid node name %q (1-63 of letters, digits, '.', '_', '-'; set -name)", o.Name)
	}
	if host, port, err := net.SplitHostPort(o.Edge); err != nil || host == "" || port == "" {
		return Result{}, fmt.Errorf("join: -edge %q: want host:port of the edge's node_listen", o.Edge)
	}
	if err := checkDir(o.Dir); err != nil {
		return Result{}, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	out, err := newDirWriter(o.Dir)
	if err != nil {
		return Result{}, err
	}
	defer out.abandon()
	id := identity.ID{Role: identity.RoleNode, Name: o.Name}
	conn, edge, ca, err := dialEdge(ctx, o, tok.Pin)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	id.TrustDomain = edge.TrustDomain
	key, err := identity.NewNodeKey(id)
	if err != nil {
		return Result{}, err
	}
	defer clear(key.KeyPEM)
	rk, err := identity.NewRecipientKey()
	if err != nil {
		return Result{}, err
	}
	defer clear(rk.KeyPEM)
	if err := out.write(dirFile{KeyFile, key.KeyPEM, 0o600}, dirFile{RecipientKeyFile, rk.KeyPEM, 0o600}); err != nil {
		return Result{}, err
	}
	resp, err := exchange(conn, &iop.NodeJoinRequest{TokenId: tok.ID, TokenSecret: tok.Secret, NodeName: o.Name,
		Csr: key.CSR, LeaseRecipientPublicKey: rk.Public.Bytes(), Version: o.Version})
	if err != nil {
		return Result{}, err
	}
	cert, err := checkAnswer(resp, id, key.CSR, ca)
	if err != nil {
		return Result{}, err
	}
	files := []dirFile{
		{CertFile, resp.GetCertificatePem(), 0o644},
		{CAFile, identity.CertificatePEM(ca.Raw), 0o644},
	}
	res := Result{Node: o.Name, Edge: edge.Name, TrustDomain: edge.TrustDomain, NotAfter: cert.NotAfter,
		ConfigPath: filepath.Join(o.Dir, ConfigFile)}
	if pub := resp.GetIssuerPublicKey(); len(pub) > 0 {
		pemBytes, err := identity.IssuerPublicKeyPEM(pub)
		if err != nil {
			return Result{}, fmt.Errorf("%w: issuer public key: %w", ErrAnswer, err)
		}
		files = append(files, dirFile{IssuerPubFile, pemBytes, 0o644})
		res.Credentials = true
	}
	nodeJSON, err := nodeConfig(o.Name, o.Edge, edge, res.Credentials)
	if err != nil {
		return Result{}, err
	}
	files = append(files, dirFile{ConfigFile, nodeJSON, 0o644})
	if err := out.write(files...); err != nil {
		return Result{}, err
	}
	if err := out.commit(); err != nil {
		return Result{}, err
	}
	return res, nil
}

// checkDir accepts a Dir that does not exist (its parent is created) or is
// an empty directory.
func checkDir(dir string) error {
	if dir == "" {
		return fmt.Errorf("%w: -dir is required", ErrBadDir)
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(filepath.Clean(dir)), 0o755); err != nil {
			return fmt.Errorf("%w: %w", ErrBadDir, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("%w: %w", ErrBadDir, err)
	case len(entries) > 0:
		return fmt.Errorf("%w: %s is not empty (a node joins into a new directory; remove it or choose another)", ErrBadDir, dir)
	}
	return nil
}

// dialEdge connects and handshakes with the join ALPN; the edge must show
// the pinned CA (identity.CheckJoinPeer) before anything is sent.
func dialEdge(ctx context.Context, o JoinOptions, pin string) (*tls.Conn, identity.ID, *x509.Certificate, error) {
	dial := o.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	raw, err := dial(dctx, "tcp", o.Edge)
	cancel()
	if err != nil {
		return nil, identity.ID{}, nil, fmt.Errorf("%w %s: %w", ErrConnect, o.Edge, err)
	}
	tc := tls.Client(raw, identity.JoinClientConfig(pin, o.Now))
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		raw.Close()
		if errors.Is(err, identity.ErrPinMismatch) {
			return nil, identity.ID{}, nil, fmt.Errorf("%w %s: nothing was sent: %w", ErrConnect, o.Edge, err)
		}
		return nil, identity.ID{}, nil, fmt.Errorf("%w %s: TLS handshake: %w", ErrConnect, o.Edge, err)
	}
	edge, ca, err := identity.CheckJoinPeer(tc.ConnectionState(), pin, o.Now())
	if err != nil {
		raw.Close()
		return nil, identity.ID{}, nil, fmt.Errorf("%w %s: %w", ErrConnect, o.Edge, err)
	}
	return tc, edge, ca, nil
}

// exchange sends the request and reads the answer.
func exchange(conn *tls.Conn, req *iop.NodeJoinRequest) (*iop.NodeJoinResponse, error) {
	conn.SetDeadline(time.Now().Add(AnswerTimeout))
	if err := wire.NewWriter(conn, fleetRequestCap).WriteEnvelope(&iop.Envelope{Kind: &iop.Envelope_JoinRequest{JoinRequest: req}}); err != nil {
		return nil, fmt.Errorf("%w: sending the request: %w", ErrConnect, err)
	}
	var env iop.Envelope
	if err := wire.NewReader(conn, MaxAnswer).ReadEnvelope(&env); err != nil {
		return nil, fmt.Errorf("%w: reading it: %w (an edge that closes at once may serve no joins: an older build)", ErrAnswer, err)
	}
	resp := env.GetJoinResponse()
	if resp == nil {
		return nil, fmt.Errorf("%w: not a NodeJoinResponse", ErrAnswer)
	}
	if !resp.GetOk() {
		return nil, fmt.Errorf("%w: %s", ErrRefused, resp.GetError())
	}
	return resp, nil
}

// fleetRequestCap is the edge's cap on the request frame (fleet.MaxJoinRequest).
const fleetRequestCap = 16 << 10

// checkAnswer checks the granted certificate: it parses, names id, holds
// the public key of csr, is signed by the CA the handshake showed, and
// that CA is the one the answer carries.
func checkAnswer(resp *iop.NodeJoinResponse, id identity.ID, csrDER []byte, ca *x509.Certificate) (*x509.Certificate, error) {
	cert, err := identity.ParseCertificatePEM(resp.GetCertificatePem())
	if err != nil {
		return nil, fmt.Errorf("%w: certificate: %w", ErrAnswer, err)
	}
	if got, err := identity.FromCertificate(cert); err != nil || got != id {
		return nil, fmt.Errorf("%w: the certificate names %v (%v), want %s", ErrAnswer, got, err, id)
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, err
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := cert.PublicKey.(equaler); !ok || !pub.Equal(csr.PublicKey) {
		return nil, fmt.Errorf("%w: the certificate is not for this node's key", ErrAnswer)
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("%w: the certificate is not signed by the pinned CA: %w", ErrAnswer, err)
	}
	if got, err := identity.ParseCertificatePEM(resp.GetCaPem()); err != nil || !bytes.Equal(got.Raw, ca.Raw) {
		return nil, fmt.Errorf("%w: the CA it sent is not the one its handshake showed", ErrAnswer)
	}
	return cert, nil
}

// nodeConfig is the node.json a join writes: paths relative to its
// directory, reconnecting until stopped (a joined node is a service).
func nodeConfig(name, edgeAddr string, edge identity.ID, creds bool) ([]byte, error) {
	type tlsCfg struct {
		CertFile         string `json:"cert_file"`
		KeyFile          string `json:"key_file"`
		CAFile           string `json:"ca_file"`
		TrustDomain      string `json:"trust_domain"`
		ExpectedEdgeName string `json:"expected_edge_name"`
	}
	type credCfg struct {
		RecipientPrivateKeyFile string `json:"recipient_private_key_file"`
		IssuerPublicKey         string `json:"issuer_public_key"`
	}
	cfg := struct {
		NodeID      string         `json:"node_id"`
		EdgeAddr    string         `json:"edge_addr"`
		TLS         tlsCfg         `json:"tls"`
		Reconnect   map[string]int `json:"reconnect"`
		Credentials *credCfg       `json:"credentials,omitempty"`
	}{
		NodeID: name, EdgeAddr: edgeAddr,
		TLS:       tlsCfg{CertFile: CertFile, KeyFile: KeyFile, CAFile: CAFile, TrustDomain: edge.TrustDomain, ExpectedEdgeName: edge.Name},
		Reconnect: map[string]int{"interval_sec": 5, "max_attempts": 0},
	}
	if creds {
		cfg.Credentials = &credCfg{RecipientPrivateKeyFile: RecipientKeyFile, IssuerPublicKey: IssuerPubFile}
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

type dirFile struct {
	name string
	data []byte
	mode fs.FileMode
}

// dirWriter fills a new temporary directory beside dir (mode 0700) and
// renames it to dir (rename(2) replaces an empty directory), so dir holds
// every file or none (SPEC J3).
type dirWriter struct {
	dir, tmp string
	done     bool
}

// newDirWriter makes the temporary directory beside dir.
func newDirWriter(dir string) (*dirWriter, error) {
	dir = filepath.Clean(dir)
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".join-*")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDir, err)
	}
	return &dirWriter{dir: dir, tmp: tmp}, nil
}

// write creates files in the temporary directory.
func (w *dirWriter) write(files ...dirFile) error {
	for _, f := range files {
		if err := storefile.Create(filepath.Join(w.tmp, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("%w: %w", ErrBadDir, err)
		}
	}
	return nil
}

// commit syncs the temporary directory and renames it to dir.
func (w *dirWriter) commit() error {
	if err := storefile.SyncDir(w.tmp); err != nil {
		return fmt.Errorf("%w: %w", ErrBadDir, err)
	}
	// syscall.Rename, not os.Rename: os.Rename refuses any existing
	// directory as the target, rename(2) replaces an empty one atomically
	// (and fails on one that is not empty).
	if err := syscall.Rename(w.tmp, w.dir); err != nil {
		return fmt.Errorf("%w: rename %s to %s: %w (is %s still empty?)", ErrBadDir, w.tmp, w.dir, err, w.dir)
	}
	w.done = true
	return storefile.SyncDir(filepath.Dir(w.dir))
}

// abandon removes the temporary directory unless commit renamed it.
func (w *dirWriter) abandon() {
	if !w.done {
		os.RemoveAll(w.tmp)
	}
}
