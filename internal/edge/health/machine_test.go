package health

import (
	"errors"
	"testing"

	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

var keyA = pool.Key{Node: "n1", Provider: "ollama"}

// stallFailure is a well-formed stall terminal's evidence for keyA/"tiny".
func stallFailure(health string, seq uint64) *iop.ExecutionFailure {
	cls := map[string]string{protocol.HealthAvailable: protocol.LivenessRequestStalled, protocol.HealthUnavailable: protocol.LivenessProviderUnhealthy, protocol.HealthUnknown: protocol.LivenessHealthUnknown}[health]
	return &iop.ExecutionFailure{Code: protocol.CodeResponseStalled.String(), ProviderHealth: health, LivenessClassification: cls,
		IdleMs: 2000, NodeRunId: "nr-1", AttemptId: "a-1", Fence: protocol.FenceConfirmed,
		Adapter: keyA.Provider, Target: "tiny", HealthObservationSeq: seq}
}

func with(f *iop.ExecutionFailure, edit func(*iop.ExecutionFailure)) *iop.ExecutionFailure {
	edit(f)
	return f
}

// The pure stall transition (SPEC H8, H9, H2, H5): validation against the
// lease binding, freshness per (node, generation, provider), and the
// overlay effect.
func TestMachineStall(t *testing.T) {
	cur := binding{key: keyA, gen: 3, target: "tiny", current: true}
	rows := []struct {
		name       string
		prior      *record // keyA's record before the step
		b          binding
		f          *iop.ExecutionFailure
		reject     Reject
		fresh      bool
		setOverlay bool
		lastSeq    uint64 // keyA's lastSeq after the step
		recGen     uint64 // keyA's record generation after the step (0 = none)
	}{
		{name: "H8 fresh unavailable sets the overlay", b: cur, f: stallFailure(protocol.HealthUnavailable, 4),
			fresh: true, setOverlay: true, lastSeq: 4, recGen: 3},
		{name: "H8 fresh available is accepted without overlay", b: cur, f: stallFailure(protocol.HealthAvailable, 4),
			fresh: true, lastSeq: 4, recGen: 3},
		{name: "H8 fresh unknown is accepted without overlay", b: cur, f: stallFailure(protocol.HealthUnknown, 4),
			fresh: true, lastSeq: 4, recGen: 3},
		{name: "H8 stale seq unavailable is validated but sets nothing", prior: &record{gen: 3, lastSeq: 9}, b: cur,
			f: stallFailure(protocol.HealthUnavailable, 9), lastSeq: 9, recGen: 3},
		{name: "H8 lower seq unavailable is stale", prior: &record{gen: 3, lastSeq: 9}, b: cur,
			f: stallFailure(protocol.HealthUnavailable, 5), lastSeq: 9, recGen: 3},
		{name: "H5 unbound seq 0 is validated, never fresh", b: cur, f: stallFailure(protocol.HealthUnavailable, 0), recGen: 3},
		{name: "H9 newer generation starts fresh: seq 1 beats the old generation's 9", prior: &record{gen: 2, lastSeq: 9, overlaid: true},
			b: cur, f: stallFailure(protocol.HealthUnavailable, 1), fresh: true, setOverlay: true, lastSeq: 1, recGen: 3},
		{name: "H9 older generation's terminal is stale", prior: &record{gen: 4, lastSeq: 1},
			b: cur, f: stallFailure(protocol.HealthUnavailable, 7), lastSeq: 1, recGen: 4},
		{name: "H8 missing failure rejected", b: cur, f: nil, reject: RejectMissing},
		{name: "H8 wrong code rejected", b: cur, f: with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.Code = "upstream_error" }),
			reject: RejectCode},
		{name: "H8 adapter not the lease's provider rejected", b: cur,
			f: with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.Adapter = "other" }), reject: RejectAdapter},
		{name: "H8 target not the lease's target rejected", b: cur,
			f: with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.Target = "big" }), reject: RejectTarget},
		{name: "H2 health outside the enum rejected", b: cur,
			f: with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.ProviderHealth = "healthy" }), reject: RejectHealth},
		{name: "H2 classification not paired rejected", b: cur,
			f:      with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.LivenessClassification = protocol.LivenessRequestStalled }),
			reject: RejectClassification},
		{name: "H7 fence outside the enum rejected", b: cur,
			f: with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.Fence = "" }), reject: RejectFence},
		{name: "H8 fenced generation rejected", b: binding{key: keyA, gen: 3, target: "tiny"},
			f: stallFailure(protocol.HealthUnavailable, 4), reject: RejectNotCurrent},
		{name: "H8 rejected evidence leaves the seq untouched", prior: &record{gen: 3, lastSeq: 2}, b: cur,
			f: with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.Target = "big" }), reject: RejectTarget,
			lastSeq: 2, recGen: 3},
		{name: "H8 fresh unavailable for a node's other provider does not touch this one", prior: &record{gen: 3, lastSeq: 2},
			b:     binding{key: pool.Key{Node: "n1", Provider: "llama"}, gen: 3, target: "tiny", current: true},
			f:     with(stallFailure(protocol.HealthUnavailable, 4), func(f *iop.ExecutionFailure) { f.Adapter = "llama" }),
			fresh: true, setOverlay: true, lastSeq: 2, recGen: 3},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			m := newMachine()
			if r.prior != nil {
				p := *r.prior
				m.provs[keyA] = &p
			}
			v := m.stall(r.b, r.f)
			if v.reject != r.reject || v.fresh != r.fresh || v.setOverlay != r.setOverlay {
				t.Errorf("got reject=%v fresh=%v setOverlay=%v, want %v %v %v", v.reject, v.fresh, v.setOverlay, r.reject, r.fresh, r.setOverlay)
			}
			if r.reject == RejectNone && v.health != r.f.ProviderHealth {
				t.Errorf("validated health %q, want %q", v.health, r.f.ProviderHealth)
			}
			rec := m.provs[keyA]
			switch {
			case r.recGen == 0 && rec != nil:
				t.Errorf("record %+v, want none", *rec)
			case r.recGen != 0 && rec == nil:
				t.Errorf("no record, want gen %d", r.recGen)
			case rec != nil && (rec.gen != r.recGen || rec.lastSeq != r.lastSeq):
				t.Errorf("record gen %d lastSeq %d, want %d %d", rec.gen, rec.lastSeq, r.recGen, r.lastSeq)
			}
		})
	}
}

