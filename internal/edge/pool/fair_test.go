package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"iop/internal/protocol"
)

var kOne = Key{"gpu-1", "one"}

// oneSlot: model "m" (and "n", sharing the provider) on one provider of
// capacity slots; 64 waiters.
func oneSlot(slots int) Config {
	return Config{
		Nodes:     []string{"gpu-1"},
		Resources: []Resource{{Key: kOne, Type: "ollama", Capacity: slots, LongCapacity: slots, Operations: []string{protocol.OpChatCompletions}}},
		Groups: []Group{
			{Name: "m", Candidates: []Candidate{{Key: kOne, Target: "t"}}},
			{Name: "n", Candidates: []Candidate{{Key: kOne, Target: "t"}}},
		},
		MaxWaiters:  64,
		WaitTimeout: time.Minute,
	}
}

// req is a chat request of key with weight, class and completion bound
// (the prompt is empty, so Cost is maxTokens).
func req(key string, weight int, prio Priority, maxTokens int) Request {
	r := chat("m", 0)
	r.Key, r.Weight, r.Priority, r.MaxTokens = key, weight, prio, maxTokens
	return r
}

// served releases the oldest held lease n times and returns the keys (the
// name's text before '#') granted, in order.
func (h *harness) serveN(n int) []string {
	h.t.Helper()
	var keys []string
	for range n {
		var oldest string
		for name, l := range h.leases {
			if l != nil && !l.returned && (oldest == "" || name < oldest) {
				oldest = name
			}
		}
		if oldest == "" {
			h.t.Fatalf("no lease held to release")
		}
		before := len(h.granted)
		h.release(oldest, true)
		h.leases[oldest] = nil
		for _, g := range h.granted[before:] {
			keys = append(keys, keyOf(g))
		}
	}
	return keys
}

func keyOf(name string) string {
	for i := range name {
		if name[i] == '#' {
			return name[:i]
		}
	}
	return name
}

func count(keys []string, k string) int {
	n := 0
	for _, v := range keys {
		if v == k {
			n++
		}
	}
	return n
}

