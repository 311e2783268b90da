package pool

import (
	"time"

	"iop/internal/edge/routing"
)

// The cost of a turn (SPEC Q3's choice under prefix_affinity): every
// resource that is a candidate of a prefix_affinity group keeps a
// routing.Backlog — the prefill granted to it and not yet done — and every
// prefix_affinity group a routing.Fit — its providers' time per token and
// how much queued prompts and busy slots delay a first byte — so that
// routing.Choose can weigh the wait on a busy holder of a conversation
// against the prefill the holder saves (internal/edge/routing, cost.go).
//
// A grant queues the request's uncached prompt tokens (its estimated
// prompt less what the resource's affinity table holds of it) on its
// resource at the transition's time; every grant on such a resource
// counts, whatever mode the request's own group has. A lease's return
// hands its Sample (own and queued-ahead tokens, other requests in flight)
// back to the backlog, and ObserveFirstByte — the request's time to first
// byte, reported after it ended (internal/edge/access's record, wired in
// internal/edge) — pairs with it and feeds the fit of the lease's group.
// When nothing reports, a fit stays at the configured speed
// (Resource.PrefillTokensPerSecond of the group's first candidate that
// sets one, else routing.DefaultTokenTime) and load delays nothing: the
// holder keeps its turns. Fits survive config reloads (by model name).
//
// Time: the wrapper reads the Clock before taking Pool.mu (it stays a
// leaf) and only while some group is costed, so least_loaded and ordered
// pools read no clock; state.now only rises.

// markCosted marks the resources that are candidates of a prefix_affinity
// group (a resource keeps its backlog while it stays marked) and gives
// each the fit of the first such group, whose time per token drains its
// backlog for grants of groups without a fit.
func (s *state) markCosted() {
	for _, r := range s.resources {
		r.costed, r.fit = false, nil
	}
	s.costed = false
	for _, g := range s.groupList {
		if g.mode != routing.PrefixAffinity {
			continue
		}
		for _, c := range g.classes {
			for i := range c.cands {
				r := c.cands[i].res
				if !r.costed {
					r.costed, r.fit = true, g.fit
				}
				s.costed = true
			}
		}
	}
	for _, r := range s.resources {
		if !r.costed {
			r.bl = routing.Backlog{}
		}
	}
	for _, g := range s.groupList {
		if g.svc != nil {
			s.costed = true // a Timed group's leases need the time too (wait.go)
		}
	}
}

// seedTokenTime is the time per token a new fit for gc starts from: its
// first candidate's configured prefill speed, else 0 (the default).
func (s *state) seedTokenTime(gc Group) float64 {
	for _, cc := range gc.Candidates {
		if r := s.resources[cc.Key]; r != nil && r.configured && r.cfg.PrefillTokensPerSecond > 0 {
			return tokenTime(r.cfg.PrefillTokensPerSecond)
		}
	}
	return 0
}

// tokenTime is seconds per token for a speed in tokens per second; 0 (the
// default) for a speed <= 0.
func tokenTime(tokensPerSecond float64) float64 {
	if tokensPerSecond <= 0 {
		return 0
	}
	return 1 / tokensPerSecond
}

// queuePrefill queues the prefill of a request of g with prefix and
// promptTokens granted on r now (before it counts in r's in-flight) and
// returns the lease's Sample.
func (s *state) queuePrefill(g *group, r *resource, prefix []uint64, promptTokens int) routing.Sample {
	f := g.fit
	if f == nil {
		f = r.fit
	}
	_, held := r.held(prefix)
	return r.bl.Grant(s.now, promptTokens-held, r.inFlight, f.TokenTime())
}

// setNow advances the transition time to now (never back: the wrapper
// reads the clock before the lock, so calls may arrive out of order).
func (s *state) setNow(now time.Time) {
	if now.After(s.now) {
		s.now = now
	}
}

// lock takes p.mu for one transition, with the state's time set when some
// group weighs the cost of a turn (the clock is read first, outside the
// lock).
func (p *Pool) lock() {
	if !p.costed.Load() {
		p.mu.Lock()
		return
	}
	now := p.clk.Now()
	p.mu.Lock()
	p.s.setNow(now)
}

// unlockConfig publishes whether the new config weighs costs (read
// without the lock by lock) and unlocks.
func (p *Pool) unlockConfig() {
	p.costed.Store(p.s.costed)
	p.mu.Unlock()
}

// ObserveFirstByte reports that a request served by provider k ended, with
// ttfb from its lease's grant to its first response byte (Q3 cost:
// routing.Backlog.Observe). usable says ttfb is a time to first token — a
// streamed answer, completed, on the request's first attempt; otherwise the
// report only pairs with the lease (a non-streamed answer's first byte
// comes after its whole generation). Reports for providers that no
// prefix_affinity group routes to are ignored.
func (p *Pool) ObserveFirstByte(k Key, ttfb time.Duration, usable bool) {
	if !p.costed.Load() {
		return
	}
	p.lock()
	if r := p.s.resources[k]; r != nil && r.costed {
		r.bl.Observe(p.s.now, ttfb, usable)
	}
	p.mu.Unlock()
}

// PrefillEstimate is one provider's prefill queue as prefix_affinity sees
// it (Pool.PrefillEstimates).
type PrefillEstimate struct {
	Key
	// Queued is the prompt tokens queued on it now, Wait how long a
	// request granted now is expected to wait for them and for the
	// requests in flight; TokensPerSecond the estimated prefill speed of a
	// request's own prompt.
	Queued          float64
	Wait            time.Duration
	TokensPerSecond float64
}

// PrefillEstimates returns the estimate of every provider a
// prefix_affinity group routes to, by the fit of the first such group, in
// no particular order (for tests and diagnostics).
func (p *Pool) PrefillEstimates() []PrefillEstimate {
	p.lock()
	defer p.mu.Unlock()
	var out []PrefillEstimate
	for _, r := range p.s.resources {
		if r.costed {
			f := r.fit
			ahead := r.bl.Ahead(p.s.now, f.TokenTime())
			out = append(out, PrefillEstimate{Key: r.cfg.Key, Queued: ahead,
				Wait:            time.Duration(f.Wait(ahead, r.inFlight) * float64(time.Second)),
				TokensPerSecond: 1 / f.TokenTime()})
		}
	}
	return out
}
