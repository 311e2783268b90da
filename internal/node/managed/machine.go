package managed

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"iop/internal/protocol"
)

// State is a model's residency (SPEC U2, U3): what the node says about it to
// every edge.
type State uint8

const (
	Unloaded State = iota // no process
	Loading               // a process is starting and not yet healthy
	Loaded                // a healthy process serves it
	Stopping              // its process is being stopped (it still holds its memory)
	Failed                // its last load failed or its process crashed; retried after a backoff
)

var stateNames = [...]string{protocol.ResidencyUnloaded, protocol.ResidencyLoading, protocol.ResidencyLoaded,
	protocol.ResidencyStopping, protocol.ResidencyFailed}

// String is the state's wire name (protocol.Residency*): "unloaded",
// "loading", "loaded", "stopping" or "failed".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", s)
}

// Limits are what a Machine keeps loaded (SPEC U3, U4).
type Limits struct {
	MaxLoaded  int           // processes at once (Loading + Loaded + Stopping), ≥ 1
	BudgetMB   int64         // sum of their MemoryMB; 0 = no memory bound
	IdleUnload time.Duration // a loaded model without a request for this long is stopped
	// BackoffMin and BackoffMax bound the wait after a failed load or a
	// crash before the next start (doubling per consecutive failure).
	BackoffMin, BackoffMax time.Duration
}

// EventKind names what happened.
type EventKind uint8

const (
	EvTick       EventKind = iota // time passed: idle unloads, backoffs over
	EvRequest                     // Waiter wants Model
	EvCancel                      // Waiter gave up before its grant (deadline, cancel)
	EvDone                        // a granted request of Model ended
	EvReady                       // Model's process answers its health path
	EvLoadFailed                  // Model's process failed to start or turned unhealthy before ready (Err); it is gone
	EvExited                      // Model's process ended on its own after ready (a crash, Err); it is gone
	EvStopped                     // Model's process, stopped by FxStop, is gone
)

// Event is one input of Step; Now is the time it happened.
type Event struct {
	Kind   EventKind
	Model  string
	Waiter uint64 // EvRequest, EvCancel; 0 = none (a preload)
	Err    string // EvLoadFailed, EvExited
	Now    time.Time
}

// EffectKind names what the owner of a Machine must do.
type EffectKind uint8

const (
	FxStart EffectKind = iota // start Model's process; report EvReady or EvLoadFailed
	FxStop                    // stop Model's process; report EvStopped
	FxGrant                   // Waiter may use Model now; it reports EvDone when its request ends
	FxFail                    // Waiter's request fails (Reason): model_unavailable
)

// Effect is one output of Step.
type Effect struct {
	Kind   EffectKind
	Model  string
	Waiter uint64
	Reason string // FxStop: "idle", "evict" or "removed"; FxFail: why
}

func (e Effect) String() string {
	switch e.Kind {
	case FxStart:
		return "start " + e.Model
	case FxStop:
		return "stop " + e.Model + " (" + e.Reason + ")"
	case FxGrant:
		return fmt.Sprintf("grant %d %s", e.Waiter, e.Model)
	default:
		return fmt.Sprintf("fail %d %s: %s", e.Waiter, e.Model, e.Reason)
	}
}

// model is one model's part of the machine.
type model struct {
	state    State
	memMB    int64
	preload  bool
	known    bool // in the backend's current model list
	inflight int
	lastUse  time.Time
	waiters  []uint64 // granted at EvReady (state Loading)
	failures int      // consecutive failed loads or crashes
	retryAt  time.Time
	lastErr  string
	started  time.Time     // of the current load
	loadTime time.Duration // the last successful load's, 0 = never loaded
	counts   Counts
}

// Counts are one model's lifecycle counters since the machine started
// (SPEC U8).
type Counts struct {
	Loads, LoadFailures, Crashes, Evictions, IdleUnloads uint64
	LoadTotal                                            time.Duration // summed over Loads
}

// pend is a request waiting for its model's process to start.
type pend struct {
	waiter uint64
	model  string
}

