package pool

import (
	"testing"

	"iop/internal/edge/routing"
)

// affinityConfig: baseConfig with model "tiny" (gpu-1/ollama cap 2, then
// gpu-2/llama cap 2) in routing mode m.
func affinityConfig(m routing.Mode, wait bool) func() Config {
	return func() Config {
		c := baseConfig()
		c.Groups[0].Routing = m
		c.Groups[0].Epsilon = 1 // the bound never bites with two slots each
		if wait {
			c.Groups[0].AffinityWait = 50e6
		}
		return c
	}
}

// turn is a chat request of conversation conv carrying n boundaries.
func turn(conv uint64, n int) Request {
	r := chat("tiny", 0)
	for i := range n {
		r.Prefix = append(r.Prefix, conv<<8|uint64(i))
	}
	return r
}

func other(k Key) Key {
	if k == kOllama {
		return kLlama
	}
	return kOllama
}

// wantDecisions checks model tiny's prefix_affinity counters.
func (h *harness) wantDecisions(hit, hash, fallback uint64) {
	h.t.Helper()
	for _, g := range h.s.routing() {
		if g.Model != "tiny" {
			continue
		}
		if g.PrefixHit != hit || g.Hash != hash || g.Fallback != fallback {
			h.t.Fatalf("tiny decisions: prefix_hit %d hash %d fallback %d; want %d %d %d", g.PrefixHit, g.Hash, g.Fallback, hit, hash, fallback)
		}
		return
	}
	h.t.Fatal("model tiny missing from routing()")
}