func capResp(adapterKey, target, status, seq string) *iop.NodeCommandResponse {
	res := map[string]string{"adapter": adapterKey, "instance_key": "ollama/" + adapterKey}
	for k, v := range map[string]string{protocol.KeyAdapterKey: adapterKey, protocol.KeyTarget: target, protocol.KeyStatus: status, protocol.KeySeq: seq} {
		if v != "" {
			res[k] = v
		}
	}
	return &iop.NodeCommandResponse{Ok: true, Result: res}
}

// The pure probe transition (SPEC H10): only an ok answer naming exactly
// the probed binding with a higher seq and status available clears;
// anything else changes nothing (the record and its seq stay).
func TestMachineProbe(t *testing.T) {
	overlaid := record{gen: 3, lastSeq: 5, overlaid: true, overlaySeq: 5, target: "tiny"}
	pt := probeTarget{key: keyA, gen: 3, target: "tiny", seq: 5}
	errBoom := errors.New("boom")
	rows := []struct {
		name     string
		prior    record
		pt       probeTarget
		resp     *iop.NodeCommandResponse
		err      error
		notReady bool
		result   ProbeResult
		clear    bool
		lastSeq  uint64
		dropped  bool
	}{
		{name: "H10 higher-seq available clears", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", protocol.HealthAvailable, "6"),
			result: ProbeCleared, clear: true, lastSeq: 6},
		{name: "H10 equal seq available is stale", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", protocol.HealthAvailable, "5"),
			result: ProbeStale, lastSeq: 5},
		{name: "H10 lower seq available is stale", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", protocol.HealthAvailable, "2"),
			result: ProbeStale, lastSeq: 5},
		{name: "H10 unavailable keeps the overlay, seq accepted", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", protocol.HealthUnavailable, "7"),
			result: ProbeUnavailable, lastSeq: 7},
		{name: "H10 unknown keeps the overlay", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", protocol.HealthUnknown, "7"),
			result: ProbeUnknown, lastSeq: 7},
		{name: "H10 other adapter_key is a mismatch", prior: overlaid, pt: pt, resp: capResp("llama", "tiny", protocol.HealthAvailable, "7"),
			result: ProbeMismatch, lastSeq: 5},
		{name: "H10 other target is a mismatch", prior: overlaid, pt: pt, resp: capResp("ollama", "big", protocol.HealthAvailable, "7"),
			result: ProbeMismatch, lastSeq: 5},
		{name: "N1 diagnostic adapter key alone is not evidence", prior: overlaid, pt: pt,
			resp:   &iop.NodeCommandResponse{Ok: true, Result: map[string]string{"adapter": "ollama", protocol.KeyTarget: "tiny", protocol.KeyStatus: protocol.HealthAvailable, protocol.KeySeq: "7"}},
			result: ProbeMalformed, lastSeq: 5},
		{name: "H10 missing seq is malformed", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", protocol.HealthAvailable, ""),
			result: ProbeMalformed, lastSeq: 5},
		{name: "H10 non-numeric seq is malformed", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", protocol.HealthAvailable, "x7"),
			result: ProbeMalformed, lastSeq: 5},
		{name: "H10 status outside the enum is malformed", prior: overlaid, pt: pt, resp: capResp("ollama", "tiny", "healthy", "7"),
			result: ProbeMalformed, lastSeq: 5},
		{name: "H10 empty answer is malformed", prior: overlaid, pt: pt, resp: &iop.NodeCommandResponse{Ok: true},
			result: ProbeMalformed, lastSeq: 5},
		{name: "H10 not ok is malformed", prior: overlaid, pt: pt, resp: &iop.NodeCommandResponse{Error: "unknown_adapter: x"},
			result: ProbeMalformed, lastSeq: 5},
		{name: "H10 command error changes nothing", prior: overlaid, pt: pt, err: errBoom, result: ProbeError, lastSeq: 5},
		{name: "H10 generation no longer ready drops the record", prior: overlaid, pt: pt, err: errBoom, notReady: true,
			result: ProbeNotReady, dropped: true},
		{name: "H10 answer for an older generation is superseded", prior: record{gen: 4, lastSeq: 1, overlaid: true, target: "tiny"},
			pt: pt, resp: capResp("ollama", "tiny", protocol.HealthAvailable, "9"), result: ProbeSuperseded, lastSeq: 1},
		{name: "H10 answer after the overlay went is superseded", prior: record{gen: 3, lastSeq: 5, target: "tiny"},
			pt: pt, resp: capResp("ollama", "tiny", protocol.HealthAvailable, "9"), result: ProbeSuperseded, lastSeq: 5},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			m := newMachine()
			p := r.prior
			m.provs[keyA] = &p
			v := m.probe(r.pt, r.resp, r.err, r.notReady)
			if v.result != r.result || v.clear != r.clear {
				t.Errorf("got %v clear=%v, want %v clear=%v", v.result, v.clear, r.result, r.clear)
			}
			rec := m.provs[keyA]
			if r.dropped {
				if rec != nil {
					t.Errorf("record %+v kept, want dropped", *rec)
				}
				return
			}
			if rec == nil {
				t.Fatal("record dropped")
			}
			if rec.lastSeq != r.lastSeq {
				t.Errorf("lastSeq %d, want %d", rec.lastSeq, r.lastSeq)
			}
			if rec.overlaid != r.prior.overlaid {
				t.Errorf("overlaid changed to %v by probe alone", rec.overlaid)
			}
		})
	}
}