// Machine is the lifecycle decision of one managed backend (SPEC U2-U4): a
// pure state machine with time as an event. It starts a model's process
// on the first request for it; it keeps at most Limits.MaxLoaded processes
// and Limits.BudgetMB of memory, making room by stopping the least recently
// used loaded model that has no request in flight and is not preloaded — a
// model with a request in flight is never stopped; a request that finds no
// room waits (FIFO, its deadline is its owner's: EvCancel) until a model
// can be stopped or one is; a model that can never fit fails at once. A
// loaded model idle for Limits.IdleUnload is stopped, unless preloaded. A
// failed load or a crash is retried, at the next request or preload, after
// a backoff doubling from BackoffMin to BackoffMax; the requests waiting
// on a failed load fail. It is not safe for concurrent use.
type Machine struct {
	lim     Limits
	models  map[string]*model
	pending []pend
	stats   Stats
}

// Stats are a Machine's counters.
type Stats struct {
	Loads, LoadFailures, Crashes, Evictions, IdleUnloads uint64
}

// NewMachine returns a machine with no model known.
func NewMachine(l Limits) *Machine {
	if l.MaxLoaded < 1 {
		l.MaxLoaded = 1
	}
	if l.BackoffMin <= 0 {
		l.BackoffMin = time.Second
	}
	if l.BackoffMax < l.BackoffMin {
		l.BackoffMax = max(l.BackoffMin, time.Minute)
	}
	return &Machine{lim: l, models: map[string]*model{}}
}

// SetModels replaces the known models (name → memory in MiB) and the
// preload set; a model that left stays until it is idle (then stops with
// reason "removed"), and new requests for it fail. Follow with an EvTick.
func (m *Machine) SetModels(mem map[string]int64, preload []string) {
	for _, md := range m.models {
		md.known, md.preload = false, false
	}
	for name, mb := range mem {
		md := m.models[name]
		if md == nil {
			md = &model{}
			m.models[name] = md
		}
		md.known, md.memMB = true, mb
	}
	for _, name := range preload {
		if md := m.models[name]; md != nil && md.known {
			md.preload = true
		}
	}
}

// Step applies ev and returns what to do, in order.
func (m *Machine) Step(ev Event) []Effect {
	var fx []Effect
	md := m.models[ev.Model]
	switch ev.Kind {
	case EvRequest:
		switch {
		case md == nil || !md.known:
			return []Effect{{Kind: FxFail, Waiter: ev.Waiter, Model: ev.Model, Reason: "this node serves no model of that name"}}
		case m.lim.BudgetMB > 0 && md.memMB > m.lim.BudgetMB:
			return []Effect{{Kind: FxFail, Waiter: ev.Waiter, Model: ev.Model,
				Reason: fmt.Sprintf("the model needs %d MiB, more than memory_budget_mb (%d)", md.memMB, m.lim.BudgetMB)}}
		case md.state == Loaded:
			md.inflight++
			md.lastUse = ev.Now
			return []Effect{{Kind: FxGrant, Waiter: ev.Waiter, Model: ev.Model}}
		case md.state == Loading:
			md.waiters = append(md.waiters, ev.Waiter)
			return nil
		}
		m.pending = append(m.pending, pend{ev.Waiter, ev.Model})
	case EvCancel:
		m.pending = slices.DeleteFunc(m.pending, func(p pend) bool { return p.waiter == ev.Waiter })
		if md != nil {
			md.waiters = slices.DeleteFunc(md.waiters, func(w uint64) bool { return w == ev.Waiter })
		}
	case EvDone:
		if md != nil && md.inflight > 0 {
			md.inflight--
			md.lastUse = ev.Now
		}
	case EvReady:
		if md == nil || md.state != Loading {
			return nil
		}
		md.state, md.failures, md.lastErr = Loaded, 0, ""
		md.loadTime = ev.Now.Sub(md.started)
		md.lastUse = ev.Now
		m.stats.Loads++
		md.counts.Loads++
		md.counts.LoadTotal += md.loadTime
		for _, w := range md.waiters {
			if w != 0 {
				md.inflight++
				fx = append(fx, Effect{Kind: FxGrant, Waiter: w, Model: ev.Model})
			}
		}
		md.waiters = nil
	case EvLoadFailed, EvExited:
		if md == nil || (md.state != Loading && md.state != Loaded) {
			return nil
		}
		if ev.Kind == EvExited {
			m.stats.Crashes++
			md.counts.Crashes++
		} else {
			m.stats.LoadFailures++
			md.counts.LoadFailures++
		}
		md.state, md.lastErr = Failed, ev.Err
		md.failures++
		md.retryAt = ev.Now.Add(m.backoff(md.failures))
		for _, w := range md.waiters {
			if w != 0 {
				fx = append(fx, Effect{Kind: FxFail, Waiter: w, Model: ev.Model, Reason: "its process failed to load: " + ev.Err})
			}
		}
		md.waiters = nil
	case EvStopped:
		if md != nil && md.state == Stopping {
			md.state = Unloaded
		}
	case EvTick:
		fx = m.tick(ev.Now)
	}
	return append(fx, m.schedule(ev.Now)...)
}

