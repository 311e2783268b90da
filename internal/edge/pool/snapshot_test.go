package pool

import (
	"testing"

	"iop/internal/edge/routing"
	"iop/internal/protocol"
)

// snap is the comparable part of one ProviderSnapshot.
type snap struct {
	status, health         string
	capacity, long         int32
	inFlight, longInFlight int32
	queued, longQueued     int32
	provider, category     string
}

func offline(provider string) snap {
	return snap{status: StatusUnavailable, health: HealthOffline, provider: provider, category: "local_inference"}
}

func (h *harness) wantSnapshot(connected map[string]bool, want map[Key]snap) {
	h.t.Helper()
	got := h.s.snapshot()
	seen := 0
	for _, ns := range got {
		if ns.Connected != connected[ns.Node] {
			h.t.Fatalf("node %s connected = %v, want %v", ns.Node, ns.Connected, connected[ns.Node])
		}
		if ns.Connected != !ns.ReadySince.IsZero() {
			h.t.Fatalf("node %s connected %v but ready_since %v", ns.Node, ns.Connected, ns.ReadySince)
		}
		for _, p := range ns.Providers {
			k := Key{ns.Node, p.ProviderId}
			w, ok := want[k]
			if !ok {
				continue
			}
			seen++
			g := snap{p.Status, p.Health, p.Capacity, p.LongCapacity, p.InFlight, p.LongInFlight, p.Queued, p.LongQueued, p.ProviderId, p.Category}
			if g != w {
				h.t.Fatalf("%v snapshot:\n got %+v\nwant %+v", k, g, w)
			}
		}
	}
	if seen != len(want) {
		h.t.Fatalf("snapshot lists %d of the %d providers wanted: %+v", seen, len(want), got)
	}
}

// TestSnapshot: projections of pool state into ProviderSnapshots.
func TestSnapshot(t *testing.T) {
	rows := []struct {
		name string
		run  func(h *harness)
	}{
		{"N3 P3 disconnected or pending node: connected=false, unavailable/offline, zeros", func(h *harness) {
			h.acq("w", chat("tiny", 0)) // queued: must not show as pressure on offline providers
			h.wantSnapshot(map[string]bool{}, map[Key]snap{kOllama: offline("ollama"), kLlama: offline("llama")})
			if got := h.s.snapshot(); len(got) != 2 || got[0].Node != "gpu-1" || got[1].Node != "gpu-2" {
				h.t.Fatalf("nodes %+v, want gpu-1 then gpu-2 (config order)", got)
			}
		}},
		{"N3 after ready the same identity returns with configured capacity", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 200))
			h.wantSnapshot(map[string]bool{"gpu-2": true}, map[Key]snap{
				kOllama: offline("ollama"),
				kLlama:  {StatusAvailable, HealthHealthy, 2, 1, 1, 1, 0, 0, "llama", "local_inference"},
			})
			if got := h.s.snapshot()[1].ReadySince; !got.Equal(h.now) {
				h.t.Fatalf("ready_since = %v, want %v", got, h.now)
			}
		}},
		{"Q8 one queued request counts under every live candidate", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			for _, n := range []string{"a", "b", "c", "d"} {
				h.acq(n, chat("tiny", 0)) // fills ollama and llama
			}
			h.acq("w", chat("tiny", 0))
			h.acq("L", chat("tiny", 300))
			h.acq("m", Request{Model: "tiny", Operation: protocol.OpMessages}) // llama only
			h.acq("b1", chat("big", 0))                                        // llama only
			h.wantSnapshot(map[string]bool{"gpu-1": true, "gpu-2": true}, map[Key]snap{
				kOllama: {StatusAvailable, HealthHealthy, 2, 1, 2, 0, 2, 1, "ollama", "local_inference"},
				kLlama:  {StatusAvailable, HealthHealthy, 2, 1, 2, 0, 4, 1, "llama", "local_inference"},
			})
			// L8: the fence re-evaluates the queue against live candidates.
			h.fence("gpu-1", 1, 2)
			h.wantSnapshot(map[string]bool{"gpu-2": true}, map[Key]snap{
				kOllama: offline("ollama"),
				kLlama:  {StatusAvailable, HealthHealthy, 2, 1, 2, 0, 4, 1, "llama", "local_inference"},
			})
		}},
		{"Q8 a provider listed twice in one group counts a request once", func(h *harness) {
			cfg := baseConfig()
			cfg.Groups[1].Candidates = append(cfg.Groups[1].Candidates, Candidate{Key: kLlama, Target: "other"})
			h.reconfigure(cfg)
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.acq("b", chat("big", 0))
			h.acq("w", chat("big", 0))
			if l := h.wantLease("a", kLlama); l.Target != "big-l" {
				h.t.Fatalf("target %q, want the first entry's big-l", l.Target)
			}
			h.wantSnapshot(map[string]bool{"gpu-2": true}, map[Key]snap{
				kLlama: {StatusAvailable, HealthHealthy, 2, 1, 2, 0, 1, 0, "llama", "local_inference"},
			})
		}},
		{"H9 overlaid provider: unavailable/unavailable, zeros, identity kept", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", chat("big", 0))
			h.overlay(true, kLlama, 1, 1, true)
			h.acq("w", chat("big", 0))
			h.wantSnapshot(map[string]bool{"gpu-2": true}, map[Key]snap{
				kLlama: {status: StatusUnavailable, health: HealthUnavailable, provider: "llama", category: "local_inference"},
			})
			h.overlay(false, kLlama, 1, 2, true)
			h.wantSnapshot(map[string]bool{"gpu-2": true}, map[Key]snap{
				kLlama: {StatusAvailable, HealthHealthy, 2, 1, 2, 0, 0, 0, "llama", "local_inference"},
			})
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) { row.run(newHarness(t, baseConfig())) })
	}
}

