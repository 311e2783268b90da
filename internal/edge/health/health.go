// Package health owns the Edge's provider-health decisions (SPEC H8–H12):
// validating the health evidence a node puts on a response_stalled terminal
// against the lease that terminal belongs to, the handoff fields the Edge
// adds to a validated stall, when the runtime-unavailable overlay is set
// and cleared, the recovery loop that probes overlaid providers with
// CAPABILITIES, and the metrics and log events of all of that.
//
// The decisions live in a pure state machine (machine.go: no I/O, no clock,
// no locks); Tracker is its concurrency wrapper and carries out its effects
// on the pool (SetOverlay, ClearOverlay) and the node transport (Command).
//
// It must never trust payload identity (the node, generation and provider
// come from the lease and the session that carried the terminal, SPEC H8),
// add recovery_eligible to anything, return or hold a lease, build an HTTP
// response, or put ids, payloads, credentials or caller identities into a
// metric label (H12, P4). A recovery probe carries the credential lease
// Options.ProbeCredentials issues for it (SPEC C3), which the package
// passes to the node once and never logs or keeps.
//
// # Locks and goroutines
//
// Tracker.mu guards the machine. It is held across pool calls, which is
// allowed because Pool.mu is a leaf in every lock order, and never across a
// node command. Run is the only goroutine the package starts (plus one per
// probe of a round, all joined before the round ends); it is owned by the
// caller of Run and exits when ctx ends.
package health

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Defaults and bounds of the recovery loop (SPEC H10).
const (
	// DefaultProbeInterval is the time between two recovery rounds.
	DefaultProbeInterval = 5 * time.Second
	// MinProbeInterval and MaxProbeInterval bound Options.ProbeInterval.
	MinProbeInterval = 100 * time.Millisecond
	MaxProbeInterval = 5 * time.Minute
	// DefaultProbeTimeout bounds one CAPABILITIES round trip: the node's
	// probe timeout (2 s) plus margin.
	DefaultProbeTimeout = 5 * time.Second
	// MaxProbeTimeout bounds Options.ProbeTimeout.
	MaxProbeTimeout = time.Minute
)

// Overlay is the pool's runtime-unavailable overlay (SPEC H8–H10);
// *pool.Pool satisfies it.
type Overlay interface {
	SetOverlay(k pool.Key, gen, seq uint64) bool
	ClearOverlay(k pool.Key, gen, seq uint64) bool
}

// Commander sends a NodeCommandRequest to the ready session (node, gen)
// (SPEC N1); *transport.Server satisfies it. An error wrapping
// dispatch.ErrNotReady means gen is not the node's current ready owner.
type Commander interface {
	Command(ctx context.Context, node string, gen uint64, req *iop.NodeCommandRequest) (*iop.NodeCommandResponse, error)
}

// Options configure a Tracker. Overlay is required; Commander is required
// for Run.
type Options struct {
	Overlay   Overlay
	Commander Commander
	// Logger gets the edge_provider_health_observation and
	// edge_liveness_recovery_observation events (SPEC H12); nil discards.
	Logger *slog.Logger
	// ProbeInterval: time between recovery rounds; 0 means
	// DefaultProbeInterval, others are clamped to [MinProbeInterval,
	// MaxProbeInterval].
	ProbeInterval time.Duration
	// ProbeTimeout bounds one CAPABILITIES command; 0 means
	// DefaultProbeTimeout, at most MaxProbeTimeout.
	ProbeTimeout time.Duration
	// ProbeCredentials, when set, issues the credential lease a recovery
	// probe of provider on node for target carries (SPEC C3, H10;
	// *creds.Plane's ProbeLease): with the credential plane on, a keyed
	// models path answers a probe without it 401 and the overlay would
	// never clear. nil, nil, nil: send the probe without one. An error is
	// logged and the probe goes without.
	ProbeCredentials func(node, provider, target string) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error)
}

// Tracker is the Edge's provider-health owner. Safe for concurrent use.
type Tracker struct {
	o   Options
	log *slog.Logger

	mu sync.Mutex
	m  *machine // guarded by mu

	evidence    [2][nEvidence]atomic.Uint64 // [source][evidence]
	transitions [2]atomic.Uint64            // [to unavailable, to available]
	eligibility [nEligibility]atomic.Uint64
	results     [nResults]atomic.Uint64
}

// New returns a Tracker for o.
func New(o Options) *Tracker {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.ProbeInterval == 0:
		o.ProbeInterval = DefaultProbeInterval
	case o.ProbeInterval < MinProbeInterval:
		o.ProbeInterval = MinProbeInterval
	case o.ProbeInterval > MaxProbeInterval:
		o.ProbeInterval = MaxProbeInterval
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	o.ProbeTimeout = min(o.ProbeTimeout, MaxProbeTimeout)
	return &Tracker{o: o, log: o.Logger, m: newMachine()}
}