// backoff is the wait after the n-th consecutive failure.
func (m *Machine) backoff(n int) time.Duration {
	d := m.lim.BackoffMin
	for i := 1; i < n && d < m.lim.BackoffMax; i++ {
		d *= 2
	}
	return min(d, m.lim.BackoffMax)
}

// tick stops idle (and removed) models and queues the preloads.
func (m *Machine) tick(now time.Time) []Effect {
	var fx []Effect
	for _, name := range m.names() {
		md := m.models[name]
		if md.state == Loaded && md.inflight == 0 && len(md.waiters) == 0 && !m.wanted(name) {
			switch {
			case !md.known:
				md.state = Stopping
				fx = append(fx, Effect{Kind: FxStop, Model: name, Reason: "removed"})
			case !md.preload && now.Sub(md.lastUse) >= m.lim.IdleUnload:
				md.state = Stopping
				m.stats.IdleUnloads++
				md.counts.IdleUnloads++
				fx = append(fx, Effect{Kind: FxStop, Model: name, Reason: "idle"})
			}
		}
		if md.preload && (md.state == Unloaded || md.state == Failed) && !m.wanted(name) {
			m.pending = append(m.pending, pend{0, name})
		}
	}
	return fx
}

// wanted reports whether a pending request names model.
func (m *Machine) wanted(name string) bool {
	return slices.ContainsFunc(m.pending, func(p pend) bool { return p.model == name })
}

