// Package edge assembles the Edge daemon: the node transport (mutual TLS,
// registry, heartbeats), the provider pool, the client HTTP surface and the
// admin surface, wired so that node readiness and fencing drive the pool
// (SPEC L5, L8, Q5) and config reloads reach pool, surface and ready nodes
// (SPEC N2). It owns process-level lifecycle only; every decision lives in
// the packages it wires.
package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/admin"
	"iop/internal/edge/api"
	"iop/internal/edge/config"
	"iop/internal/edge/creds"
	"iop/internal/edge/events"
	"iop/internal/edge/fleet"
	"iop/internal/edge/health"
	"iop/internal/edge/keys"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/edge/routing"
	"iop/internal/edge/tracing"
	"iop/internal/edge/transport"
	"iop/internal/identity"
	iop "iop/proto/gen/iop"
)

// Options for Run.
type Options struct {
	Logger  *slog.Logger
	Version string
	// Reload delivers validated configs (SIGHUP in main); nil = never.
	Reload <-chan *config.Config
	// Listeners, when set, are used instead of listening on the config's
	// addresses (tests pass 127.0.0.1:0 listeners).
	HTTPListener, NodeListener, AdminListener net.Listener
	// Started, when set, is called once every listener is serving.
	Started func(Addrs)
	// ShutdownGrace, when positive, replaces shutdown.drain_timeout_ms: how
	// long requests in flight may go on after ctx is done.
	ShutdownGrace time.Duration
	// HealthProbeInterval is the recovery loop's period (SPEC H10); 0 =
	// health.DefaultProbeInterval, bounded by health.MinProbeInterval and
	// health.MaxProbeInterval.
	HealthProbeInterval time.Duration
	// RegisterBurst and RegisterInterval bound how often one node identity
	// may register (transport.Options; SPEC L4): 0 = the transport's
	// defaults, a negative RegisterBurst removes the bound (tests of a
	// takeover storm).
	RegisterBurst    int
	RegisterInterval time.Duration
}

// Addrs are the bound listener addresses.
type Addrs struct{ HTTP, Node, Admin net.Addr }

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
			// SPEC V3: a route whose adapter is not known here counts as
			// remote (a local-only key fails closed).
			if n := c.NodeByID(mp.Node); n == nil || n.Adapter(mp.Provider) == nil {
				cd.Remote = true
			} else {
				cd.Remote = n.Adapter(mp.Provider).Remote()
			}
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

