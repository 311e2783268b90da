// Package fleet is the part of the edge's node set that is not in its
// config file (SPEC J1-J7, D1, D2): the enrollment store (join tokens,
// enrolled and revoked nodes), the join and renewal exchanges that sign
// node certificates with the CA key held online, the handshake check that
// refuses revoked and superseded certificates, and the models the nodes'
// backends report. The edge combines its config file with Inputs through
// config.Effective whenever Changed fires.
//
// It must never log or return a join token's secret or a private key,
// never write the store except through Update (locked, atomic), and never
// block a transport read loop: Report, NodeFenced and Admit only take its
// lock for map work.
//
// # Goroutines and locks
//
// Watch runs on its caller's goroutine (the edge starts one) and re-reads
// the store when the file changes; ServeJoin runs on the transport's
// connection goroutine of a join connection; Renew on a goroutine of the
// node's session. Fleet.mu guards the snapshot and the discovery state; it
// is never held across file I/O, a signature or Changed.
package fleet

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/limit"
	"iop/internal/identity"
	"iop/internal/ratelog"
	"iop/internal/storefile"
)

// DefaultWatchInterval is how often Watch looks at the store file.
const DefaultWatchInterval = 250 * time.Millisecond

// Options configure a Fleet.
type Options struct {
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the wall clock of tokens and certificates; nil = time.Now.
	Now func() time.Time
	// Changed is called outside every lock when Inputs changed: a node
	// joined or was revoked, or the models a node reports changed. It must
	// not block (the edge coalesces the calls into one recomputation of
	// its config).
	Changed func()
	// WaitApplied, when set, blocks until the edge has applied every
	// change Changed announced so far, or ctx ends: a join answers only
	// once its node can register (SPEC J2).
	WaitApplied func(ctx context.Context)
	// WatchInterval overrides DefaultWatchInterval (tests).
	WatchInterval time.Duration
}

// Fleet holds the enrollment material and state. Make one with New.
type Fleet struct {
	o   Options
	log *slog.Logger

	mu    sync.Mutex
	cfg   *config.Config        // the config file's; guarded by mu
	mat   *material             // guarded by mu; replaced by Reconfigure
	snap  *Store                // the store as last read; guarded by mu, never mutated
	stamp storefile.Stamp       // of the store file when snap was read; guarded by mu
	disc  map[string]*discovery // node → what it reports; guarded by mu

	joins     limit.Keys
	joinLog   ratelog.Limiter
	renewLog  ratelog.Limiter // refused renewals (renew.go)
	modelsLog ratelog.Limiter // the "node models" lines (discovery.go)
}

// material is what one config makes of enrollment: the CA (nil when
// enrollment is off), the identities and the policy.
type material struct {
	enabled     bool
	ca          *identity.CA
	storePath   string
	trustDomain string
	edgeName    string
	issuerPub   ed25519.PublicKey // nil without credentials.issuer_key_file
	chainCA     *x509.Certificate // the CA of tls.ca_file that signed the edge's certificate; nil if none
	ttl         time.Duration
	joinsPerMin int
}

// New loads what cfg (the config file's, not Effective's) names: the CA
// when enrollment is on (tls.ca_file and enrollment.ca_key_file must be a
// matching pair), the edge's own name, the lease issuer public key when
// credentials.issuer_key_file is set, and the enrollment store (a missing
// file is empty). An unusable file is an error naming it.
func New(cfg *config.Config, o Options) (*Fleet, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Changed == nil {
		o.Changed = func() {}
	}
	if o.WatchInterval <= 0 {
		o.WatchInterval = DefaultWatchInterval
	}
	f := &Fleet{o: o, log: o.Logger, disc: map[string]*discovery{}}
	if err := f.Reconfigure(cfg); err != nil {
		return nil, err
	}
	return f, nil
}

// Reconfigure loads cfg's enrollment material and re-reads the store
// (a reload, SIGHUP); on an error nothing changes. It does not call
// Changed: the caller recomputes its config anyway.
func (f *Fleet) Reconfigure(cfg *config.Config) error {
	m, err := loadMaterial(cfg)
	if err != nil {
		return err
	}
	stamp := storefile.StatStamp(m.storePath)
	st, err := LoadStore(m.storePath)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.cfg, f.mat, f.snap, f.stamp = cfg, m, st, stamp
	f.mu.Unlock()
	return nil
}

func loadMaterial(cfg *config.Config) (*material, error) {
	e := cfg.Enrollment
	m := &material{enabled: e.Enabled(), storePath: e.StoreFile, trustDomain: cfg.TLS.TrustDomain,
		ttl: time.Duration(e.CertificateTTLMs) * time.Millisecond, joinsPerMin: e.JoinsPerMinute}
	own, err := os.ReadFile(cfg.TLS.CertFile)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file: %w", err)
	}
	leaf, err := identity.ParseCertificatePEM(own)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file %s: %w", cfg.TLS.CertFile, err)
	}
	id, err := identity.FromCertificate(leaf)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file %s: %w", cfg.TLS.CertFile, err)
	}
	m.edgeName = id.Name
	if m.chainCA, err = identity.IssuerIn(cfg.TLS.CAFile, leaf); err != nil {
		return nil, fmt.Errorf("tls.ca_file: %w", err)
	}
	if m.enabled {
		if m.ca, err = identity.LoadCA(cfg.TLS.CAFile, e.CAKeyFile); err != nil {
			return nil, fmt.Errorf("enrollment.ca_key_file: %w", err)
		}
		if err := leaf.CheckSignatureFrom(m.ca.Cert); err != nil {
			return nil, fmt.Errorf("enrollment.ca_key_file: the edge's certificate %s is not signed by this CA; nodes that join could not verify the edge", cfg.TLS.CertFile)
		}
	}
	if k := cfg.Credentials.IssuerKeyFile; k != "" {
		priv, err := identity.LoadIssuerPrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("credentials.issuer_key_file: %w", err)
		}
		m.issuerPub = priv.Public().(ed25519.PublicKey)
		clear(priv)
	}
	return m, nil
}

