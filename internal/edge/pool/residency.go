package pool

import (
	"sort"

	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Residency of the models of managed and Ollama providers (SPEC U6, U7):
// a node's NodeResidencyReport says, per such adapter, which targets are loaded
// and how long a load took there. Routing prefers a free candidate whose
// target is loaded and counts a cold start as its cost (route.go); a
// provider whose node never reported, or whose report is of an older
// generation, is taken to be loaded (every backend that is not managed
// serves its models without a load the edge could see).

// ModelResidency is one target's residency on a provider, as reported.
type ModelResidency struct {
	Model string
	// State is a protocol.Residency* value.
	State string
	// LoadMs is the last measured load of the model there, ms; 0 = never
	// loaded since the node started.
	LoadMs   int64
	MemoryMB int64
	InFlight int
	// Counts are the node's counters since it started (SPEC U8), as
	// reported: /metrics shows them.
	Counts ResidencyCounts
}

// ResidencyCounts are one model's lifecycle counters on its provider
// (ModelResidency fields 6-11).
type ResidencyCounts struct {
	Loads, LoadFailures, Crashes, Evictions, IdleUnloads uint64
	LoadMsTotal                                          int64
}

// Bounds of what one report may make the pool hold (SPEC B1-style: a
// compromised node's report is cut, not trusted).
const (
	maxResidencyModels = 4096
	maxResidencyName   = 256
)

// residency is a resource's reported residency, valid for generation gen
// of its node.
type residency struct {
	gen    uint64
	models map[string]ModelResidency
}

// NodeResidency takes generation gen of node's report: adapters maps each
// managed provider's name to its models, replacing what the pool knew of
// that provider; a provider the pool does not have is ignored, as is a
// stale generation. At most 4096 models of names up to 256 bytes are kept
// per provider. Waiters are pumped: a provider may have become preferable.
// It reports whether anything applied.
func (p *Pool) NodeResidency(node string, gen uint64, adapters map[string][]ModelResidency) bool {
	p.lock()
	ok := p.s.setResidency(node, gen, adapters)
	p.apply()
	p.mu.Unlock()
	return ok
}

func (s *state) setResidency(node string, gen uint64, adapters map[string][]ModelResidency) bool {
	n := s.nodes[node]
	if n == nil || gen != n.gen || !n.ready {
		return false
	}
	applied := false
	for name, models := range adapters {
		r := s.resources[Key{Node: node, Provider: name}]
		if r == nil {
			continue
		}
		m := make(map[string]ModelResidency, min(len(models), maxResidencyModels))
		for _, mr := range models {
			if len(m) >= maxResidencyModels {
				break
			}
			if mr.Model == "" || len(mr.Model) > maxResidencyName {
				continue
			}
			m[mr.Model] = mr
		}
		r.resid = residency{gen: gen, models: m}
		applied = true
	}
	return applied
}

// coldStart reports whether target is not loaded on r by its node's
// current report, and the seconds its load took there last (0 when never
// measured): the cost a request there pays before its first token.
func (r *resource) coldStart(target string) (cold bool, seconds float64) {
	if r.resid.models == nil || r.resid.gen != r.node.gen {
		return false, 0
	}
	mr, ok := r.resid.models[target]
	if !ok || mr.State == protocol.ResidencyLoaded {
		return false, 0
	}
	return true, float64(mr.LoadMs) / 1000
}

// Residency is what the pool knows of target's residency on k: its
// reported state and load time; ok is false without a current report.
func (p *Pool) Residency(k Key, target string) (ModelResidency, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.s.resources[k]
	if r == nil || r.resid.models == nil || r.resid.gen != r.node.gen {
		return ModelResidency{}, false
	}
	mr, ok := r.resid.models[target]
	return mr, ok
}

// residencySnapshot is r's current report sorted by model (the snapshot's
// ProviderSnapshot.residency); nil without one.
func (r *resource) residencySnapshot() []*iop.ModelResidency {
	if r.resid.models == nil || r.resid.gen != r.node.gen {
		return nil
	}
	out := make([]*iop.ModelResidency, 0, len(r.resid.models))
	for _, m := range r.resid.models {
		c := m.Counts
		out = append(out, &iop.ModelResidency{Model: m.Model, State: m.State, LoadMs: m.LoadMs, MemoryMb: m.MemoryMB, InFlight: int32(min(m.InFlight, 1<<30)),
			Loads: c.Loads, LoadMsTotal: c.LoadMsTotal, LoadFailures: c.LoadFailures, Crashes: c.Crashes, Evictions: c.Evictions, IdleUnloads: c.IdleUnloads})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}
