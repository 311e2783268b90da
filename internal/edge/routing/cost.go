package routing

import (
	"math"
	"time"
)

// The cost of a turn (prefix_affinity, SPEC Q3's choice among the free
// candidates). The holder of a conversation saves the turn the prefill of
// the history it holds, but a free slot is not free time: a backend
// processes the prompts it was given in turn (llama-server fills each step
// with the prompt tokens of its slots in order, up to its batch size, and
// decodes one token for every generating slot in the same step; vLLM and
// SGLang schedule prefill chunks the same way), so a turn that arrives
// behind other prompts waits for them before its own prefill starts. Choose
// therefore weighs, for every free candidate, the wait (for the prompts
// already queued on it and the requests in flight there,
// Candidate.Backlog: Fit.Wait) against the turn's
// own prefill there (its prompt less what the candidate holds,
// Candidate.Held, at the candidate's time per token), and a busy holder
// yields the turn to another candidate when the wait there would be longer
// than the prefill it saves. At low load nothing is queued and the holder
// always wins.

// DefaultBalance is the weight of the queued prefill against the saved one
// when the config says nothing (models[].affinity_balance): 1 = the turn
// goes to the candidate where its first token is expected soonest.
const DefaultBalance = 1.0

// DefaultTokenTime is the seconds per prefilled token a provider is
// assumed to take until its answers have been timed (Fit.Observe), when
// the config gives no prefill speed: 0.5 ms, 2,000 tokens/s, a CPU-class
// figure (llama-server on a few threads with a small model; a GPU prefills
// ten to a hundred times faster). Until then queued tokens are assumed to
// delay nothing, so the figure only scales the queue's drain.
const DefaultTokenTime = 0.0005

// Token-time bounds (seconds per token): an estimate is kept within them
// whatever the observations say.
const (
	MinTokenTime = 1e-6
	MaxTokenTime = 1.0
)

// Turn is what a decision knows of the request.
type Turn struct {
	// HasKey says the request carries a conversation; Key is its
	// conversation key (Prefix[0]).
	HasKey bool
	Key    uint64
	// Prompt is the request's estimated prompt tokens
	// (pool.EstimatePromptTokens); 0 = unknown (no cost is weighed).
	Prompt int
}

// Policy is a group's prefix_affinity knobs.
type Policy struct {
	// Epsilon is the load bound's slack for new conversations (≥ 0).
	Epsilon float64
	// Balance weighs the prefill queued on a candidate against the prefill
	// the turn saves there (≥ 0): a candidate's cost is
	// Balance·Backlog + (Prompt − Held)·TokenTime. 0 = never weigh: the
	// holder takes every turn while it has a free slot.
	Balance float64
}

// cost is the expected seconds to c's first token for a turn of prompt
// tokens: the queued prefill (weighted), the turn's own uncached prefill
// and, where its model is not loaded, the model's load (SPEC U6).
func cost(c *Candidate, prompt int, balance float64) float64 {
	own := max(prompt-c.Held, 1) // a backend always evaluates the last token again
	k := balance*c.Backlog + float64(own)*c.TokenTime
	if c.Cold {
		k += coldSeconds(c)
	}
	return k
}

// coldSeconds is c's cold start: its measured load, else DefaultColdStart.
func coldSeconds(c *Candidate) float64 {
	if c.ColdStart > 0 {
		return c.ColdStart
	}
	return DefaultColdStart
}

// yieldTo returns the free candidate a turn chosen for holder best should
// go to instead, or -1 to keep it on best: the free candidate of lowest
// cost, when that is strictly below best's; ties go to the lower
// load/capacity, then to slice order.
func yieldTo(cands []Candidate, best int, t Turn, p Policy) int {
	if p.Balance <= 0 || t.Prompt <= 0 {
		return -1
	}
	keep := cost(&cands[best], t.Prompt, p.Balance)
	alt, altCost := -1, keep
	for i := range cands {
		c := &cands[i]
		if i == best || !c.Free {
			continue
		}
		k := cost(c, t.Prompt, p.Balance)
		if k < altCost || alt >= 0 && k == altCost && c.Load*cands[alt].Weight < cands[alt].Load*c.Weight {
			alt, altCost = i, k
		}
	}
	return alt
}

// A provider's prefill queue and a group's fit, two pure machines the pool
// calls under its lock with the time.
//
// Backlog is one provider's queue: the uncached prompt tokens granted to it
// and not yet processed, a first-come-first-served fluid that drains at the
// group's time per token and is empty while the provider holds no lease.
// It also keeps, for a while, what each released lease met when it was
// granted (its Sample), to be paired with the time to first byte of the
// same request when the access record reports it (Pair, in release order,
// within PairWindow).
//
// Fit is one model group's calibration from those pairs: the least-squares
// fit of ttfb ≈ Base + TokenTime·own + perAhead·ahead + perBusy·busy over
// the decayed observations of all its providers, none negative, with a
// weak prior of the seed TokenTime and no base or delays — until the
// group's answers show that load delays them, its holders keep their
// turns. How much queued tokens and busy slots delay a new request is the
// backend's: llama-server on a CPU processes its slots' prompts in turn and
// decodes a token for every generating slot in each step, so both cost
// time, while a backend that prefills side by side and batches its decoding
// (a GPU with compute to spare; the demo backend without slots) is hardly
// delayed. Base carries what does not grow with the request or the load
// (the first-token step, network and relay time). One fit serves every
// candidate of the group, so that a provider is never preferred for the
// noise in its own figures (a group's providers are taken to be alike):
// candidates differ by their state — what they hold, what is queued on
// them, what they have in flight.

