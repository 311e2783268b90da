package adapter

import (
	"errors"
	"fmt"
	"strings"

	"iop/internal/lease"
	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// ErrNoLeaseKeys: the Edge turned the credential plane on but the Node has
// no lease keys (NewSet).
var ErrNoLeaseKeys = errors.New("the edge's credential plane is on (credentials.enabled) but this node has no lease keys: " +
	"set credentials.recipient_private_key_file and credentials.issuer_public_key in the node config")

// ErrLeaseKeyMismatch: the Edge seals this Node's leases to another
// recipient key, or signs them with another issuer key, than the Node's
// own (NewSet): every lease would be refused.
var ErrLeaseKeyMismatch = errors.New("the edge's lease keys and this node's are not pairs")

// checkLeaseKeys compares the key ids the payload names with the Node's
// (an Edge that names none is not checked).
func checkLeaseKeys(rt *iop.NodeRuntimeConfig, o *lease.Opener) error {
	if id := rt.GetCredentialRecipientKeyId(); id != "" && id != o.RecipientKeyID() {
		return fmt.Errorf("%w: the edge seals leases to recipient key %.16s, this node's credentials.recipient_private_key_file is key %s "+
			"(nodes[].lease_recipient_public_key in the edge config must be this node's <node>.recipient.pub)", ErrLeaseKeyMismatch, id, o.RecipientKeyID())
	}
	if id := rt.GetCredentialIssuerKeyId(); id != "" && !o.TrustsIssuer(id) {
		return fmt.Errorf("%w: the edge signs leases with issuer key %.16s, this node's credentials.issuer_public_key(s) are keys %s "+
			"(add the edge's issuer.pub to them and restart the node)", ErrLeaseKeyMismatch, id, strings.Join(o.IssuerKeyIDs(), ", "))
	}
	return nil
}

// checkPresence applies SPEC C4's presence rules at the boundary, before
// capacity: lease and binding travel together, are required with the
// plane on and refused with it off. It returns the failure code.
func (s *Set) checkPresence(l *iop.CredentialLease, b *iop.CredentialLeaseBinding) (protocol.Code, error) {
	if err := lease.CheckPresence(s.creds, l, b); err != nil {
		return credentialCode(err), fmt.Errorf("credential lease rejected: %w", err)
	}
	return "", nil
}

func credentialCode(err error) protocol.Code {
	if lease.Required(err) {
		return protocol.CodeCredentialRequired
	}
	return protocol.CodeCredentialInvalid
}

// authHeader is where inst carries an upstream credential: the profile's
// auth_header and auth_scheme for openai_compat, "Authorization: Bearer"
// for ollama (the Edge's config.AuthHeader says the same).
func (inst *instance) authHeader() (header, scheme string) {
	if inst.typ == protocol.TypeOllama {
		return "Authorization", "Bearer"
	}
	return inst.profile.GetAuthHeader(), inst.profile.GetAuthScheme()
}

// credential opens the request's lease and returns the endpoint its
// provider call uses (SPEC C3): inst.ep itself with the plane off, else a
// copy carrying the credential in the adapter's auth header. Callers run
// it after capacity admission, immediately before the call. The lease must
// name this node, this adapter, target and profile, and the slot revision
// and projection generation this node's payload names or newer; it opens
// once (replay cache) and only within its lifetime (±5 s skew).
//
// The opened plaintext and the header value built from it are byte slices
// cleared before credential returns. What remains is the header value Go's
// net/http needs as an immutable string, held only by the returned
// endpoint copy and the one outgoing request: nothing caches it across
// requests (SPEC C6), and it is unreachable once the call returns.
func (s *Set) credential(inst *instance, target string, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) (*upstream.Endpoint, error) {
	if !s.creds {
		return inst.ep, nil
	}
	header, scheme := inst.authHeader()
	pt, err := s.leases.Open(s.now(), lease.Scope{
		Node: s.nodeID, Provider: inst.name, Target: target, Profile: inst.profile.GetName(),
		AuthHeader: header, AuthScheme: scheme, Generation: s.credGen, Revisions: s.credRevs,
	}, l, b)
	defer clear(pt)
	if err != nil {
		return nil, fmt.Errorf("credential lease rejected: %w", err)
	}
	if err := lease.CheckHeaderValue(pt); err != nil {
		return nil, fmt.Errorf("credential lease rejected: %w", &lease.Error{Err: lease.ErrMalformed, Detail: "the credential: " + err.Error()})
	}
	v := make([]byte, 0, len(scheme)+1+len(pt))
	if scheme != "" {
		v = append(append(v, scheme...), ' ')
	}
	v = append(v, pt...)
	ep := *inst.ep
	ep.AuthHeader, ep.AuthValue = header, string(v)
	clear(v)
	return &ep, nil
}

// runnerFor is inst's runner calling ep (inst.runner when ep is inst.ep).
func (inst *instance) runnerFor(ep *upstream.Endpoint) runner {
	if ep == inst.ep {
		return inst.runner
	}
	return inst.newRunner(ep)
}
