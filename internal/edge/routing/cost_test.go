package routing

import (
	"math"
	"testing"
	"time"
)

// costed returns a free live candidate of capacity 8 with load in flight,
// match boundaries holding held tokens, backlog seconds queued and the
// default time per token (0.5 ms).
func costed(id uint64, load, match, held int, backlog float64) Candidate {
	return Candidate{ID: id, Live: true, Free: true, Load: load, Weight: 8, Match: match, Held: held,
		Backlog: backlog, TokenTime: DefaultTokenTime}
}

// TestTurnCost: Q3 — the choice among the free candidates weighs a turn's
// cost: the prefill queued on a candidate against the prefill the turn
// saves there. The rows are the rule's cases; prompts are 3,000 tokens of
// which the holder holds 2,800 (a later turn: 0.1 s of prefill on the
// holder, 1.5 s elsewhere at 0.5 ms per token).
func TestTurnCost(t *testing.T) {
	busy := func(c Candidate) Candidate { c.Free = false; return c }
	coldAt := func(c Candidate, s float64) Candidate { c.Cold, c.ColdStart = true, s; return c }
	fast := func(c Candidate) Candidate { c.TokenTime = DefaultTokenTime / 20; return c }
	const prompt, held = 3000, 2800
	rows := []struct {
		name    string
		cands   []Candidate
		prompt  int
		balance float64
		want    int // -2: any candidate, checked by result only
		result  Result
	}{
		{name: "holder idle keeps its turn",
			cands: []Candidate{costed(1, 0, 5, held, 0), costed(2, 0, 0, 0, 0)}, want: 0, result: ResultPrefixHit},
		{name: "holder busy but its queue is shorter than the saved prefill keeps its turn",
			// 0.5 + 0.1 s on the holder against 1.5 s elsewhere
			cands: []Candidate{costed(1, 6, 5, held, 0.5), costed(2, 0, 0, 0, 0)}, want: 0, result: ResultPrefixHit},
		{name: "holder busy with an idle peer yields when its queue outweighs the saved prefill",
			// 2 + 0.1 s on the holder against 1.5 s on the idle peer
			cands: []Candidate{costed(1, 7, 5, held, 2), costed(2, 0, 0, 0, 0)}, want: 1, result: ResultYield},
		{name: "all busy: the holder keeps its turn while its first token still comes first",
			// 2 + 0.1 s against 1.5 + 1.5 s
			cands: []Candidate{costed(1, 7, 5, held, 2), costed(2, 6, 0, 0, 1.5)}, want: 0, result: ResultPrefixHit},
		{name: "all busy: the candidate with the earliest first token takes the turn",
			// 3 + 0.1 s against 0.5 + 1.5 s against 1 + 1.5 s
			cands: []Candidate{costed(1, 7, 5, held, 3), costed(2, 4, 0, 0, 0.5), costed(3, 5, 0, 0, 1)}, want: 1, result: ResultYield},
		{name: "equal costs elsewhere: the lower load takes the yielded turn",
			cands: []Candidate{costed(1, 7, 5, held, 3), costed(2, 5, 0, 0, 0.5), costed(3, 2, 0, 0, 0.5)}, want: 2, result: ResultYield},
		{name: "a tie keeps the holder",
			// 1.4 + 0.1 s against 1.5 s
			cands: []Candidate{costed(1, 7, 5, held, 1.4), costed(2, 0, 0, 0, 0)}, want: 0, result: ResultPrefixHit},
		{name: "a holder of a shorter prefix is weighed by what it holds",
			// 2 + 0.1 s against 0.2 + (3000−2000)·0.5 ms = 0.7 s: a
			// partial holder, still a yield (the longest holder is passed over)
			cands: []Candidate{costed(1, 7, 5, held, 2), costed(2, 1, 3, 2000, 0.2)}, want: 1, result: ResultYield},
		{name: "another holder of the same prefix with less queued takes it as a prefix hit",
			cands: []Candidate{costed(1, 7, 5, held, 2), costed(2, 1, 5, held, 0)}, want: 1, result: ResultPrefixHit},
		{name: "a faster provider is weighed at its own time per token",
			// 1 + 0.1 s on the holder against 3000 · 25 µs = 75 ms
			cands: []Candidate{costed(1, 4, 5, held, 1), fast(costed(2, 0, 0, 0, 0))}, want: 1, result: ResultYield},
		{name: "a new conversation: the bounded hash decides, whatever is queued",
			cands: []Candidate{costed(1, 0, 0, 0, 5), costed(2, 0, 0, 0, 0)}, want: -2, result: ResultHash},
		{name: "holder at capacity: another free candidate as before, no cost weighed",
			cands: []Candidate{busy(costed(1, 8, 5, held, 0)), costed(2, 3, 0, 0, 4), costed(3, 1, 0, 0, 0)}, want: -2, result: ResultFallback},
		{name: "balance 0: the holder takes every turn while it has a free slot",
			cands: []Candidate{costed(1, 7, 5, held, 10), costed(2, 0, 0, 0, 0)}, balance: -1, want: 0, result: ResultPrefixHit},
		{name: "balance 4: a shorter queue on the holder already outweighs the saved prefill",
			// 4·0.5 + 0.1 s against 1.5 s
			cands: []Candidate{costed(1, 6, 5, held, 0.5), costed(2, 0, 0, 0, 0)}, balance: 4, want: 1, result: ResultYield},
		{name: "U6 every candidate cold: a cold start is part of the cost",
			// 0.1 + 5 s (load) on the holder against 1.5 + 0.5 s
			cands: []Candidate{coldAt(costed(1, 0, 5, held, 0), 5), coldAt(costed(2, 0, 0, 0, 0), 0.5)}, want: 1, result: ResultYield},
		{name: "U6 a load never measured costs DefaultColdStart",
			// 0.1 + 1 s on the holder against 1.5 + 0.5 s
			cands: []Candidate{coldAt(costed(1, 0, 5, held, 0), 0), coldAt(costed(2, 0, 0, 0, 0), 0.5)}, want: 0, result: ResultPrefixHit},
		{name: "unknown prompt size: no cost weighed",
			cands: []Candidate{costed(1, 7, 5, held, 10), costed(2, 0, 0, 0, 0)}, prompt: -1, want: 0, result: ResultPrefixHit},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			p := Policy{Epsilon: 0.5, Balance: DefaultBalance}
			switch {
			case r.balance < 0:
				p.Balance = 0
			case r.balance > 0:
				p.Balance = r.balance
			}
			tn := Turn{HasKey: true, Key: 0xfeed, Prompt: prompt}
			if r.prompt < 0 {
				tn.Prompt = 0
			}
			got, res := Choose(r.cands, tn, p)
			if r.want != -2 && got != r.want || r.want == -2 && got < 0 {
				t.Errorf("chose %d, want %d", got, r.want)
			}
			if res != r.result {
				t.Errorf("result %s, want %s", res, r.result)
			}
		})
	}
}