// Sample is what a request met when it was granted: its own uncached
// prompt tokens, the tokens queued ahead of it and the other requests in
// flight on the provider.
type Sample struct {
	Own, Ahead float64
	Busy       int
}

// Backlog is one provider's prefill queue (see above). The zero value is
// an empty queue.
type Backlog struct {
	tokens  float64   // queued at at
	at      time.Time // when tokens was last set
	pend    [pendLen]pending
	head, n int
}

type pending struct {
	at  time.Time // released
	s   Sample
	fit *Fit // the group whose request it was; nil: only consumed
}

// pendLen bounds the released leases waiting for their observation.
const pendLen = 16

// PairWindow is how long after its release a lease's Sample waits for the
// observation of the same request; older ones are dropped.
const PairWindow = 2 * time.Second

// Ahead is the prompt tokens still queued at now, draining at tokenTime
// seconds per token (≥ 0).
func (b *Backlog) Ahead(now time.Time, tokenTime float64) float64 {
	if b.tokens <= 0 {
		return 0
	}
	left := b.tokens
	if d := now.Sub(b.at).Seconds(); d > 0 && tokenTime > 0 {
		left -= d / tokenTime
	}
	return max(left, 0)
}

// Grant queues the prefill of a request granted at now with tokens
// uncached prompt tokens (< 1 counts as 1) and busy other requests in
// flight on the provider, the queue draining at tokenTime, and returns its
// Sample, to hand back to Released.
func (b *Backlog) Grant(now time.Time, tokens, busy int, tokenTime float64) Sample {
	sm := Sample{Own: float64(max(tokens, 1)), Ahead: b.Ahead(now, tokenTime), Busy: max(busy, 0)}
	b.tokens, b.at = sm.Ahead+sm.Own, now
	return sm
}

// Released records the return at now of a lease whose Grant returned sm,
// for a request of fit's group (nil: not a prefix_affinity group's); idle
// says the provider holds no lease any more, so its queue is empty.
func (b *Backlog) Released(now time.Time, sm Sample, fit *Fit, idle bool) {
	if idle {
		b.tokens, b.at = 0, now
	}
	i := (b.head + b.n) % pendLen
	if b.n == pendLen {
		b.head = (b.head + 1) % pendLen // the oldest is dropped
	} else {
		b.n++
	}
	b.pend[i] = pending{at: now, s: sm, fit: fit}
}

// Observe pairs the time to first byte of a request that ended at now
// (ttfb: from its grant to the first response byte) with the oldest lease
// released within PairWindow and feeds it to that lease's group's Fit;
// usable says the figure is a time to first token (a streamed answer,
// first attempt), otherwise the pair is only consumed. It reports whether
// a fit changed.
func (b *Backlog) Observe(now time.Time, ttfb time.Duration, usable bool) bool {
	for b.n > 0 && now.Sub(b.pend[b.head].at) > PairWindow {
		b.pop()
	}
	if b.n == 0 {
		return false
	}
	p := b.pop()
	if !usable || p.fit == nil {
		return false
	}
	return p.fit.Observe(p.s, ttfb)
}

func (b *Backlog) pop() pending {
	p := b.pend[b.head]
	b.pend[b.head] = pending{}
	b.head = (b.head + 1) % pendLen
	b.n--
	return p
}

// Fit is one group's calibration (see above). The zero value is not
// usable; use NewFit.
type Fit struct {
	seed float64           // the configured seconds per token (the prior)
	coef [nFigures]float64 // see the fig* indexes
	// Decayed sums of the observations: Σ x·xᵀ and Σ y·x for x = (1, own,
	// ahead, busy), y the seconds to first byte.
	sxx [nFigures][nFigures]float64
	sxy [nFigures]float64
}

// ObserveWeight is the weight of a new observation in the calibration
// (an exponential decay over about the last 1/ObserveWeight answers).
const ObserveWeight = 0.125

// The figures of the fit, in order: seconds per first byte, per own token,
// per token queued ahead, per other request in flight.
const (
	figBase = iota
	figOwn
	figAhead
	figBusy
	nFigures
)

