// Package creds is the Edge's side of the managed credential plane (SPEC
// C1, C2, C5, C6). Load reads what one config names — the lease issuer key,
// the secret store and its key, each node's recipient public key — checks
// that every route's slot is in the store and opens with the key, and
// computes each node's credential projection (the generation and slot
// revisions its config payload carries). A Plane holds the current
// Material and issues one sealed, signed lease per dispatched request.
//
// Generations: a node's projection generation rises (to the wall clock in
// Unix ms, or the previous value + 1 if that is not higher) whenever a
// reload changes what its leases would say — a route to it, a slot's
// revision, its recipient key or the lease lifetime — and stays otherwise
// (a new issuer key included: leases signed with the old one stay valid
// while the node trusts it), so an unrelated reload refreshes no node. The node rejects leases of an
// older generation or an older slot revision than its payload names (SPEC
// C6: none for another revision or generation).
//
// The package keeps no plaintext: a secret is decrypted from the store for
// one lease and cleared as soon as it is sealed. It never logs, and its
// errors name slots, files and routes, never a secret, a ciphertext or a
// key. Goroutines: each node's lease.Recipient refills its prepared HPKE
// encapsulations on a short-lived goroutine of its own.
package creds

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/secretstore"
	"iop/internal/identity"
	"iop/internal/lease"
	iop "iop/proto/gen/iop"
)

// Errors of Lease; test with errors.Is.
var (
	// ErrNoRoute: the request's (model, node, provider) is not a route of
	// the loaded config (a reload raced the request).
	ErrNoRoute = errors.New("no credential route")
	// ErrIssue: the store or the seal failed.
	ErrIssue = errors.New("credential lease could not be issued")
	// ErrRevoked: the route's slot was removed from the store (`edge
	// secrets rm`): its secret is never issued again (SPEC C6).
	ErrRevoked = errors.New("credential slot revoked (removed from the secret store)")
)

// PreparedPerNode is how many HPKE encapsulations to each node are kept
// prepared (lease.Recipient.Precompute): the X25519 work of a lease is done
// off the request's path while requests come slower than a refill
// goroutine prepares them (tens of thousands per second per core).
const PreparedPerNode = 32

// Request names one dispatched request: who asked (principal, "" in open
// mode), the model group (route) and the selected provider and target.
type Request struct {
	Principal string
	Model     string
	Node      string
	Provider  string
	Target    string
	// BootID is the selected node's boot id (RegisterRequest.boot_id),
	// bound into the lease so that the node refuses it after a restart;
	// Plane fills it in from its BootIDs source.
	BootID string
}

type routeKey struct{ model, node, provider string }

// probeKey is what a health probe names: a provider and a target.
type probeKey struct{ node, provider, target string }

// route is what a lease for one route says besides the request.
type route struct {
	slot, profile, header, scheme string
	revision                      uint64 // route revision: a digest of the route's configuration
}

// Material is the plane's state for one config: immutable once loaded.
type Material struct {
	enabled    bool
	issuer     *lease.Issuer
	key        *secretstore.Key
	store      *secretstore.Store
	recipients map[string]*lease.Recipient
	routes     map[routeKey]route
	probes     map[probeKey]routeKey // the first route (config order) to each provider and target
	revoked    map[routeKey]string   // routes whose slot the store removed → the slot
	proj       config.CredentialProjection
	digests    map[string][sha256.Size]byte
}