// TestRouting is the routing-mode table of the pool (R1): each row a
// script of transitions; the harness checks the Q2/Q5 invariants (and
// that no pinned waiter is servable) after every step.
func TestRouting(t *testing.T) {
	rows := []struct {
		name string
		cfg  func() Config
		run  func(h *harness)
	}{
		{name: "issue16 Q3 ordered fills the first candidate in config order, then spills", cfg: affinityConfig(routing.Ordered, false), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			for i, want := range []Key{kOllama, kOllama, kLlama, kLlama} {
				name := string(rune('a' + i))
				h.acq(name, chat("tiny", 0))
				h.wantLease(name, want)
			}
			h.acq("e", chat("tiny", 0))
			h.wantQueued("e")
			h.release("c", true)
			h.wantLease("e", kLlama)
		}},
		{name: "issue16 prefix_affinity: later turns follow the first, counted as prefix hits", cfg: affinityConfig(routing.PrefixAffinity, false), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.release("t1", true)
			h.wantDecisions(0, 1, 0)
			for i, n := range []int{3, 5, 7} {
				name := string(rune('a' + i))
				h.acq(name, turn(7, n))
				h.wantLease(name, home)
				h.release(name, true)
			}
			h.wantDecisions(3, 1, 0)
		}},
		{name: "issue16 prefix_affinity: holder at capacity, the free candidate takes it at once (affinity_wait 0)", cfg: affinityConfig(routing.PrefixAffinity, false), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(7, 1)) // the same conversation again: the holder's second slot
			h.wantLease("x1", home)
			h.acq("t2", turn(7, 3))
			h.wantLease("t2", other(home))
			h.wantDecisions(1, 1, 1)
		}},
		{name: "issue16 prefix_affinity: affinity_wait pins the request to its busy holder until a slot frees", cfg: affinityConfig(routing.PrefixAffinity, true), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(7, 1))
			h.acq("t2", turn(7, 3))
			h.wantQueued("t2")
			h.acq("n1", turn(9, 1)) // another conversation is not blocked by the pinned one
			if h.leases["n1"] == nil {
				h.t.Fatal("n1 waits behind a pinned waiter")
			}
			h.release("x1", true)
			h.wantLease("t2", home)
			h.wantGranted("t2")
		}},
		{name: "issue16 prefix_affinity: affinity_wait expiry lets the pinned request take any candidate", cfg: affinityConfig(routing.PrefixAffinity, true), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(7, 1))
			h.acq("t2", turn(7, 3))
			h.wantQueued("t2")
			h.s.affinityExpired(h.waiters["t2"])
			h.settle()
			h.wantLease("t2", other(home))
			h.s.affinityExpired(h.waiters["t2"]) // late timer: nothing
			h.settle()
		}},
		{name: "issue16 H9 prefix_affinity: the holder overlaid while a request waits for it, the request moves at once", cfg: affinityConfig(routing.PrefixAffinity, true), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(7, 1))
			h.acq("t2", turn(7, 3))
			h.wantQueued("t2")
			h.overlay(true, home, 1, 1, true)
			h.wantLease("t2", other(home))
		}},
		{name: "issue16 L8 prefix_affinity: the holder's node fenced while a request waits for it, the request moves at once", cfg: affinityConfig(routing.PrefixAffinity, true), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(7, 1))
			h.acq("t2", turn(7, 3))
			h.fence(home.Node, 1, 2)
			h.wantLease("t2", other(home))
		}},
		{name: "issue16 L9 prefix_affinity: a new node generation forgets its prefixes (the backend may have restarted)", cfg: affinityConfig(routing.PrefixAffinity, false), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.release("t1", true)
			h.fence(home.Node, 1, 0)
			h.ready(home.Node, 2, true)
			h.acq("t2", turn(7, 3))
			h.wantDecisions(0, 2, 0) // a hash decision again, not a prefix hit
		}},
		{name: "issue16 prefix_affinity: a request without a conversation goes to the least loaded", cfg: affinityConfig(routing.PrefixAffinity, false), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("tiny", 0))
			h.wantLease("a", kOllama)
			h.acq("b", chat("tiny", 0))
			h.wantLease("b", kLlama)
			h.wantDecisions(0, 0, 2)
		}},
		{name: "issue16 Q4 prefix_affinity: a waiter queued with no free candidate goes to the holder first freed", cfg: affinityConfig(routing.PrefixAffinity, false), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(8, 1))
			h.acq("x2", turn(9, 1))
			h.acq("x3", turn(10, 1))
			h.acq("t2", turn(7, 3))
			h.wantQueued("t2")
			var freeOther string
			for _, n := range []string{"x1", "x2", "x3"} {
				if h.leases[n].Key == other(home) {
					freeOther = n
					break
				}
			}
			h.release(freeOther, true) // only the other provider frees: FIFO, no wait for the holder
			h.wantLease("t2", other(home))
		}},
		{name: "issue16 Q4 prefix_affinity: affinity_wait pins a queued waiter to its busy holder when another provider frees first", cfg: affinityConfig(routing.PrefixAffinity, true), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(8, 1))
			h.acq("x2", turn(9, 1))
			h.acq("x3", turn(10, 1))
			h.acq("t2", turn(7, 3)) // every slot taken: it queues in its class
			h.acq("n1", turn(11, 1))
			h.wantQueued("t2", "n1")
			var freeOther, freeHome string
			for _, n := range []string{"x1", "x2", "x3"} {
				switch {
				case h.leases[n].Key == other(home) && freeOther == "":
					freeOther = n
				case h.leases[n].Key == home && freeHome == "":
					freeHome = n
				}
			}
			if freeHome == "" {
				freeHome = "t1"
			}
			h.release(freeOther, true) // t2's holder is still busy: t2 waits for it, n1 takes the slot
			h.wantQueued("t2")
			if w := h.waiters["t2"]; w.pin == nil || w.pin.cfg.Key != home {
				h.t.Fatalf("t2 is not pinned to its holder %v", home)
			}
			h.wantLease("n1", other(home))
			h.release(freeHome, true)
			h.wantLease("t2", home)
			h.wantGranted("n1", "t2")
		}},
		{name: "issue16 Q4 prefix_affinity: a queued waiter pinned by the pump takes any candidate after its affinity wait, and is pinned only once", cfg: affinityConfig(routing.PrefixAffinity, true), run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("t1", turn(7, 1))
			home := h.leases["t1"].Key
			h.acq("x1", turn(8, 1))
			h.acq("x2", turn(9, 1))
			h.acq("x3", turn(10, 1))
			h.acq("t2", turn(7, 3))
			var freeOther string
			for _, n := range []string{"x1", "x2", "x3"} {
				if h.leases[n].Key == other(home) {
					freeOther = n
					break
				}
			}
			h.release(freeOther, true)
			h.wantQueued("t2")
			h.s.affinityExpired(h.waiters["t2"])
			h.settle()
			h.wantLease("t2", other(home))
		}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			r.run(newHarness(t, r.cfg()))
		})
	}
}
