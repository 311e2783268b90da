// Package identity owns workload identity between Edge and Node (SPEC I1–I3):
// SPIFFE IDs of the form spiffe://<trust_domain>/<role>/<name>, the TLS 1.3
// configurations for the edge's node listener and the node's dialer (mutual
// TLS, identity checked in VerifyConnection, certificates re-read from disk
// on rotation), and a dev PKI generator for deployments without openssl.
//
// It must never log, read the environment or flags, hold package-level
// mutable state, print or return private key material in errors, or accept
// a peer whose identity it has not checked against the CA and the expected
// role, trust domain and name.
package identity

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"
)

// Roles of a SPIFFE ID's first path segment (SPEC I1).
const (
	RoleEdge = "edge"
	RoleNode = "node"
)

// DefaultTrustDomain is the trust domain used when none is configured.
const DefaultTrustDomain = "iop.local"

const (
	spiffeScheme        = "spiffe://"
	maxSPIFFEIDLen      = 2048 // bytes, SPIFFE ID spec §2.3
	maxTrustDomainBytes = 255
)

// ID is a workload identity: spiffe://<TrustDomain>/<Role>/<Name> (SPEC I1).
type ID struct {
	TrustDomain string
	Role        string // RoleEdge or RoleNode
	Name        string // edge name or node id
}

// Parse parses uri as spiffe://<trust_domain>/<role>/<name>, following the
// SPIFFE ID specification: the trust domain is lowercase letters, digits,
// '.', '-' and '_'; the role is "edge" or "node"; the name is one non-empty
// segment of letters, digits, '.', '-' and '_' (not "." or ".."). Anything
// else (another scheme, upper case, userinfo, a port, percent-encoding, a
// query, a fragment, extra or empty segments) fails with ErrBadSPIFFEID,
// whose text quotes uri (only its first 64 bytes when it is over 2048).
func Parse(uri string) (ID, error) {
	bad := func(why string) (ID, error) {
		return ID{}, fmt.Errorf("%w: %q: %s", ErrBadSPIFFEID, uri, why)
	}
	if len(uri) > maxSPIFFEIDLen { // a peer's: quote only its start
		return ID{}, fmt.Errorf("%w: %q…: %d bytes, longer than %d", ErrBadSPIFFEID, strings.ToValidUTF8(uri[:64], ""), len(uri), maxSPIFFEIDLen)
	}
	rest, ok := strings.CutPrefix(uri, spiffeScheme)
	if !ok {
		return bad("scheme must be spiffe://")
	}
	td, path, ok := strings.Cut(rest, "/")
	if !ok {
		return bad("no path: want /<role>/<name>")
	}
	if err := validTrustDomain(td); err != nil {
		return bad(err.Error())
	}
	segs := strings.Split(path, "/")
	if len(segs) != 2 {
		return bad("path must be exactly /<role>/<name>")
	}
	role, name := segs[0], segs[1]
	if role != RoleEdge && role != RoleNode {
		return bad(fmt.Sprintf("role %q is neither %q nor %q", role, RoleEdge, RoleNode))
	}
	if err := validName(name); err != nil {
		return bad(err.Error())
	}
	return ID{TrustDomain: td, Role: role, Name: name}, nil
}

// String returns the ID as a SPIFFE URI, spiffe://<td>/<role>/<name>.
func (id ID) String() string {
	return spiffeScheme + id.TrustDomain + "/" + id.Role + "/" + id.Name
}

// URL returns the ID as a URL, the form an x509 URI SAN takes.
func (id ID) URL() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: id.TrustDomain, Path: "/" + id.Role + "/" + id.Name}
}

// validate reports whether id would round-trip through Parse.
func (id ID) validate() error {
	_, err := Parse(id.String())
	return err
}

// FromCertificate returns the SPIFFE ID of a leaf certificate. The leaf
// must not be a CA (ErrLeafIsCA) and must carry exactly one URI SAN
// (ErrNotOneURISAN) that parses as an ID (ErrBadSPIFFEID). It does not
// verify the chain.
func FromCertificate(c *x509.Certificate) (ID, error) {
	if c == nil {
		return ID{}, ErrNoPeerCertificate
	}
	if c.BasicConstraintsValid && c.IsCA {
		return ID{}, fmt.Errorf("certificate %q (serial %s): %w", c.Subject.CommonName, c.SerialNumber, ErrLeafIsCA)
	}
	if len(c.URIs) != 1 {
		return ID{}, fmt.Errorf("certificate %q (serial %s) has %d URI SANs: %w",
			c.Subject.CommonName, c.SerialNumber, len(c.URIs), ErrNotOneURISAN)
	}
	return Parse(c.URIs[0].String())
}

// ValidateTrustDomain reports whether td is a valid SPIFFE trust domain
// name (ErrBadSPIFFEID otherwise).
func ValidateTrustDomain(td string) error {
	if err := validTrustDomain(td); err != nil {
		return fmt.Errorf("%w: trust domain %q: %s", ErrBadSPIFFEID, td, err)
	}
	return nil
}

// ValidateName reports whether name can be the name segment of an ID
// (ErrBadSPIFFEID otherwise).
func ValidateName(name string) error {
	if err := validName(name); err != nil {
		return fmt.Errorf("%w: name %q: %s", ErrBadSPIFFEID, name, err)
	}
	return nil
}

func validTrustDomain(td string) error {
	if td == "" {
		return fmt.Errorf("empty trust domain")
	}
	if len(td) > maxTrustDomainBytes {
		return fmt.Errorf("trust domain longer than %d bytes", maxTrustDomainBytes)
	}
	for i := 0; i < len(td); i++ {
		c := td[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("trust domain has character %q (allowed: a-z 0-9 . - _)", c)
		}
	}
	return nil
}

func validName(name string) error {
	if name == "" {
		return fmt.Errorf("empty name")
	}
	if name == "." || name == ".." {
		return fmt.Errorf("name %q is a relative path segment", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("name has character %q (allowed: A-Z a-z 0-9 . - _)", c)
		}
	}
	return nil
}
