package adapter

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// ManagedBackend is a managed backend of the node's own config that an
// adapter's AdapterConfig.managed names (internal/node/managed.Backend;
// SPEC U1, U2).
type ManagedBackend interface {
	// Acquire waits, within ctx, until model's process serves, and returns
	// its base URL and the release to call once the request ended; an
	// error is ctx's cause or says why the model cannot be had
	// (model_unavailable).
	Acquire(ctx context.Context, model string) (base *url.URL, release func(), err error)
	// Loaded is model's process's base URL when it is loaded, and its
	// residency (protocol.Residency*; "" = not a model of the backend).
	Loaded(model string) (base *url.URL, residency string)
	// Models lists the backend's models (a rescan of its models_dir).
	Models() ([]string, error)
	// Report is every model's residency (SPEC U6).
	Report() []*iop.ModelResidency
}

// Residency is the residency of the models of every managed adapter (its
// lifecycle machine) and every ollama adapter (its /api/ps watcher,
// started by the first call), in config order (SPEC U6; the session's
// NodeResidencyReport); nil when the Set has neither.
func (s *Set) Residency() []*iop.AdapterResidency {
	var out []*iop.AdapterResidency
	for _, n := range s.names {
		switch inst := s.instances[n]; {
		case inst.managed != nil:
			out = append(out, &iop.AdapterResidency{Adapter: n, Models: inst.managed.Report()})
		case inst.ps != nil:
			out = append(out, &iop.AdapterResidency{Adapter: n, Models: inst.ps.Report()})
		}
	}
	return out
}

// ResidencyChanged is closed when a residency Residency reports may have
// changed (SPEC U6): take it before calling Residency.
func (s *Set) ResidencyChanged() <-chan struct{} { return s.signal.C() }

// ErrUnknownManaged (NewSet): the payload names a managed backend this
// node's config does not declare.
var ErrUnknownManaged = errors.New("managed backend is not declared in this node's config (managed[].name)")

// bindManaged makes inst a managed instance when its config names a
// managed backend (SPEC U1): only an openai_compat adapter, only a backend
// the node's own config declares.
func bindManaged(inst *instance, ac *iop.AdapterConfig, backends map[string]ManagedBackend) error {
	name := ac.GetManaged()
	if name == "" {
		return nil
	}
	if inst.typ != protocol.TypeOpenAICompat {
		return fmt.Errorf("managed %q: a managed backend serves an %s adapter", name, protocol.TypeOpenAICompat)
	}
	mb := backends[name]
	if mb == nil {
		return fmt.Errorf("%w: %q", ErrUnknownManaged, name)
	}
	inst.managed = mb
	return nil
}

// managedAcquire waits for target's process of a managed instance within
// the request's ctx and timeout_sec, which the wait uses up (the time to
// first token includes the load, SPEC U2), and returns ep aimed at the
// process and the release to defer; code is "" on success. Other
// instances get ep back unchanged.
func (s *Set) managedAcquire(ctx context.Context, inst *instance, a *attempt, target string, ep *upstream.Endpoint) (*upstream.Endpoint, func(), protocol.Code, error) {
	if inst.managed == nil {
		return ep, func() {}, "", nil
	}
	start := time.Now()
	lctx := ctx
	if a.deadline > 0 {
		var cancel context.CancelFunc
		lctx, cancel = context.WithTimeoutCause(ctx, a.deadline, errRunDeadline)
		defer cancel()
	}
	base, release, err := inst.managed.Acquire(lctx, target)
	switch {
	case err == nil:
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrNodeShutdown):
		return nil, nil, protocol.CodeNodeShutdown, ErrNodeShutdown
	case ctx.Err() != nil:
		return nil, nil, protocol.CodeCancelled, context.Cause(ctx)
	case errors.Is(err, errRunDeadline):
		return nil, nil, protocol.CodeTimeout, fmt.Errorf("adapter %q: waiting for model %q to load: %w", inst.name, target, errRunDeadline)
	default:
		return nil, nil, protocol.CodeModelUnavailable, fmt.Errorf("adapter %q: %w", inst.name, err)
	}
	if a.deadline > 0 {
		a.deadline -= time.Since(start)
		if a.deadline <= 0 {
			release()
			return nil, nil, protocol.CodeTimeout, fmt.Errorf("adapter %q: waiting for model %q to load: %w", inst.name, target, errRunDeadline)
		}
	}
	e := *ep
	u := *base
	u.Path = ep.Base.Path
	e.Base = &u
	return &e, release, "", nil
}

// probeManaged is Probe of a managed instance (SPEC H10, U2): a loaded
// model's process is probed; one that is not loaded is "available" when
// the backend has it (a request would load it) and its last load did not
// fail, "unavailable" otherwise. A probe never starts a process.
func (s *Set) probeManaged(ctx context.Context, inst *instance, ep *upstream.Endpoint, target string) string {
	base, res := inst.managed.Loaded(target)
	switch {
	case res == "", res == protocol.ResidencyFailed:
		return protocol.HealthUnavailable
	case base == nil:
		return protocol.HealthAvailable
	}
	e := *ep
	u := *base
	u.Path = ep.Base.Path
	e.Base = &u
	return s.probeWith(ctx, inst, inst.newRunner(&e), target)
}