// feed gives f one answer: a request that met own and ahead tokens and
// busy requests took y seconds to its first byte.
func feed(f *Fit, own, ahead float64, busy int, y float64) {
	f.Observe(Sample{Own: own, Ahead: ahead, Busy: busy}, time.Duration(y*float64(time.Second)))
}

// TestBacklog: Q3 — a provider's prefill queue: grants queue first come
// first served, the queue drains at the time per token and empties when
// the provider holds nothing, and a released lease's Sample pairs with
// its request's time to first byte, oldest first, within PairWindow, for
// its group's fit only.
func TestBacklog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const tt = DefaultTokenTime
	grant := func(t *testing.T, b *Backlog, ms, tokens int, wantAhead float64) {
		t.Helper()
		sm := b.Grant(at(ms), tokens, 2, tt)
		if sm.Own != float64(tokens) || math.Abs(sm.Ahead-wantAhead) > 1e-6 || sm.Busy != 2 {
			t.Fatalf("Grant(%d, busy 2) = %+v; want own %d, ahead %g, busy 2", tokens, sm, tokens, wantAhead)
		}
	}
	rows := []struct {
		name      string
		run       func(t *testing.T, b *Backlog)
		aheadAt   int     // ms
		wantAhead float64 // tokens
	}{
		{name: "an idle provider's grant is queued for its own prefill",
			run: func(t *testing.T, b *Backlog) { grant(t, b, 0, 1000, 0) }, aheadAt: 0, wantAhead: 1000},
		{name: "a second grant waits behind the first",
			run: func(t *testing.T, b *Backlog) { grant(t, b, 0, 1000, 0); grant(t, b, 0, 500, 1000) }, aheadAt: 0, wantAhead: 1500},
		{name: "the queue drains with time",
			run: func(t *testing.T, b *Backlog) { grant(t, b, 0, 1000, 0); grant(t, b, 200, 1000, 600) }, aheadAt: 700, wantAhead: 600},
		{name: "a drained queue counts nothing ahead",
			run: func(t *testing.T, b *Backlog) { grant(t, b, 0, 1000, 0); grant(t, b, 900, 10, 0) }, aheadAt: 900, wantAhead: 10},
		{name: "the provider holding nothing any more has nothing queued",
			run: func(t *testing.T, b *Backlog) { b.Released(at(100), b.Grant(at(0), 4000, 0, tt), nil, true) }, aheadAt: 100, wantAhead: 0},
		{name: "a release while other leases are held leaves the queue",
			run: func(t *testing.T, b *Backlog) { b.Released(at(100), b.Grant(at(0), 4000, 1, tt), nil, false) }, aheadAt: 100, wantAhead: 3800},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			var b Backlog
			r.run(t, &b)
			if got := b.Ahead(at(r.aheadAt), tt); math.Abs(got-r.wantAhead) > 1e-6 {
				t.Errorf("Ahead = %g tokens, want %g", got, r.wantAhead)
			}
		})
	}

	t.Run("pairs oldest first, at most pendLen wait, only within the window, only for a fit", func(t *testing.T) {
		var b Backlog
		f := NewFit(0)
		for i := range pendLen + 4 {
			b.Released(t0, Sample{Own: float64(1000 * (i + 1))}, f, false)
		}
		if b.n != pendLen {
			t.Fatalf("%d releases wait, want %d", b.n, pendLen)
		}
		// The oldest left is the fifth release (5,000 tokens): 5 s, 1 ms
		// per token, pulls the estimate to about 1 ms (paired with the
		// first, 1,000 tokens, it would be 5 ms).
		if !b.Observe(t0, 5*time.Second, true) {
			t.Fatal("the observation changed nothing")
		}
		if got := f.TokenTime(); math.Abs(got-0.001) > 0.05*0.001 {
			t.Errorf("TokenTime = %g, want 0.001 (paired with the oldest waiting release)", got)
		}
		if b.Observe(t0, 9*time.Second, false) {
			t.Error("an unusable figure (not streamed, a retry) changed the fit; it only consumes its pair")
		}
		if b.Observe(t0.Add(PairWindow+time.Millisecond), 9*time.Second, true) || b.n != 0 {
			t.Errorf("an observation after the window paired (%d left)", b.n)
		}
		b.Released(t0, Sample{Own: 1000}, nil, false)
		if b.Observe(t0, 9*time.Second, true) {
			t.Error("a lease of a group without a fit fed one")
		}
	})
}

