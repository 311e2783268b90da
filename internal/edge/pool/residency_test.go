package pool

import (
	"testing"

	"iop/internal/protocol"
)

// U6: a least_loaded group prefers the free candidate whose target its
// node reports loaded, even when it is busier; a report of another
// generation, or none, leaves the choice to the load; the snapshot shows
// the current generation's report.
func TestResidency(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.ready("gpu-1", 1, true)
	h.ready("gpu-2", 1, true)
	h.acq("a", chat("tiny", 1)) // least loaded, config order: gpu-1
	h.wantLease("a", kOllama)
	h.release("a", true)

	// gpu-1's target is unloaded, gpu-2's loaded: gpu-2, although both are idle and gpu-1 is first.
	if !h.s.setResidency("gpu-1", 1, map[string][]ModelResidency{"ollama": {{Model: "tiny-o", State: protocol.ResidencyUnloaded, LoadMs: 4000}}}) {
		t.Fatal("U6: report of the ready generation not applied")
	}
	h.s.setResidency("gpu-2", 1, map[string][]ModelResidency{"llama": {{Model: "tiny-l", State: protocol.ResidencyLoaded}}})
	h.acq("b", chat("tiny", 1))
	h.wantLease("b", kLlama)
	h.acq("c", chat("tiny", 1)) // gpu-2 busier (1 of 2) but still the loaded one
	h.wantLease("c", kLlama)
	h.acq("d", chat("tiny", 1)) // gpu-2 full: the cold candidate rather than a wait
	h.wantLease("d", kOllama)
	for _, n := range []string{"b", "c", "d"} {
		h.release(n, true)
	}

	snap := h.s.snapshot()
	if r := snap[0].Providers[0].GetResidency(); len(r) != 1 || r[0].GetModel() != "tiny-o" || r[0].GetState() != protocol.ResidencyUnloaded || r[0].GetLoadMs() != 4000 {
		t.Fatalf("U6: snapshot residency %v", r)
	}
	if cold, s := h.s.resources[kOllama].coldStart("tiny-o"); !cold || s != 4 {
		t.Fatalf("coldStart %v %v", cold, s)
	}

	// A stale generation's report changes nothing; a new generation starts without one.
	if h.s.setResidency("gpu-2", 7, map[string][]ModelResidency{"llama": {{Model: "tiny-l", State: protocol.ResidencyUnloaded}}}) {
		t.Fatal("U6: a report of a generation that is not ready applied")
	}
	h.fence("gpu-1", 1, 0)
	h.ready("gpu-1", 2, true)
	if cold, _ := h.s.resources[kOllama].coldStart("tiny-o"); cold {
		t.Fatal("U6: generation 2 inherited generation 1's report")
	}
	if r := h.s.snapshot()[0].Providers[0].GetResidency(); len(r) != 0 {
		t.Fatalf("U6: snapshot of generation 2 shows %v", r)
	}
}