// Run serves until ctx is done, then drains HTTP (bounded), closes node
// sessions and returns nil. It returns an error at once when the TLS
// material is unusable or a listener cannot be opened.
func Run(ctx context.Context, cfg *config.Config, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ap := newApplier()
	fl, err := fleet.New(cfg, fleet.Options{Logger: log.With("component", "fleet"), Changed: ap.request, WaitApplied: ap.wait})
	if err != nil {
		return fmt.Errorf("enrollment: %w", err)
	}
	file := cfg // as read from the file; the edge runs Effective(file)
	cfg = file.Effective(fl.Inputs())
	mat, err := creds.Load(cfg, nil, time.Now())
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	cfg.CredentialProjection = mat.Projection() // before any node registers
	for _, r := range mat.Revoked() {
		log.Warn("credential route revoked: its slot was removed from the secret store; it issues no lease", "route", r)
	}
	plane := creds.NewPlane(mat, nil)
	var cur atomic.Pointer[config.Config]
	cur.Store(cfg)
	current := func() *config.Config { return cur.Load() }

	// A name with an enrollment record is let through to fl.Admit, which
	// refuses a revoked or superseded certificate naming why (SPEC J6).
	tlsCfg, err := tlsConfig(file, func(name string) bool { return current().NodeByID(name) != nil || fl.Known(name) }, fl)
	if err != nil {
		return err
	}

	p := pool.New(PoolConfig(cfg, mat), pool.SystemClock())
	bus := &events.Bus{}
	var ht *health.Tracker // set below, before any hook can run (Serve)
	var tr *transport.Server
	// runs tells the pool which adapters generation gen of node runs: the
	// payload its registration got or it last APPLIED (SPEC N2), never
	// one it answered RESTART_REQUIRED or FAILED to. Serialized, and
	// read under the lock, so the pool ends with the latest answer.
	var runsMu sync.Mutex
	runs := func(node string, gen uint64) {
		runsMu.Lock()
		defer runsMu.Unlock()
		pl, _ := tr.Running(node, gen) // not current: nil, so nothing of gen is served
		p.NodeRuns(node, gen, RunsOf(pl))
	}
	tr = transport.New(transport.Options{
		TLS: tlsCfg, Config: current, Logger: log.With("component", "transport"), Events: bus,
		Hooks: transport.Hooks{
			OnReady: func(node string, gen uint64) {
				runs(node, gen)
				// SPEC E4: a node serving several edges may give this one a share of its capacity.
				p.NodeReadyShare(node, gen, tr.CapacityShare(node, gen))
			},
			OnApplied: runs,
			OnFence: func(node string, gen uint64) {
				p.NodeFenced(node, gen)
				ht.NodeFenced(node, gen) // H9: no overlay outlives its generation
				fl.NodeFenced(node, gen) // D2: its discovered models go with it
			},
			OnDraining: func(node string, gen uint64) { p.NodeDraining(node, gen) },
		},
		Fleet: transport.FleetHooks{Join: fl.ServeJoin, Renew: fl.Renew,
			OnModels:    func(node string, gen uint64, r *iop.NodeModelsReport) { fl.Report(node, gen, r) },
			OnResidency: func(node string, gen uint64, r *iop.NodeResidencyReport) { p.NodeResidency(node, gen, residencyOf(r)) }},
		RegisterBurst: o.RegisterBurst, RegisterInterval: o.RegisterInterval,
	})
	plane.BindBoots(tr.BootID) // SPEC C3: a node's restart invalidates its earlier leases
	ht = health.New(health.Options{Overlay: overlayEvents{p, bus}, Commander: tr, Logger: log.With("component", "health"),
		ProbeInterval: o.HealthProbeInterval, ProbeCredentials: plane.ProbeLease})
	kr, err := loadKeys(cfg, log.With("component", "keys"))
	if err != nil {
		return err
	}
	hist := access.NewSeries(time.Now) // the operator page's last 15 minutes
	metrics, recent := access.NewMetrics(hist, firstBytes{p}), access.NewRecent(0)
	od := outlier.New(outlier.Options{Pool: ejectEvents{p, bus}, Policy: OutlierPolicy(cfg), Logger: log.With("component", "outlier")})
	defer od.Close()
	ao := api.Options{Config: current, Pool: p, Dispatcher: tr, Health: ht, Outlier: od, Logger: log.With("component", "api"),
		AccessLog: log, Metrics: metrics, Recent: recent, Credentials: plane, Keys: kr.reg}
	exp := newExporter(cfg, o.Version, log)
	bootTracing := cfg.Tracing // what the exporter runs with; a reload changes none of it
	if exp != nil {
		ao.Tracer, ao.TraceRatio = exp, cfg.Tracing.Ratio()
	}
	bm, err := openBatches(cfg, log.With("component", "batches"), kr.reg)
	if err != nil {
		return err
	}
	if bm != nil {
		ao.Batches = bm
		defer bm.Close() // an early return; the shutdown below closes it first
	}
	h := api.New(ao)
	if bm != nil {
		bm.Bind(h)
	}
	if h.OpenMode() {
		log.Warn("no api_keys and no keys.store_file configured: the HTTP API is open to anyone who can reach it")
	}
	var counters []admin.Counter
	for _, m := range ht.Metrics() {
		counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: "counter", Samples: m.Samples})
	}
	for _, m := range od.Metrics() {
		counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: "counter", Samples: m.Samples})
	}
	for _, m := range h.Metrics() {
		counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: "counter", Samples: m.Samples})
	}
	if exp != nil {
		for _, m := range exp.Metrics() {
			counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: m.Type, Samples: m.Samples})
		}
	}
	collectors := []admin.Collector{metrics, kr.reg}
	var batches admin.BatchSource
	if bm != nil {
		collectors, batches = append(collectors, bm), bm
	}
	adm := admin.New(admin.Options{Status: p, Routing: p, Groups: p, Waiting: p, Events: bus, Discovered: fl.Discovered, Metrics: counters, Collectors: collectors,
		Batches: batches,
		Keys:    kr.reg,
		Recent:  recent, Payloads: payloadStates{tr}, Pprof: cfg.Admin.Pprof, Version: o.Version,
		Access: func() admin.Access {
			c := current()
			return admin.Access{TokenSHA256: c.Admin.TokenSHA256, AllowedHosts: c.Admin.AllowedHosts}
		}, Series: hist})
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}

	listen := func(given net.Listener, addr string) (net.Listener, error) {
		if given != nil {
			return given, nil
		}
		return net.Listen("tcp", addr)
	}
	var lns []net.Listener
	closeAll := func() {
		for _, l := range lns {
			l.Close()
		}
	}
	nodeLn, err := listen(o.NodeListener, cfg.NodeListen)
	if err != nil {
		return fmt.Errorf("node_listen: %w", err)
	}
	lns = append(lns, nodeLn)
	httpLn, err := listen(o.HTTPListener, cfg.HTTPListen)
	if err != nil {
		closeAll()
		return fmt.Errorf("http_listen: %w", err)
	}
	lns = append(lns, httpLn)
	adminLn, err := listen(o.AdminListener, cfg.AdminListen)
	if err != nil {
		closeAll()
		return fmt.Errorf("admin_listen: %w", err)
	}

	httpLn = h.Listener(httpLn) // counts net/http's own 431s (SPEC B4)
	httpSrv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		MaxHeaderBytes: api.MaxHeaderBytes(cfg),               // http.max_header_bytes (SPEC B4)
		ConnContext:    h.ConnContext, ConnState: h.ConnState, // http.max_connections
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	adminSrv := &http.Server{Handler: adm, ReadHeaderTimeout: 10 * time.Second}

	trCtx, stopTransport := context.WithCancel(context.Background())
	hctx, stopHealth := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	wg.Add(7)
	go func() {
		defer wg.Done()
		ht.Run(hctx) // the recovery loop (SPEC H10)
	}()
	go func() {
		defer wg.Done()
		fl.Watch(hctx.Done()) // SPEC J6: edge nodes revoke reaches a running edge
	}()
	go func() {
		defer wg.Done()
		sampleSeries(hctx, p, hist)
	}()
	go func() {
		defer wg.Done()
		kr.loader.Run(hctx, 0, nil) // the key store's poll (K2)
	}()
	pctx, stopPersist := context.WithCancel(context.Background())
	persisted := kr.runPersister(pctx) // stopped after the drain: its last write counts every request (K7)
	xctx, stopExport := context.WithCancel(context.Background())
	exported := make(chan struct{})
	go func() { // stopped after the drain: the last requests' spans go out (tracing.FinalFlush)
		defer close(exported)
		if exp != nil {
			exp.Run(xctx)
		}
	}()
	go func() {
		defer wg.Done()
		if err := tr.Serve(trCtx, nodeLn); err != nil && !errors.Is(err, transport.ErrServerClosed) {
			errc <- fmt.Errorf("node transport: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := httpSrv.Serve(httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := adminSrv.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("admin: %w", err)
		}
	}()
	if bm != nil {
		bm.Start() // SPEC X3: the batches that had not ended resume
	}
	log.Info("edge serving", "version", o.Version, "http", httpLn.Addr().String(),
		"node", nodeLn.Addr().String(), "admin", adminLn.Addr().String())
	if o.Started != nil {
		o.Started(Addrs{HTTP: httpLn.Addr(), Node: nodeLn.Addr(), Admin: adminLn.Addr()})
	}

	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errc:
			runErr = err
			break loop
		case nc, ok := <-o.Reload:
			if !ok {
				o.Reload = nil
				continue
			}
			if err := fl.Reconfigure(nc); err != nil {
				log.Error("config reload rejected; keeping the running config", "err", fmt.Errorf("enrollment: %w", err))
				continue
			}
			ap.apply(func() {
				if reload(ctx, log, file, nc.Effective(fl.Inputs()), &cur, plane, kr.loader, p, tr) {
					file = nc
					od.SetPolicy(OutlierPolicy(nc))
					if !sameTracing(bootTracing, nc.Tracing) {
						log.Warn("config reload: tracing settings take effect only after a restart")
					}
				} else if err := fl.Reconfigure(file); err != nil {
					log.Error("enrollment: restoring the running config's", "err", err)
				}
			})
		case <-ap.kick:
			// A join, a revocation or a change of the models the nodes
			// report (SPEC J2, J6, D2).
			ap.apply(func() { apply(ctx, log, file.Effective(fl.Inputs()), &cur, plane, p, tr) })
		}
	}

	if bm != nil {
		bm.Close() // lines in flight stop unanswered: they run again at the next start (SPEC X3)
	}
	drainHTTP(log, httpSrv, h, drainTimeout(current(), o.ShutdownGrace), stopWait)
	stopPersist()
	<-persisted
	stopExport()
	<-exported
	adminSrv.Close()
	stopHealth()
	stopTransport()
	wg.Wait()
	// The node sessions are gone: a stream whose cancel the node never
	// confirmed gives its lease back at once (SPEC Q2).
	dctx, cancel := context.WithTimeout(context.Background(), stopWait)
	if h.WaitDetached(dctx) != nil {
		log.Warn("leases of cancelled streams still held at exit")
	}
	cancel()
	log.Info("edge stopped")
	return runErr
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

