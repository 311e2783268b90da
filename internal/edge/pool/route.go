package pool

import "iop/internal/edge/routing"

// pick returns the candidate of class c to grant now to a request with
// prefix and promptTokens, or nil when none is free; for prefix_affinity groups also how
// routing decided. Only live, free candidates are ever returned (SPEC Q3):
//   - least_loaded: a candidate whose target is loaded before one that
//     is not (SPEC U6, residency.go), then lowest in_flight/capacity, then
//     config order;
//   - ordered: the first in config order;
//   - prefix_affinity: routing.Choose (longest held prefix unless the
//     prefill queued on its holder outweighs what it saves, cost.go; then
//     bounded-load rendezvous hashing; never a wait while one is free).
//
// It changes nothing: the pump calls it for every class head and grants
// only one.
func (s *state) pick(c *class, prefix []uint64, promptTokens int) (*cand, routing.Result) {
	cd, res, _ := s.choose(c, prefix, promptTokens)
	return cd, res
}

// choose is pick that also returns, for a prefix_affinity request that was
// not given to the holder of its longest prefix because that holder is at
// capacity, the holder (admit may pin the request to it, pin.go).
func (s *state) choose(c *class, prefix []uint64, promptTokens int) (*cand, routing.Result, *resource) {
	switch c.g.mode {
	case routing.PrefixAffinity:
		return s.pickAffinity(c, prefix, promptTokens)
	case routing.Ordered:
		for i := range c.cands {
			if r := c.cands[i].res; r.live() && r.free(c.long) {
				return &c.cands[i], routing.ResultFallback, nil
			}
		}
		return nil, routing.ResultFallback, nil
	}
	var best *cand
	bestCold := false
	for i := range c.cands {
		cd := &c.cands[i]
		r := cd.res
		if !r.live() || !r.free(c.long) {
			continue
		}
		cold, _ := r.coldStart(cd.target) // SPEC U6: a loaded target first
		if best == nil || bestCold && !cold || cold == bestCold && r.inFlight*best.res.capacity() < best.res.inFlight*r.capacity() {
			best, bestCold = cd, cold
		}
	}
	return best, routing.ResultFallback, nil
}

func (s *state) pickAffinity(c *class, prefix []uint64, promptTokens int) (*cand, routing.Result, *resource) {
	cs := s.scratch[:0]
	holder := -1 // the live candidate with the longest match, first in config order
	for i := range c.cands {
		r := c.cands[i].res
		live := r.live()
		cd := routing.Candidate{ID: r.id, Live: live, Free: live && r.free(c.long), Load: r.inFlight, Weight: r.capacity()}
		if live && len(prefix) > 0 {
			cd.Match, cd.Held = r.held(prefix)
		}
		if cd.Match > 0 && (holder < 0 || cd.Match > cs[holder].Match) {
			holder = i
		}
		if r.costed {
			f := c.g.fit
			cd.Backlog, cd.TokenTime = f.Wait(r.bl.Ahead(s.now, f.TokenTime()), r.inFlight), f.TokenTime()
		}
		cd.Cold, cd.ColdStart = r.coldStart(c.cands[i].target) // SPEC U6
		cs = append(cs, cd)
	}
	s.scratch = cs
	t := routing.Turn{HasKey: len(prefix) > 0, Prompt: promptTokens}
	if t.HasKey {
		t.Key = prefix[0]
	}
	i, res := routing.Choose(cs, t, routing.Policy{Epsilon: c.g.epsilon, Balance: c.g.balance})
	if i < 0 {
		return nil, res, nil
	}
	var busy *resource
	if res == routing.ResultFallback && holder >= 0 && !cs[holder].Free && cs[i].Match < cs[holder].Match {
		busy = c.cands[holder].res
	}
	return &c.cands[i], res, busy
}

// held returns how many leading boundaries of prefix r's affinity table
// holds for its node's current generation, and the prompt tokens up to
// there (routing.Table.Held); 0, 0 without a current table.
func (r *resource) held(prefix []uint64) (match, tokens int) {
	if r.aff == nil || r.aff.Gen() != r.node.gen {
		return 0, 0
	}
	return r.aff.Held(prefix)
}

// recordAffinity counts a prefix_affinity decision for g and records the
// request's prefix (of promptTokens) in r's table, which is reset first
// when it belongs to an older generation of r's node (a reconnected
// backend may have lost its cache).
func (s *state) recordAffinity(g *group, r *resource, prefix []uint64, promptTokens int, res routing.Result) {
	g.stats[res]++
	if len(prefix) == 0 {
		return
	}
	switch {
	case r.aff == nil:
		r.aff = routing.NewTable(r.node.gen, s.affEntries)
	case r.aff.Gen() != r.node.gen:
		r.aff.Reset(r.node.gen)
	}
	r.aff.Record(prefix, promptTokens)
}

// routeCounts are one model's prefix_affinity decisions by routing.Result.
type routeCounts [routing.NumResults]uint64

// GroupRouting is one model group's routing mode and the prefix_affinity
// decisions taken for it since the pool started (R1). The counts
// survive config reloads and never fall; a group that was never in
// prefix_affinity mode has all zero.
type GroupRouting struct {
	Model string
	// Mode is the configured mode's name (routing.NameOrdered, …).
	Mode                             string
	PrefixHit, Hash, Fallback, Yield uint64
}

// HitRatio is PrefixHit over all decisions, 0 when there were none.
func (g GroupRouting) HitRatio() float64 {
	n := g.PrefixHit + g.Hash + g.Fallback + g.Yield
	if n == 0 {
		return 0
	}
	return float64(g.PrefixHit) / float64(n)
}

// routing projects every configured group, in config order.
func (s *state) routing() []GroupRouting {
	out := make([]GroupRouting, 0, len(s.groupList))
	for _, g := range s.groupList {
		out = append(out, GroupRouting{Model: g.name, Mode: g.mode.String(),
			PrefixHit: g.stats[routing.ResultPrefixHit], Hash: g.stats[routing.ResultHash], Fallback: g.stats[routing.ResultFallback],
			Yield: g.stats[routing.ResultYield]})
	}
	return out
}
