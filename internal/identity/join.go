package identity

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Joining (SPEC J1, J2): a new node has no certificate yet. It dials the
// edge's node listener offering the TLS ALPN protocol JoinALPN; the edge
// then completes the handshake without asking for a client certificate
// and presents its certificate chain with the CA appended. The node
// accepts the edge only if that CA's public key hashes to the pin its
// join token carries and the edge's certificate verifies against it, so
// it checks the edge before it sends anything (the token's secret, its
// CSR). One listener and one port serve sessions and joins; a join
// connection carries one request and one answer, then closes.

// JoinALPN is the TLS application protocol of a join connection.
const JoinALPN = "iop-join/1"

// Join token wire form (SPEC J1): "iop1.<pin>.<id>.<secret>", where pin is
// CAPin of the deployment's CA (43 characters of unpadded base64url), id
// is 16 lowercase hex characters (8 random bytes; the edge finds the token
// by it) and secret is 43 characters of unpadded base64url (32 random
// bytes; the edge keeps only its SHA-256); a token for one node (`edge
// tokens create -node`) ends ".<node>", the name `node join` then joins as
// without -name. The name is a hint to the node, not a grant: the edge
// checks the name asked for against the token's record.
const joinTokenPrefix = "iop1"

// JoinToken is a parsed join token. Secret is a credential: never log it.
type JoinToken struct {
	Pin    string
	ID     string
	Secret string
	// Node is the one node name the token is for; "" for a -prefix token
	// (or one made before tokens carried it).
	Node string
}

// String is the token's wire form.
func (t JoinToken) String() string {
	s := joinTokenPrefix + "." + t.Pin + "." + t.ID + "." + t.Secret
	if t.Node != "" {
		s += "." + t.Node
	}
	return s
}

// ValidNodeName reports whether name may be a node's name (SPEC J1): 1-63
// of ASCII letters, digits, '.', '_', '-', starting with a letter or digit.
func ValidNodeName(name string) bool {
	if len(name) == 0 || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// SecretSHA256 is the hex SHA-256 of the token's secret: what the edge
// stores.
func (t JoinToken) SecretSHA256() string { return SecretSHA256(t.Secret) }

// SecretSHA256 is the hex SHA-256 of a join token secret.
func SecretSHA256(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// SecretMatches reports, in constant time, whether secret hashes to
// wantSHA256 (hex).
func SecretMatches(secret, wantSHA256 string) bool {
	got := SecretSHA256(secret)
	return subtle.ConstantTimeCompare([]byte(got), []byte(wantSHA256)) == 1
}

// NewJoinToken returns a token pinning pin with a fresh random id and
// secret (crypto/rand).
func NewJoinToken(pin string) (JoinToken, error) {
	if _, err := base64.RawURLEncoding.DecodeString(pin); err != nil || len(pin) != 43 {
		return JoinToken{}, fmt.Errorf("%w: pin %q is not a CA pin", ErrBadJoinToken, pin)
	}
	var id [8]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return JoinToken{}, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return JoinToken{}, err
	}
	return JoinToken{Pin: pin, ID: hex.EncodeToString(id[:]), Secret: base64.RawURLEncoding.EncodeToString(secret[:])}, nil
}

// ParseJoinToken parses the wire form. Surrounding white space is ignored
// (a pasted line). Errors wrap ErrBadJoinToken and never quote the secret.
func ParseJoinToken(s string) (JoinToken, error) {
	parts := strings.SplitN(strings.TrimSpace(s), ".", 5) // a node name may hold dots
	bad := func(why string) (JoinToken, error) {
		return JoinToken{}, fmt.Errorf("%w: %s (want iop1.<pin>.<id>.<secret>[.<node>], as edge tokens create prints it)", ErrBadJoinToken, why)
	}
	if len(parts) < 4 {
		return bad(fmt.Sprintf("%d dot-separated parts", len(parts)))
	}
	if parts[0] != joinTokenPrefix {
		return bad("unknown version prefix")
	}
	t := JoinToken{Pin: parts[1], ID: parts[2], Secret: parts[3]}
	if len(parts) == 5 {
		if t.Node = parts[4]; !ValidNodeName(t.Node) {
			return bad("the node name after the secret is not 1-63 of letters, digits, '.', '_', '-'")
		}
	}
	if b, err := base64.RawURLEncoding.DecodeString(t.Pin); err != nil || len(b) != sha256.Size {
		return bad("the CA pin is not 43 characters of base64url")
	}
	if b, err := hex.DecodeString(t.ID); err != nil || len(b) != 8 || strings.ToLower(t.ID) != t.ID {
		return bad("the token id is not 16 lowercase hex characters")
	}
	if b, err := base64.RawURLEncoding.DecodeString(t.Secret); err != nil || len(b) != 32 {
		return bad("the secret is not 43 characters of base64url")
	}
	return t, nil
}

// CAPin is the pin of a CA certificate: the unpadded base64url of the
// SHA-256 of its SubjectPublicKeyInfo (the key, not the certificate, so a
// CA re-issued with the same key keeps its pin; kubeadm's discovery hash
// pins the same bytes).
func CAPin(ca *x509.Certificate) string {
	sum := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// JoinServerConfig returns base with join connections added: a ClientHello
// offering JoinALPN gets a config that asks for no client certificate,
// negotiates JoinALPN and presents base's certificate with ca appended to
// the chain (so the node can check it against its pin); every other
// ClientHello gets base unchanged. base must serve its certificate through
// GetCertificate (ServerConfig does).
func JoinServerConfig(base *tls.Config, ca *x509.Certificate) *tls.Config {
	join := &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		ClientAuth:             tls.NoClientCert,
		NextProtos:             []string{JoinALPN},
		Time:                   base.Time,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			own, err := base.GetCertificate(hello)
			if err != nil || own == nil {
				return own, err
			}
			chained := *own
			chained.Certificate = append(slices.Clone(own.Certificate), ca.Raw)
			return &chained, nil
		},
	}
	out := base.Clone()
	out.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if slices.Contains(hello.SupportedProtos, JoinALPN) {
			return join, nil
		}
		return nil, nil
	}
	return out
}