// prior is the weight of the prior (seed TokenTime, no base or delays) in
// the fit, per figure, never decayed: as much as one observation of 128 own
// tokens, 128 tokens ahead and one busy request, and a hundredth of one
// answer for the base, so that a time that does not vary with the request
// goes to the base rather than to a load that hardly varies (a steady
// number of busy slots).
var prior = [nFigures]float64{0.01, 128 * 128, 128 * 128, 1}

// NewFit returns a fit assuming tokenTime seconds per prefilled token
// (≤ 0: DefaultTokenTime; kept within the bounds), no base and no delay
// from queued tokens or busy slots until answers are observed.
func NewFit(tokenTime float64) *Fit {
	if !(tokenTime > 0) {
		tokenTime = DefaultTokenTime
	}
	tokenTime = clampTokenTime(tokenTime)
	f := &Fit{seed: tokenTime}
	f.coef[figOwn] = tokenTime
	return f
}

func clampTokenTime(v float64) float64 { return min(max(v, MinTokenTime), MaxTokenTime) }

// TokenTime is the estimated seconds per token of a request's own prompt.
func (f *Fit) TokenTime() float64 { return f.coef[figOwn] }

// Base is the estimated seconds every first byte takes, whatever the
// request and the load.
func (f *Fit) Base() float64 { return f.coef[figBase] }

// Delays are the estimated seconds of wait per token queued ahead and per
// other request in flight.
func (f *Fit) Delays() (perAhead, perBusy float64) { return f.coef[figAhead], f.coef[figBusy] }

// Wait is the seconds a request is expected to wait on a provider with
// ahead tokens queued and busy other requests in flight
// (Candidate.Backlog).
func (f *Fit) Wait(ahead float64, busy int) float64 {
	return f.coef[figAhead]*max(ahead, 0) + f.coef[figBusy]*float64(max(busy, 0))
}

// Observe adds one answer: a request that met sm took ttfb from its grant
// to its first byte. It reports whether the estimate changed.
func (f *Fit) Observe(sm Sample, ttfb time.Duration) bool {
	if ttfb <= 0 || !(sm.Own > 0) || !(sm.Ahead >= 0) {
		return false
	}
	x := [nFigures]float64{1, sm.Own, sm.Ahead, float64(sm.Busy)}
	y := ttfb.Seconds()
	k := 1 - ObserveWeight
	for i := range nFigures {
		for j := range nFigures {
			f.sxx[i][j] = f.sxx[i][j]*k + x[i]*x[j]
		}
		f.sxy[i] = f.sxy[i]*k + y*x[i]
	}
	f.fit()
	return true
}

// fit solves the least squares with the prior over the figures in use,
// dropping the most negative figure but the own-token time (each is ≥ 0)
// and solving again, then keeps every figure within its bounds.
func (q *Fit) fit() {
	var x0 [nFigures]float64
	x0[figOwn] = q.seed
	use := [nFigures]bool{true, true, true, true}
	var c [nFigures]float64
	for range nFigures {
		c = q.solve(use, x0)
		worst := -1
		for i := range nFigures {
			if i != figOwn && use[i] && c[i] < 0 && (worst < 0 || c[i] < c[worst]) {
				worst = i
			}
		}
		if worst < 0 {
			break
		}
		use[worst] = false
	}
	for i := range nFigures {
		if i != figOwn && (!use[i] || !(c[i] >= 0)) {
			c[i] = 0
		}
	}
	if math.IsNaN(c[figOwn]) {
		c[figOwn] = q.seed
	}
	q.coef[figBase] = min(c[figBase], MaxBusyDelay)
	q.coef[figOwn] = clampTokenTime(c[figOwn])
	q.coef[figAhead] = min(c[figAhead], MaxTokenTime)
	q.coef[figBusy] = min(c[figBusy], MaxBusyDelay)
}

// MaxBusyDelay bounds the estimated base time and wait per busy request,
// seconds.
const MaxBusyDelay = 60.0

// solve is the ridge least-squares solution over the figures in use (the
// others are 0), by Gaussian elimination with partial pivoting.
func (q *Fit) solve(use [nFigures]bool, x0 [nFigures]float64) [nFigures]float64 {
	var idx [nFigures]int
	n := 0
	for i := range nFigures {
		if use[i] {
			idx[n] = i
			n++
		}
	}
	var m [nFigures][nFigures + 1]float64
	for r := range n {
		i := idx[r]
		for cc := range n {
			m[r][cc] = q.sxx[i][idx[cc]]
		}
		m[r][r] += prior[i]
		m[r][n] = q.sxy[i] + prior[i]*x0[i]
	}
	for col := range n {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[piv][col]) {
				piv = r
			}
		}
		m[col], m[piv] = m[piv], m[col]
		if m[col][col] == 0 {
			return x0
		}
		for r := range n {
			if r == col {
				continue
			}
			f := m[r][col] / m[col][col]
			for cc := col; cc <= n; cc++ {
				m[r][cc] -= f * m[col][cc]
			}
		}
	}
	var out [nFigures]float64
	for r := range n {
		out[idx[r]] = m[r][n] / m[r][r]
	}
	return out
}