// Load reads the credential material cfg names and computes the projection,
// continuing prev's generations (nil at start). With the plane off it
// returns a Material that issues nothing. Errors name the file, slot or
// route at fault.
func Load(cfg *config.Config, prev *Material, now time.Time) (*Material, error) {
	m := &Material{enabled: cfg.Credentials.Enabled}
	if !m.enabled {
		return m, nil
	}
	cr := cfg.Credentials
	priv, err := identity.LoadIssuerPrivateKey(cr.IssuerKeyFile)
	if err != nil {
		return nil, fmt.Errorf("credentials.issuer_key_file: %w", err)
	}
	if m.issuer, err = lease.NewIssuer(priv, time.Duration(cr.LeaseTTLMs)*time.Millisecond); err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	if m.key, err = secretstore.LoadKey(cr.StoreKeyFile); err != nil {
		return nil, fmt.Errorf("credentials.store_key_file: %w", err)
	}
	if m.store, err = secretstore.Load(cr.StoreFile); err != nil {
		return nil, fmt.Errorf("credentials.store_file: %w", err)
	}
	m.recipients = map[string]*lease.Recipient{}
	for i, n := range cfg.Nodes {
		pub, err := identity.ParseRecipientPublicKeyBase64(n.LeaseRecipientPublicKey)
		if err == nil {
			m.recipients[n.ID], err = lease.NewRecipient(pub)
		}
		if err != nil {
			return nil, fmt.Errorf("nodes[%d].lease_recipient_public_key: %w", i, err)
		}
		m.recipients[n.ID].Precompute(PreparedPerNode)
	}
	if err := m.loadRoutes(cfg); err != nil {
		return nil, err
	}
	m.project(cfg, prev, now)
	return m, nil
}

// loadRoutes resolves every route's slot, profile and auth header and
// checks that each slot is in the store and opens with its key. A slot
// the store removed (`edge secrets rm` leaves a tombstone) is revocation,
// not an error: its routes issue no lease (ErrRevoked), and because they
// leave the projection, the generation of their nodes rises, so a node
// that applied the refreshed payload refuses the leases issued before
// (SPEC C6). A slot the store never held is an error, naming the route.
func (m *Material) loadRoutes(cfg *config.Config) error {
	m.routes = map[routeKey]route{}
	m.probes = map[probeKey]routeKey{}
	m.revoked = map[routeKey]string{}
	opened := map[string]bool{}
	for i, mod := range cfg.Models {
		for j, mp := range mod.Providers {
			n := cfg.NodeByID(mp.Node)
			if n == nil || n.Adapter(mp.Provider) == nil {
				continue // validate reported it
			}
			a := n.Adapter(mp.Provider)
			slot := config.RouteSlot(mp, a)
			if m.store.Removed(slot) {
				m.revoked[routeKey{mod.Name, mp.Node, mp.Provider}] = slot
				continue
			}
			if !opened[slot] {
				pt, _, err := m.store.Open(m.key, slot)
				clear(pt)
				if err != nil {
					return fmt.Errorf("models[%d].providers[%d]: credential slot %q: %w (edge secrets set -slot %s)", i, j, slot, err, slot)
				}
				opened[slot] = true
			}
			h, sch := config.AuthHeader(a)
			rk := routeKey{mod.Name, mp.Node, mp.Provider}
			m.routes[rk] = route{slot: slot, profile: config.ProfileName(a),
				header: h, scheme: sch, revision: routeRevision(mod.Name, mp, slot)}
			if pk := (probeKey{mp.Node, mp.Provider, mp.Target}); m.probes[pk] == (routeKey{}) {
				m.probes[pk] = rk
			}
		}
	}
	return nil
}