// ProbeInterval is the effective time between recovery rounds.
func (t *Tracker) ProbeInterval() time.Duration { return t.o.ProbeInterval }

func leaseCurrent(l *pool.Lease) bool {
	if f := l.Fenced(); f != nil {
		select {
		case <-f:
			return false
		default:
		}
	}
	return true
}

// ObserveStall takes the response_stalled terminal of a stream that ran on
// lease l (SPEC H8). Identity comes from l only: its node and generation
// are the transport identity of the session that carried the terminal,
// its provider and target the immutable binding. f, the terminal's
// ExecutionFailure (nil when the node sent none), is validated against l:
// code, adapter, target, the provider_health and liveness_classification
// pair, the fence, and that l's generation was not fenced. When valid, f
// gets provider_id = l.Provider, its validated provider_health and
// recovery_handoff = "confirmed" (also when its seq is stale), and
// ObserveStall reports true; otherwise f is left as it is. Only a fresh
// (seq above every accepted one for (node, generation, provider))
// unavailable observation sets the pool's overlay. It never returns or
// holds l: the caller releases l exactly once whatever this reports.
func (t *Tracker) ObserveStall(l *pool.Lease, f *iop.ExecutionFailure) bool {
	b := binding{key: l.Key, gen: l.Generation, target: l.Target, current: leaseCurrent(l)}
	t.mu.Lock()
	v := t.m.stall(b, f)
	transition := false
	if v.setOverlay {
		applied := t.o.Overlay.SetOverlay(l.Key, l.Generation, v.seq)
		transition = t.m.overlaySet(l.Key, l.Generation, v.seq, l.Target, applied)
	}
	t.mu.Unlock()

	ev := evRejected
	switch {
	case v.reject != RejectNone:
	case !v.fresh:
		ev = evStale
	default:
		ev = evidenceOf(v.health)
	}
	t.evidence[srcStall][ev].Add(1)
	if transition {
		t.transitions[toUnavailable].Add(1)
	}
	attrs := []slog.Attr{
		slog.String("source", "stall"), slog.String("node", l.Node), slog.String("provider", l.Provider),
		slog.String("evidence", evidenceNames[ev]), slog.Uint64("seq", f.GetHealthObservationSeq()),
	}
	if v.reject != RejectNone {
		attrs = append(attrs, slog.String("reject", v.reject.String()))
	} else {
		attrs = append(attrs, slog.String("classification", f.GetLivenessClassification()),
			slog.String("fence", f.GetFence()), slog.Int64("idle_ms", f.GetIdleMs()))
	}
	if transition {
		attrs = append(attrs, slog.String("transition", protocol.HealthUnavailable))
	}
	level := slog.LevelInfo
	if v.reject != RejectNone || transition {
		level = slog.LevelWarn
	}
	t.log.LogAttrs(context.Background(), level, "edge_provider_health_observation", attrs...)

	if v.reject != RejectNone {
		return false
	}
	f.ProviderId = l.Provider
	f.ProviderHealth = v.health
	f.RecoveryHandoff = protocol.HandoffConfirmed
	return true
}

// NodeFenced forgets every record of node at generation gen or older: a
// newer generation never inherits an overlay (SPEC H9) and the pool has
// already dropped it. Wire it to the transport's fence hook.
func (t *Tracker) NodeFenced(node string, gen uint64) {
	t.mu.Lock()
	t.m.fenced(node, gen)
	t.mu.Unlock()
}

// Overlaid lists the providers this Tracker holds overlaid, ordered by
// node then provider (for tests and diagnostics).
func (t *Tracker) Overlaid() []pool.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []pool.Key
	for _, pt := range t.m.due() {
		out = append(out, pt.key)
	}
	return out
}

// Run is the recovery loop (SPEC H10): every ProbeInterval it sends one
// CAPABILITIES command per overlaid provider — for the adapter and the
// target of the stall that set the overlay, to the node generation the
// overlay belongs to — and clears the overlay only on an accepted
// available answer. The probes of one round run concurrently and the round
// ends when all have answered or timed out, so rounds never overlap. Run
// returns when ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(t.o.ProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.ProbeRound(ctx)
		}
	}
}

// ProbeRound runs one recovery round now and returns when every probe of
// it has been answered, timed out or been cancelled by ctx.
func (t *Tracker) ProbeRound(ctx context.Context) {
	t.mu.Lock()
	due := t.m.due()
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, pt := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.probe(ctx, pt)
		}()
	}
	wg.Wait()
}

