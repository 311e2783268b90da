package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"
)

// J2: a CSR is only a key and a request: whatever it asks for besides
// its one SPIFFE ID — a CA certificate (basicConstraints CA:true with a
// path length), key usages that sign certificates or CRLs, the serverAuth,
// codeSigning or any EKU, name constraints, an unknown extension, another
// subject — the certificate the edge signs is the node leaf the edge
// builds: not a CA, digitalSignature, clientAuth only, CN = the node name,
// exactly the one URI SAN; a CSR asking for IP, e-mail, a second URI or a
// URI of another shape is refused outright.
func TestSignNodeIgnoresWhatTheCSRAsks(t *testing.T) {
	p := newPKI(t, td, "edge-1")
	ca, err := LoadCA(p.path(CACertFile), p.path(CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	id := ID{TrustDomain: td, Role: RoleNode, Name: "gpu-3"}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ext := func(oid asn1.ObjectIdentifier, critical bool, v any) pkix.Extension {
		b, err := asn1.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return pkix.Extension{Id: oid, Critical: critical, Value: b}
	}
	type basicConstraints struct {
		IsCA       bool `asn1:"optional"`
		MaxPathLen int  `asn1:"optional,default:-1"`
	}
	var (
		oidBasic     = asn1.ObjectIdentifier{2, 5, 29, 19}
		oidKeyUsage  = asn1.ObjectIdentifier{2, 5, 29, 15}
		oidEKU       = asn1.ObjectIdentifier{2, 5, 29, 37}
		oidNameConst = asn1.ObjectIdentifier{2, 5, 29, 30}
		oidPrivate   = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}
	)
	keyUsageCertSign := asn1.BitString{Bytes: []byte{0x06}, BitLength: 7} // keyCertSign, cRLSign
	ekus := []asn1.ObjectIdentifier{{1, 3, 6, 1, 5, 5, 7, 3, 1}, {1, 3, 6, 1, 5, 5, 7, 3, 3}, {2, 5, 29, 37, 0}}
	asked := []struct {
		name string
		ext  pkix.Extension
	}{
		{"CA:true with a path length", ext(oidBasic, true, basicConstraints{IsCA: true, MaxPathLen: 5})},
		{"keyCertSign and cRLSign", ext(oidKeyUsage, true, keyUsageCertSign)},
		{"serverAuth, codeSigning and any EKU", ext(oidEKU, false, ekus)},
		{"name constraints", pkix.Extension{Id: oidNameConst, Critical: true, Value: []byte{0x30, 0x00}}},
		{"an unknown critical extension", ext(oidPrivate, true, "x")},
	}
	for _, a := range asked {
		t.Run("J2 asks for "+a.name, func(t *testing.T) {
			der := csrFor(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "root-ca", Organization: []string{"evil"}},
				URIs: sans(id), ExtraExtensions: []pkix.Extension{a.ext}}, key)
			certDER, err := ca.SignNode(der, id, time.Now(), time.Hour)
			if err != nil {
				t.Fatalf("SignNode: %v", err)
			}
			c, err := x509.ParseCertificate(certDER)
			if err != nil {
				t.Fatal(err)
			}
			if c.IsCA || c.KeyUsage != x509.KeyUsageDigitalSignature || len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth ||
				len(c.UnknownExtKeyUsage) != 0 || c.Subject.CommonName != "gpu-3" || len(c.URIs) != 1 || c.URIs[0].String() != id.String() ||
				len(c.PermittedDNSDomains)+len(c.ExcludedDNSDomains) != 0 {
				t.Fatalf("J2: issued IsCA %v, KeyUsage %v, EKU %v %v, CN %q, URIs %v", c.IsCA, c.KeyUsage, c.ExtKeyUsage, c.UnknownExtKeyUsage,
					c.Subject.CommonName, c.URIs)
			}
			for _, e := range c.Extensions {
				if e.Id.Equal(oidPrivate) || e.Id.Equal(oidNameConst) {
					t.Fatalf("J2: the CSR's extension %v was copied", e.Id)
				}
			}
			if _, err := FromCertificate(c); err != nil {
				t.Fatalf("J2: the issued leaf is no node identity: %v", err)
			}
		})
	}
	uri := func(s string) *url.URL { u, _ := url.Parse(s); return u }
	for _, tt := range []struct {
		name string
		tmpl *x509.CertificateRequest
	}{
		{"an IP SAN as well", &x509.CertificateRequest{URIs: sans(id), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}},
		{"an e-mail SAN as well", &x509.CertificateRequest{URIs: sans(id), EmailAddresses: []string{"root@edge"}}},
		{"a second URI of another node", &x509.CertificateRequest{URIs: []*url.URL{id.URL(), uri("spiffe://iop.local/node/gpu-4")}}},
		{"a path-like name", &x509.CertificateRequest{URIs: []*url.URL{uri("spiffe://iop.local/node/../edge/edge-1")}}},
		{"a query on the ID", &x509.CertificateRequest{URIs: []*url.URL{uri("spiffe://iop.local/node/gpu-3?x=1")}}},
	} {
		t.Run("J2 refused: "+tt.name, func(t *testing.T) {
			if _, err := ca.SignNode(csrFor(t, tt.tmpl, key), id, time.Now(), time.Hour); !errors.Is(err, ErrBadCSR) {
				t.Fatalf("J2: %v, want ErrBadCSR", err)
			}
		})
	}
}
