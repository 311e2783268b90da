package pool

import (
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/routing"
)

func (h *harness) eject(k Key, until time.Time, want bool) {
	h.t.Helper()
	if got := h.s.eject(k, until, "status"); got != want {
		h.t.Fatalf("eject(%v) = %v, want %v", k, got, want)
	}
	h.settle()
}

func (h *harness) readmit(k Key, want bool) {
	h.t.Helper()
	if got := h.s.readmit(k); got != want {
		h.t.Fatalf("readmit(%v) = %v, want %v", k, got, want)
	}
	h.settle()
}

func tried(r Request, ks ...Key) Request {
	r.Exclude = ks
	return r
}

// inSlot is r as a re-dispatch bound to credential slot slot (SPEC C6).
func inSlot(r Request, slot string) Request {
	r.SameSlot, r.Slot = true, slot
	return r
}

// slotConfig is baseConfig with tiny's routes on credential slots: ollama
// on a, llama on b (or on a too when shared).
func slotConfig(shared bool) Config {
	cfg := baseConfig()
	cfg.Groups[0].Candidates[0].Slot = "slot-a"
	cfg.Groups[0].Candidates[1].Slot = "slot-b"
	if shared {
		cfg.Groups[0].Candidates[1].Slot = "slot-a"
	}
	return cfg
}

