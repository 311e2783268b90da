package edge

import (
	"context"
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
	"iop/internal/edge/batch"
	"iop/internal/edge/config"
	"iop/internal/edge/creds"
	"iop/internal/edge/events"
	"iop/internal/edge/fleet"
	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/edge/tracing"
	"iop/internal/edge/transport"
	iop "iop/proto/gen/iop"
)

// Options for Serve.
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

// Serve runs the Edge of cfg until ctx is done, then drains HTTP
// (bounded), closes node sessions and returns nil; it returns the error of
// a listener that stopped serving after the drain likewise. It returns an
// error at once, having started nothing, when the enrollment store, the
// credential material, the TLS material, the key store or batches.dir is
// unusable or a listener cannot be opened.
func Serve(ctx context.Context, cfg *config.Config, o Options) error {
	d, err := build(cfg, o)
	if err != nil {
		return err
	}
	err = d.serve(ctx)
	d.stop()
	return err
}

// daemon is one Edge (Serve): the parts build wires, its listeners and
// servers, the state a reload changes, and its own goroutines by the stage
// that stops them. build starts no goroutine; serve starts them all and
// stop ends every one before it returns.
type daemon struct {
	o   Options
	log *slog.Logger

	ap    *applier
	fl    *fleet.Fleet
	plane *creds.Plane
	cur   atomic.Pointer[config.Config] // the running config: file's config.Effective
	p     *pool.Pool
	bus   *events.Bus
	ht    *health.Tracker
	tr    *transport.Server
	kr    *keyRuntime
	hist  *access.Series
	od    *outlier.Detector
	exp   *tracing.Exporter // nil: tracing off
	bm    *batch.Manager    // nil: no batches.dir
	h     *api.Handler
	adm   http.Handler

	nodeLn, httpLn, adminLn net.Listener
	httpSrv, adminSrv       *http.Server
	errc                    chan error // a server that stopped serving; one slot each

	// Reload state, used by serve's loop only.
	file        *config.Config // as read from the file; the edge runs its config.Effective
	bootTracing config.Tracing // what the exporter runs with; a reload changes none of it

	// runsMu serializes runs.
	runsMu sync.Mutex

	// The goroutines, by the stage that stops them (stop's order):
	// persist (the usage file, K7) and export (the spans) after the
	// drain, so that their last write counts every request; then
	// background (health, fleet watch, series, key store poll) and
	// servers (node transport, HTTP, admin) together.
	persist, export, background, servers stage
}

// stage is a set of a daemon's goroutines that stop together: run starts
// one under the stage's context, cancel ends that context and wait returns
// once every one started has returned. A stage never begun (begin) has
// nothing to cancel or wait for.
type stage struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *stage) begin(parent context.Context) { s.ctx, s.cancel = context.WithCancel(parent) }

func (s *stage) run(fn func(ctx context.Context)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn(s.ctx)
	}()
}

func (s *stage) stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
}

func (d *daemon) current() *config.Config { return d.cur.Load() }