// project computes each node's projection: the revisions of the slots its
// routes use, and a generation that rises when the node's digest changes.
func (m *Material) project(cfg *config.Config, prev *Material, now time.Time) {
	m.proj = config.CredentialProjection{Nodes: map[string]config.NodeCredentials{}}
	m.digests = map[string][sha256.Size]byte{}
	lines := map[string][]string{}
	revs := map[string]map[string]uint64{}
	for k, r := range m.routes {
		rev, _ := m.store.Revision(r.slot)
		if revs[k.node] == nil {
			revs[k.node] = map[string]uint64{}
		}
		revs[k.node][r.slot] = rev
		lines[k.node] = append(lines[k.node], fmt.Sprintf("%q %q %q %d %q %q %q %d", k.model, k.provider,
			r.slot, rev, r.profile, r.header, r.scheme, r.revision))
	}
	for _, n := range cfg.Nodes {
		l := lines[n.ID]
		sort.Strings(l)
		h := sha256.New()
		// Not the issuer key: a lease signed with the old one still opens
		// on a node that trusts both (the rotation's overlap, SPEC C3), and
		// raising the generation with the key made one issued just before
		// the switch fail on a node that applied the refreshed payload
		// before it arrived. The node stops trusting the old key when its
		// own config drops it.
		fmt.Fprintf(h, "ttl %d recipient %s\n", m.issuer.TTL(), m.recipients[n.ID].KeyID())
		for _, s := range l {
			fmt.Fprintln(h, s)
		}
		var d [sha256.Size]byte
		h.Sum(d[:0])
		m.digests[n.ID] = d
		gen := uint64(now.UnixMilli())
		if prev != nil && prev.enabled {
			if pg := prev.proj.Nodes[n.ID].Generation; pg != 0 {
				switch {
				case prev.digests[n.ID] == d:
					gen = pg
				case gen <= pg:
					gen = pg + 1
				}
			}
		}
		m.proj.Nodes[n.ID] = config.NodeCredentials{Generation: gen, SlotRevisions: revs[n.ID],
			RecipientKeyID: m.recipients[n.ID].KeyID(), IssuerKeyID: m.issuer.KeyID()}
	}
}

// routeRevision is the first 8 bytes of SHA-256 over the route's
// configuration: it changes when the route does.
func routeRevision(model string, mp config.ModelProvider, slot string) uint64 {
	sum := sha256.Sum256(fmt.Appendf(nil, "%q %q %q %q %q", model, mp.Node, mp.Provider, mp.Target, slot))
	return binary.BigEndian.Uint64(sum[:8])
}

// Revoked describes the routes whose slot was removed from the store, one
// line each ("slot \"s\": model m → node/provider"), sorted; the edge
// warns with them at start, at reload and in -check.
func (m *Material) Revoked() []string {
	var out []string
	for k, slot := range m.revoked {
		out = append(out, fmt.Sprintf("slot %q: model %s → %s/%s", slot, k.model, k.node, k.provider))
	}
	sort.Strings(out)
	return out
}

// RouteRevoked reports whether the route of model to node/provider is one
// of Revoked's: its slot was removed from the store, so it issues no lease
// (Lease: ErrRevoked). False for a nil Material and with the plane off.
func (m *Material) RouteRevoked(model, node, provider string) bool {
	if m == nil {
		return false
	}
	_, revoked := m.revoked[routeKey{model, node, provider}]
	return revoked
}

// Enabled reports whether the plane is on.
func (m *Material) Enabled() bool { return m.enabled }

// Projection is the per-node credential projection for config payloads.
func (m *Material) Projection() config.CredentialProjection { return m.proj }

// Lease returns the lease and binding for r at now (SPEC C2), or nil, nil,
// nil with the plane off. The secret is decrypted from the store, sealed to
// the node's recipient key and cleared. Errors: ErrRevoked, ErrNoRoute,
// ErrIssue (wrapped with the route).
func (m *Material) Lease(now time.Time, r Request) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error) {
	if !m.enabled {
		return nil, nil, nil
	}
	rk := routeKey{r.Model, r.Node, r.Provider}
	rt, ok := m.routes[rk]
	rcp := m.recipients[r.Node]
	if slot, revoked := m.revoked[rk]; revoked {
		return nil, nil, fmt.Errorf("%w: slot %q, model %q on %s/%s", ErrRevoked, slot, r.Model, r.Node, r.Provider)
	}
	if !ok || rcp == nil {
		return nil, nil, fmt.Errorf("%w: model %q on %s/%s", ErrNoRoute, r.Model, r.Node, r.Provider)
	}
	secret, rev, err := m.store.Open(m.key, rt.slot)
	defer clear(secret)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: model %q on %s/%s: %w", ErrIssue, r.Model, r.Node, r.Provider, err)
	}
	b := &iop.CredentialLeaseBinding{
		Principal: r.Principal, Slot: rt.slot, Route: r.Model, Profile: rt.profile, UpstreamTarget: r.Target,
		NodeId: r.Node, Provider: r.Provider, CredentialRevision: rev, RouteRevision: rt.revision,
		ProjectionGeneration: m.proj.Nodes[r.Node].Generation, AuthHeader: rt.header, AuthScheme: rt.scheme,
		NodeBootId: r.BootID,
	}
	l, err := m.issuer.Issue(now, rcp, b, secret)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: model %q on %s/%s: %w", ErrIssue, r.Model, r.Node, r.Provider, err)
	}
	return l, b, nil
}