// TestFit: Q3 — a group's calibration from its providers' timed answers:
// the time per token, the delay per token queued ahead and per busy slot
// (none until answers show them), a fixed time per answer kept apart from
// the load, every figure within bounds.
func TestFit(t *testing.T) {
	const tt = DefaultTokenTime
	rows := []struct {
		name      string
		seed      float64
		run       func(f *Fit)
		wantBase  float64 // seconds; within 10 % (or 50 ms: the prior's pull on the token time); < 0: not checked
		wantToken float64 // seconds per token (0 = the seed); within 10 %
		wantAhead float64 // seconds per token ahead; within 10 % of the token time
		wantBusy  float64 // seconds per busy request; within 10 % (or 5 ms)
	}{
		{name: "no answers: the seed, no delays"},
		{name: "a configured speed seeds the estimate", seed: 0.00005, wantToken: 0.00005},
		{name: "a slower provider's answers raise the token time, no delay seen",
			run: func(f *Fit) {
				for i := range 16 {
					feed(f, float64(500+100*i), 0, 0, 0.002*float64(500+100*i))
				}
			}, wantToken: 0.002},
		{name: "answers that grow with the prompts queued ahead teach the delay (a CPU's turn-taking)",
			run: func(f *Fit) {
				for i := range 16 {
					own, ahead := float64(300+50*(i%4)), float64(1000*(i%3))
					feed(f, own, ahead, i%5, tt*(own+ahead))
				}
			}, wantToken: tt, wantAhead: tt},
		{name: "answers that grow with the requests in flight teach their delay (decoding shares each step)",
			run: func(f *Fit) {
				for i := range 16 {
					own, busy := float64(300+50*(i%4)), i%7
					feed(f, own, float64(200*(i%3)), busy, tt*own+0.02*float64(busy))
				}
			}, wantToken: tt, wantBusy: 0.02},
		{name: "a fixed time per answer is not taken for load",
			run: func(f *Fit) {
				for i := range 16 {
					own := float64(300 + 50*(i%4))
					feed(f, own, float64(1000*(i%3)), 1+i%5, 0.3+tt*own)
				}
			}, wantBase: 0.3, wantToken: tt},
		{name: "a fixed time per answer is not taken for load, even at a steady load",
			run: func(f *Fit) {
				for i := range 16 {
					own := float64(300 + 50*(i%4))
					feed(f, own, 0, 3+i%2, 0.3+tt*own)
				}
			}, wantBase: 0.3, wantToken: tt},
		{name: "answers that do not grow with load teach no delay (side-by-side prefill, batched decoding)",
			run: func(f *Fit) {
				for i := range 16 {
					own, ahead := float64(300+50*(i%4)), float64(1000*(i%3))
					feed(f, own, ahead, i%5, tt*own)
				}
			}, wantToken: tt},
		{name: "the estimate stays within its bounds",
			run: func(f *Fit) {
				for i := range 16 {
					feed(f, float64(100*(i+1)), 0, 0, 2*float64(100*(i+1)))
				}
			}, wantBase: -1, wantToken: MaxTokenTime},
		{name: "a figure that is no time to first token changes nothing",
			run: func(f *Fit) {
				if f.Observe(Sample{Own: 0}, time.Second) || f.Observe(Sample{Own: 10}, 0) {
					t.Error("Observe took a sample without own tokens or time")
				}
			}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			f := NewFit(r.seed)
			if r.run != nil {
				r.run(f)
			}
			if got := f.Base(); r.wantBase >= 0 && math.Abs(got-r.wantBase) > max(0.1*r.wantBase, 0.05) {
				t.Errorf("Base = %g s, want %g", got, r.wantBase)
			}
			want := r.wantToken
			if want == 0 {
				want = DefaultTokenTime
			}
			if got := f.TokenTime(); math.Abs(got-want) > 0.1*want {
				t.Errorf("TokenTime = %g, want %g", got, want)
			}
			perAhead, perBusy := f.Delays()
			if math.Abs(perAhead-r.wantAhead) > 0.1*f.TokenTime() {
				t.Errorf("delay per token ahead = %g, want %g", perAhead, r.wantAhead)
			}
			if math.Abs(perBusy-r.wantBusy) > max(0.1*r.wantBusy, 0.005) {
				t.Errorf("delay per busy request = %g, want %g", perBusy, r.wantBusy)
			}
			if got, want := f.Wait(1000, 3), perAhead*1000+3*perBusy; got != want {
				t.Errorf("Wait = %g s, want %g", got, want)
			}
		})
	}
}