func (t *Tracker) probe(ctx context.Context, pt probeTarget) {
	req := &iop.NodeCommandRequest{Type: iop.NodeCommandType_NODE_COMMAND_CAPABILITIES, Adapter: pt.key.Provider, Target: pt.target}
	if issue := t.o.ProbeCredentials; issue != nil {
		l, b, err := issue(pt.key.Node, pt.key.Provider, pt.target)
		if err != nil {
			t.log.Warn("credential lease not issued for a recovery probe; probing without", "node", pt.key.Node,
				"provider", pt.key.Provider, "err", err)
		}
		req.CredentialLease, req.CredentialBinding = l, b
	}
	cctx, cancel := context.WithTimeout(ctx, t.o.ProbeTimeout)
	resp, err := t.o.Commander.Command(cctx, pt.key.Node, pt.gen, req)
	cancel()
	if err != nil && ctx.Err() != nil {
		return // shutting down: not an observation
	}
	t.mu.Lock()
	v := t.m.probe(pt, resp, err, errors.Is(err, dispatch.ErrNotReady))
	transition := false
	if v.clear {
		applied := t.o.Overlay.ClearOverlay(pt.key, pt.gen, v.seq)
		transition = t.m.cleared(pt.key, pt.gen, applied)
		if !applied {
			v.result = ProbeSuperseded
		}
	}
	t.mu.Unlock()

	ev := probeEvidence[v.result]
	t.evidence[srcProbe][ev].Add(1)
	if transition {
		t.transitions[toAvailable].Add(1)
	}
	attrs := []slog.Attr{
		slog.String("source", "probe"), slog.String("node", pt.key.Node), slog.String("provider", pt.key.Provider),
		slog.String("evidence", evidenceNames[ev]), slog.String("result", v.result.String()), slog.Uint64("seq", v.seq),
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	if transition {
		attrs = append(attrs, slog.String("transition", protocol.HealthAvailable))
	}
	level := slog.LevelDebug
	if transition {
		level = slog.LevelInfo
	} else if v.result == ProbeMismatch || v.result == ProbeMalformed {
		level = slog.LevelWarn
	}
	t.log.LogAttrs(ctx, level, "edge_provider_health_observation", attrs...)
}

// Eligibility is the HTTP layer's decision on re-dispatching a stalled
// request (SPEC H11). The values are bounded metric labels.
type Eligibility uint8

const (
	Eligible             Eligibility = iota // nothing written, first stall, handoff confirmed
	IneligibleEvidence                      // the stall had no confirmed handoff
	IneligibleStarted                       // bytes were already written to the client
	IneligibleAttempted                     // the request was already re-dispatched once
	IneligibleClientGone                    // the client left
	IneligibleDisabled                      // re-dispatch is turned off
	nEligibility
)

var eligibilityNames = [...]string{"eligible", "evidence_rejected", "response_started", "attempt_used", "client_gone", "disabled"}

func (e Eligibility) String() string {
	if e < nEligibility {
		return eligibilityNames[e]
	}
	return "invalid"
}

// RecoveryResult is the outcome of an eligible re-dispatch (SPEC H11).
type RecoveryResult uint8

const (
	RecoveryRecovered RecoveryResult = iota // the second attempt answered
	RecoveryFailed                          // the second attempt ended in an error
	RecoveryNoLease                         // no second lease in time: the client got the stall
	nResults
)

var resultNames = [...]string{"recovered", "failed", "no_lease"}

func (r RecoveryResult) String() string {
	if r < nResults {
		return resultNames[r]
	}
	return "invalid"
}

// RecoveryEligibility records the HTTP layer's re-dispatch decision for a
// stall on lease l of model group model (SPEC H11, H12).
func (t *Tracker) RecoveryEligibility(l *pool.Lease, model string, e Eligibility) {
	if e >= nEligibility {
		return
	}
	t.eligibility[e].Add(1)
	t.log.LogAttrs(context.Background(), slog.LevelInfo, "edge_liveness_recovery_observation",
		slog.String("phase", "eligibility"), slog.String("result", e.String()), slog.String("model", model),
		slog.String("node", l.Node), slog.String("provider", l.Provider))
}

// RecoveryOutcome records how an eligible re-dispatch ended (SPEC H11,
// H12): second is the second attempt's lease (nil for RecoveryNoLease);
// sameProvider notes that the pool picked the stalled provider again.
func (t *Tracker) RecoveryOutcome(first, second *pool.Lease, model string, r RecoveryResult) {
	if r >= nResults {
		return
	}
	t.results[r].Add(1)
	attrs := []slog.Attr{slog.String("phase", "result"), slog.String("result", r.String()), slog.String("model", model),
		slog.String("node", first.Node), slog.String("provider", first.Provider)}
	if second != nil {
		attrs = append(attrs, slog.String("second_node", second.Node), slog.String("second_provider", second.Provider),
			slog.Bool("same_provider", second.Key == first.Key))
	}
	t.log.LogAttrs(context.Background(), slog.LevelInfo, "edge_liveness_recovery_observation", attrs...)
}