// TestFairShare is the scheduler's rule table (SPEC G1–G3, G5): each row
// fills one slot with a held request ("0hold", released first), queues
// requests named key#i, then releases one lease at a time and checks who
// got the slot.
func TestFairShare(t *testing.T) {
	rows := []struct {
		name string
		cfg  func() Config
		run  func(h *harness)
	}{
		{name: "G1 a key alone takes everything", cfg: func() Config { return oneSlot(4) }, run: func(h *harness) {
			for i := range 6 {
				h.acq(fmt.Sprintf("a#%d", i), req("a", 1, 0, 10))
			}
			for i := range 4 { // work-conserving: every slot, no cap per key
				h.wantLease(fmt.Sprintf("a#%d", i), kOne)
			}
			h.wantQueued("a#4", "a#5")
			h.release("a#0", true)
			h.wantGranted("a#4")
		}},
		{name: "G1 two equal keys alternate", run: func(h *harness) {
			for i := range 4 {
				h.acq(fmt.Sprintf("a#%d", i), req("a", 1, 0, 10))
			}
			for i := range 4 {
				h.acq(fmt.Sprintf("b#%d", i), req("b", 1, 0, 10))
			}
			if got, want := h.serveN(8), []string{"a", "b", "a", "b", "a", "b", "a", "b"}; !slices.Equal(got, want) {
				h.t.Fatalf("grants %v, want %v", got, want)
			}
		}},
		{name: "G1 weights 3:1", run: func(h *harness) {
			for i := range 12 {
				h.acq(fmt.Sprintf("a#%02d", i), req("a", 3, 0, 10))
				h.acq(fmt.Sprintf("b#%02d", i), req("b", 1, 0, 10))
			}
			got := h.serveN(8)
			if count(got, "a") != 6 || count(got, "b") != 2 {
				h.t.Fatalf("8 grants %v: a %d, b %d; want 6 and 2", got, count(got, "a"), count(got, "b"))
			}
		}},
		{name: "G1 token cost: a long-request key against a short-request key", run: func(h *harness) {
			for i := range 10 {
				h.acq(fmt.Sprintf("long#%02d", i), req("long", 1, 0, 400))
				h.acq(fmt.Sprintf("short#%02d", i), req("short", 1, 0, 100))
			}
			got := h.serveN(10)
			if count(got, "long") != 2 || count(got, "short") != 8 {
				h.t.Fatalf("10 grants %v: long %d, short %d; want 2 and 8 (equal tokens)", got, count(got, "long"), count(got, "short"))
			}
		}},
		{name: "G1 a key that stops waiting banks nothing", run: func(h *harness) {
			// b waits alone for a while; a arrives later and is not owed
			// the time it was away: the two alternate from then on.
			for i := range 6 {
				h.acq(fmt.Sprintf("b#%d", i), req("b", 1, 0, 10))
			}
			if got := h.serveN(3); !slices.Equal(got, []string{"b", "b", "b"}) {
				h.t.Fatalf("b alone: grants %v", got)
			}
			for i := range 3 {
				h.acq(fmt.Sprintf("a#%d", i), req("a", 1, 0, 10))
			}
			got := h.serveN(4)
			if count(got, "a") != 2 || count(got, "b") != 2 {
				h.t.Fatalf("after a arrives: grants %v, want 2 each", got)
			}
		}},
		{name: "G2 class order: critical, then interactive, then batch", run: func(h *harness) {
			h.acq("batch#0", req("x", 1, PriorityBatch, 10))
			h.acq("inter#0", req("x", 1, PriorityInteractive, 10))
			h.acq("crit#0", req("y", 1, PriorityCritical, 10))
			h.acq("inter#1", req("y", 1, PriorityInteractive, 10))
			if got, want := h.serveN(4), []string{"crit", "inter", "inter", "batch"}; !slices.Equal(got, want) {
				h.t.Fatalf("grants %v, want %v", got, want)
			}
		}},
		{name: "G2 starvation bound: batch gets a slot after starvation_grants interactive grants", cfg: func() Config {
			c := oneSlot(1)
			c.StarvationGrants = 3
			return c
		}, run: func(h *harness) {
			h.acq("batch#0", req("b", 1, PriorityBatch, 10))
			h.acq("batch#1", req("b", 1, PriorityBatch, 10))
			for i := range 12 {
				h.acq(fmt.Sprintf("inter#%02d", i), req("i", 1, PriorityInteractive, 10))
			}
			want := []string{"inter", "inter", "inter", "batch", "inter", "inter", "inter", "batch", "inter", "inter"}
			if got := h.serveN(10); !slices.Equal(got, want) {
				h.t.Fatalf("grants %v, want %v", got, want)
			}
		}},
		{name: "G2 starvation bound holds for batch under critical and interactive", cfg: func() Config {
			c := oneSlot(1)
			c.StarvationGrants = 2
			return c
		}, run: func(h *harness) {
			h.acq("batch#0", req("b", 1, PriorityBatch, 10))
			for i := range 8 {
				h.acq(fmt.Sprintf("inter#%02d", i), req("i", 1, PriorityInteractive, 10))
				h.acq(fmt.Sprintf("crit#%02d", i), req("c", 1, PriorityCritical, 10))
			}
			got := h.serveN(4)
			// c c: inter and batch both passed over twice → batch (the
			// lower on a tie), then inter (still at its bound).
			if want := []string{"crit", "crit", "batch", "inter"}; !slices.Equal(got, want) {
				h.t.Fatalf("grants %v, want %v", got, want)
			}
		}},
		{name: "G3 a key at its queue share gets 429 while the others keep queueing", cfg: func() Config {
			c := oneSlot(1)
			c.MaxWaiters = 4
			return c
		}, run: func(h *harness) {
			h.acq("a#0", req("a", 1, 0, 10))
			h.acq("a#1", req("a", 1, 0, 10))
			h.acq("b#0", req("b", 1, 0, 10))
			h.acq("a#2", req("a", 1, 0, 10)) // a holds 2 = 4 × 1/2
			var ks *KeyShareError
			if err := h.errs["a#2"]; !errors.As(err, &ks) || !errors.Is(err, ErrQueueFull) || ks.Key != "a" || ks.Share != 2 {
				h.t.Fatalf("a#2: err %v, want a KeyShareError of key a, share 2", err)
			}
			h.acq("b#1", req("b", 1, 0, 10))
			h.wantQueued("a#1", "b#0", "b#1")
		}},
		{name: "G3 a full queue makes room for a key under its share", cfg: func() Config {
			c := oneSlot(1)
			c.MaxWaiters = 4
			return c
		}, run: func(h *harness) {
			for i := range 4 { // a alone may fill the queue
				h.acq(fmt.Sprintf("a#%d", i), req("a", 1, 0, 10))
			}
			h.wantQueued("a#0", "a#1", "a#2", "a#3")
			h.acq("b#0", req("b", 1, 0, 10))
			h.wantQueued("b#0")
			var ks *KeyShareError
			if err := h.errs["a#3"]; !errors.As(err, &ks) || ks.Key != "a" {
				h.t.Fatalf("a#3 (a's newest): err %v, want a KeyShareError of key a", err)
			}
			h.acq("a#5", req("a", 1, 0, 10)) // over its share (2) while b waits
			if !errors.As(h.errs["a#5"], &ks) {
				h.t.Fatalf("a#5: err %v, want a KeyShareError", h.errs["a#5"])
			}
			if h.s.waiters != 4 {
				h.t.Fatalf("waiters %d, want 4", h.s.waiters)
			}
		}},
		{name: "G3 one key alone may fill the queue", cfg: func() Config {
			c := oneSlot(1)
			c.MaxWaiters = 3
			return c
		}, run: func(h *harness) {
			for i := range 4 {
				h.acq(fmt.Sprintf("a#%d", i), req("a", 1, 0, 10))
			}
			h.wantQueued("a#0", "a#1", "a#2")
			h.wantErr("a#3", ErrQueueFull, "queue full")
		}},
		{name: "G5 a request asking again keeps its place in its key's FIFO", run: func(h *harness) {
			first := h.leases["0hold"]
			h.acq("a#1", req("a", 1, 0, 10))
			h.acq("a#2", req("a", 1, 0, 10))
			again := req("a", 1, 0, 10)
			again.Arrival = first.Arrival // the held request, re-dispatched
			h.acq("a#0", again)
			h.release("0hold", true)
			h.wantGranted("a#0")
		}},
		{name: "G2 groups sharing a provider: the higher class first, then arrival", run: func(h *harness) {
			r := req("a", 1, PriorityBatch, 10)
			h.acq("batch#0", r)
			r = req("b", 1, PriorityInteractive, 10)
			r.Model = "n"
			h.acq("inter#0", r)
			if got, want := h.serveN(2), []string{"inter", "batch"}; !slices.Equal(got, want) {
				h.t.Fatalf("grants %v, want %v", got, want)
			}
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			cfg := oneSlot(1)
			if row.cfg != nil {
				cfg = row.cfg()
			}
			h := newHarness(t, cfg)
			h.ready("gpu-1", 1, true)
			if cfg.Resources[0].Capacity == 1 {
				h.acq("0hold", req("hold", 1, 0, 1))
				h.wantLease("0hold", kOne)
			}
			row.run(h)
		})
	}
}

