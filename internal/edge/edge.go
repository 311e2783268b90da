// Package edge assembles the Edge daemon: the node transport (mutual TLS,
// registry, heartbeats), the provider pool, the client HTTP surface and the
// admin surface, wired so that node readiness and fencing drive the pool
// (SPEC L5, L8, Q5) and config reloads reach pool, surface and ready nodes
// (SPEC N2). It owns process-level lifecycle only; every decision lives in
// the packages it wires.
//
// Serve is the daemon's entry point (the edge binary's): build wires the
// parts and opens the listeners, starting nothing; serve starts the
// goroutines and applies reloads and effective-config changes one at a
// time; stop drains and ends them. It never routes, authenticates or reads
// a request body itself.
//
// Goroutines: the daemon's own are in four stages (daemon.go): background
// (the health recovery loop, the fleet store watch, the series sampler, the
// key store poll), servers (node transport, HTTP, admin), persist (the usage
// file) and export (the spans); stop ends and waits for every one before
// Serve returns. The parts it wires own theirs (api, transport, batch).
package edge

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/api"
	"iop/internal/edge/config"
	"iop/internal/edge/creds"
	"iop/internal/edge/events"
	"iop/internal/edge/fleet"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/edge/routing"
	"iop/internal/edge/tracing"
	"iop/internal/edge/transport"
	"iop/internal/identity"
	iop "iop/proto/gen/iop"
)

// PoolConfig projects the Edge config onto the provider pool's config
// (SPEC Q1: dispatch targets are exactly models[].providers). Each
// resource's Revision is its adapter's config.AdapterRevision in the
// node's current payload, which the pool compares with what the node's
// generation runs (pool.NodeRuns, SPEC N2). mat (nil =
// none) is the credential material: a route whose slot the secret store
// removed (mat.RouteRevoked, `edge secrets rm`) is no candidate while its
// model group has a route that is not revoked — it could issue no lease,
// and a request bound to it could fall back to no other slot (SPEC C6), so
// choosing it failed a request another route could serve. A group whose
// every route is revoked keeps them all: its requests get 502
// credential_unavailable, which says why.
func PoolConfig(c *config.Config, mat *creds.Material) pool.Config {
	pc := pool.Config{MaxWaiters: *c.Queue.MaxWaiters, WaitTimeout: time.Duration(c.Queue.WaitTimeoutMs) * time.Millisecond,
		StarvationGrants: c.Queue.StarvationGrants}
	for _, n := range c.Nodes {
		pc.Nodes = append(pc.Nodes, n.ID)
		revs := map[string]string{}
		for _, ac := range c.NodePayload(n.ID).GetAdapters() {
			revs[ac.GetName()] = config.AdapterRevision(ac)
		}
		for i := range n.Adapters {
			a := &n.Adapters[i]
			pc.Resources = append(pc.Resources, pool.Resource{
				Key:  pool.Key{Node: n.ID, Provider: a.Name},
				Type: a.Type, Category: a.Category,
				Capacity: a.Capacity, LongCapacity: *a.LongCapacity,
				Operations:             config.Operations(a),
				PrefillTokensPerSecond: a.PrefillTokensPerS,
				Revision:               revs[a.Name],
			})
		}
	}
	for _, m := range c.Models {
		mode, _ := routing.ParseMode(m.Routing) // validated by config
		g := pool.Group{Name: m.Name, LongContextTokens: m.LongContextTokens, Routing: mode,
			Epsilon: routing.DefaultEpsilon, AffinityWait: time.Duration(m.AffinityWaitMs) * time.Millisecond}
		if m.AffinityEpsilon != nil {
			g.Epsilon = *m.AffinityEpsilon
		}
		for _, f := range m.Fallbacks {
			g.Timed = g.Timed || f.WaitMs > 0 // SPEC V1: its service times predict the wait
		}
		g.Balance = routing.DefaultBalance
		if m.AffinityBalance != nil {
			g.Balance = *m.AffinityBalance
		}
		live := 0 // routes not revoked
		for _, mp := range m.Providers {
			if !mat.RouteRevoked(m.Name, mp.Node, mp.Provider) {
				live++
			}
		}
		for _, mp := range m.Providers {
			if live > 0 && mat.RouteRevoked(m.Name, mp.Node, mp.Provider) {
				continue
			}
			cd := pool.Candidate{
				Key:            pool.Key{Node: mp.Node, Provider: mp.Provider},
				Target:         mp.Target,
				StallTimeoutMs: c.EffectiveStallTimeoutMs(mp),
			}
			cd.Remote = c.RouteRemote(mp) // SPEC V3
			if n := c.NodeByID(mp.Node); c.Credentials.Enabled && n != nil {
				cd.Slot = config.RouteSlot(mp, n.Adapter(mp.Provider)) // SPEC C6: a re-dispatch stays within it
			}
			g.Candidates = append(g.Candidates, cd)
		}
		pc.Groups = append(pc.Groups, g)
	}
	return pc
}