// JoinClientConfig returns the TLS config of a join connection (`node
// join`): TLS 1.3, ALPN JoinALPN, no client certificate, and in
// VerifyConnection the edge checked with CheckJoinPeer against pin. now
// is the clock (nil = time.Now).
func JoinClientConfig(pin string, now func() time.Time) *tls.Config {
	if now == nil {
		now = time.Now
	}
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		NextProtos:             []string{JoinALPN},
		InsecureSkipVerify:     true, // replaced by CheckJoinPeer; see ClientConfig for why
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, _, err := CheckJoinPeer(cs, pin, now())
			return err
		},
	}
}

// CheckJoinPeer checks the edge end of a join connection: it negotiated
// JoinALPN (else the edge does not serve joins: an older build), its chain
// holds a CA certificate whose CAPin is pin (else ErrPinMismatch), and its
// leaf verifies against that CA at now for serverAuth and carries an edge
// SPIFFE ID in the CA's trust domain. It returns the edge's ID and the CA.
func CheckJoinPeer(cs tls.ConnectionState, pin string, now time.Time) (ID, *x509.Certificate, error) {
	if cs.NegotiatedProtocol != JoinALPN {
		return ID{}, nil, fmt.Errorf("edge: the server did not accept the join protocol %q (an edge build without node join, or not an iop edge)", JoinALPN)
	}
	certs := cs.PeerCertificates
	if len(certs) == 0 {
		return ID{}, nil, fmt.Errorf("edge: %w", ErrNoPeerCertificate)
	}
	var ca *x509.Certificate
	for _, c := range certs[1:] {
		if c.BasicConstraintsValid && c.IsCA && subtle.ConstantTimeCompare([]byte(CAPin(c)), []byte(pin)) == 1 {
			ca = c
		}
	}
	if ca == nil {
		return ID{}, nil, fmt.Errorf("edge: %w (the token is for another deployment's CA, or this is not the edge that made it)", ErrPinMismatch)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if err := verifyChain(certs[:1], roots, now); err != nil {
		return ID{}, nil, err
	}
	id, err := FromCertificate(certs[0])
	if err != nil {
		return ID{}, nil, fmt.Errorf("edge certificate: %w", err)
	}
	if id.Role != RoleEdge {
		return ID{}, nil, fmt.Errorf("edge certificate %s: role %q, want %q: %w", id, id.Role, RoleEdge, ErrWrongRole)
	}
	if td := caTrustDomain(ca); td != "" && id.TrustDomain != td {
		return ID{}, nil, fmt.Errorf("edge certificate %s: trust domain %q, the CA's is %q: %w", id, id.TrustDomain, td, ErrWrongTrustDomain)
	}
	return id, ca, nil
}
