package fleet

import (
	"context"
	"crypto/ecdh"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/limit"
	"iop/internal/identity"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// Bounds of a join connection (SPEC J4): whoever reaches node_listen can
// open one, so it is treated like any unauthenticated peer.
const (
	// JoinTimeout bounds the exchange after the TLS handshake: one request
	// read, the decision (a store rewrite and a signature), one answer.
	JoinTimeout = 10 * time.Second
	// MaxJoinRequest caps the request frame (a CSR is about 400 bytes).
	MaxJoinRequest = 16 << 10
	// MaxConcurrentJoins bounds joins being decided at once.
	MaxConcurrentJoins = 4
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidNodeName reports whether name may join (SPEC J1): 1-63 of letters,
// digits, '.', '_', '-', starting with a letter or digit.
func ValidNodeName(name string) bool { return nameRE.MatchString(name) }

// ServeJoin answers one join connection (SPEC J1, J2, J4): its TLS
// handshake is done and negotiated identity.JoinALPN. It reads one
// NodeJoinRequest (at most MaxJoinRequest bytes, within JoinTimeout),
// answers one NodeJoinResponse and returns; the caller closes conn. A join
// beyond MaxConcurrentJoins at once or enrollment.joins_per_minute is
// answered "busy" without reading further. Refusals are logged at most a
// few lines a second (anyone can cause them).
func (f *Fleet) ServeJoin(conn net.Conn) {
	now := f.o.Now()
	conn.SetDeadline(time.Now().Add(JoinTimeout))
	m := f.material()
	remote := conn.RemoteAddr().String()
	answer := func(resp *iop.NodeJoinResponse) {
		_ = wire.NewWriter(conn, wire.DefaultPreReadyCap).WriteEnvelope(&iop.Envelope{Kind: &iop.Envelope_JoinResponse{JoinResponse: resp}})
	}
	slot, err := f.joins.Acquire("join", limit.KeyLimit{MaxConcurrent: MaxConcurrentJoins, RequestsPerMinute: m.joinsPerMin}, now)
	if err != nil {
		var re *limit.RefusedError
		wait := time.Second
		if errors.As(err, &re) {
			wait = re.RetryAfter
		}
		f.refused(remote, "", fmt.Errorf("too many joins at once or this minute (enrollment.joins_per_minute); retry in %v", wait.Round(time.Second)))
		answer(&iop.NodeJoinResponse{Error: fmt.Sprintf("edge busy: too many joins; retry in %v", wait.Round(time.Second))})
		return
	}
	defer slot.Release()
	var env iop.Envelope
	if err := wire.NewReader(conn, MaxJoinRequest).ReadEnvelope(&env); err != nil {
		f.refused(remote, "", fmt.Errorf("reading the join request: %w", err))
		answer(&iop.NodeJoinResponse{Error: "join request unreadable: " + err.Error()})
		return
	}
	req := env.GetJoinRequest()
	if req == nil {
		f.refused(remote, "", errors.New("the first frame is not a NodeJoinRequest"))
		answer(&iop.NodeJoinResponse{Error: "the first frame of a join connection must be NodeJoinRequest"})
		return
	}
	resp, err := f.join(m, req, now)
	if err != nil {
		f.refused(remote, req.GetNodeName(), err)
		answer(&iop.NodeJoinResponse{Error: err.Error()})
		return
	}
	if w := f.o.WaitApplied; w != nil {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(JoinTimeout/2))
		w(ctx) // the node may connect as soon as it has its answer
		cancel()
	}
	f.log.Info("node joined", "node", resp.GetNodeName(), "token", req.GetTokenId(), "remote", remote,
		"not_after", time.UnixMilli(resp.GetNotAfterUnixMs()).UTC().Format(time.RFC3339))
	answer(resp)
}

func (f *Fleet) refused(remote, node string, err error) {
	if ok, suppressed := f.joinLog.Allow(f.o.Now()); ok {
		f.log.Warn("node join refused", "remote", remote, "node", peerText(node), "err", err, "suppressed", suppressed)
	}
}

// maxPeerText is how many bytes of a name the peer sent a refusal quotes
// (a valid node name has at most 63).
const maxPeerText = 64

// peerText is s as a refusal may quote it (SPEC J4: the peer chose it):
// at most maxPeerText bytes, valid UTF-8, "…" when cut.
func peerText(s string) string {
	if len(s) <= maxPeerText {
		return strings.ToValidUTF8(s, "")
	}
	return strings.ToValidUTF8(s[:maxPeerText], "") + "…"
}

// ErrEnrollmentOff: the edge serves no joins or renewals
// (enrollment.ca_key_file is not set).
var ErrEnrollmentOff = errors.New("enrollment is off on this edge (its config sets no enrollment.ca_key_file)")

// join decides one request and, when it is granted, records it and
// signs the certificate. Everything that can be checked without the store
// is checked first, then the token, then the config; the store is
// rewritten only for a granted join, and the certificate exists only once
// the store holds its serial.
func (f *Fleet) join(m *material, req *iop.NodeJoinRequest, now time.Time) (*iop.NodeJoinResponse, error) {
	if !m.enabled {
		return nil, ErrEnrollmentOff
	}
	name := req.GetNodeName()
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("invalid node name %q (1-63 of letters, digits, '.', '_', '-')", peerText(name))
	}
	pub, err := ecdh.X25519().NewPublicKey(req.GetLeaseRecipientPublicKey())
	if err != nil {
		return nil, fmt.Errorf("lease recipient public key: %d bytes, want 32 of X25519", len(req.GetLeaseRecipientPublicKey()))
	}
	id := identity.ID{TrustDomain: m.trustDomain, Role: identity.RoleNode, Name: name}
	if _, err := identity.CheckNodeCSR(req.GetCsr(), id); err != nil {
		return nil, err
	}
	var c *x509.Certificate
	err = f.update(m, func(st *Store) error {
		st.Prune(now)
		tok, err := st.CheckJoin(req.GetTokenId(), req.GetTokenSecret(), name, now)
		if err != nil {
			return err
		}
		// After the token: a peer without one learns nothing of the config
		// (which names nodes[] lists, which templates match), and a name
		// the token does not allow is refused naming the token's (J1).
		if err := f.placeable(name); err != nil {
			return err
		}
		if c, err = m.sign(req.GetCsr(), id, now); err != nil {
			return err
		}
		st.RecordJoin(tok, name, base64.StdEncoding.EncodeToString(pub.Bytes()), serialHex(c), c.NotAfter, now)
		return nil
	})
	if err != nil {
		return nil, err
	}
	resp := &iop.NodeJoinResponse{Ok: true, NodeName: name, TrustDomain: m.trustDomain, EdgeName: m.edgeName,
		CertificatePem: identity.CertificatePEM(c.Raw), CaPem: identity.CertificatePEM(m.ca.Cert.Raw),
		NotAfterUnixMs: c.NotAfter.UnixMilli()}
	if m.issuerPub != nil {
		resp.IssuerPublicKey = []byte(m.issuerPub)
	}
	return resp, nil
}

// sign signs a node certificate for the CSR (identity.CA.SignNode, the
// configured lifetime) and returns it parsed.
func (m *material) sign(csr []byte, id identity.ID, now time.Time) (*x509.Certificate, error) {
	der, err := m.ca.SignNode(csr, id, now, m.ttl)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// placeable checks, against the config file, that a joined node named name
// would get a place: no nodes[] entry has the name (that node's adapters
// and key are the file's) and a node template matches it.
func (f *Fleet) placeable(name string) error {
	cfg := f.config()
	switch {
	case cfg == nil:
		return errors.New("edge has no config")
	case cfg.NodeByID(name) != nil:
		return fmt.Errorf("node %q is listed in the edge config's nodes[]: it uses a certificate from edge pki; join another name", name)
	case cfg.TemplateFor(name) == nil:
		return fmt.Errorf("no node_templates entry of the edge config matches %q: the node would get no adapters", name)
	}
	return nil
}

func (f *Fleet) config() *config.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg
}
