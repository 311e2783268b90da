package fleet

import (
	"crypto/x509"
	"time"

	"iop/internal/identity"
	iop "iop/proto/gen/iop"
)

// Renew answers a ready node's CertificateRenewRequest (SPEC J5): node is
// the session's node id, leaf the certificate it connected with. The node
// must be enrolled, not revoked, connected with a certificate the store
// holds for it, and not have renewed within MinRenewGap; the CSR must be
// for its own identity. Then the new certificate's serial goes into the
// store (first, before the one it replaces) and the certificate is
// returned. A refusal's log line is rate limited. It does I/O (a store
// rewrite) and takes about a millisecond: call it off the session's read
// loop.
func (f *Fleet) Renew(node string, leaf *x509.Certificate, req *iop.CertificateRenewRequest) *iop.CertificateRenewResponse {
	m := f.material()
	now := f.o.Now()
	fail := func(err error) *iop.CertificateRenewResponse {
		if ok, suppressed := f.renewLog.Allow(now); ok { // a node may ask as often as it likes
			f.log.Warn("node certificate renewal refused", "node", node, "err", err, "suppressed", suppressed)
		}
		return &iop.CertificateRenewResponse{Error: err.Error()}
	}
	if !m.enabled {
		return fail(ErrEnrollmentOff)
	}
	id := identity.ID{TrustDomain: m.trustDomain, Role: identity.RoleNode, Name: node}
	if _, err := identity.CheckNodeCSR(req.GetCsr(), id); err != nil {
		return fail(err)
	}
	var c *x509.Certificate
	err := f.update(m, func(st *Store) error {
		if err := st.CheckRenew(node, serialHex(leaf), m.ttl, now); err != nil {
			return err
		}
		var err error
		if c, err = m.sign(req.GetCsr(), id, now); err != nil {
			return err
		}
		st.RecordRenew(node, serialHex(c), c.NotAfter, now)
		return nil
	})
	if err != nil {
		return fail(err)
	}
	f.log.Info("node certificate renewed", "node", node, "not_after", c.NotAfter.UTC().Format(time.RFC3339))
	return &iop.CertificateRenewResponse{Ok: true, CertificatePem: identity.CertificatePEM(c.Raw), NotAfterUnixMs: c.NotAfter.UnixMilli()}
}
