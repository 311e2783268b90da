package exchange

import (
	"iop/internal/edge/creds"
	"iop/internal/edge/reply"
	iop "iop/proto/gen/iop"
)

// credential returns the lease and binding of x's current provider lease
// (SPEC C2: after provider selection, for exactly that node, provider and
// target; a re-dispatch asks again for the new provider). ok is false when
// no lease could be issued: it answered 502 and nothing is sent to the
// node, so nothing reaches the upstream. The edge never falls back to
// another slot (SPEC C6): the slot is the route's.
func (h *Engine) credential(x *Exchange) (l *iop.CredentialLease, b *iop.CredentialLeaseBinding, ok bool) {
	if h.o.Credentials == nil {
		return nil, nil, true
	}
	pl := x.lease
	l, b, err := h.o.Credentials.Lease(creds.Request{Principal: x.Principal, Model: x.Model,
		Node: pl.Node, Provider: pl.Provider, Target: pl.Target})
	if err != nil {
		h.log.Warn("credential lease not issued", "model", x.Model, "node", pl.Node, "provider", pl.Provider, "err", err)
		reply.WriteError(x.out.W, x.Endpoint.Surface, reply.BadGateway("credential_unavailable",
			"the edge could not issue a credential for the selected provider"))
		return nil, nil, false
	}
	return l, b, true
}