// ChainCA is the CA certificate a join connection presents after the
// edge's own (SPEC J1): the one of tls.ca_file that signed the edge's
// certificate, or nil when the bundle holds none (joins then fail the
// node's pin check).
func (f *Fleet) ChainCA() *x509.Certificate { return f.material().chainCA }

// Inputs is what config.Effective needs from the fleet: the enrolled nodes
// (not revoked), the revoked names and the discovered models.
func (f *Fleet) Inputs() ([]config.EnrolledNode, map[string]bool, config.Discovered) {
	f.mu.Lock()
	defer f.mu.Unlock()
	enrolled, revoked := storeInputs(f.snap)
	disc := make(config.Discovered, len(f.disc))
	for node, d := range f.disc {
		if !d.fenced {
			disc[node] = d.adapters // never mutated: Report replaces the map
		}
	}
	return enrolled, revoked, disc
}

func storeInputs(st *Store) ([]config.EnrolledNode, map[string]bool) {
	var enrolled []config.EnrolledNode
	revoked := map[string]bool{}
	for _, r := range st.Nodes {
		switch {
		case r.RevokedAt != nil:
			revoked[r.Name] = true
		case len(r.Serials) > 0:
			enrolled = append(enrolled, config.EnrolledNode{ID: r.Name, LeaseRecipientPublicKey: r.LeaseRecipientPublicKey})
		}
	}
	return enrolled, revoked
}

// Admit is identity.ServerOptions.VerifyNode (SPEC J6): a node with a
// record in the store must present one of the certificates the store
// issued it last, and a revoked name none. A name without a record (a
// node of the config file with a certificate from edge pki) is admitted.
func (f *Fleet) Admit(id identity.ID, leaf *x509.Certificate) error {
	f.mu.Lock()
	r := f.snap.Node(id.Name)
	var revoked bool
	var serials []string
	if r != nil {
		revoked, serials = r.RevokedAt != nil, r.Serials
	}
	f.mu.Unlock()
	switch {
	case r == nil:
		return nil
	case revoked:
		return fmt.Errorf("%w: %s", ErrNodeRevoked, id)
	case !slices.Contains(serials, serialHex(leaf)):
		return fmt.Errorf("%w: %s presented serial %s", ErrSuperseded, id, serialHex(leaf))
	}
	return nil
}

// Known reports whether the store has a record of name (enrolled or
// revoked): Admit, not the configured names, decides its handshake.
func (f *Fleet) Known(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap.Node(name) != nil
}

func serialHex(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// Watch re-reads the store whenever the file changes (edge tokens,
// edge nodes revoke, another process) until stop is closed, and calls
// Changed when the enrolled or revoked nodes changed: a revoked node is
// thereby disconnected within about one WatchInterval (SPEC J6).
func (f *Fleet) Watch(stop <-chan struct{}) {
	t := time.NewTicker(f.o.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		f.reread()
	}
}

// reread loads the store if its file changed; it reports whether Inputs
// changed and then calls Changed. A file that does not load is logged
// once per change of it; the last store read stays in effect.
func (f *Fleet) reread() bool {
	f.mu.Lock()
	m, last := f.mat, f.stamp
	f.mu.Unlock()
	stamp := storefile.StatStamp(m.storePath)
	if stamp == last {
		return false
	}
	st, err := LoadStore(m.storePath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false
		}
		f.mu.Lock()
		if f.mat == m { // this file is reported once, until it changes again
			f.stamp = stamp
		}
		f.mu.Unlock()
		f.log.Error("enrollment store unreadable; keeping the last one read", "err", err)
		return false
	}
	return f.install(m, st, stamp)
}

// install makes st the snapshot (read at stamp) and calls Changed when
// the enrolled or revoked nodes differ from the previous snapshot's.
func (f *Fleet) install(m *material, st *Store, stamp storefile.Stamp) bool {
	f.mu.Lock()
	if f.mat != m { // a Reconfigure came in between: it read the store itself
		f.mu.Unlock()
		return false
	}
	oldE, oldR := storeInputs(f.snap)
	newE, newR := storeInputs(st)
	f.snap, f.stamp = st, stamp
	f.mu.Unlock()
	if slices.Equal(oldE, newE) && mapsEqual(oldR, newR) {
		return false
	}
	for _, name := range slices.Sorted(maps.Keys(newR)) {
		if !oldR[name] { // the fence that follows names only the config change
			f.log.Warn("node revoked: disconnecting it and refusing its certificate", "node", name)
		}
	}
	f.o.Changed()
	return true
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// update runs fn under the store's lock (Update) and installs the store it
// saved as the snapshot.
func (f *Fleet) update(m *material, fn func(*Store) error) error {
	st, stamp, err := update(m.storePath, fn)
	if err != nil {
		return err
	}
	f.install(m, st, stamp)
	return nil
}

// material returns the current enrollment material.
func (f *Fleet) material() *material {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mat
}
