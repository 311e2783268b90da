package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"iop/internal/identity"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// FleetHooks connect the node listener to internal/edge/fleet (SPEC J1,
// J4, J5, D1). Each may be nil.
type FleetHooks struct {
	// Join answers a join connection (TLS ALPN identity.JoinALPN, no client
	// certificate) on its connection goroutine, bounding it itself; the
	// transport closes conn when it returns. Without Join, such a
	// connection is closed after its handshake.
	Join func(conn net.Conn)
	// Renew answers a ready node's CertificateRenewRequest; cert is the
	// certificate the node holds now: the one the session connected with,
	// or the one the session's last successful renewal issued (SPEC J5: a
	// session renews again and again without reconnecting). It is called
	// on a goroutine of its own, at most one at a time per session.
	Renew func(node string, cert *x509.Certificate, req *iop.CertificateRenewRequest) *iop.CertificateRenewResponse
	// OnModels takes a ready node's NodeModelsReport from its read loop;
	// it must not block.
	OnModels func(node string, gen uint64, r *iop.NodeModelsReport)
	// OnResidency takes a ready node's NodeResidencyReport (SPEC U6) from
	// its read loop; it must not block.
	OnResidency func(node string, gen uint64, r *iop.NodeResidencyReport)
}

// ErrPayloadTooLarge: a node's RegisterResponse would exceed the pre-ready
// frame cap (SPEC N6); the registration is refused with fatal set.
var ErrPayloadTooLarge = errors.New("config payload too large")

// errJoined ends a join connection's goroutine after FleetHooks.Join.
var errJoined = errors.New("transport: join connection answered")

// joinConn reports whether tc (handshake done) is a join connection, and
// then answers it through FleetHooks.Join.
func (s *Server) joinConn(tc *tls.Conn) bool {
	if tc.ConnectionState().NegotiatedProtocol != identity.JoinALPN {
		return false
	}
	if j := s.o.Fleet.Join; j != nil {
		j(tc)
	}
	return true
}

// fleetFrame handles a ready session's CertificateRenewRequest or
// NodeModelsReport (SPEC J5, D1). A renewal runs on its own goroutine
// (it rewrites the enrollment store and signs) and is answered with a
// must-deliver CertificateRenewResponse; one arriving while another is
// in progress, or on an edge without renewal, is answered with an error.
// A granted renewal's certificate becomes the session's current one
// (session.cert) before the answer is sent, so the next renewal is
// decided on it.
func (c *session) fleetFrame(env *iop.Envelope) {
	s := c.s
	node, gen, current := c.binding()
	if !current {
		return
	}
	switch k := env.Kind.(type) {
	case *iop.Envelope_ModelsReport:
		if f := s.o.Fleet.OnModels; f != nil {
			f(node, gen, k.ModelsReport)
		}
	case *iop.Envelope_ResidencyReport:
		if f := s.o.Fleet.OnResidency; f != nil {
			f(node, gen, k.ResidencyReport)
		}
	case *iop.Envelope_RenewRequest:
		answer := func(r *iop.CertificateRenewResponse) {
			c.sendMustDirect(&iop.Envelope{Kind: &iop.Envelope_RenewResponse{RenewResponse: r}})
		}
		renew := s.o.Fleet.Renew
		if renew == nil {
			c.sendMust(&iop.Envelope{Kind: &iop.Envelope_RenewResponse{RenewResponse: &iop.CertificateRenewResponse{
				Error: "this edge does not renew certificates (enrollment is off)"}}})
			return
		}
		if !c.renewing.CompareAndSwap(false, true) {
			c.sendMust(&iop.Envelope{Kind: &iop.Envelope_RenewResponse{RenewResponse: &iop.CertificateRenewResponse{
				Error: "a renewal of this session is already in progress"}}})
			return
		}
		s.wg.Add(1) // Serve waits for it like for a connection goroutine
		go func() {
			defer s.wg.Done()
			resp := renew(node, c.currentCert(), k.RenewRequest)
			if resp.GetOk() {
				if renewed, err := identity.ParseCertificatePEM(resp.GetCertificatePem()); err == nil {
					c.cert.Store(renewed)
				}
			}
			c.renewing.Store(false)
			answer(resp)
		}()
	}
}

// currentCert is the certificate the session's node holds now (see
// fleetFrame): the TLS peer's until a renewal replaced it.
func (c *session) currentCert() *x509.Certificate {
	if cert := c.cert.Load(); cert != nil {
		return cert
	}
	return c.tc.ConnectionState().PeerCertificates[0]
}

// binding is the session's node and generation, and whether it is still
// that node's current owner (registry.Binding under Server.mu).
func (c *session) binding() (node string, gen uint64, current bool) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.reg.Binding(c.id)
}

// oversize reports, for a registration of nodeID on this connection, a
// RegisterResponse the node could not read before ready: one over the
// 64 KiB pre-ready frame cap (SPEC N6). Called under Server.mu.
func (c *session) oversize(nodeID string) error {
	if nodeID != c.peer {
		return nil // the registry refuses it
	}
	p := c.s.cfg.NodePayload(nodeID)
	if p == nil {
		return nil
	}
	env := &iop.Envelope{Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{Accepted: true, Config: p}}}
	if n := proto.Size(env); n > wire.DefaultPreReadyCap {
		return fmt.Errorf("register %q: %w: %d bytes, over the %d bytes a node reads before ready; give it fewer adapters",
			nodeID, ErrPayloadTooLarge, n, wire.DefaultPreReadyCap)
	}
	return nil
}
