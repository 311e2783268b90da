package pool

import "testing"

// N2: once NodeRuns said what a node generation runs, a configured
// resource is a candidate of it only while that generation runs the
// resource's Revision: a waiter of a provider the node runs an older
// revision of waits (its timeout says why), and is served as soon as the
// generation runs the configured one, with the capacity it runs it with;
// a stale generation's NodeRuns
// changes nothing; one given before its generation is ready applies when
// it is; a newer generation nobody said anything of runs nothing.
func TestN2NodeRuns(t *testing.T) {
	cfg := baseConfig()
	cfg.Resources[0].Revision, cfg.Resources[1].Revision = "o1", "l1"
	h := newHarness(t, cfg)
	h.ready("gpu-1", 1, true) // never told: everything configured is run
	h.acq("t1", chat("tiny", 1))
	h.wantLease("t1", kOllama)

	if !h.s.setRuns("gpu-2", 1, map[string]Run{"llama": {Revision: "l0", Capacity: 2, LongCapacity: 1}}) {
		t.Fatal("setRuns before ready refused")
	}
	h.settle()
	h.ready("gpu-2", 1, true)
	h.acq("b1", chat("big", 1))
	h.acq("b2", chat("big", 1))
	h.wantQueued("b1", "b2")
	h.timeout("b1")
	h.wantErr("b1", ErrWaitTimeout, "not in the config node gpu-2 runs")
	if ps := h.s.snapshot()[1].Providers[0]; ps.GetStatus() != StatusUnavailable || ps.GetCapacity() != 0 {
		t.Errorf("N3: provider not run shows %v, want unavailable", ps)
	}

	if !h.s.setRuns("gpu-2", 1, map[string]Run{"llama": {Revision: "l1", Capacity: 1, LongCapacity: 1}}) { // APPLIED
		t.Fatal("setRuns of the ready generation refused")
	}
	h.settle()
	h.wantLease("b2", kLlama)
	h.acq("b2b", chat("big", 1)) // capacity 1 as run, though 2 configured
	h.wantQueued("b2b")
	h.release("b2", true)
	h.wantLease("b2b", kLlama)
	h.release("b2b", true)

	h.fence("gpu-2", 1, 0)
	h.ready("gpu-2", 2, true) // nobody said what generation 2 runs
	h.acq("b3", chat("big", 1))
	h.wantQueued("b3")
	if h.s.setRuns("gpu-2", 1, map[string]Run{"llama": {Revision: "l1", Capacity: 1, LongCapacity: 1}}) {
		t.Fatal("L9: setRuns of a stale generation applied")
	}
	h.settle()
	h.wantQueued("b3")
	h.fence("gpu-2", 2, 0)
	h.s.setRuns("gpu-2", 3, map[string]Run{"llama": {Revision: "l1", Capacity: 2, LongCapacity: 1}, "other": {Revision: "x", Capacity: 1}}) // a re-registration, before its ready
	h.settle()
	h.wantQueued("b3")
	h.ready("gpu-2", 3, true)
	h.wantLease("b3", kLlama)
}
