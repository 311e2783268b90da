package transport

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// N6: a node whose RegisterResponse would exceed the 64 KiB it reads
// before ready is refused with a reason and fatal set, and closed, instead
// of being sent a frame it cannot read (which reconnects for ever); the
// registry is untouched, so the next node of the same id is not fenced
// by it.
func TestRegisterPayloadOverPreReadyCap(t *testing.T) {
	leakcheck.Check(t)
	big, err := config.Parse([]byte(`{
	  "tls": {"cert_file": "edge-1.crt", "key_file": "edge-1.key", "ca_file": "ca.crt"},
	  "nodes": [{"id": "gpu-1", "adapters": [{"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434"}]}],
	  "models": [{"name": "tiny", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// The effective config is not validated again (templates are, at
	// load): give gpu-1 the oversized adapter list directly.
	var adapters []config.Adapter
	for i := range 120 {
		lc := 4
		adapters = append(adapters, config.Adapter{Name: fmt.Sprintf("a%03d", i), Type: protocol.TypeOpenAICompat, Profile: "vllm",
			Capacity: 4, LongCapacity: &lc, BaseURL: "http://127.0.0.1:8000/" + strings.Repeat("p", 500)})
	}
	big.Nodes[0].Adapters = adapters
	h := newHarness(t, harnessOpts{cfg: big})
	n := h.dial("gpu-1")
	r := n.register("gpu-1")
	if r.GetAccepted() || !r.GetFatal() || !strings.Contains(r.GetReason(), "before ready") {
		t.Fatalf("N6 register: accepted %v, fatal %v, reason %q", r.GetAccepted(), r.GetFatal(), r.GetReason())
	}
	n.expectClosed()
	if st := h.node("gpu-1"); st.Generation != 0 || st.Pending || st.Connected {
		t.Errorf("N6 the registry changed: %+v", st)
	}
	h.noHooks()
}

// J1 J5 D1: a join connection (TLS ALPN iop-join/1, no client certificate)
// goes to FleetHooks.Join and never reaches the registry; a ready node's
// CertificateRenewRequest is answered from FleetHooks.Renew with the
// certificate it connected with, and its NodeModelsReport reaches
// FleetHooks.OnModels with its generation; both are ignored before ready.
func TestFleetFrames(t *testing.T) {
	leakcheck.Check(t)
	var joined atomic.Int32
	renewed := make(chan string, 4)
	models := make(chan string, 4)
	h := newHarness(t, harnessOpts{modify: func(o *Options) {
		o.Fleet = FleetHooks{
			Join: func(c net.Conn) { joined.Add(1); c.Write([]byte("joined")) },
			Renew: func(node string, leaf *x509.Certificate, req *iop.CertificateRenewRequest) *iop.CertificateRenewResponse {
				id, _ := identity.FromCertificate(leaf)
				renewed <- node + " " + id.Name
				return &iop.CertificateRenewResponse{Ok: true, NotAfterUnixMs: 42}
			},
			OnModels: func(node string, gen uint64, r *iop.NodeModelsReport) {
				models <- fmt.Sprintf("%s/%d/%s", node, gen, r.GetAdapters()[0].GetModels()[0])
			},
		}
		o.TLS = identity.JoinServerConfig(o.TLS, caOf(t, o.TLS))
	}})
	raw, err := h.dialer()
	if err != nil {
		t.Fatal(err)
	}
	jc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{identity.JoinALPN}, MinVersion: tls.VersionTLS13})
	jc.SetDeadline(time.Now().Add(wait))
	buf := make([]byte, 6)
	if _, err := jc.Read(buf); err != nil || string(buf) != "joined" || joined.Load() != 1 {
		t.Fatalf("J1 the join connection: %q %v (joins %d)", buf, err, joined.Load())
	}
	jc.Close()
	if st := h.node("gpu-1"); st.Generation != 0 {
		t.Error("J1 a join touched the registry")
	}

	n := h.dial("gpu-1")
	n.send(&iop.Envelope{Kind: &iop.Envelope_RenewRequest{RenewRequest: &iop.CertificateRenewRequest{}}}) // before ready: ignored
	n.connect("gpu-1")
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	n.send(&iop.Envelope{Kind: &iop.Envelope_ModelsReport{ModelsReport: &iop.NodeModelsReport{
		Adapters: []*iop.AdapterModels{{Adapter: "ollama", Models: []string{"tiny:latest"}}}}}})
	n.send(&iop.Envelope{Kind: &iop.Envelope_RenewRequest{RenewRequest: &iop.CertificateRenewRequest{Csr: []byte{1}}}})
	var resp *iop.CertificateRenewResponse
	for resp == nil {
		resp = n.recv().GetRenewResponse()
	}
	if !resp.GetOk() || resp.GetNotAfterUnixMs() != 42 {
		t.Fatalf("J5 renew answer %v", resp)
	}
	select {
	case got := <-renewed:
		if got != "gpu-1 gpu-1" {
			t.Errorf("J5 Renew got %q, want the session's node and its own certificate", got)
		}
	case <-time.After(wait):
		t.Fatal("J5 Renew not called")
	}
	if len(renewed) != 0 {
		t.Error("J5 the renewal sent before ready was answered")
	}
	select {
	case got := <-models:
		if got != "gpu-1/1/tiny:latest" {
			t.Errorf("D1 OnModels got %q", got)
		}
	case <-time.After(wait):
		t.Fatal("D1 OnModels not called")
	}
}

// caOf is a CA certificate for the join chain: the transport only routes
// by ALPN (the pin check is internal/identity's and the node's).
func caOf(t *testing.T, _ *tls.Config) *x509.Certificate {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: "edge-1"}); err != nil {
		t.Fatal(err)
	}
	ca, err := identity.LoadCA(filepath.Join(dir, identity.CACertFile), filepath.Join(dir, identity.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return ca.Cert
}

// J5: a session renews again and again without reconnecting, so each
// renewal is decided on the certificate the node holds now: the one the
// session's last successful renewal issued, not the one it connected with
// (the edge keeps only the last two serials, so the third renewal of a
// long-lived session would otherwise be refused as superseded and the
// node locked out at its next handshake). A refused renewal keeps it.
func TestRenewalChainOnOneSession(t *testing.T) {
	leakcheck.Check(t)
	calls := make(chan string, 8)
	answers := make(chan *iop.CertificateRenewResponse, 8)
	h := newHarness(t, harnessOpts{modify: func(o *Options) {
		o.Fleet = FleetHooks{Renew: func(node string, cert *x509.Certificate, req *iop.CertificateRenewRequest) *iop.CertificateRenewResponse {
			calls <- cert.SerialNumber.Text(16)
			return <-answers
		}}
	}})
	serialOf := func(name string) (string, []byte) {
		pemBytes, err := os.ReadFile(h.file(name + ".crt"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := identity.ParseCertificatePEM(pemBytes)
		if err != nil {
			t.Fatal(err)
		}
		return c.SerialNumber.Text(16), pemBytes
	}
	connected, _ := serialOf("gpu-1")
	// Stand-ins for the certificates the edge would sign: the transport
	// only reads them back as the session's current certificate.
	second, secondPEM := serialOf("gpu-2")
	third, thirdPEM := serialOf("gpu-3")
	n := h.dial("gpu-1")
	n.connect("gpu-1")
	h.wantHooks(hookCall{"ready", "gpu-1", 1})
	for i, step := range []struct {
		answer *iop.CertificateRenewResponse
		want   string // the serial Renew must be handed
	}{
		{&iop.CertificateRenewResponse{Ok: true, CertificatePem: secondPEM}, connected},
		{&iop.CertificateRenewResponse{Error: "certificate renewed too recently"}, second},
		{&iop.CertificateRenewResponse{Ok: true, CertificatePem: thirdPEM}, second},
		{&iop.CertificateRenewResponse{Ok: true, CertificatePem: secondPEM}, third},
	} {
		answers <- step.answer
		n.send(&iop.Envelope{Kind: &iop.Envelope_RenewRequest{RenewRequest: &iop.CertificateRenewRequest{Csr: []byte{1}}}})
		var resp *iop.CertificateRenewResponse
		for resp == nil {
			resp = n.recv().GetRenewResponse()
		}
		select {
		case got := <-calls:
			if got != step.want {
				t.Fatalf("J5 renewal %d was decided on serial %s, want %s (the certificate the session holds now)", i+1, got, step.want)
			}
		case <-time.After(wait):
			t.Fatalf("J5 renewal %d: Renew not called", i+1)
		}
		if resp.GetOk() != step.answer.GetOk() {
			t.Fatalf("J5 renewal %d answered %v", i+1, resp)
		}
	}
}