// reload applies a new config file (nc is its config.Effective) and
// reports whether it did: listener and TLS changes need a restart; the
// credential material (secret store, keys) and the key store are read
// again first and a failure rejects the whole reload; then install.
func reload(ctx context.Context, log *slog.Logger, boot, nc *config.Config, cur *atomic.Pointer[config.Config], plane *creds.Plane,
	kl *keys.Loader, p *pool.Pool, tr *transport.Server) bool {
	mat, err := creds.Load(nc, plane.Material(), time.Now())
	if err != nil {
		log.Error("config reload rejected; keeping the running config", "err", err)
		return false
	}
	// SPEC C3: a new issuer key that a ready node does not trust would
	// fail every credentialed request to it; the nodes first trust both
	// keys (credentials.issuer_public_keys), then the edge switches.
	if id := mat.IssuerKeyID(); id != "" && id != plane.Material().IssuerKeyID() {
		if nodes := tr.UntrustingNodes(id); len(nodes) > 0 {
			log.Error("config reload rejected; keeping the running config", "err",
				fmt.Errorf("credentials.issuer_key_file: issuer key %s is not trusted by ready nodes %v: add its public key to their credentials.issuer_public_keys and restart them first", id, nodes))
			return false
		}
	}
	if err := kl.Reload(nc); err != nil { // api_keys and the key store read again (K2); nothing changed yet
		log.Error("config reload rejected; keeping the running config", "err", fmt.Errorf("keys: %w", err))
		return false
	}
	if nc.HTTPListen != boot.HTTPListen || nc.NodeListen != boot.NodeListen || nc.AdminListen != boot.AdminListen || nc.TLS != boot.TLS {
		log.Warn("config reload: listen addresses and tls settings take effect only after a restart")
	}
	if api.MaxHeaderBytes(nc) > api.MaxHeaderBytes(boot) {
		log.Warn("config reload: a higher http.max_header_bytes takes effect only after a restart (net/http refuses past the value the edge started with)")
	}
	install(ctx, log, nc, mat, cur, plane, p, tr)
	log.Info("config reloaded")
	return true
}

