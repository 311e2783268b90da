package pool

import (
	"testing"
	"testing/synctest"
	"time"
)

// refused returns name's lease as refused over capacity (ReleaseRefused).
func (h *harness) refused(name string, want bool) {
	h.t.Helper()
	if got := h.s.refused(h.leases[name], h.now, 0); got != want {
		h.t.Fatalf("refused(%s) = %v, want %v", name, got, want)
	}
	h.settle()
}

// refusedFair is refused with the node's fair share.
func (h *harness) refusedFair(name string, fair int) {
	h.t.Helper()
	if !h.s.refused(h.leases[name], h.now, fair) {
		h.t.Fatalf("refused(%s) = false", name)
	}
	h.settle()
}

// liftAfter moves the clock by d and ends the i-th window armed.
func (h *harness) liftAfter(i int, d time.Duration) {
	h.t.Helper()
	h.now = h.now.Add(d)
	lf := h.lifts[i]
	h.s.liftLimit(lf.r, lf.seq, h.now)
	h.settle()
}

func (h *harness) wantWindows(ds ...time.Duration) {
	h.t.Helper()
	if len(h.lifts) != len(ds) {
		h.t.Fatalf("%d windows armed, want %d", len(h.lifts), len(ds))
	}
	for i, d := range ds {
		if h.lifts[i].d != d {
			h.t.Fatalf("window %d is %v, want %v", i, h.lifts[i].d, d)
		}
	}
}

// E4, Q2: a node's capacity gate refusing a lease over capacity (other
// edges hold the rest) returns the lease and lowers what the provider
// admits to the leases this pool holds on it, until a probe window that
// doubles while refusals keep coming; nothing cools, nothing fails.
func TestRefusedOverCapacity(t *testing.T) {
	rows := []struct {
		name string
		run  func(h *harness)
	}{
		{"E4 the provider admits only what this edge holds; one of those ending frees a slot", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.refused("b", true)
			h.wantWindows(RefusedBackoff)
			h.acq("b2", chat("big", 0)) // b again: it waits, the node is full
			h.wantQueued("b2")
			h.release("a", true) // a's node slot is free: b2 takes it
			h.wantLease("b2", kLlama)
			h.acq("c", chat("big", 0))
			h.wantQueued("c")
		}},
		{"E4 the window ends: the provider admits up to its capacity again", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.refused("a", true)
			h.acq("a2", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.wantQueued("a2", "b")
			h.liftAfter(0, RefusedBackoff)
			h.wantGranted("a2", "b")
		}},
		{"E4 refusals soon after a lift double the window, up to its bound; a quiet spell starts it over", func(h *harness) {
			h.ready("gpu-2", 1, true)
			want := []time.Duration{RefusedBackoff}
			h.acq("r0", chat("big", 0))
			h.refused("r0", true)
			for i := 1; i < 7; i++ {
				h.liftAfter(i-1, h.lifts[i-1].d)
				name := "r" + string(rune('0'+i))
				h.acq(name, chat("big", 0))
				h.refused(name, true)
				want = append(want, min(want[i-1]*2, RefusedBackoffMax))
			}
			h.wantWindows(want...)
			h.liftAfter(6, RefusedBackoffMax)
			h.now = h.now.Add(2 * RefusedBackoffMax)
			h.acq("q", chat("big", 0))
			h.refused("q", true)
			h.wantWindows(append(want, RefusedBackoff)...)
		}},
		{"E4 several refusals in one window: one window, the lowest count", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.refused("b", true)
			h.refused("a", true)
			h.wantWindows(RefusedBackoff)
			h.acq("c", chat("big", 0))
			h.wantQueued("c")
			h.refused("a", false) // returned once
		}},
		{"E4 another provider serves what the refused one cannot", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("tiny", 0))
			h.wantLease("a", kOllama)
			h.refused("a", true)
			h.acq("a2", chat("tiny", 0))
			h.wantLease("a2", kLlama)
		}},
		{"E4 the node's fair share bounds the window's admissions", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.refusedFair("b", 1) // at its share: the usual window
			h.wantWindows(RefusedBackoff)
			h.release("a", true)
			h.acq("c", chat("big", 0))
			h.wantLease("c", kLlama) // one: its share
			h.acq("d", chat("big", 0))
			h.wantQueued("d")
		}},
		{"E4 below its fair share an edge tries again soon, also within a longer window", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.refusedFair("b", 1) // a holds its share: the usual window
			h.refusedFair("a", 2) // none held of a share of 2: the node keeps a slot for it
			h.wantWindows(RefusedBackoff, RefusedRetry)
			h.acq("c", chat("big", 0))
			h.wantQueued("c")
			h.liftAfter(1, RefusedRetry)
			h.wantLease("c", kLlama)
		}},
		{"E4 a new generation of the node forgets its refusals", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.refused("a", true)
			h.fence("gpu-2", 1, 0)
			h.ready("gpu-2", 2, true)
			h.acq("b", chat("big", 0))
			h.acq("c", chat("big", 0))
			h.wantLease("b", kLlama)
			h.wantLease("c", kLlama)
			h.liftAfter(0, RefusedBackoff) // the old window's end changes nothing
			h.acq("d", chat("big", 0))
			h.wantQueued("d")
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			row.run(newHarness(t, baseConfig()))
		})
	}
}

// E4: through the Pool and its clock: ReleaseRefused arms the window and
// the clock lifts it, pumping the waiter.
func TestPoolReleaseRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		p := New(baseConfig(), clk)
		p.NodeReady("gpu-2", 1)
		l := mustAcquire(t, p, chat("big", 0))
		if !p.ReleaseRefused(l, 0) || p.ReleaseRefused(l, 0) {
			t.Fatal("ReleaseRefused: want true once, then false")
		}
		out := make(chan outcome, 1)
		start(t.Context(), p, "w", chat("big", 0), out)
		noOutcome(t, out)
		clk.Advance(RefusedBackoff - time.Millisecond)
		noOutcome(t, out)
		clk.Advance(time.Millisecond)
		o := <-out
		if o.err != nil || o.l.Key != kLlama {
			t.Fatalf("got (%v, %v) after the window, want a lease on %v", o.l, o.err, kLlama)
		}
		p.Release(o.l)
	})
}

// E4: a node that gives this edge a share of its capacity
// (RegisterRequest.capacity_share): its providers admit ceil(capacity ×
// share) leases here, snapshots show that number, and a new generation
// with no share has the whole capacity again.
func TestNodeShare(t *testing.T) {
	h := newHarness(t, baseConfig())
	if !h.s.ready("gpu-2", 1, h.now, 0.5) {
		t.Fatal("ready")
	}
	h.settle()
	h.acq("a", chat("big", 0))
	h.acq("b", chat("big", 0))
	h.wantLease("a", kLlama)
	h.wantQueued("b")
	for _, ns := range h.s.snapshot() {
		for _, p := range ns.Providers {
			if p.ProviderId == "llama" && (p.Capacity != 1 || p.LongCapacity != 1) {
				t.Fatalf("snapshot capacity %d long %d, want 1 and 1", p.Capacity, p.LongCapacity)
			}
		}
	}
	h.fence("gpu-2", 1, 1)
	h.ready("gpu-2", 2, true)
	h.wantLease("b", kLlama)
	h.acq("c", chat("big", 0))
	h.wantLease("c", kLlama)
}