// ProbeLease returns the lease and binding for a health probe of provider
// on node for target (SPEC C3, H10: a recovery probe of a keyed models
// path needs the credential as a request does), or nil, nil, nil with the
// plane off. The first model group in config order that routes target to
// that provider names the slot and the binding's route; the principal is
// empty (the Edge's own). Errors: ErrNoRoute (no model group routes target
// there), ErrIssue.
func (m *Material) ProbeLease(now time.Time, node, provider, target string) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error) {
	return m.probeLease(now, node, provider, target, "")
}

// probeLease is ProbeLease binding the lease to the node's bootID.
func (m *Material) probeLease(now time.Time, node, provider, target, bootID string) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error) {
	if !m.enabled {
		return nil, nil, nil
	}
	rk, ok := m.probes[probeKey{node, provider, target}]
	if !ok {
		return nil, nil, fmt.Errorf("%w: target %q on %s/%s", ErrNoRoute, target, node, provider)
	}
	return m.Lease(now, Request{Model: rk.model, Node: node, Provider: provider, Target: target, BootID: bootID})
}

// IssuerKeyID is the id (lease.KeyID) of the issuer key leases are signed
// with, "" with the plane off.
func (m *Material) IssuerKeyID() string {
	if !m.enabled {
		return ""
	}
	return m.issuer.KeyID()
}

// Plane is the Edge's credential plane: the current Material, swapped on
// reload. Safe for concurrent use.
type Plane struct {
	cur   atomic.Pointer[Material]
	now   func() time.Time
	boots atomic.Pointer[func(node string) string]
}

// BindBoots makes every lease carry its node's boot id, as boot returns it
// (the transport's registration of that node; SPEC C3): a node refuses a
// lease bound to another boot of itself, so its restart invalidates the
// leases issued before. Until it is called leases carry none.
func (p *Plane) BindBoots(boot func(node string) string) { p.boots.Store(&boot) }

func (p *Plane) bootID(node string) string {
	if f := p.boots.Load(); f != nil {
		return (*f)(node)
	}
	return ""
}

// NewPlane returns a Plane serving m; now is the wall clock (nil =
// time.Now).
func NewPlane(m *Material, now func() time.Time) *Plane {
	if now == nil {
		now = time.Now
	}
	p := &Plane{now: now}
	p.cur.Store(m)
	return p
}

// Material returns the current Material.
func (p *Plane) Material() *Material { return p.cur.Load() }

// Swap makes m current; leases issued from then on use it.
func (p *Plane) Swap(m *Material) { p.cur.Store(m) }

// Lease issues r's lease from the current Material (see Material.Lease).
func (p *Plane) Lease(r Request) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error) {
	m := p.cur.Load()
	if !m.enabled {
		return nil, nil, nil
	}
	r.BootID = p.bootID(r.Node)
	return m.Lease(p.now(), r)
}

// ProbeLease issues a health probe's lease from the current Material (see
// Material.ProbeLease).
func (p *Plane) ProbeLease(node, provider, target string) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error) {
	m := p.cur.Load()
	if !m.enabled {
		return nil, nil, nil
	}
	return m.probeLease(p.now(), node, provider, target, p.bootID(node))
}