// RunsOf is what a node generation running payload p runs, for
// pool.NodeRuns (SPEC N2): each adapter's config.AdapterRevision and the
// capacities p gives it. nil p runs nothing.
func RunsOf(p *iop.NodeConfigPayload) map[string]pool.Run {
	out := make(map[string]pool.Run, len(p.GetAdapters()))
	for _, a := range p.GetAdapters() {
		out[a.GetName()] = pool.Run{Revision: config.AdapterRevision(a), Capacity: int(a.GetCapacity()), LongCapacity: int(a.GetLongCapacity())}
	}
	return out
}

// streamedGap is how long after its first byte a response must still have
// been running for that first byte to count as a time to first token: a
// non-streamed answer's head and body are written together, after the
// whole generation.
const streamedGap = 10 * time.Millisecond

// firstBytes is the access.Observer that reports every finished request's
// time from its lease to its first byte to the pool (observeFirstByte).
type firstBytes struct{ p *pool.Pool }

func (f firstBytes) Observe(r *access.Record) { observeFirstByte(f.p, r) }

// observeFirstByte reports a finished request's time from its lease to its
// first byte (the access record's TTFB less its queue wait) to the pool,
// which pairs it with the lease to calibrate the provider's prefill speed
// for prefix_affinity (SPEC Q3 cost of a turn, pool.ObserveFirstByte). It
// counts only a completed, streamed answer on its first attempt.
func observeFirstByte(p *pool.Pool, r *access.Record) {
	if r.Node == "" || r.Path == access.PathNone {
		return
	}
	usable := r.Outcome == access.OK && r.Retries == 0 && r.TTFB > 0 && r.Duration-r.TTFB >= streamedGap
	p.ObserveFirstByte(pool.Key{Node: r.Node, Provider: r.Provider}, r.TTFB-r.QueueWait, usable)
}

// OutlierPolicy projects outlier_detection onto the passive-health policy
// (docs/config.md, "What cools a provider").
func OutlierPolicy(c *config.Config) outlier.Policy {
	od := c.OutlierDetection
	return outlier.Policy{
		Base:     time.Duration(od.BaseEjectionMs) * time.Millisecond,
		Max:      time.Duration(od.MaxEjectionMs) * time.Millisecond,
		Disabled: od.Enabled != nil && !*od.Enabled,
	}
}

// newExporter is the OTLP exporter of cfg's tracing block, nil when
// tracing is off (docs/operating.md "Tracing").
func newExporter(cfg *config.Config, version string, log *slog.Logger) *tracing.Exporter {
	t := cfg.Tracing
	if !t.Enabled() {
		return nil
	}
	log.Info("tracing on", "endpoint", tracing.Endpoint(t.OTLPEndpoint), "sampling_ratio", t.Ratio())
	return tracing.New(tracing.Options{Endpoint: tracing.Endpoint(t.OTLPEndpoint), Timeout: time.Duration(t.TimeoutMs) * time.Millisecond,
		QueueSpans: t.QueueSpans, Resource: tracing.Resource{Version: version}, Logger: log.With("component", "tracing")})
}