// build wires the Edge of cfg and opens its listeners; it starts no
// goroutine, and on an error it closes what it opened.
func build(cfg *config.Config, o Options) (*daemon, error) {
	d := &daemon{o: o, log: o.Logger, ap: newApplier(), file: cfg, bootTracing: cfg.Tracing, errc: make(chan error, 3)}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	log := d.log
	fl, err := fleet.New(cfg, fleet.Options{Logger: log.With("component", "fleet"), Changed: d.ap.request, WaitApplied: d.ap.wait})
	if err != nil {
		return nil, fmt.Errorf("enrollment: %w", err)
	}
	d.fl = fl
	cfg = cfg.Effective(fl.Inputs())
	mat, err := creds.Load(cfg, nil, time.Now())
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	cfg.CredentialProjection = mat.Projection() // before any node registers
	for _, r := range mat.Revoked() {
		log.Warn("credential route revoked: its slot was removed from the secret store; it issues no lease", "route", r)
	}
	d.plane = creds.NewPlane(mat, nil)
	d.cur.Store(cfg)

	// A name with an enrollment record is let through to fl.Admit, which
	// refuses a revoked or superseded certificate naming why (SPEC J6).
	tlsCfg, err := tlsConfig(d.file, func(name string) bool { return d.current().NodeByID(name) != nil || fl.Known(name) }, fl)
	if err != nil {
		return nil, err
	}
	d.p = pool.New(PoolConfig(cfg, mat), pool.SystemClock())
	d.bus = &events.Bus{}
	d.tr = transport.New(transport.Options{
		TLS: tlsCfg, Config: d.current, Logger: log.With("component", "transport"), Events: d.bus,
		Hooks: transport.Hooks{
			OnReady: func(node string, gen uint64) {
				d.runs(node, gen)
				// SPEC E4: a node serving several edges may give this one a share of its capacity.
				d.p.NodeReadyShare(node, gen, d.tr.CapacityShare(node, gen))
			},
			OnApplied: d.runs,
			OnFence: func(node string, gen uint64) {
				d.p.NodeFenced(node, gen)
				d.ht.NodeFenced(node, gen) // H9: no overlay outlives its generation
				fl.NodeFenced(node, gen)   // D2: its discovered models go with it
			},
			OnDraining: func(node string, gen uint64) { d.p.NodeDraining(node, gen) },
		},
		Fleet: transport.FleetHooks{Join: fl.ServeJoin, Renew: fl.Renew,
			OnModels: func(node string, gen uint64, r *iop.NodeModelsReport) { fl.Report(node, gen, r) },
			OnResidency: func(node string, gen uint64, r *iop.NodeResidencyReport) {
				d.p.NodeResidency(node, gen, residencyOf(r))
			}},
		RegisterBurst: o.RegisterBurst, RegisterInterval: o.RegisterInterval,
	})
	d.plane.BindBoots(d.tr.BootID) // SPEC C3: a node's restart invalidates its earlier leases
	d.ht = health.New(health.Options{Overlay: overlayEvents{d.p, d.bus}, Commander: d.tr, Logger: log.With("component", "health"),
		ProbeInterval: o.HealthProbeInterval, ProbeCredentials: d.plane.ProbeLease})
	if d.kr, err = loadKeys(cfg, log.With("component", "keys")); err != nil {
		return nil, err
	}
	d.od = outlier.New(outlier.Options{Pool: ejectEvents{d.p, d.bus}, Policy: OutlierPolicy(cfg), Logger: log.With("component", "outlier")})
	if err := d.buildSurfaces(cfg); err != nil {
		d.closeParts()
		return nil, err
	}
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	if err := d.listen(cfg); err != nil {
		d.closeParts()
		return nil, err
	}
	return d, nil
}

// runs tells the pool which adapters generation gen of node runs: the
// payload its registration got or it last APPLIED (SPEC N2), never one it
// answered RESTART_REQUIRED or FAILED to. Serialized, and read under the
// lock, so the pool ends with the latest answer.
func (d *daemon) runs(node string, gen uint64) {
	d.runsMu.Lock()
	defer d.runsMu.Unlock()
	pl, _ := d.tr.Running(node, gen) // not current: nil, so nothing of gen is served
	d.p.NodeRuns(node, gen, RunsOf(pl))
}