// apply installs nc, the effective config after a join, a revocation or a
// change of the discovered models (config.Effective of the same file): the
// credential material is read again for it (a joined node's recipient
// key, the routes' slots) and a failure keeps the running config.
func apply(ctx context.Context, log *slog.Logger, nc *config.Config, cur *atomic.Pointer[config.Config], plane *creds.Plane, p *pool.Pool, tr *transport.Server) {
	mat, err := creds.Load(nc, plane.Material(), time.Now())
	if err != nil {
		log.Error("config change rejected; keeping the running config", "err", err)
		return
	}
	install(ctx, log, nc, mat, cur, plane, p, tr)
	log.Info("config applied", "nodes", len(nc.Nodes), "models", len(nc.Models))
}

// install makes nc current: the credential material mat, the pool (Q5
// pump), the surface and the ready nodes (N2), which learn new slot
// revisions and projection generations from their refreshed payloads
// (SPEC C6); a node nc no longer has (removed, revoked) is fenced and
// closed by the refresh's reconciliation (SPEC J6).
func install(ctx context.Context, log *slog.Logger, nc *config.Config, mat *creds.Material, cur *atomic.Pointer[config.Config],
	plane *creds.Plane, p *pool.Pool, tr *transport.Server) {
	for _, r := range mat.Revoked() {
		log.Warn("credential route revoked: its slot was removed from the secret store; it issues no lease", "route", r)
	}
	nc.CredentialProjection = mat.Projection()
	plane.Swap(mat) // a removed slot is never issued again from here on (SPEC C6)
	cur.Store(nc)
	p.Reconfigure(PoolConfig(nc, mat))
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, r := range tr.RefreshAll(rctx) {
		if r.Err != nil {
			log.Warn("config refresh failed", "node", r.Node, "revision", r.Revision, "err", r.Err)
			continue
		}
		log.Info("config refresh", "node", r.Node, "revision", r.Revision, "status", r.Status.String(), "reason", r.Reason)
	}
}

// Check validates what Run would load before serving: the certificate, key
// and CA files (readable, matching, an edge identity) and, with the
// credential plane on, the issuer key, the secret store and its key (every
// route's slot present and opening, or removed by `edge secrets rm`), and
// the key store and the usage file (docs/keys.md). It returns what Run
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
				MemoryMB: max(m.GetMemoryMb(), 0), InFlight: int(max(m.GetInFlight(), 0))})
		}
		out[a.GetAdapter()] = ms
	}
	return out
}