// TestSchedulerProperties drives the scheduler with random arrivals,
// releases, cancels and node changes on two providers shared by two
// groups (SPEC G1, G2): the harness checks after every step that no
// waiter is servable while a slot is free (work-conserving), that no
// class is passed over past its starvation bound, each key's FIFO is in
// arrival order, and the counts agree. And while two keys of equal
// weight stay backlogged in one class, their tokens differ by at most
// two requests' cost (SFQ's bound).
func TestSchedulerProperties(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { schedulerRun(t, rand.New(rand.NewPCG(seed, 7)), 600) })
	}
}

// FuzzScheduler is TestSchedulerProperties with the fuzzer's seeds.
func FuzzScheduler(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(99), uint64(3))
	f.Fuzz(func(t *testing.T, a, b uint64) { schedulerRun(t, rand.New(rand.NewPCG(a, b)), 300) })
}

func schedulerRun(t *testing.T, rng *rand.Rand, steps int) {
	kTwo := Key{"gpu-2", "two"}
	cfg := oneSlot(2)
	cfg.Nodes = append(cfg.Nodes, "gpu-2")
	cfg.Resources = append(cfg.Resources, Resource{Key: kTwo, Type: "ollama", Capacity: 1, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}})
	cfg.Groups[0].Candidates = append(cfg.Groups[0].Candidates, Candidate{Key: kTwo, Target: "t"})
	cfg.MaxWaiters = 24
	cfg.StarvationGrants = 1 + rng.IntN(5)
	h := newHarness(t, cfg)
	h.ready("gpu-1", 1, true)
	h.ready("gpu-2", 1, true)
	keys := []struct {
		name   string
		weight int
	}{{"a", 1}, {"b", 1}, {"c", 2}, {"d", 5}}
	gen := map[string]uint64{"gpu-1": 1, "gpu-2": 1}
	n := 0
	for range steps {
		switch op := rng.IntN(10); {
		case op < 5:
			k := keys[rng.IntN(len(keys))]
			r := req(k.name, k.weight, Priorities[rng.IntN(NumPriorities)], 1+rng.IntN(500))
			if rng.IntN(4) == 0 {
				r.Model = "n"
			}
			n++
			h.acq(fmt.Sprintf("%s#%04d", k.name, n), r)
		case op < 8:
			var held []string
			for name, l := range h.leases {
				if l != nil && !l.returned {
					held = append(held, name)
				}
			}
			if len(held) > 0 {
				slices.Sort(held)
				name := held[rng.IntN(len(held))]
				h.release(name, true)
				h.leases[name] = nil
			}
		case op < 9:
			var queued []string
			for name, w := range h.waiters {
				if w.queued {
					queued = append(queued, name)
				}
			}
			if len(queued) > 0 {
				slices.Sort(queued)
				h.cancel(queued[rng.IntN(len(queued))], true)
			}
		default:
			node := []string{"gpu-1", "gpu-2"}[rng.IntN(2)]
			if rng.IntN(2) == 0 {
				h.fence(node, gen[node], h.s.nodes[node].leasesHeld())
			} else {
				gen[node]++
				h.ready(node, gen[node], true)
			}
		}
	}
}

