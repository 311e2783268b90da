// Package node runs the Node daemon: it builds the mutual-TLS client config
// from the node's own files, then lets one supervisor goroutine per edge
// (node config edges[], or edge_addr for one) dial that Edge and keep a
// session with it for as long as the process runs (SPEC S1–S5).
//
// It never reads flags or the environment (main passes LookupEnv), never
// exits the process (main maps Run's result to an exit code, SPEC S4) and
// never listens: the Node only dials out (SPEC P1).
package node

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"iop/internal/identity"
	"iop/internal/lease"
	"iop/internal/node/adapter"
	"iop/internal/node/config"
	"iop/internal/node/enroll"
	"iop/internal/node/session"
	"iop/internal/node/supervisor"
	iop "iop/proto/gen/iop"
)

// Options are Run's dependencies, injected by main or a test.
type Options struct {
	Logger  *slog.Logger // nil: discard
	Version string       // reported in RegisterRequest.version
	// LookupEnv resolves AdapterConfig.api_key_env (os.LookupEnv in main).
	LookupEnv func(string) (string, bool)
	// HTTPClient is the upstream client shared by the adapter instances;
	// nil = the adapter package's default.
	HTTPClient *http.Client
	// NewExecutor overrides how a NodeConfigPayload becomes an Executor
	// (tests); nil = the adapter set.
	NewExecutor session.NewExecutorFunc
	// Timeouts override the session's defaults (tests).
	Timeouts session.Timeouts
	// Now is the wall clock leases are checked against; nil = time.Now.
	Now func() time.Time
}

// Run runs the Node until ctx is done or it stops for good. It first builds
// the TLS client config of every edge from cfg.TLS (each edge's with its
// own expected certificate name); an unreadable or invalid certificate,
// key or CA file is fatal at once, before any dial (SPEC S3). Then one
// supervisor per edge of cfg.Edges dials it and reconnects with cfg's
// reconnect policy (SPEC S1, S2; supervisor.RunEdges: attempts count only
// while no edge has a ready session). Every edge's session runs the
// payload that edge sent, on adapters whose capacity is the node's, shared
// by all edges (adapter.Capacity, SPEC E4). It returns
//   - nil after ctx is done (SIGINT/SIGTERM): promptly when not connected
//     (even mid-backoff); every ready session drains first (session.Connect:
//     each edge stops dispatching to it, work in flight gets
//     shutdown.drain_timeout_ms);
//   - an error wrapping supervisor.ErrFatal (and an *identity.FileError for a
//     credential file) for a local error;
//   - an error wrapping supervisor.ErrExhausted once every edge used up
//     reconnect.max_attempts consecutive failed attempts.
func Run(ctx context.Context, cfg *config.Config, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("node_id", cfg.NodeID)
	if err := enroll.Recover(cfg.TLS.CertFile, cfg.TLS.KeyFile); err != nil { // SPEC J5: an interrupted renewal
		return supervisor.MarkFatal(fmt.Errorf("node %s: recovering a renewed key: %w", cfg.NodeID, err))
	}
	tcs := make([]*tls.Config, len(cfg.Edges))
	for i, e := range cfg.Edges {
		tc, err := tlsConfig(cfg, e.Name)
		if err != nil {
			return supervisor.MarkFatal(err)
		}
		tcs[i] = tc
	}
	opener, err := leaseOpener(cfg)
	if err != nil {
		return supervisor.MarkFatal(err)
	}
	capacity := adapter.NewCapacity()                                // SPEC E4: one capacity per adapter, whichever edge sends the work
	residency := adapter.NewSignal()                                 // SPEC U6: every residency change wakes every session's report
	ollamaWatch := adapter.NewOllamaWatchers()                       // SPEC U7: each Ollama read once for every edge
	backends, closeManaged, err := startManaged(cfg, log, residency) // SPEC U1: the node's own managed backends, shared by every edge
	if err != nil {
		return supervisor.MarkFatal(err)
	}
	defer closeManaged() // after every session drained: then no request is in flight on a process
	// SPEC J5: one certificate for every edge; used only when an edge's
	// payload says certificate_renewal (two sessions due at once: the
	// second request replaces the first's key, whose answer then fails to
	// install and is retried; by then the file is renewed).
	renewer := enroll.NewRenewer(identity.ID{TrustDomain: cfg.TLS.TrustDomain, Role: identity.RoleNode, Name: cfg.NodeID},
		cfg.TLS.CertFile, cfg.TLS.KeyFile)
	p := supervisor.Policy{Interval: cfg.Interval(), MaxAttempts: cfg.MaxAttempts()}
	edges := make([]supervisor.Edge, 0, len(cfg.Edges))
	peers := &edgePeers{held: map[string]int{}}
	for i, e := range cfg.Edges {
		elog := log
		if len(cfg.Edges) > 1 {
			elog = log.With("edge", e.String())
		}
		newExec := o.NewExecutor
		if newExec == nil {
			newExec = adapterExecutor(o, elog, cfg.NodeID, opener, cfg.APIKeyEnvAllowed, capacity, e, backends, residency, ollamaWatch)
		}
		so := session.Options{
			NodeID:      cfg.NodeID,
			Addr:        e.Addr,
			TLS:         tcs[i],
			NewExecutor: newExec,
			Version:     o.Version,
			Logger:      elog,
			Timeouts:    o.Timeouts,
			// SIGTERM on a ready session: NodeDrainingNotice, then the work in
			// flight gets shutdown.drain_timeout_ms to finish.
			DrainTimeout: cfg.DrainTimeout(),
			// What the drain timeout leaves is cancelled with this cause: the
			// adapters end it with failure code node_shutdown.
			DrainCause: adapter.ErrNodeShutdown,
			Renewer:    renewer,
			// SPEC E4: the edge admits at most this share of each adapter.
			CapacityShare: e.CapacityShare,
		}
		if len(cfg.Edges) > 1 {
			// SPEC S1: two entries that reach one edge are one edge.
			so.ClaimPeer = func(remote string) (func(), error) { return peers.claim(cfg.Edges, i, remote) }
		}
		if opener != nil {
			// SPEC C3: the edge binds this process's leases to its boot (a
			// restart invalidates them) and checks its issuer key against
			// the ones trusted here before a reload.
			so.BootID, so.TrustedIssuerKeyIDs = opener.BootID(), opener.IssuerKeyIDs()
		}
		edges = append(edges, supervisor.Edge{Name: e.String(), Log: elog,
			Connect: func(ctx context.Context, ready func()) (bool, error) {
				so := so
				so.OnReady = ready
				ready2, err := session.Connect(ctx, so)
				if errors.Is(err, session.ErrRegisterFatal) { // SPEC N6: retrying this edge cannot help
					return ready2, supervisor.MarkGiveUp(err)
				}
				return ready2, err
			}})
		log.Info("node starting", "edge", e.Name, "edge_addr", e.Addr, "reconnect_interval_ms", p.Interval.Milliseconds(), "max_attempts", p.MaxAttempts)
	}
	return supervisor.RunEdges(ctx, p, edges)
}

