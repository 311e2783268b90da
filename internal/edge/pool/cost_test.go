package pool

import (
	"math"
	"testing"
	"time"

	"iop/internal/edge/routing"
)

// costConfig: baseConfig with both providers at capacity 8 and model tiny
// in prefix_affinity with the default balance.
func costConfig() Config {
	c := baseConfig()
	for i := range c.Resources {
		c.Resources[i].Capacity, c.Resources[i].LongCapacity = 8, 8
	}
	c.Groups[0].Routing = routing.PrefixAffinity
	c.Groups[0].Epsilon = 1
	c.Groups[0].Balance = routing.DefaultBalance
	c.Groups[0].LongContextTokens = 0
	return c
}

// sized is turn(conv, n) with an estimated prompt of tokens.
func sized(conv uint64, n, tokens int) Request {
	r := turn(conv, n)
	r.PromptTokens = tokens
	return r
}

// at sets the transition time to t0 + ms.
func (h *harness) at(ms int) { h.s.setNow(h.now.Add(time.Duration(ms) * time.Millisecond)) }

func (h *harness) wantYields(n uint64) {
	h.t.Helper()
	for _, g := range h.s.routing() {
		if g.Model == "tiny" && g.Yield != n {
			h.t.Fatalf("tiny yields = %d, want %d (decisions %+v)", g.Yield, n, g)
		}
	}
}

// homes serves the first turn of conversations 1..n one at a time
// (nothing queued anywhere) and returns them by the provider they landed on.
func (h *harness) homes(n int) map[Key][]uint64 {
	h.t.Helper()
	out := map[Key][]uint64{}
	for conv := uint64(1); conv <= uint64(n); conv++ {
		name := "first" + string(rune('a'+conv))
		h.acq(name, sized(conv, 1, 1000))
		l := h.leases[name]
		out[l.Key] = append(out[l.Key], conv)
		h.release(name, true)
	}
	return out
}

// TestTurnCostInPool: Q3 — the pool weighs a turn's cost with each
// provider's prefill queue: a holder with nothing queued keeps its turns,
// a busy holder yields when its queue outweighs the prefill it saves
// (counted as yield, never pinned), a cheap turn stays on a busy holder,
// the queue drains with time and empties when the provider is idle, and
// timed answers calibrate the speed.
func TestTurnCostInPool(t *testing.T) {
	h := newHarness(t, costConfig())
	h.ready("gpu-1", 1, true)
	h.ready("gpu-2", 1, true)
	h.at(0)
	homes := h.homes(24)
	var home Key
	for k, convs := range homes {
		if len(convs) >= 4 {
			home = k
		}
	}
	if home == (Key{}) {
		t.Fatalf("no provider is home of 4 of 24 conversations: %v", homes)
	}
	a, b, c, d := homes[home][0], homes[home][1], homes[home][2], homes[home][3]
	h.wantYields(0)
	// Until answers show that queued prompts delay a provider, nothing
	// yields; these show a CPU's turn-taking on both (each token queued
	// ahead costs a token's time).
	teachTurnTaking(h.s.groups["tiny"].fit)

	// holder idle keeps its turn: nothing queued (every lease returned).
	h.at(10000)
	h.acq("a2", sized(a, 3, 1200))
	h.wantLease("a2", home)
	h.release("a2", true)

	// holder busy with an idle peer: the first long turn (3,000 uncached
	// tokens, 1.5 s at the default speed) stays, the second would wait
	// 1.5 s there against 2 s of prefill on the idle peer: it yields.
	h.at(20000)
	h.acq("b2", sized(b, 3, 4000))
	h.wantLease("b2", home)
	h.acq("c2", sized(c, 3, 4000))
	h.wantLease("c2", other(home))
	h.wantYields(1)
	// a cheap turn (100 uncached tokens) stays on the busy holder: 1.5 +
	// 0.05 s there, 2 + 0.55 s on the peer.
	h.acq("d2", sized(d, 3, 1100))
	h.wantLease("d2", home)
	h.wantYields(1)

	// the queue drains with time: 2 s later the holder takes a long turn again.
	h.at(22000)
	h.acq("a3", sized(a, 5, 4000))
	h.wantLease("a3", home)
	h.wantYields(1)

	// a provider that holds no lease has nothing queued.
	for _, n := range []string{"b2", "c2", "d2", "a3"} {
		h.release(n, true)
	}
	r, f := h.s.resources[home], h.s.groups["tiny"].fit
	if got := r.bl.Ahead(h.s.now, f.TokenTime()); got != 0 {
		t.Fatalf("idle holder's queue = %g tokens, want 0", got)
	}

	// timed answers calibrate the group's fit: a3's own 2,800 tokens took
	// 6 s (its pair is the last released lease on the holder).
	before := f.TokenTime()
	for range 4 {
		r.bl.Observe(h.s.now, 6*time.Second, true)
	}
	if after := f.TokenTime(); !(after > before) || math.IsNaN(after) {
		t.Fatalf("token time %g after slow answers, want above %g", after, before)
	}
	h.wantDecisions(4, 24, 0)
}