// H8, H10: the pool's answers feed back: a refused SetOverlay leaves
// nothing overlaid; a refused ClearOverlay drops the record; a second
// fresh unavailable is no new transition; the probe asks about the target
// of the stall that set the overlay.
func TestMachineEffects(t *testing.T) {
	m := newMachine()
	cur := binding{key: keyA, gen: 3, target: "tiny", current: true}
	m.stall(cur, stallFailure(protocol.HealthUnavailable, 1))
	if m.overlaySet(keyA, 3, 1, "tiny", false) {
		t.Error("refused SetOverlay reported a transition")
	}
	if len(m.due()) != 0 {
		t.Errorf("due %v after a refused SetOverlay, want none", m.due())
	}
	m.stall(cur, stallFailure(protocol.HealthUnavailable, 2))
	if !m.overlaySet(keyA, 3, 2, "tiny", true) {
		t.Error("applied SetOverlay: no transition")
	}
	m.stall(cur, stallFailure(protocol.HealthUnavailable, 3))
	if m.overlaySet(keyA, 3, 3, "other", true) {
		t.Error("second SetOverlay on an overlaid provider reported a transition")
	}
	due := m.due()
	if len(due) != 1 || due[0] != (probeTarget{key: keyA, gen: 3, target: "tiny", seq: 2}) {
		t.Errorf("due = %+v, want the stall that set it (target tiny, seq 2)", due)
	}
	if m.cleared(keyA, 3, false) {
		t.Error("refused ClearOverlay reported a transition")
	}
	if m.provs[keyA] != nil {
		t.Error("record kept after a refused ClearOverlay")
	}
	m.stall(cur, stallFailure(protocol.HealthUnavailable, 4))
	m.overlaySet(keyA, 3, 4, "tiny", true)
	if n := m.fenced("n1", 3); n != 1 || len(m.provs) != 0 {
		t.Errorf("fenced dropped %d overlaid, %d records left; want 1, 0", n, len(m.provs))
	}
}