// edgePeers are the edge addresses the sessions of a Node with several
// edges are connected to (SPEC S1): edges[] entries are distinct as
// written, but two of them can still reach one edge (a host name and its
// address, two names of one host), and that edge would see the node's
// two sessions take its identity from each other at every reconnect (L4).
// The session that dials an address another entry's session holds goes
// no further and is retried every reconnect interval like a down edge
// (its attempts do not count while the other session is ready, S2).
type edgePeers struct {
	mu   sync.Mutex
	held map[string]int // remote "ip:port" → the edges[] index connected to it
}

// claim records that entry i's session is connected to remote, or refuses
// it, naming both entries, when another entry's session is. release
// forgets the claim.
func (p *edgePeers) claim(edges []config.Edge, i int, remote string) (release func(), err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if j, ok := p.held[remote]; ok && j != i {
		return nil, fmt.Errorf("edges[%d] %s reaches the edge address %s that edges[%d] %s is connected to: one edge listed twice (remove one entry)",
			i, edges[i].Addr, remote, j, edges[j].Addr)
	}
	p.held[remote] = i
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.held[remote] == i {
			delete(p.held, remote)
		}
	}, nil
}

// adapterExecutor returns the factory that turns a NodeConfigPayload into the
// Node's adapter set (SPEC N2); an adapter's api_key_env is read only when
// allowEnv (the node config's api_key_env_allow) offers it. ReuseBodyBuffers is on: the session's emit
// either writes a BODY frame before it returns or, when it has to queue the
// frame for the writer, copies the body first.
// Every Set shares capacity; edge's share bounds its requests and its
// name keys the backends its payload names (adapter.ErrAdapterConflict).
func adapterExecutor(o Options, log *slog.Logger, nodeID string, opener *lease.Opener, allowEnv func(string) bool,
	capacity *adapter.Capacity, edge config.Edge, backends map[string]adapter.ManagedBackend, residency *adapter.Signal, ollamaWatch *adapter.OllamaWatchers) session.NewExecutorFunc {
	return func(p *iop.NodeConfigPayload) (session.Executor, error) {
		set, err := adapter.NewSet(p, adapter.Options{
			HTTPClient:       o.HTTPClient,
			Logger:           log,
			LookupEnv:        o.LookupEnv,
			AllowEnv:         allowEnv,
			ReuseBodyBuffers: true,
			NodeID:           nodeID,
			Leases:           opener,
			Now:              o.Now,
			Capacity:         capacity,
			Edge:             edge.String(),
			CapacityShare:    edge.CapacityShare,
			Managed:          backends,
			Residency:        residency,
			Ollama:           ollamaWatch,
		})
		if restartRequired(err) {
			return nil, fmt.Errorf("%w: %w", session.ErrRestartRequired, err)
		}
		if err != nil {
			return nil, err
		}
		return set, nil
	}
}