// Passive-health ejection and re-dispatch exclusion as pool
// transitions. The harness checks after every step that no queued waiter
// is servable (Q5) — narrowed classes included.
func TestCoolingAndExclusion(t *testing.T) {
	until := time.Unix(2000, 0)
	rows := []struct {
		name string
		run  func(h *harness)
	}{
		{"Q3 an ejected provider is skipped while another live candidate takes the request", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.eject(kOllama, until, true)
			h.acq("a", chat("tiny", 0))
			h.wantLease("a", kLlama)
			h.acq("b", chat("tiny", 0))
			h.wantLease("b", kLlama)
			h.acq("c", chat("tiny", 0)) // llama full, ollama cooling: wait, never the cooling one
			h.wantQueued("c")
		}},
		{"Q4 Q5 every candidate cooling: the request waits as usual and re-admission pumps it", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.eject(kOllama, until, true)
			h.acq("a", chat("tiny", 0))
			h.wantQueued("a")
			h.readmit(kOllama, true)
			h.wantLease("a", kOllama)
			h.readmit(kOllama, false)
			h.eject(Key{"gpu-9", "x"}, until, false)
		}},
		{"Q4 wait timeout names the cooling provider", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.eject(kLlama, until, true)
			h.acq("a", chat("big", 0))
			h.timeout("a")
			h.wantErr("a", ErrWaitTimeout, "provider gpu-2/llama cooling down after status failures until 1970-01-01T00:33:20Z")
		}},
		{"Q8 snapshot: cooling provider unavailable/cooling with its window; counters kept", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("tiny", 0))
			h.wantLease("a", kOllama)
			h.eject(kOllama, until.Add(1500*time.Millisecond), true)
			h.wantSnapshot(map[string]bool{"gpu-1": true, "gpu-2": true}, map[Key]snap{
				kOllama: {status: StatusUnavailable, health: HealthCooling, capacity: 2, long: 1, inFlight: 1, provider: "ollama", category: "local_inference"},
			})
			for _, ns := range h.s.snapshot() {
				for _, p := range ns.Providers {
					want := ""
					if p.ProviderId == "ollama" {
						want = "1970-01-01T00:33:21.500Z"
					}
					if p.CoolingUntil != want || (want != "") != (p.CoolingReason == "status") {
						h.t.Fatalf("%s: cooling_until %q reason %q, want %q", p.ProviderId, p.CoolingUntil, p.CoolingReason, want)
					}
				}
			}
		}},
		{"Q3 an ejection is about the backend: it survives a node reconnect and a reload", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.eject(kOllama, until, true)
			h.fence("gpu-1", 1, 0)
			h.ready("gpu-1", 2, true)
			h.reconfigure(baseConfig())
			h.acq("a", chat("tiny", 0))
			h.wantQueued("a")
			h.readmit(kOllama, true)
			h.wantLease("a", kOllama)
		}},
		{"H11 a tried provider is never granted again; the request takes another", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", tried(chat("tiny", 0), kOllama))
			h.wantLease("a", kLlama)
		}},
		{"H11 only tried providers free: the re-dispatch waits in a narrowed class, served by arrival", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("l1", chat("big", 0))
			h.acq("l2", chat("big", 0))
			h.wantLease("l2", kLlama)
			h.acq("r", tried(chat("tiny", 0), kOllama)) // llama full; ollama free but tried
			h.wantQueued("r")
			h.acq("n", chat("tiny", 0)) // a fresh request may take ollama at once
			h.wantLease("n", kOllama)
			h.acq("w", chat("tiny", 0))
			h.wantLease("w", kOllama) // ollama's second slot
			h.acq("w3", chat("tiny", 0))
			h.wantQueued("w3")
			h.release("l1", true) // llama frees: r arrived first
			h.wantLease("r", kLlama)
			h.release("n", true) // ollama frees: w3 (r is gone)
			h.wantLease("w3", kOllama)
			h.wantGranted("r", "w3")
			for _, c := range h.s.groups["tiny"].classes {
				if c.narrowed {
					h.t.Fatalf("narrowed class still registered with %d waiters", c.n)
				}
			}
		}},
		{"H11 every candidate tried: ErrAllTried at once, nothing queued", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.acq("a", tried(chat("tiny", 0), kOllama, kLlama))
			h.wantErr("a", ErrAllTried, `"tiny"`)
			h.wantStats(0, 0)
		}},
		{"H11 same exclusions share one narrowed class; cancel and timeout unregister it", func(h *harness) {
			h.ready("gpu-1", 1, true)
			own := len(h.s.groups["tiny"].classes)
			h.acq("r1", tried(chat("tiny", 0), kOllama))
			h.acq("r2", tried(chat("tiny", 0), kOllama))
			h.wantQueued("r1", "r2")
			if h.waiters["r1"].cls != h.waiters["r2"].cls {
				h.t.Fatal("two requests excluding the same provider wait in different classes")
			}
			h.cancel("r1", true)
			h.timeout("r2")
			h.wantErr("r2", ErrWaitTimeout, "gpu-2 not ready")
			if n := len(h.s.groups["tiny"].classes); n != own {
				h.t.Fatalf("tiny has %d classes after its narrowed waiters left, want its %d own", n, own)
			}
		}},
		{"C2 a lease carries its route's credential slot", func(h *harness) {
			h.reconfigure(slotConfig(false))
			h.ready("gpu-1", 1, true)
			h.acq("a", chat("tiny", 0))
			if l := h.wantLease("a", kOllama); l.Slot != "slot-a" {
				h.t.Fatalf("lease slot %q, want slot-a", l.Slot)
			}
		}},
		{"C6 a re-dispatch never falls back to another credential slot: ErrAllTried naming the slot", func(h *harness) {
			h.reconfigure(slotConfig(false))
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", inSlot(tried(chat("tiny", 0), kOllama), "slot-a")) // llama is free, but on slot-b
			h.wantErr("a", ErrAllTried, `within credential slot "slot-a"`)
			h.wantStats(0, 0)
		}},
		{"C6 a re-dispatch takes an untried route of its own slot", func(h *harness) {
			h.reconfigure(slotConfig(true))
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", inSlot(tried(chat("tiny", 0), kOllama), "slot-a"))
			if l := h.wantLease("a", kLlama); l.Slot != "slot-a" {
				h.t.Fatalf("lease slot %q, want slot-a", l.Slot)
			}
		}},
		{"C6 Q5 a queued re-dispatch whose slot's last route a reload moves to another slot fails with ErrAllTried", func(h *harness) {
			h.reconfigure(slotConfig(true))
			h.acq("r", inSlot(tried(chat("tiny", 0), kOllama), "slot-a"))
			h.wantQueued("r")
			h.reconfigure(slotConfig(false))
			h.wantErr("r", ErrAllTried, `"slot-a"`)
			h.wantStats(0, 0)
		}},
		{"H11 Q5 reconfigure moves a narrowed waiter; a removed last candidate fails it with ErrAllTried", func(h *harness) {
			h.acq("r", tried(chat("tiny", 0), kOllama))
			h.wantQueued("r")
			h.reconfigure(baseConfig())
			h.wantQueued("r")
			cfg := baseConfig()
			cfg.Groups[0].Candidates = cfg.Groups[0].Candidates[:1] // tiny: ollama only
			h.reconfigure(cfg)
			h.wantErr("r", ErrAllTried, "tiny")
			h.wantStats(0, 0)
		}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			r.run(newHarness(t, baseConfig()))
		})
	}
}