// leasesHeld counts the leases n's resources hold (a fence returns them).
func (n *nodeState) leasesHeld() int {
	c := 0
	for _, r := range n.all {
		c += r.inFlight
	}
	return c
}

// TestSFQShareBound: two keys of equal weight kept backlogged in one class
// receive tokens within one largest request of each other at every grant
// (SPEC G1, SFQ's fairness bound), whatever their request sizes.
func TestSFQShareBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	h := newHarness(t, oneSlot(1))
	h.ready("gpu-1", 1, true)
	h.acq("0hold", req("hold", 1, 0, 1))
	const maxCost = 300
	tokens := map[string]int{}
	n := 0
	queue := func(k string) {
		n++
		h.acq(fmt.Sprintf("%s#%05d", k, n), req(k, 1, 0, 1+rng.IntN(maxCost)))
	}
	for range 4 {
		queue("a")
		queue("b")
	}
	for range 400 {
		before := len(h.granted)
		h.serveN(1)
		for _, g := range h.granted[before:] {
			k := keyOf(g)
			tokens[k] += h.waiters[g].cost
			queue(k) // stays backlogged
		}
		if d := tokens["a"] - tokens["b"]; d > 2*maxCost || d < -2*maxCost {
			t.Fatalf("G1 tokens a %d, b %d: differ by more than two requests", tokens["a"], tokens["b"])
		}
	}
}

// BenchmarkFairShare is the scheduler's cost per grant (SPEC G1): keys
// (equal weights, all in one class) each keep 4 requests queued for one
// provider of capacity 8; each op releases a lease, which the pump grants
// to the next waiter by fair share, and queues a new request of the
// granted key (admit and enqueue). Allocations: the waiter and the lease.
func BenchmarkFairShare(b *testing.B) {
	for _, keys := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			cfg := oneSlot(8)
			cfg.MaxWaiters = 4*keys + 8
			s := newState(cfg)
			s.ready("gpu-1", 1, time.Unix(0, 0), 0)
			names := make([]string, keys)
			queue := func(k string) {
				r := req(k, 1, 0, 50)
				if l, c, err := s.admit(r); l != nil || err != nil {
					b.Fatalf("admit: lease %v err %v, want a wait", l, err)
				} else {
					s.enqueue(c, newWaiter(r), 0)
				}
			}
			var held []*Lease
			for i := range 8 {
				l, _, _ := s.admit(req("fill", 1, 0, 50))
				held = append(held, l)
				_ = i
			}
			for i := range names {
				names[i] = fmt.Sprintf("key-%02d", i)
				for range 4 {
					queue(names[i])
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.release(held[i%8])
				g := s.fx.grants[0]
				held[i%8] = g.l
				s.fx.reset()
				queue(g.w.key)
				i++
			}
		})
	}
}

// TestWaiting: the pool's count of waiting requests per key and class,
// pinned or not (the /status view, SPEC G6).
func TestWaiting(t *testing.T) {
	p := New(oneSlot(1), SystemClock())
	p.NodeReady("gpu-1", 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := p.Acquire(ctx, req("a", 1, 0, 10))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 3)
	for _, r := range []Request{req("a", 1, PriorityBatch, 10), req("a", 1, 0, 10), req("", 1, 0, 10)} {
		go func() {
			defer func() { done <- struct{}{} }()
			if l, err := p.Acquire(ctx, r); err == nil {
				p.Release(l)
			}
		}()
	}
	for {
		if _, w := p.Stats(); w == 3 {
			break
		}
		runtime.Gosched()
	}
	byKey, byClass := p.Waiting()
	if byKey["a"] != 2 || byKey[""] != 1 || len(byKey) != 2 || byClass != [NumPriorities]int{0, 2, 1} {
		t.Fatalf("G6 waiting by key %v, by class %v", byKey, byClass)
	}
	p.Release(l)
	for range 3 {
		<-done
	}
}
