package pool

import (
	"errors"
	"testing"
	"time"
)

// SPEC V1: a request whose group has a fallback on unavailable
// (Request.LeaveUnavailable) never waits for a provider to come back: with
// none it may use live it fails with an UnavailableError at admission, and
// a queued one in the transition that takes its last live provider away
// (fence, drain, ejection, overlay, what the node runs), with its arrival
// number to queue again in its place; a request without the mark waits as
// before, and one whose class keeps a live provider stays queued.
func TestLeaveUnavailable(t *testing.T) {
	leave := func(r Request) Request { r.LeaveUnavailable = true; return r }
	// fill: big's one provider (gpu-2/llama, capacity 2) is full and a
	// leaver and a waiter queue for it.
	fill := func(h *harness) {
		h.ready("gpu-1", 1, true)
		h.ready("gpu-2", 1, true)
		h.acq("a", chat("big", 0))
		h.acq("b", chat("big", 0))
		h.acq("leaver", leave(chat("big", 0)))
		h.acq("stayer", chat("big", 0))
		h.wantQueued("leaver", "stayer")
	}
	wantLeft := func(h *harness, contains string) {
		h.t.Helper()
		h.wantErr("leaver", ErrUnavailable, contains)
		var ue *UnavailableError
		if !errors.As(h.errs["leaver"], &ue) || ue.Arrival != h.waiters["leaver"].seq || ue.Arrival == 0 || ue.Model != "big" {
			h.t.Fatalf("error %#v, want big's UnavailableError with the waiter's arrival %d", h.errs["leaver"], h.waiters["leaver"].seq)
		}
		h.wantQueued("stayer")
	}
	for _, row := range []struct {
		name string
		run  func(h *harness)
	}{
		{"V1 admission with no live provider: at once, not queued", func(h *harness) {
			h.acq("leaver", leave(chat("big", 0)))
			h.acq("stayer", chat("big", 0))
			h.wantErr("leaver", ErrUnavailable, "no live provider: node gpu-2 not ready")
			h.wantQueued("stayer")
			h.wantStats(0, 1)
		}},
		{"V1 a fence of the last live provider's node", func(h *harness) {
			fill(h)
			h.fence("gpu-2", 1, 2)
			wantLeft(h, "node gpu-2 not ready")
			h.wantStats(0, 1)
		}},
		{"V1 a drain", func(h *harness) {
			fill(h)
			h.drain("gpu-2", 1, true)
			wantLeft(h, "no live provider")
			h.wantStats(2, 1)
		}},
		{"V1 an ejection by passive health", func(h *harness) {
			fill(h)
			h.s.eject(kLlama, h.now.Add(time.Minute), "status")
			h.settle()
			wantLeft(h, "cooling down after status failures")
		}},
		{"V1 an overlay", func(h *harness) {
			fill(h)
			h.overlay(true, kLlama, 1, 1, true)
			wantLeft(h, "provider gpu-2/llama unavailable")
		}},
		{"V1 a node that no longer runs the provider", func(h *harness) {
			fill(h)
			h.s.setRuns("gpu-2", 1, map[string]Run{})
			h.settle()
			wantLeft(h, "not in the config node gpu-2 runs")
		}},
		{"V1 H11 a re-dispatch whose untried providers are down", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.acq("first", chat("tiny", 0))
			h.wantLease("first", kOllama)
			h.acq("again", leave(Request{Model: "tiny", Operation: "chat_completions", Exclude: []Key{kOllama}, Arrival: 7}))
			h.wantErr("again", ErrUnavailable, "node gpu-2 not ready")
			if ue := (*UnavailableError)(nil); !errors.As(h.errs["again"], &ue) || ue.Arrival != 7 {
				h.t.Fatalf("error %#v, want the arrival it asked with (7)", h.errs["again"])
			}
		}},
		{"V1 a class that keeps a live provider stays queued", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			for _, n := range []string{"a", "b", "c", "d"} {
				h.acq(n, chat("tiny", 0)) // tiny: ollama 2 + llama 2
			}
			h.acq("leaver", leave(chat("tiny", 0)))
			h.fence("gpu-1", 1, 2) // ollama goes; llama, full, is still live
			h.wantQueued("leaver")
			if h.errs["leaver"] != nil {
				h.t.Fatalf("leaver failed: %v", h.errs["leaver"])
			}
		}},
	} {
		t.Run(row.name, func(t *testing.T) {
			h := newHarness(t, baseConfig())
			row.run(h)
			if h.s.leavers != h.countLeavers() {
				t.Fatalf("leavers = %d, queued with the mark %d", h.s.leavers, h.countLeavers())
			}
		})
	}
}

// countLeavers counts the queued waiters with Request.LeaveUnavailable.
func (h *harness) countLeavers() int {
	n := 0
	for w := h.s.all.head; w != nil; w = w.anext {
		if w.leave {
			n++
		}
	}
	return n
}