// names is the models in a fixed order (the effects of one step are
// deterministic).
func (m *Machine) names() []string {
	out := make([]string, 0, len(m.models))
	for n := range m.models {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// used is the processes and memory held now (Loading, Loaded, Stopping).
func (m *Machine) used() (n int, mb int64) {
	for _, md := range m.models {
		if md.state == Loading || md.state == Loaded || md.state == Stopping {
			n++
			mb += md.memMB
		}
	}
	return n, mb
}

func (m *Machine) fits(n int, mb, need int64) bool {
	return n+1 <= m.lim.MaxLoaded && (m.lim.BudgetMB == 0 || mb+need <= m.lim.BudgetMB)
}

// schedule starts the pending requests' models in FIFO order while they
// fit, stopping LRU models to make room for the first that does not; a
// model in its backoff waits without holding the others up.
func (m *Machine) schedule(now time.Time) []Effect {
	var fx []Effect
	for i := 0; i < len(m.pending); {
		p := m.pending[i]
		md := m.models[p.model]
		switch {
		case md == nil || !md.known:
			m.pending = slices.Delete(m.pending, i, i+1)
			if p.waiter != 0 {
				fx = append(fx, Effect{Kind: FxFail, Waiter: p.waiter, Model: p.model, Reason: "the model left this node's model list"})
			}
			continue
		case md.state == Loaded:
			m.pending = slices.Delete(m.pending, i, i+1)
			if p.waiter != 0 {
				md.inflight++
				md.lastUse = now
				fx = append(fx, Effect{Kind: FxGrant, Waiter: p.waiter, Model: p.model})
			}
			continue
		case md.state == Loading:
			m.pending = slices.Delete(m.pending, i, i+1)
			md.waiters = append(md.waiters, p.waiter)
			continue
		case md.state == Stopping, md.state == Failed && now.Before(md.retryAt):
			i++ // after EvStopped, or the backoff (EvTick)
			continue
		}
		n, mb := m.used()
		if !m.fits(n, mb, md.memMB) {
			if why := m.neverFits(p.model); why != "" {
				// SPEC U3, U4: room that only the preloaded models hold
				// never comes; waiting for it would hold every later
				// request (a preload that does not fit stays unloaded).
				m.pending = slices.Delete(m.pending, i, i+1)
				if p.waiter != 0 {
					fx = append(fx, Effect{Kind: FxFail, Waiter: p.waiter, Model: p.model, Reason: why})
				}
				continue
			}
			fx = append(fx, m.makeRoom(n, mb, md.memMB)...)
			return fx // strict FIFO: the first that waits for room holds the later ones
		}
		md.state, md.started = Loading, now
		fx = append(fx, Effect{Kind: FxStart, Model: p.model})
		// every pending request of this model now waits on its load
		kept := m.pending[:0]
		for _, q := range m.pending {
			if q.model == p.model {
				md.waiters = append(md.waiters, q.waiter)
			} else {
				kept = append(kept, q)
			}
		}
		m.pending = kept
	}
	return fx
}

// neverFits says why model can never have room under the memory budget
// (SPEC U3, U4): its own size beside the memory of the preloaded models
// that hold theirs (never stopped to make room) passes memory_budget_mb;
// "" when stopping other models can make room for it.
func (m *Machine) neverFits(name string) string {
	md := m.models[name]
	if m.lim.BudgetMB == 0 || md == nil {
		return ""
	}
	var held int64
	for other, o := range m.models {
		if other != name && o.preload && (o.state == Loading || o.state == Loaded) {
			held += o.memMB
		}
	}
	switch {
	case md.memMB > m.lim.BudgetMB:
		return fmt.Sprintf("the model needs %d MiB, more than memory_budget_mb (%d)", md.memMB, m.lim.BudgetMB)
	case md.memMB+held > m.lim.BudgetMB:
		return fmt.Sprintf("the model needs %d MiB and the preloaded models hold %d MiB: together more than memory_budget_mb (%d)",
			md.memMB, held, m.lim.BudgetMB)
	}
	return ""
}

// makeRoom stops least recently used models without a request in flight
// (never a preloaded one, never one that requests wait on) until, with the
// models already stopping, need fits; it stops none when even all of them
// would not make room (the request waits for one to become idle).
func (m *Machine) makeRoom(n int, mb, need int64) []Effect {
	var cands []string
	for _, name := range m.names() {
		md := m.models[name]
		if md.state == Stopping {
			n--
			mb -= md.memMB
		}
		if md.state == Loaded && md.inflight == 0 && !md.preload && len(md.waiters) == 0 && !m.wanted(name) {
			cands = append(cands, name)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return m.models[cands[i]].lastUse.Before(m.models[cands[j]].lastUse) })
	var stop []string
	for _, c := range cands {
		if m.fits(n, mb, need) {
			break
		}
		stop = append(stop, c)
		n--
		mb -= m.models[c].memMB
	}
	if !m.fits(n, mb, need) {
		return nil
	}
	var fx []Effect
	for _, c := range stop {
		m.models[c].state = Stopping
		m.stats.Evictions++
		m.models[c].counts.Evictions++
		fx = append(fx, Effect{Kind: FxStop, Model: c, Reason: "evict"})
	}
	return fx
}

// Next is when the machine next wants an EvTick (an idle unload or a
// backoff ending); ok is false when nothing is due.
func (m *Machine) Next() (at time.Time, ok bool) {
	take := func(t time.Time) {
		if !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	for name, md := range m.models {
		switch {
		case md.state == Loaded && md.inflight == 0 && !md.preload:
			take(md.lastUse.Add(m.lim.IdleUnload))
		case md.state == Failed && (md.preload || m.wanted(name)):
			take(md.retryAt)
		}
	}
	return at, ok
}

// Residency is one model's state as the machine sees it.
type Residency struct {
	Model    string
	State    State
	MemoryMB int64
	InFlight int
	Preload  bool
	// LoadTime is the last successful load's duration (0 = never loaded).
	LoadTime time.Duration
	LastErr  string
	Counts   Counts
}

// Residency lists the known models (and those still loaded after they
// left), sorted by name.
func (m *Machine) Residency() []Residency {
	var out []Residency
	for _, name := range m.names() {
		md := m.models[name]
		if !md.known && md.state == Unloaded {
			continue
		}
		out = append(out, Residency{Model: name, State: md.state, MemoryMB: md.memMB, InFlight: md.inflight,
			Preload: md.preload, LoadTime: md.loadTime, LastErr: md.lastErr, Counts: md.counts})
	}
	return out
}

// Stats returns the machine's counters.
func (m *Machine) Stats() Stats { return m.stats }