// TestTurnCostUntaught: Q3 — low load or no evidence: a provider whose
// answers never showed queued prompts delaying it keeps every turn of the
// conversations it holds, however many prompts are queued on it.
func TestTurnCostUntaught(t *testing.T) {
	h := newHarness(t, costConfig())
	h.ready("gpu-1", 1, true)
	h.ready("gpu-2", 1, true)
	h.at(0)
	homes := h.homes(24)
	for k, convs := range homes {
		h.at(10000)
		for i, conv := range convs[:min(len(convs), 8)] {
			name := k.String() + string(rune('a'+i))
			h.acq(name, sized(conv, 3, 4000))
			h.wantLease(name, k)
		}
		break
	}
	h.wantYields(0)
}

// teachTurnTaking feeds f sixteen answers whose time to first token is the
// default time per token over their own tokens and those queued ahead
// (busy slots cost nothing).
func teachTurnTaking(f *routing.Fit) {
	for i := range 16 {
		sm := routing.Sample{Own: float64(300 + 50*(i%4)), Ahead: float64(1000 * (i % 3)), Busy: i % 5}
		f.Observe(sm, time.Duration(routing.DefaultTokenTime*(sm.Own+sm.Ahead)*float64(time.Second)))
	}
}

// TestCostOnlyForAffinity: Q3 — a pool without prefix_affinity groups keeps
// no prefill queue and reads no clock; a reconfigure that adds one starts
// the group's fit at the configured speed and keeps the queues across
// reloads.
func TestCostOnlyForAffinity(t *testing.T) {
	clk := newFakeClock()
	cfg := baseConfig()
	p := New(cfg, countingClock{clk, new(int)})
	cc := p.clk.(countingClock)
	p.NodeReady("gpu-1", 1)
	*cc.n = 0
	for range 3 {
		l, err := p.Acquire(t.Context(), chat("tiny", 10))
		if err != nil {
			t.Fatal(err)
		}
		p.Release(l)
	}
	if *cc.n != 0 {
		t.Fatalf("least_loaded pool read the clock %d times", *cc.n)
	}
	if len(p.PrefillEstimates()) != 0 {
		t.Fatal("least_loaded pool keeps prefill estimates")
	}
	aff := costConfig()
	aff.Resources[0].PrefillTokensPerSecond = 20000
	p.Reconfigure(aff)
	est := p.PrefillEstimates()
	if len(est) != 2 {
		t.Fatalf("estimates for %d providers, want 2", len(est))
	}
	for _, e := range est { // the group's first candidate's speed seeds its fit
		if math.Abs(e.TokensPerSecond-20000) > 1e-6 {
			t.Errorf("%v: %g tokens/s, want 20000", e.Key, e.TokensPerSecond)
		}
	}
	l, err := p.Acquire(t.Context(), sized(1, 1, 4000))
	if err != nil {
		t.Fatal(err)
	}
	p.Reconfigure(aff) // a reload keeps the queue
	var queued float64
	for _, e := range p.PrefillEstimates() {
		queued += e.Queued
	}
	if queued <= 0 {
		t.Fatal("a reload dropped the queued prefill")
	}
	p.Release(l)
}

// countingClock counts Now calls.
type countingClock struct {
	*fakeClock
	n *int
}

func (c countingClock) Now() time.Time {
	*c.n++
	return c.fakeClock.Now()
}