// buildSurfaces builds the client API (with the exporter and batches) and
// the admin surface.
func (d *daemon) buildSurfaces(cfg *config.Config) error {
	log := d.log
	d.hist = access.NewSeries(time.Now) // the operator page's last 15 minutes
	metrics, recent := access.NewMetrics(d.hist, firstBytes{d.p}), access.NewRecent(0)
	ao := api.Options{Config: d.current, Pool: d.p, Dispatcher: d.tr, Health: d.ht, Outlier: d.od, Logger: log.With("component", "api"),
		AccessLog: log, Metrics: metrics, Recent: recent, Credentials: d.plane, Keys: d.kr.reg}
	d.exp = newExporter(cfg, d.o.Version, log)
	if d.exp != nil {
		ao.Tracer, ao.TraceRatio = d.exp, cfg.Tracing.Ratio()
	}
	bm, err := openBatches(cfg, log.With("component", "batches"), d.kr.reg)
	if err != nil {
		return err
	}
	if bm != nil {
		ao.Batches, d.bm = bm, bm
	}
	d.h = api.New(ao)
	if bm != nil {
		bm.Bind(d.h)
	}
	if d.h.OpenMode() {
		log.Warn("no api_keys and no keys.store_file configured: the HTTP API is open to anyone who can reach it")
	}
	collectors := []admin.Collector{metrics, d.kr.reg}
	var batches admin.BatchSource
	if bm != nil {
		collectors, batches = append(collectors, bm), bm
	}
	d.adm = admin.New(admin.Options{Status: d.p, Routing: d.p, Groups: d.p, Waiting: d.p, Events: d.bus, Discovered: d.fl.Discovered,
		Metrics: d.counters(), Collectors: collectors, Batches: batches, Keys: d.kr.reg,
		Recent: recent, Payloads: payloadStates{d.tr}, Pprof: cfg.Admin.Pprof, Version: d.o.Version,
		Access: func() admin.Access {
			c := d.current()
			return admin.Access{TokenSHA256: c.Admin.TokenSHA256, AllowedHosts: c.Admin.AllowedHosts}
		}, Series: d.hist})
	return nil
}

// counters are the admin surface's counters of health, outlier detection,
// the client API and the exporter.
func (d *daemon) counters() []admin.Counter {
	var counters []admin.Counter
	for _, m := range d.ht.Metrics() {
		counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: "counter", Samples: m.Samples})
	}
	for _, m := range d.od.Metrics() {
		counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: "counter", Samples: m.Samples})
	}
	for _, m := range d.h.Metrics() {
		counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: "counter", Samples: m.Samples})
	}
	if d.exp != nil {
		for _, m := range d.exp.Metrics() {
			counters = append(counters, admin.Counter{Name: m.Name, Help: m.Help, Type: m.Type, Samples: m.Samples})
		}
	}
	return counters
}