// sameTracing reports whether two tracing blocks are equal.
func sameTracing(a, b config.Tracing) bool {
	return a.OTLPEndpoint == b.OTLPEndpoint && a.Ratio() == b.Ratio() && a.TimeoutMs == b.TimeoutMs && a.QueueSpans == b.QueueSpans
}

// payloadStates is the transport's view of which config payload each ready
// node runs, for /status (SPEC N2).
type payloadStates struct{ tr *transport.Server }

// ConfigErrors is why a node could not run this edge's config (SPEC N2).
func (p payloadStates) ConfigErrors() map[string]string { return p.tr.ConfigErrors() }

func (p payloadStates) NodePayloads() map[string]string {
	out := map[string]string{}
	for _, n := range p.tr.Nodes() {
		if n.Payload != "" {
			out[n.ID] = string(n.Payload)
		}
	}
	return out
}

// overlayEvents is the pool's overlay as the health tracker sees it, with
// each applied change published on the droppable fan-out (SPEC N4, L10:
// published after the pool changed, never waited for).
type overlayEvents struct {
	p   *pool.Pool
	bus *events.Bus
}

func (o overlayEvents) SetOverlay(k pool.Key, gen, seq uint64) bool {
	ok := o.p.SetOverlay(k, gen, seq)
	if ok {
		o.bus.Publish(events.Event{Type: events.TypeProviderUnavailable, Node: k.Node, Provider: k.Provider, Time: time.Now(),
			Reason: "runtime-unavailable overlay (stall evidence)"})
	}
	return ok
}

func (o overlayEvents) ClearOverlay(k pool.Key, gen, seq uint64) bool {
	ok := o.p.ClearOverlay(k, gen, seq)
	if ok {
		o.bus.Publish(events.Event{Type: events.TypeProviderAvailable, Node: k.Node, Provider: k.Provider, Time: time.Now(),
			Reason: "recovery probe answered available"})
	}
	return ok
}

// ejectEvents is the pool's passive-health ejection as the outlier
// detector drives it, with each change published on the droppable fan-out
// (provider.cooling, provider.readmitted; SPEC N4, L10).
type ejectEvents struct {
	p   *pool.Pool
	bus *events.Bus
}

func (e ejectEvents) Eject(k pool.Key, until time.Time, reason string) bool {
	ok := e.p.Eject(k, until, reason)
	if ok {
		e.bus.Publish(events.Event{Type: events.TypeProviderCooling, Node: k.Node, Provider: k.Provider, Time: time.Now(),
			Reason: reason + ", until " + until.UTC().Format(time.RFC3339)})
	}
	return ok
}

func (e ejectEvents) Readmit(k pool.Key) bool {
	ok := e.p.Readmit(k)
	if ok {
		e.bus.Publish(events.Event{Type: events.TypeProviderReadmitted, Node: k.Node, Provider: k.Provider, Time: time.Now()})
	}
	return ok
}

