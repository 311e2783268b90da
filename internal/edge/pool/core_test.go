package pool

import (
	"errors"
	"iop/internal/protocol"
	"testing"
	"time"
)

// TestStateMachine is the pool's transition table: each row is a script
// of transitions on a bare state, named after the SPEC IDs it proves. The
// harness checks after every step that capacity is never exceeded (Q2),
// counters match held leases, and no queued waiter is left servable (Q5).
func TestStateMachine(t *testing.T) {
	rows := []struct {
		name string
		cfg  func() Config // nil: baseConfig
		run  func(h *harness)
	}{
		{name: "Q1 Q6 lease carries the winning candidate's target, type and stall timeout", run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("tiny", 0))
			a := h.wantLease("a", kOllama)
			if a.Target != "tiny-o" || a.Type != "ollama" || a.StallTimeoutMs != 60000 || a.Generation != 1 || a.Model != "tiny" || a.Long {
				h.t.Fatalf("lease a = %+v, want target tiny-o, ollama, stall 60000, gen 1, model tiny, short", *a)
			}
			h.acq("b", chat("tiny", 0))
			b := h.wantLease("b", kLlama)
			if b.Target != "tiny-l" || b.Type != "openai_compat" || b.StallTimeoutMs != 0 {
				h.t.Fatalf("lease b = %+v, want target tiny-l, openai_compat, stall 0", *b)
			}
		}},
		{name: "Q3 least loaded by in_flight/capacity, then config order", cfg: func() Config {
			c := baseConfig()
			c.Resources[0].Capacity = 4
			return c
		}, run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			// ollama cap 4, llama cap 2; loads (ollama vs llama) before each
			// pick: 0/4=0/2 → ollama (config order), 1/4>0/2 → llama,
			// 1/4<1/2 → ollama, 2/4=1/2 → ollama, 3/4>1/2 → llama,
			// llama full → ollama.
			for i, want := range []Key{kOllama, kLlama, kOllama, kOllama, kLlama, kOllama} {
				name := string(rune('a' + i))
				h.acq(name, chat("tiny", 0))
				h.wantLease(name, want)
			}
			h.acq("g", chat("tiny", 0))
			h.wantQueued("g")
		}},
		{name: "Q3 provider type never excludes, the operation does", run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			msg := Request{Model: "tiny", Operation: protocol.OpMessages}
			h.acq("m1", msg)
			h.wantLease("m1", kLlama)
			h.acq("m2", msg)
			h.wantLease("m2", kLlama)
			h.acq("m3", msg) // ollama is free but has no messages operation
			h.wantQueued("m3")
			h.acq("c1", chat("tiny", 0))
			h.wantLease("c1", kOllama)
		}},
		{name: "Q3 unknown model and unsupported operation fail at once", run: func(h *harness) {
			h.acq("u", chat("nope", 0))
			h.wantErr("u", ErrUnknownModel, `"nope"`)
			h.reconfigure(Config{Resources: baseConfig().Resources, MaxWaiters: 8, Groups: []Group{
				{Name: "local", Candidates: []Candidate{{Key: kOllama, Target: "x"}}},
			}})
			h.acq("r", Request{Model: "local", Operation: protocol.OpResponses})
			h.wantErr("r", ErrNoCandidate, `"responses"`)
			var nc *NoCandidateError
			if !errors.As(h.errs["r"], &nc) || nc.Model != "local" || nc.Operation != protocol.OpResponses {
				h.t.Fatalf("err = %#v, want *NoCandidateError{local, responses}", h.errs["r"])
			}
			h.wantStats(0, 0)
		}},
		{name: "P3 L5 accepted-but-not-ready node is never a candidate; ready pumps", run: func(h *harness) {
			h.acq("a", chat("tiny", 0))
			h.wantQueued("a")
			h.ready("gpu-2", 1, true)
			h.wantLease("a", kLlama)
			h.wantGranted("a")
		}},
		{name: "Q2 capacity never exceeded; lease returned exactly once", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("c", chat("big", 0))
			h.wantLease("b", kLlama)
			h.wantQueued("c")
			h.release("a", true)
			h.wantLease("c", kLlama)
			h.release("a", false)
			h.wantStats(2, 0)
			h.release("b", true)
			h.release("c", true)
			h.release("c", false)
			h.wantStats(0, 0)
		}},
		{name: "Q2 Q7 long request holds a capacity slot and a long slot", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("L1", chat("big", 100))
			if l := h.wantLease("L1", kLlama); !l.Long {
				h.t.Fatalf("L1 at the 100-token threshold: Long = false, want true")
			}
			h.acq("L2", chat("big", 5000))
			h.wantQueued("L2") // long capacity 1 is held
			h.acq("S1", chat("big", 99))
			if l := h.wantLease("S1", kLlama); l.Long {
				h.t.Fatalf("S1 below the threshold: Long = true, want false")
			}
			h.acq("S2", chat("big", 0))
			h.wantQueued("S2") // capacity 2 is held (L1 + S1)
			h.release("S1", true)
			h.wantLease("S2", kLlama) // L2 (earlier) cannot use it: long full
			h.release("L1", true)
			h.wantLease("L2", kLlama)
			h.wantGranted("S2", "L2")
			if r := h.s.resources[kLlama]; r.inFlight != 2 || r.longInFlight != 1 {
				h.t.Fatalf("llama in_flight %d long %d, want 2 and 1", r.inFlight, r.longInFlight)
			}
		}},
		{name: "Q7 a group without long_context_tokens has no long requests", cfg: func() Config {
			c := baseConfig()
			c.Groups[1].LongContextTokens = 0
			return c
		}, run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 1_000_000))
			if l := h.wantLease("a", kLlama); l.Long {
				h.t.Fatalf("Long = true with long_context_tokens 0")
			}
		}},
		{name: "Q7 long request where no provider has long capacity fails at once", cfg: func() Config {
			c := baseConfig()
			c.Resources[1].LongCapacity = 0
			return c
		}, run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 100))
			h.wantErr("a", ErrNoCandidate, "long-context")
		}},
		{name: "Q4 FIFO within a group", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("w1", chat("big", 0))
			h.acq("w2", chat("big", 0))
			h.acq("w3", chat("big", 0))
			h.wantQueued("w1", "w2", "w3")
			h.release("a", true)
			h.release("b", true)
			h.release("w1", true)
			h.wantGranted("w1", "w2", "w3")
		}},
		{name: "Q4 Q5 a waiter that cannot be served does not block the one behind it", run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			msg := Request{Model: "tiny", Operation: protocol.OpMessages}
			h.acq("m1", msg)
			h.acq("m2", msg)
			h.acq("c1", chat("tiny", 0))
			h.acq("c2", chat("tiny", 0))
			h.acq("m3", msg)
			h.acq("c3", chat("tiny", 0))
			h.wantQueued("m3", "c3")
			h.release("c1", true) // an ollama slot: m3 cannot use it
			h.wantLease("c3", kOllama)
			h.release("m1", true)
			h.wantLease("m3", kLlama)
			h.wantGranted("c3", "m3")
		}},
		{name: "Q4 a shared provider goes to the earliest waiter of any group", run: func(h *harness) {
			h.ready("gpu-2", 1, true) // gpu-1 (tiny's other candidate) stays down
			h.acq("b1", chat("big", 0))
			h.acq("b2", chat("big", 0))
			h.acq("t1", chat("tiny", 0))
			h.acq("b3", chat("big", 0))
			h.release("b1", true)
			h.wantLease("t1", kLlama)
			h.release("b2", true)
			h.wantLease("b3", kLlama)
			h.wantGranted("t1", "b3")
		}},
		{name: "Q4 groups are independent", run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("b1", chat("big", 0))
			h.acq("b2", chat("big", 0))
			h.acq("bw", chat("big", 0))
			h.wantQueued("bw")
			h.acq("t1", chat("tiny", 0)) // later than bw, but bw cannot use ollama
			h.wantLease("t1", kOllama)
			h.acq("t2", chat("tiny", 0))
			h.acq("t3", chat("tiny", 0))
			h.wantQueued("t3")
			h.release("t1", true)
			h.wantLease("t3", kOllama)
			h.release("b1", true)
			h.wantLease("bw", kLlama)
			h.wantGranted("t3", "bw")
		}},
		{name: "Q4 bounded waiters: beyond max_waiters is QueueFull with Retry-After", cfg: func() Config {
			c := baseConfig()
			c.MaxWaiters = 2
			return c
		}, run: func(h *harness) {
			for _, n := range []string{"a", "b", "w1", "w2", "w3"} {
				h.acq(n, chat("big", 0)) // no node is ready: everyone waits
			}
			h.wantQueued("a", "b")
			h.wantErr("w1", ErrQueueFull, "2 waiters")
			var qf *QueueFullError
			if !errors.As(h.errs["w1"], &qf) || qf.RetryAfter != time.Second || qf.Model != "big" {
				h.t.Fatalf("err = %#v, want *QueueFullError{big, RetryAfter 1s}", h.errs["w1"])
			}
			h.cancel("a", true)
			h.acq("w4", chat("tiny", 0)) // the bound is over all groups
			h.wantQueued("w4")
		}},
		{name: "Q4 max_waiters 0 means no request may wait", cfg: func() Config {
			c := baseConfig()
			c.MaxWaiters = 0
			return c
		}, run: func(h *harness) {
			h.acq("a", chat("big", 0))
			h.wantErr("a", ErrQueueFull, "queue full")
		}},
		{name: "Q4 cancel while queued removes the waiter", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("w1", chat("big", 0))
			h.acq("w2", chat("big", 0))
			h.cancel("w1", true)
			h.wantStats(2, 1)
			h.release("a", true)
			h.wantGranted("w2")
			h.cancel("w2", false) // already granted: the caller must release it
			h.cancel("w1", false)
			h.wantStats(2, 0)
		}},
		{name: "Q4 wait timeout names the model and the offline nodes", run: func(h *harness) {
			h.acq("a", chat("tiny", 0))
			h.timeout("a")
			h.wantErr("a", ErrWaitTimeout, `model "tiny": no provider within 30s: no live provider: node gpu-1 not ready; node gpu-2 not ready`)
			h.timeout("a") // a second expiry changes nothing
			h.ready("gpu-1", 1, true)
			h.wantGranted()
			h.wantStats(0, 0)
		}},
		{name: "Q4 wait timeout names capacity or overlay", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("w", chat("big", 0))
			h.acq("L", chat("big", 500))
			h.timeout("w")
			h.wantErr("w", ErrWaitTimeout, "all 1 live provider at capacity")
			h.timeout("L")
			h.wantErr("L", ErrWaitTimeout, "at capacity or long-context capacity")
			h.overlay(true, kLlama, 1, 1, true)
			h.acq("o", chat("big", 0))
			h.timeout("o")
			h.wantErr("o", ErrWaitTimeout, "no live provider: provider gpu-2/llama unavailable")
		}},
		{name: "Q5 H10 pump on overlay cleared", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.overlay(true, kLlama, 1, 1, true)
			h.acq("a", chat("big", 0))
			h.wantQueued("a")
			h.overlay(false, kLlama, 1, 2, true)
			h.wantLease("a", kLlama)
		}},
		{name: "Q5 pump on config change that raises capacity", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("c", chat("big", 0))
			h.wantQueued("c")
			cfg := baseConfig()
			cfg.Resources[1].Capacity = 3
			h.reconfigure(cfg)
			h.wantLease("c", kLlama)
			h.wantStats(3, 0)
		}},
		{name: "Q1 Q5 pump on config change that adds a candidate", run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("c", chat("big", 0))
			h.wantQueued("c") // ollama is free but not a big candidate
			cfg := baseConfig()
			cfg.Groups[1].Candidates = append(cfg.Groups[1].Candidates, Candidate{Key: kOllama, Target: "big-o", StallTimeoutMs: 7})
			h.reconfigure(cfg)
			if l := h.wantLease("c", kOllama); l.Target != "big-o" || l.StallTimeoutMs != 7 {
				h.t.Fatalf("lease c = %+v, want target big-o stall 7", *l)
			}
		}},
		{name: "Q5 config change drops a group or operation: its waiters fail, leases stay", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("w", chat("big", 0))
			h.acq("m", Request{Model: "tiny", Operation: protocol.OpMessages})
			h.acq("t", chat("tiny", 0))
			cfg := baseConfig()
			cfg.Groups = []Group{{Name: "tiny", Candidates: []Candidate{{Key: kOllama, Target: "x"}}}}
			cfg.Resources = cfg.Resources[:1] // llama leaves the config while leased
			h.reconfigure(cfg)
			h.wantErr("w", ErrUnknownModel, `"big" removed`)
			h.wantErr("m", ErrNoCandidate, `"messages"`)
			h.wantQueued("t") // gpu-1 is not ready
			h.wantStats(2, 1)
			h.release("a", true)
			h.release("b", true)
			h.wantStats(0, 1)
			if got := len(h.s.snapshot()[1].Providers); got != 0 {
				h.t.Fatalf("gpu-2 lists %d providers after its only one left the config, want 0", got)
			}
		}},
		{name: "L8 fence returns every lease of the generation exactly once", run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("tiny", 0)) // ollama
			h.acq("b", chat("tiny", 0)) // llama
			h.acq("c", chat("tiny", 0)) // ollama
			h.acq("d", chat("tiny", 0)) // llama
			h.acq("w", Request{Model: "tiny", Operation: protocol.OpChatCompletions})
			h.fence("gpu-1", 1, 2)
			if len(h.fenced) != 2 || h.fenced[0].Key != kOllama || h.fenced[1].Key != kOllama {
				h.t.Fatalf("fenced %v, want the two ollama leases", h.fenced)
			}
			h.wantQueued("w") // re-evaluated: llama is full, ollama is offline
			h.release("a", false)
			h.release("c", false)
			h.fence("gpu-1", 1, 0) // duplicate fence
			h.release("b", true)
			h.wantLease("w", kLlama)
			h.wantStats(2, 0)
		}},
		{name: "Q3 N3 a draining node takes no new lease; held ones go on; a new generation is live", run: func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("tiny", 0)) // ollama
			h.wantLease("a", kOllama)
			h.drain("gpu-2", 2, false) // not its generation (L9)
			h.drain("gpu-1", 1, true)
			h.drain("gpu-1", 1, false) // repeat
			h.acq("b", chat("tiny", 0))
			h.wantLease("b", kLlama) // ollama has room but drains
			h.acq("c", chat("tiny", 0))
			h.wantLease("c", kLlama)
			h.acq("w", chat("tiny", 0))
			h.wantQueued("w")
			if st := h.s.snapshot()[0]; !st.Draining || st.Providers[0].Status != StatusDraining || st.Providers[0].InFlight != 1 {
				h.t.Fatalf("gpu-1 snapshot %+v %v, want draining with its lease shown", st, st.Providers[0])
			}
			h.release("a", true) // the held lease finished normally
			h.wantQueued("w")
			h.fence("gpu-1", 1, 0) // the draining node closed
			h.ready("gpu-1", 2, true)
			h.wantLease("w", kOllama) // its next generation is live again
			h.wantStats(3, 0)
		}},
		{name: "L5 L9 stale or duplicate ready and stale fence change nothing", run: func(h *harness) {
			h.ready("gpu-2", 2, true)
			h.acq("a", chat("big", 0))
			h.ready("gpu-2", 2, false) // duplicate
			h.ready("gpu-2", 1, false) // stale
			h.fence("gpu-2", 1, 0)     // stale
			if l := h.wantLease("a", kLlama); l.Generation != 2 {
				h.t.Fatalf("lease generation %d, want 2", l.Generation)
			}
			h.acq("b", chat("big", 0))
			h.wantLease("b", kLlama) // still live
			h.wantStats(2, 0)
		}},
		{name: "L4 L8 a newer generation's ready fences the older generation's leases", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.ready("gpu-2", 2, true)
			if len(h.fenced) != 1 || h.fenced[0] != h.leases["a"] {
				h.t.Fatalf("fenced %v, want lease a", h.fenced)
			}
			h.release("a", false)
			h.acq("b", chat("big", 0))
			if l := h.wantLease("b", kLlama); l.Generation != 2 {
				h.t.Fatalf("lease generation %d, want 2", l.Generation)
			}
		}},
		{name: "L4 L8 P3 a fenced pending generation never becomes ready", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.fence("gpu-2", 2, 1) // takeover by gen 2 fences gen 1; gen 2 then dies pending
			h.ready("gpu-2", 2, false)
			h.acq("w", chat("big", 0))
			h.wantQueued("w")
			h.ready("gpu-2", 3, true)
			h.wantLease("w", kLlama)
		}},
		{name: "H8 overlay only from a fresh seq of the current ready generation", run: func(h *harness) {
			h.overlay(true, kLlama, 0, 1, false) // node not ready
			h.ready("gpu-2", 1, true)
			h.overlay(true, kLlama, 1, 0, false)            // seq absent
			h.overlay(true, kLlama, 2, 1, false)            // not the current generation
			h.overlay(true, Key{"gpu-2", "x"}, 1, 1, false) // unknown provider
			h.overlay(false, kLlama, 1, 1, false)           // nothing to clear
			h.overlay(true, kLlama, 1, 3, true)
			h.overlay(true, kLlama, 1, 3, false) // not fresh
			h.acq("a", chat("big", 0))
			h.wantQueued("a")                     // overlaid providers are no candidates
			h.overlay(false, kLlama, 1, 3, false) // H10: not higher
			h.overlay(false, kLlama, 2, 9, false) // H10: another generation
			h.overlay(false, kLlama, 1, 4, true)
			h.wantLease("a", kLlama)
			h.overlay(false, kLlama, 1, 5, false) // already clear
		}},
		{name: "H9 a newer generation does not inherit the overlay", run: func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.overlay(true, kLlama, 1, 7, true)
			h.fence("gpu-2", 1, 0)
			h.ready("gpu-2", 2, true)
			h.acq("a", chat("big", 0))
			h.wantLease("a", kLlama)
			h.overlay(true, kLlama, 2, 1, true) // seq numbering restarts per connection (H5)
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			cfg := baseConfig()
			if row.cfg != nil {
				cfg = row.cfg()
			}
			row.run(newHarness(t, cfg))
		})
	}
}