// Q4 Q8 (operator page): a group's waiters (long ones apart) and its live
// candidates, in config order.
func TestGroupsSnapshot(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.ready("gpu-2", 1, true)
	for _, n := range []string{"a", "b"} {
		h.acq(n, chat("big", 0)) // fills llama
	}
	h.acq("w", chat("tiny", 0))
	h.acq("L", chat("big", 300))
	got := h.s.groupSnapshots()
	want := []GroupSnapshot{
		{Name: "tiny", Waiters: 1, Candidates: 2, Live: 1},
		{Name: "big", Waiters: 1, LongWaiters: 1, Candidates: 1, Live: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("groups %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("group %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// Q7: the documented estimate is ceil(bytes/4).
func TestEstimatePromptTokens(t *testing.T) {
	for _, c := range []struct{ bytes, want int }{{-5, 0}, {0, 0}, {1, 1}, {4, 1}, {5, 2}, {400, 100}, {401, 101}} {
		if got := EstimatePromptTokens(c.bytes); got != c.want {
			t.Errorf("Q7 EstimatePromptTokens(%d) = %d, want %d", c.bytes, got, c.want)
		}
	}
}

// Q8 (operator page): a request pinned to the busy provider
// holding its conversation (affinity_wait) is one of its group's waiters.
func TestGroupsSnapshotPinned(t *testing.T) {
	h := newHarness(t, affinityConfig(routing.PrefixAffinity, true)())
	h.ready("gpu-1", 1, true)
	h.ready("gpu-2", 1, true)
	h.acq("t1", turn(7, 1))
	h.acq("x1", turn(7, 1)) // the holder's second slot: it is full
	h.acq("t2", turn(7, 3)) // pinned to the holder while the other is free
	h.wantQueued("t2")
	if got := h.s.groupSnapshots()[0]; got.Name != "tiny" || got.Waiters != 1 || got.LongWaiters != 0 {
		t.Errorf("group %+v, want tiny with 1 waiter (the pinned one)", got)
	}
}
