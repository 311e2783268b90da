package identity

import (
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"
)

// I1: SPIFFE IDs are spiffe://<trust_domain>/<role>/<name>, role edge or node.
func TestParse(t *testing.T) {
	good := []struct {
		name, uri string
		want      ID
	}{
		{"I1 node", "spiffe://iop.local/node/gpu-1", ID{"iop.local", RoleNode, "gpu-1"}},
		{"I1 edge", "spiffe://iop.local/edge/edge-1", ID{"iop.local", RoleEdge, "edge-1"}},
		{"I1 all allowed characters", "spiffe://a_b-c.9/node/Az.0_-x", ID{"a_b-c.9", RoleNode, "Az.0_-x"}},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.uri)
			if err != nil || got != tt.want {
				t.Fatalf("Parse(%q) = %v, %v; want %v", tt.uri, got, err, tt.want)
			}
			if s := got.String(); s != tt.uri {
				t.Errorf("String() = %q, want %q", s, tt.uri)
			}
			if s := got.URL().String(); s != tt.uri {
				t.Errorf("URL().String() = %q, want %q", s, tt.uri)
			}
		})
	}
	bad := []struct{ name, uri string }{
		{"I1 empty", ""},
		{"I1 other scheme", "https://iop.local/node/a"},
		{"I1 upper-case scheme", "SPIFFE://iop.local/node/a"},
		{"I1 upper-case trust domain", "spiffe://IOP.local/node/a"},
		{"I1 empty trust domain", "spiffe:///node/a"},
		{"I1 no path", "spiffe://iop.local"},
		{"I1 root path", "spiffe://iop.local/"},
		{"I1 role only", "spiffe://iop.local/node"},
		{"I1 empty name", "spiffe://iop.local/node/"},
		{"I1 unknown role", "spiffe://iop.local/admin/a"},
		{"I1 extra segment", "spiffe://iop.local/node/a/b"},
		{"I1 empty segment", "spiffe://iop.local//node/a"},
		{"I1 dot-dot name", "spiffe://iop.local/node/.."},
		{"I1 query", "spiffe://iop.local/node/a?x=1"},
		{"I1 fragment", "spiffe://iop.local/node/a#f"},
		{"I1 userinfo", "spiffe://user@iop.local/node/a"},
		{"I1 port", "spiffe://iop.local:443/node/a"},
		{"I1 percent-encoding", "spiffe://iop.local/node/%61"},
		{"I1 space", "spiffe://iop.local/node/a b"},
		{"I1 too long", "spiffe://iop.local/node/" + strings.Repeat("a", 2048)},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := Parse(tt.uri); !errors.Is(err, ErrBadSPIFFEID) {
				t.Errorf("Parse(%q) = %v, %v; want ErrBadSPIFFEID", tt.uri, got, err)
			}
		})
	}
}

// I1: FromCertificate takes the identity from exactly one URI SAN of a
// non-CA leaf.
func TestFromCertificate(t *testing.T) {
	u := func(s ...string) []*url.URL {
		var out []*url.URL
		for _, v := range s {
			pu, err := url.Parse(v)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, pu)
		}
		return out
	}
	tests := []struct {
		name string
		cert *x509.Certificate
		want error
	}{
		{"I1 one URI SAN", &x509.Certificate{URIs: u("spiffe://iop.local/node/a")}, nil},
		{"I1 nil certificate", nil, ErrNoPeerCertificate},
		{"I1 no URI SAN", &x509.Certificate{}, ErrNotOneURISAN},
		{"I1 two URI SANs", &x509.Certificate{URIs: u("spiffe://iop.local/node/a", "spiffe://iop.local/node/b")}, ErrNotOneURISAN},
		{"I1 CA leaf", &x509.Certificate{BasicConstraintsValid: true, IsCA: true, URIs: u("spiffe://iop.local/node/a")}, ErrLeafIsCA},
		{"I1 URI SAN not a SPIFFE ID", &x509.Certificate{URIs: u("https://iop.local/node/a")}, ErrBadSPIFFEID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromCertificate(tt.cert)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
}