// restartRequired reports whether NewSet refused a payload for want of
// something this process read at start and only a restart reads again
// (SPEC N2 RESTART_REQUIRED): its lease keys (none, or not the ones the
// payload names: credentials in the node config), an api_key_env its
// api_key_env_allow does not offer, or one its environment lacks. Any other
// refusal is the payload's own fault (FAILED).
func restartRequired(err error) bool {
	return errors.Is(err, adapter.ErrNoLeaseKeys) || errors.Is(err, adapter.ErrLeaseKeyMismatch) ||
		errors.Is(err, adapter.ErrAPIKeyEnvNotAllowed) || errors.Is(err, adapter.ErrMissingAPIKey) ||
		errors.Is(err, adapter.ErrUnknownManaged)
}

// Check validates what Run would load before dialing: the certificate, key
// and CA files (readable, matching, this node's identity) and the lease
// keys. `node -check` uses it, so a config that passes the check does not
// fail at start.
func Check(cfg *config.Config) error {
	for _, e := range cfg.Edges {
		if _, err := tlsConfig(cfg, e.Name); err != nil {
			return err
		}
	}
	_, err := leaseOpener(cfg)
	return err
}

// leaseOpener loads the node's lease keys (SPEC C3) into an Opener with
// one replay cache for the process, shared by every config the Edge
// pushes; nil when the config names none.
func leaseOpener(cfg *config.Config) (*lease.Opener, error) {
	cr := cfg.Credentials
	if cr.RecipientPrivateKeyFile == "" {
		return nil, nil
	}
	priv, err := identity.LoadRecipientPrivateKey(cr.RecipientPrivateKeyFile)
	if err != nil {
		return nil, fmt.Errorf("node %s: credentials.recipient_private_key_file: %w", cfg.NodeID, err)
	}
	type entry struct{ key, value string }
	entries := []entry{}
	if cr.IssuerPublicKey != "" {
		entries = append(entries, entry{"credentials.issuer_public_key", cr.IssuerPublicKey})
	}
	for i, k := range cr.IssuerPublicKeys {
		entries = append(entries, entry{fmt.Sprintf("credentials.issuer_public_keys[%d]", i), k})
	}
	var issuers []ed25519.PublicKey
	for _, e := range entries {
		var issuer ed25519.PublicKey
		if config.IsKeyBase64(e.value) {
			issuer, err = identity.ParseIssuerPublicKeyBase64(e.value)
		} else {
			issuer, err = identity.LoadIssuerPublicKey(e.value)
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: %s: %w", cfg.NodeID, e.key, err)
		}
		issuers = append(issuers, issuer)
	}
	o, err := lease.NewOpener(priv, issuers, lease.NewReplayCache(0), 0)
	if err != nil {
		return nil, fmt.Errorf("node %s: credentials: %w", cfg.NodeID, err)
	}
	return o, nil
}

// tlsConfig is the client config for the edge whose certificate name is
// edgeName (SPEC I2).
func tlsConfig(cfg *config.Config, edgeName string) (*tls.Config, error) {
	tc, err := identity.ClientConfig(identity.ClientOptions{
		CertFile:         cfg.TLS.CertFile,
		KeyFile:          cfg.TLS.KeyFile,
		CAFile:           cfg.TLS.CAFile,
		TrustDomain:      cfg.TLS.TrustDomain,
		ExpectedEdgeName: edgeName,
		NodeName:         cfg.NodeID,
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: TLS credentials: %w", cfg.NodeID, err)
	}
	return tc, nil
}
