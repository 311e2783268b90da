package routing

import "math"

// DefaultEpsilon is the load bound's slack when the config says nothing:
// a new conversation (or a tie between holders of its prefix) goes to a
// candidate only while that candidate's in-flight count stays within 1.1 ×
// its capacity share of the group's load. The holder of a conversation's
// longest prefix is bounded by its capacity alone (see Choose), so the
// balance of a group rests on where new conversations land, and a tight
// bound costs nothing there (nobody holds a new conversation). Measured
// (BENCHMARKS.md, prefix-affinity figures, demo replicas, 16 conversations × 5 turns at
// concurrency 8, four runs each): requests per replica max/mean 1.00–1.12
// at 0.1, 1.00–1.38 at 0.5, with every later turn a prefix hit in both.
const DefaultEpsilon = 0.1

// Candidate is one of a group's candidates as the pool sees it at the
// moment of a decision.
type Candidate struct {
	// ID is the candidate's rendezvous identity (ProviderID).
	ID uint64
	// Live: the candidate may serve at all (node ready, no overlay, not
	// cooling). Only live candidates count towards the average load.
	Live bool
	// Free: Live and a capacity slot (and a long slot for a long request)
	// is free now. Only a free candidate is ever chosen.
	Free bool
	// Load is the requests it has in flight; Weight its capacity (> 0).
	Load, Weight int
	// Match is how many leading boundaries of the request's prefix it holds
	// (Table.Held); 0 = none. Held is the estimated prompt tokens of the
	// request up to that boundary (what its prefix cache should serve).
	Match, Held int
	// Backlog is how long a request granted now waits for the prompts
	// queued on it and the requests in flight there, seconds (Fit.Wait);
	// TokenTime its seconds per prefilled token (Fit.TokenTime, > 0).
	// Read only when Policy.Balance > 0.
	Backlog, TokenTime float64
	// Cold: the request's target is not loaded there (a managed backend
	// would start its process first, SPEC U6); ColdStart is the seconds
	// its last load there took (0 = never measured: DefaultColdStart).
	Cold      bool
	ColdStart float64
}

// DefaultColdStart is the seconds a cold start is assumed to take where no
// load of the model was measured yet.
const DefaultColdStart = 1.0

// eligible: c may be chosen — free, and loaded when some free candidate
// is (SPEC U6: a loaded provider is preferred).
func eligible(c *Candidate, warmFree bool) bool { return c.Free && !(warmFree && c.Cold) }

// Choose picks the candidate for a request under prefix affinity and says
// how it decided; it returns -1 when no candidate is free (the request
// then waits, as under any mode). t says whether the request carries a
// conversation, its key and its prompt size; p.Epsilon is the load bound's
// slack (≥ 0), p.Balance the weight of a candidate's queued prefill.
//
// The free candidate holding the longest prefix of the request takes it
// (unless its cost says otherwise, below): a holder's bound is its
// capacity (Free), not the load bound, because
// turning a conversation away from the replica that holds it costs a full
// prefill of its history elsewhere and moves the conversation for good.
// Among free candidates that hold the same longest prefix, and for a
// request no free candidate holds any prefix of, the bounded-load
// rendezvous hash decides: a candidate is within bound while
// Load+1 ≤ ⌈(1+ε)·m·Weight/W⌉, with m the live candidates' load plus this
// request and W their capacity, and the one within bound with the highest
// weighted rendezvous score for key (−Weight/ln u, u uniform from key and
// ID) wins. When none of them is within bound (it can happen only when
// capacities are uneven, or among holders), or the request has no key, the
// least loaded of them (Load/Weight, then slice order) takes it: affinity
// never makes a request wait while a candidate is free.
//
// A free candidate whose target is loaded is chosen before one where it
// is not (Cold, SPEC U6) at every step above; a cold start's seconds are
// part of a candidate's cost below.
//
// A turn chosen for a holder of its prefix then weighs its cost (see
// cost.go): it goes to the free candidate where its first token is
// expected soonest — Balance × the prefill queued there plus its own
// uncached prefill there, (Prompt − Held) × TokenTime — and stays with the
// holder unless another candidate's cost is strictly lower (ResultYield;
// a candidate holding the same prefix keeps the holder's result).
// With nothing queued the holder's cost is the lowest, so at low load the
// holder keeps its turns.
func Choose(cands []Candidate, t Turn, p Policy) (int, Result) {
	hasKey, key, epsilon := t.HasKey, t.Key, p.Epsilon
	m, w, maxMatch, freeMatch := 1, 0, 0, 0
	warmFree := false
	for i := range cands {
		warmFree = warmFree || cands[i].Free && !cands[i].Cold
	}
	for i := range cands {
		c := &cands[i]
		if c.Live {
			m += c.Load
			w += c.Weight
			maxMatch = max(maxMatch, c.Match)
		}
		if eligible(c, warmFree) && hasKey {
			freeMatch = max(freeMatch, c.Match)
		}
	}
	best, least := -1, -1
	var bestScore float64
	for i := range cands {
		c := &cands[i]
		if !eligible(c, warmFree) || hasKey && c.Match != freeMatch {
			continue
		}
		if least < 0 || c.Load*cands[least].Weight < cands[least].Load*c.Weight {
			least = i
		}
		if !hasKey || !withinBound(c, m, w, epsilon) {
			continue
		}
		if s := score(key, c.ID, c.Weight); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	switch {
	case least < 0:
		return -1, ResultFallback
	case !hasKey:
		return least, ResultFallback
	case best < 0:
		best = least
	}
	if maxMatch == 0 {
		return best, ResultHash
	}
	res := ResultFallback
	if freeMatch == maxMatch {
		res = ResultPrefixHit
	}
	if freeMatch > 0 {
		if alt := yieldTo(cands, best, t, p); alt >= 0 {
			if cands[alt].Match != freeMatch {
				res = ResultYield
			}
			return alt, res
		}
	}
	return best, res
}

// withinBound: the candidate's load after taking the request stays within
// (1+ε) times its capacity share of the m requests in flight.
func withinBound(c *Candidate, m, w int, epsilon float64) bool {
	if w <= 0 || c.Weight <= 0 {
		return false
	}
	bound := math.Ceil((1+epsilon)*float64(m)*float64(c.Weight)/float64(w) - 1e-9)
	return float64(c.Load+1) <= bound
}

// score is the weighted rendezvous (highest random weight) score of
// candidate id for key: −weight / ln(u) with u in (0, 1) drawn from the
// pair, so that each candidate wins a share of keys proportional to its
// weight and removing one moves only the keys it won.
func score(key, id uint64, weight int) float64 {
	u := (float64(mix(key^id)>>11) + 0.5) / (1 << 53)
	return -float64(weight) / math.Log(u)
}