// Q5: Pool.Eject/Readmit through the wrapper; Readmit pumps a
// blocked Acquire at once.
func TestPoolReadmitPumps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(baseConfig(), nil)
		p.NodeReady("gpu-2", 1)
		if !p.Eject(kLlama, time.Now().Add(time.Hour), "reset") {
			t.Fatal("Eject of a configured provider = false")
		}
		out := make(chan outcome, 1)
		start(t.Context(), p, "a", chat("big", 0), out)
		wantStats(t, p, 0, 1)
		if !p.Readmit(kLlama) {
			t.Fatal("Readmit = false")
		}
		synctest.Wait()
		select {
		case o := <-out:
			if o.err != nil || o.l.Key != kLlama {
				t.Fatalf("got %+v, want a lease on llama", o)
			}
			p.Release(o.l)
		default:
			t.Fatal("Readmit did not pump the waiter")
		}
		if s := p.Snapshot()[1].Providers[0]; s.Health != HealthHealthy || s.CoolingUntil != "" {
			t.Fatalf("after Readmit: %v", s)
		}
	})
}

// H11 with R1's affinity wait: a re-dispatched request (Exclude) of
// a prefix_affinity group, pinned to the busy provider holding its
// conversation, moves to its narrowed class when the wait expires and is
// served there by the untried free provider — never by the one it tried.
func TestExclusionWithAffinityPin(t *testing.T) {
	cfg := baseConfig()
	cfg.Resources = append(cfg.Resources, Resource{Key: kVLLM, Type: "openai_compat", Category: "local_inference",
		Capacity: 2, LongCapacity: 1, Operations: allOps})
	cfg.Groups[0].Candidates = append(cfg.Groups[0].Candidates, Candidate{Key: kVLLM, Target: "tiny-v"})
	cfg.Groups[0].Routing = routing.PrefixAffinity
	cfg.Groups[0].Epsilon = 1
	cfg.Groups[0].AffinityWait = 50e6
	cfg.Nodes = append(cfg.Nodes, "gpu-3")
	h := newHarness(t, cfg)
	h.ready("gpu-1", 1, true)
	h.ready("gpu-2", 1, true)
	h.ready("gpu-3", 1, true)
	h.acq("a", turn(1, 1))
	holder := h.leases["a"].Key
	h.acq("b", turn(1, 1))
	h.wantLease("b", holder) // the conversation's provider, now full
	var used, free Key
	for _, k := range []Key{kOllama, kLlama, kVLLM} {
		switch {
		case k == holder:
		case used == Key{}:
			used = k
		default:
			free = k
		}
	}
	h.acq("p", tried(turn(1, 2), used))
	h.wantQueued("p")
	if h.waiters["p"].pin == nil {
		t.Fatalf("p not pinned to the holder %v", holder)
	}
	h.s.affinityExpired(h.waiters["p"])
	h.settle()
	h.wantLease("p", free)
}