// drainHTTP is the graceful drain (SIGTERM): new requests get 503 with
// Retry-After while those in flight go on, with nodes still connected, for
// up to timeout; then what is left is ended with an error in its surface's
// shape (api.Handler.Stop) and, once those have answered (bounded by
// stopWait), the server shuts down. A handler that still runs then is one
// a client holds (it stopped reading the stream, or never sends the body
// it declared): closing the connections ends it, and drainHTTP returns only
// once every handler has returned (bounded by stopWait again), so that
// each request has written its access line before the process exits.
func drainHTTP(log *slog.Logger, srv *http.Server, h *api.Handler, timeout, stopWait time.Duration) {
	h.Drain()
	srv.SetKeepAlivesEnabled(false) // idle connections close; answers carry Connection: close
	log.Info("edge draining", "in_flight", h.InFlight(), "drain_timeout_ms", timeout.Milliseconds())
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	err := h.WaitIdle(dctx)
	cancel()
	if err != nil {
		log.Warn("drain timeout: ending the requests still in flight", "in_flight", h.InFlight())
		h.Stop()
		wctx, cancel := context.WithTimeout(context.Background(), stopWait)
		if h.WaitIdle(wctx) != nil {
			log.Warn("requests still in flight after the stop; closing their connections", "in_flight", h.InFlight())
		}
		cancel()
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	_ = srv.Close() // what Shutdown left: connections whose handler is blocked on its client
	wctx, cancel := context.WithTimeout(context.Background(), stopWait)
	if h.WaitIdle(wctx) != nil {
		log.Warn("request handlers still running after their connections closed", "in_flight", h.InFlight())
	}
	cancel()
}

// stopWait bounds the wait for requests ended by api.Handler.Stop to
// answer, for handlers whose connection was closed to return, and for the
// cancelled streams' leases to come back after the node sessions closed.
const stopWait = 5 * time.Second

// drainTimeout is shutdown.drain_timeout_ms, or override when positive.
func drainTimeout(c *config.Config, override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	if c != nil && c.Shutdown.DrainTimeoutMs > 0 {
		return time.Duration(c.Shutdown.DrainTimeoutMs) * time.Millisecond
	}
	return config.DefaultDrainTimeoutMs * time.Millisecond
}

// Check validates what Serve would load before serving: the certificate, key
// and CA files (readable, matching, an edge identity) and, with the
// credential plane on, the issuer key, the secret store and its key (every
// route's slot present and opening, or removed by `edge secrets rm`), and
// the key store and the usage file (docs/keys.md). It returns what Serve
// would warn about: the config's Warnings and the routes revoked by a
// removed slot. `edge -check` uses it.
func Check(cfg *config.Config) (warnings []string, err error) {
	if _, err := loadKeys(cfg, nil); err != nil {
		return nil, err
	}
	fl, err := fleet.New(cfg, fleet.Options{})
	if err != nil {
		return nil, fmt.Errorf("enrollment: %w", err)
	}
	if _, err := tlsConfig(cfg, func(string) bool { return true }, fl); err != nil {
		return nil, err
	}
	mat, err := creds.Load(cfg.Effective(fl.Inputs()), nil, time.Now())
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	warnings = cfg.Warnings()
	for _, r := range mat.Revoked() {
		warnings = append(warnings, "credential route revoked (its slot was removed from the secret store; it issues no lease): "+r)
	}
	return warnings, nil
}

// tlsConfig is the node listener's TLS config (SPEC I1, I2): mutual TLS
// for sessions, whose certificates the fleet also checks (revoked or
// superseded, SPEC J6), and join connections on the same port (SPEC J1).
func tlsConfig(cfg *config.Config, allow func(string) bool, fl *fleet.Fleet) (*tls.Config, error) {
	tc, err := identity.ServerConfig(identity.ServerOptions{
		CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.CAFile,
		TrustDomain: cfg.TLS.TrustDomain, AllowNode: allow, VerifyNode: fl.Admit,
	})
	if err != nil {
		return nil, fmt.Errorf("edge tls: %w", err)
	}
	if ca := fl.ChainCA(); ca != nil {
		tc = identity.JoinServerConfig(tc, ca)
	}
	return tc, nil
}

// residencyOf is a NodeResidencyReport as the pool takes it (SPEC U6); the
// pool bounds what it keeps.
func residencyOf(r *iop.NodeResidencyReport) map[string][]pool.ModelResidency {
	out := make(map[string][]pool.ModelResidency, len(r.GetAdapters()))
	for _, a := range r.GetAdapters() {
		ms := make([]pool.ModelResidency, 0, min(len(a.GetModels()), 4096))
		for _, m := range a.GetModels() {
			if len(ms) == cap(ms) {
				break
			}
			ms = append(ms, pool.ModelResidency{Model: m.GetModel(), State: m.GetState(), LoadMs: max(m.GetLoadMs(), 0),
				MemoryMB: max(m.GetMemoryMb(), 0), InFlight: int(max(m.GetInFlight(), 0)),
				Counts: pool.ResidencyCounts{Loads: m.GetLoads(), LoadMsTotal: max(m.GetLoadMsTotal(), 0), LoadFailures: m.GetLoadFailures(),
					Crashes: m.GetCrashes(), Evictions: m.GetEvictions(), IdleUnloads: m.GetIdleUnloads()}})
		}
		out[a.GetAdapter()] = ms
	}
	return out
}