// listen opens the node, HTTP and admin listeners (or takes Options'),
// closing those it opened when one fails, and builds the two HTTP servers.
func (d *daemon) listen(cfg *config.Config) error {
	listen := func(given net.Listener, addr string) (net.Listener, error) {
		if given != nil {
			return given, nil
		}
		return net.Listen("tcp", addr)
	}
	var err error
	if d.nodeLn, err = listen(d.o.NodeListener, cfg.NodeListen); err != nil {
		return fmt.Errorf("node_listen: %w", err)
	}
	if d.httpLn, err = listen(d.o.HTTPListener, cfg.HTTPListen); err != nil {
		d.nodeLn.Close()
		return fmt.Errorf("http_listen: %w", err)
	}
	if d.adminLn, err = listen(d.o.AdminListener, cfg.AdminListen); err != nil {
		d.nodeLn.Close()
		d.httpLn.Close()
		return fmt.Errorf("admin_listen: %w", err)
	}
	d.httpLn = d.h.Listener(d.httpLn) // counts net/http's own 431s (SPEC B4)
	d.httpSrv = &http.Server{Handler: d.h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		MaxHeaderBytes: api.MaxHeaderBytes(cfg),                   // http.max_header_bytes (SPEC B4)
		ConnContext:    d.h.ConnContext, ConnState: d.h.ConnState, // http.max_connections
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	d.adminSrv = &http.Server{Handler: d.adm, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// closeParts closes the parts build made that hold resources before any
// goroutine started: the batch store and the outlier detector's timers.
func (d *daemon) closeParts() {
	if d.bm != nil {
		d.bm.Close()
	}
	if d.od != nil {
		d.od.Close()
	}
}

// serve starts the daemon's goroutines and serves until ctx is done (nil)
// or a server stops serving (its error), applying each config Options.Reload
// delivers (reload) and each change of the effective config the fleet asks
// for (recompute) in between.
func (d *daemon) serve(ctx context.Context) error {
	d.start(ctx)
	reloads := d.o.Reload
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-d.errc:
			return err
		case nc, ok := <-reloads:
			if !ok {
				reloads = nil
				continue
			}
			d.reload(ctx, nc)
		case <-d.ap.kick:
			// A join, a revocation or a change of the models the nodes
			// report (SPEC J2, J6, D2).
			d.ap.apply(func() { d.recompute(ctx, d.file.Effective(d.fl.Inputs())) })
		}
	}
}

// start starts every goroutine of the daemon, each in its stage, resumes
// the batches and reports the addresses (Options.Started).
func (d *daemon) start(ctx context.Context) {
	d.background.begin(ctx)
	d.persist.begin(context.Background())
	d.export.begin(context.Background())
	d.servers.begin(context.Background())
	d.background.run(d.ht.Run) // the recovery loop (SPEC H10)
	// SPEC J6: edge nodes revoke reaches a running edge.
	d.background.run(func(ctx context.Context) { d.fl.Watch(ctx.Done()) })
	d.background.run(func(ctx context.Context) { sampleSeries(ctx, d.p, d.hist) })
	d.background.run(func(ctx context.Context) { d.kr.loader.Run(ctx, 0, nil) }) // the key store's poll (K2)
	if d.kr.persist != nil {
		d.persist.run(d.kr.persist.Run) // stopped after the drain: its last write counts every request (K7)
	}
	if d.exp != nil {
		d.export.run(d.exp.Run) // stopped after the drain: the last requests' spans go out (tracing.FinalFlush)
	}
	d.servers.run(func(ctx context.Context) {
		if err := d.tr.Serve(ctx, d.nodeLn); err != nil && !errors.Is(err, transport.ErrServerClosed) {
			d.errc <- fmt.Errorf("node transport: %w", err)
		}
	})
	d.servers.run(func(context.Context) {
		if err := d.httpSrv.Serve(d.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.errc <- fmt.Errorf("http: %w", err)
		}
	})
	d.servers.run(func(context.Context) {
		if err := d.adminSrv.Serve(d.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.errc <- fmt.Errorf("admin: %w", err)
		}
	})
	if d.bm != nil {
		d.bm.Start() // SPEC X3: the batches that had not ended resume
	}
	d.log.Info("edge serving", "version", d.o.Version, "http", d.httpLn.Addr().String(),
		"node", d.nodeLn.Addr().String(), "admin", d.adminLn.Addr().String())
	if d.o.Started != nil {
		d.o.Started(Addrs{HTTP: d.httpLn.Addr(), Node: d.nodeLn.Addr(), Admin: d.adminLn.Addr()})
	}
}

// stop ends what serve started, in order: the batches (lines in flight
// run again at the next start, SPEC X3), the HTTP drain (drainHTTP), the
// usage file's and the spans' last writes, the admin server, then the
// background loops and the node transport; once the node sessions are
// gone, the leases of cancelled streams (SPEC Q2). Every goroutine of the
// daemon has returned when it returns.
func (d *daemon) stop() {
	if d.bm != nil {
		d.bm.Close()
	}
	drainHTTP(d.log, d.httpSrv, d.h, drainTimeout(d.current(), d.o.ShutdownGrace), stopWait)
	d.persist.stop()
	d.export.stop()
	d.adminSrv.Close()
	d.background.cancel()
	d.servers.cancel()
	d.background.stop()
	d.servers.stop()
	// The node sessions are gone: a stream whose cancel the node never
	// confirmed gives its lease back at once (SPEC Q2).
	dctx, cancel := context.WithTimeout(context.Background(), stopWait)
	if d.h.WaitDetached(dctx) != nil {
		d.log.Warn("leases of cancelled streams still held at exit")
	}
	cancel()
	d.log.Info("edge stopped")
	d.od.Close()
}

// reload applies nc, a new config file (Options.Reload): the fleet takes
// it first (a rejection keeps the running config), then reloadEffective
// with its config.Effective; a reload that fails gives the fleet the
// running file back. Outlier policy follows the file; tracing does not
// (only a restart changes it).
func (d *daemon) reload(ctx context.Context, nc *config.Config) {
	if err := d.fl.Reconfigure(nc); err != nil {
		d.log.Error("config reload rejected; keeping the running config", "err", fmt.Errorf("enrollment: %w", err))
		return
	}
	d.ap.apply(func() {
		if d.reloadEffective(ctx, nc.Effective(d.fl.Inputs())) {
			d.file = nc
			d.od.SetPolicy(OutlierPolicy(nc))
			if !sameTracing(d.bootTracing, nc.Tracing) {
				d.log.Warn("config reload: tracing settings take effect only after a restart")
			}
		} else if err := d.fl.Reconfigure(d.file); err != nil {
			d.log.Error("enrollment: restoring the running config's", "err", err)
		}
	})
}

// reloadEffective installs nc, a new file's config.Effective, and reports
// whether it did: listener and TLS changes need a restart; the credential
// material (secret store, keys) and the key store are read again first and
// a failure rejects the whole reload.
func (d *daemon) reloadEffective(ctx context.Context, nc *config.Config) bool {
	log, boot := d.log, d.file
	mat, err := creds.Load(nc, d.plane.Material(), time.Now())
	if err != nil {
		log.Error("config reload rejected; keeping the running config", "err", err)
		return false
	}
	// SPEC C3: a new issuer key that a ready node does not trust would
	// fail every credentialed request to it; the nodes first trust both
	// keys (credentials.issuer_public_keys), then the edge switches.
	if id := mat.IssuerKeyID(); id != "" && id != d.plane.Material().IssuerKeyID() {
		if nodes := d.tr.UntrustingNodes(id); len(nodes) > 0 {
			log.Error("config reload rejected; keeping the running config", "err",
				fmt.Errorf("credentials.issuer_key_file: issuer key %s is not trusted by ready nodes %v: add its public key to their credentials.issuer_public_keys and restart them first", id, nodes))
			return false
		}
	}
	if err := d.kr.loader.Reload(nc); err != nil { // api_keys and the key store read again (K2); nothing changed yet
		log.Error("config reload rejected; keeping the running config", "err", fmt.Errorf("keys: %w", err))
		return false
	}
	if nc.HTTPListen != boot.HTTPListen || nc.NodeListen != boot.NodeListen || nc.AdminListen != boot.AdminListen || nc.TLS != boot.TLS {
		log.Warn("config reload: listen addresses and tls settings take effect only after a restart")
	}
	if api.MaxHeaderBytes(nc) > api.MaxHeaderBytes(boot) {
		log.Warn("config reload: a higher http.max_header_bytes takes effect only after a restart (net/http refuses past the value the edge started with)")
	}
	d.install(ctx, nc, mat)
	log.Info("config reloaded")
	return true
}

// recompute installs nc, the effective config after a join, a revocation
// or a change of the discovered models (config.Effective of the same
// file): the credential material is read again for it (a joined node's
// recipient key, the routes' slots) and a failure keeps the running config.
func (d *daemon) recompute(ctx context.Context, nc *config.Config) {
	mat, err := creds.Load(nc, d.plane.Material(), time.Now())
	if err != nil {
		d.log.Error("config change rejected; keeping the running config", "err", err)
		return
	}
	d.install(ctx, nc, mat)
	d.log.Info("config applied", "nodes", len(nc.Nodes), "models", len(nc.Models))
}

// install makes nc current: the credential material mat, the pool (Q5
// pump), the surface and the ready nodes (N2), which learn new slot
// revisions and projection generations from their refreshed payloads
// (SPEC C6); a node nc no longer has (removed, revoked) is fenced and
// closed by the refresh's reconciliation (SPEC J6).
func (d *daemon) install(ctx context.Context, nc *config.Config, mat *creds.Material) {
	for _, r := range mat.Revoked() {
		d.log.Warn("credential route revoked: its slot was removed from the secret store; it issues no lease", "route", r)
	}
	nc.CredentialProjection = mat.Projection()
	d.plane.Swap(mat) // a removed slot is never issued again from here on (SPEC C6)
	d.cur.Store(nc)
	d.p.Reconfigure(PoolConfig(nc, mat))
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, r := range d.tr.RefreshAll(rctx) {
		if r.Err != nil {
			d.log.Warn("config refresh failed", "node", r.Node, "revision", r.Revision, "err", r.Err)
			continue
		}
		d.log.Info("config refresh", "node", r.Node, "revision", r.Revision, "status", r.Status.String(), "reason", r.Reason)
	}
}
