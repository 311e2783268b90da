package managed

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"
)

// A Backend's life seen from outside: New (the starter thread and the
// timer loop started, the models scanned), Acquire (a model's request
// granted once it runs, its process started on demand) and Close (every
// process stopped, every goroutine ended).

// New starts a Backend: it scans the models, starts its two goroutines and
// queues the preloads. Errors: a command without an absolute program path,
// a bad port range.
func New(cfg Config) (*Backend, error) {
	if len(cfg.Command) == 0 || !filepath.IsAbs(cfg.Command[0]) {
		return nil, fmt.Errorf("managed %q: command[0] must be an absolute path", cfg.Name)
	}
	if cfg.PortFirst < 1 || cfg.PortLast > 65535 || cfg.PortFirst > cfg.PortLast {
		return nil, fmt.Errorf("managed %q: bad port range [%d, %d]", cfg.Name, cfg.PortFirst, cfg.PortLast)
	}
	if cfg.HealthPoll <= 0 {
		cfg.HealthPoll = DefaultHealthPoll
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.LogBytes <= 0 {
		cfg.LogBytes = DefaultLogBytes
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Minute
	}
	if cfg.IdleUnload <= 0 {
		cfg.IdleUnload = 10 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		cfg:       cfg,
		log:       log.With("managed", cfg.Name),
		hc:        &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}},
		start:     make(chan startReq),
		kick:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		stopStart: make(chan struct{}),
		m: NewMachine(Limits{MaxLoaded: cfg.MaxLoaded, BudgetMB: cfg.BudgetMB, IdleUnload: cfg.IdleUnload,
			BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax}),
		procs:   map[string]*proc{},
		waiters: map[uint64]chan grant{},
		ports:   map[int]bool{},
		logs:    map[string]*ring{},
	}
	b.wg.Add(2)
	go b.starter()
	go b.timerLoop()
	names, err := b.Models()
	if err != nil {
		b.log.Warn("managed backend: listing its models failed", "err", err)
	}
	for _, p := range cfg.Preload { // SPEC U4
		if !slices.Contains(names, p) {
			b.log.Warn("managed backend: a preload names no model of models_dir or models; nothing is preloaded for it", "model", p)
		}
	}
	for _, r := range b.Residency() {
		if r.Preload && cfg.BudgetMB > 0 && r.MemoryMB > cfg.BudgetMB { // SPEC U3, U4
			b.log.Warn("managed backend: a preload model is larger than memory_budget_mb; it stays unloaded",
				"model", r.Model, "memory_mb", r.MemoryMB, "memory_budget_mb", cfg.BudgetMB)
		}
	}
	return b, nil
}

// Name is the backend's managed[].name.
func (b *Backend) Name() string { return b.cfg.Name }

// Acquire waits until model's process serves (starting it when needed,
// SPEC U2) or ctx ends, and returns its base URL and the release the
// caller must call once when its request ended (a model with a request in
// flight is never stopped, SPEC U3). Errors: ErrUnavailable (wrapped, with
// the reason), or ctx's cause.
func (b *Backend) Acquire(ctx context.Context, model string) (*url.URL, func(), error) {
	ch := make(chan grant, 1)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: managed %q is shutting down", ErrUnavailable, b.cfg.Name)
	}
	b.nextW++
	w := b.nextW
	b.waiters[w] = ch
	b.step(Event{Kind: EvRequest, Model: model, Waiter: w})
	b.mu.Unlock()
	var g grant
	select {
	case g = <-ch:
	case <-ctx.Done():
		b.mu.Lock()
		if _, waiting := b.waiters[w]; waiting {
			delete(b.waiters, w)
			b.step(Event{Kind: EvCancel, Model: model, Waiter: w})
			b.mu.Unlock()
			return nil, nil, context.Cause(ctx)
		}
		b.mu.Unlock()
		g = <-ch // answered meanwhile
		if g.err == nil {
			b.done1(model)
		}
		return nil, nil, context.Cause(ctx)
	}
	if g.err != nil {
		return nil, nil, g.err
	}
	u := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(g.port))}
	return u, sync.OnceFunc(func() { b.done1(model) }), nil
}

// Close stops every process (SIGTERM, SIGKILL after the stop grace), fails
// the requests still waiting and returns when every goroutine of the
// Backend has ended. Requests in flight lose their process: call Close
// after they ended (the node's drain).
func (b *Backend) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.done)
	for w, ch := range b.waiters {
		delete(b.waiters, w)
		ch <- grant{err: fmt.Errorf("%w: managed %q is shutting down", ErrUnavailable, b.cfg.Name)}
	}
	for _, p := range b.procs {
		b.stopProc(p)
	}
	b.mu.Unlock()
	b.procWG.Wait()
	close(b.stopStart)
	b.wg.Wait()
	b.hc.CloseIdleConnections()
}
