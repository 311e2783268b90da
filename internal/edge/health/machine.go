package health

import (
	"sort"
	"strconv"

	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Reject says why stall evidence was not accepted; RejectNone means it was
// validated. The values are bounded and safe for logs.
type Reject uint8

const (
	RejectNone           Reject = iota
	RejectMissing               // no ExecutionFailure on the terminal
	RejectCode                  // failure.code is not response_stalled
	RejectAdapter               // failure.adapter is not the lease's provider
	RejectTarget                // failure.target is not the lease's target
	RejectHealth                // provider_health outside the enum
	RejectClassification        // liveness_classification not paired with the health
	RejectFence                 // fence outside the enum
	RejectNotCurrent            // the lease's generation was fenced
)

var rejectNames = [...]string{"none", "missing_failure", "code_mismatch", "adapter_mismatch", "target_mismatch",
	"invalid_health", "classification_mismatch", "invalid_fence", "not_current"}

func (r Reject) String() string {
	if int(r) < len(rejectNames) {
		return rejectNames[r]
	}
	return "unknown"
}

// binding is what the Edge itself knows about a terminal (SPEC H8): the
// transport identity of the session that carried it (node, generation) and
// the immutable lease it belongs to (provider, target), plus whether that
// generation is still current (the lease was not fenced).
type binding struct {
	key     pool.Key
	gen     uint64
	target  string
	current bool
}

// record is the health state of one provider (node, provider) at one
// generation of its node; a newer generation starts a fresh record (H9).
type record struct {
	gen        uint64 // generation the fields below belong to
	lastSeq    uint64 // highest health_observation_seq accepted at gen
	overlaid   bool   // an overlay this machine set at gen is in force
	overlaySeq uint64 // seq of the observation that set it
	target     string // target of that stall: what the recovery probe asks about
}

// machine is the pure provider-health state machine: no I/O, no
// clock, no locks. Its transitions return verdicts; the Tracker carries
// out their effects on the pool and reports the pool's answer back.
type machine struct {
	provs map[pool.Key]*record
}

func newMachine() *machine { return &machine{provs: make(map[pool.Key]*record)} }

// rec returns k's record for generation gen: a newer generation replaces
// an older record (no inheritance, H9); nil when gen is older than the
// record's (a terminal of a superseded connection).
func (m *machine) rec(k pool.Key, gen uint64) *record {
	r := m.provs[k]
	switch {
	case r == nil || r.gen < gen:
		r = &record{gen: gen}
		m.provs[k] = r
	case r.gen > gen:
		return nil
	}
	return r
}

// stallVerdict is the decision on one stall terminal.
type stallVerdict struct {
	reject Reject
	health string // validated provider_health; "" when rejected
	seq    uint64
	// fresh: seq is above every seq accepted for (node, gen, provider).
	fresh bool
	// setOverlay: effect pool.SetOverlay(key, gen, seq), then overlaySet.
	setOverlay bool
}

// validate checks stall evidence f against b (SPEC H2, H3, H8).
func validate(b binding, f *iop.ExecutionFailure) Reject {
	switch {
	case f == nil:
		return RejectMissing
	case f.GetCode() != protocol.CodeResponseStalled.String():
		return RejectCode
	case f.GetAdapter() != b.key.Provider:
		return RejectAdapter
	case f.GetTarget() != b.target:
		return RejectTarget
	}
	var want string
	switch f.GetProviderHealth() {
	case protocol.HealthAvailable:
		want = protocol.LivenessRequestStalled
	case protocol.HealthUnavailable:
		want = protocol.LivenessProviderUnhealthy
	case protocol.HealthUnknown:
		want = protocol.LivenessHealthUnknown
	default:
		return RejectHealth
	}
	if f.GetLivenessClassification() != want {
		return RejectClassification
	}
	if fc := f.GetFence(); fc != protocol.FenceConfirmed && fc != protocol.FenceUnconfirmed {
		return RejectFence
	}
	if !b.current {
		return RejectNotCurrent
	}
	return RejectNone
}

// stall takes one response_stalled terminal (SPEC H8). Validated evidence
// with a fresh seq is accepted (the seq becomes the last accepted one);
// only fresh unavailable evidence asks for the overlay. seq 0 (an unbound
// session, H5) is never fresh. Rejected evidence changes nothing.
func (m *machine) stall(b binding, f *iop.ExecutionFailure) stallVerdict {
	v := stallVerdict{reject: validate(b, f)}
	if v.reject != RejectNone {
		return v
	}
	v.health, v.seq = f.GetProviderHealth(), f.GetHealthObservationSeq()
	r := m.rec(b.key, b.gen)
	if r == nil || v.seq == 0 || v.seq <= r.lastSeq {
		return v
	}
	r.lastSeq, v.fresh = v.seq, true
	v.setOverlay = v.health == protocol.HealthUnavailable
	return v
}

// overlaySet records the pool's answer to SetOverlay(k, gen, seq) asked by
// a stall on target. It reports whether the provider went from not
// overlaid to overlaid (a health transition).
func (m *machine) overlaySet(k pool.Key, gen, seq uint64, target string, applied bool) bool {
	r := m.provs[k]
	if r == nil || r.gen != gen {
		return false
	}
	if !applied {
		// The pool refused: gen is no longer current or k is no longer
		// configured. Nothing of ours is in force.
		r.overlaid = false
		return false
	}
	if r.overlaid {
		return false
	}
	r.overlaid, r.overlaySeq, r.target = true, seq, target
	return true
}

// probeTarget is one overlaid provider the recovery loop asks about
// (SPEC H10): CAPABILITIES for (key.Provider, target) on (key.Node, gen).
type probeTarget struct {
	key    pool.Key
	gen    uint64
	target string
	seq    uint64 // the seq that set the overlay
}

// due lists every overlaid provider, ordered by node then provider.
func (m *machine) due() []probeTarget {
	var out []probeTarget
	for k, r := range m.provs {
		if r.overlaid {
			out = append(out, probeTarget{key: k, gen: r.gen, target: r.target, seq: r.overlaySeq})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key.Node != out[j].key.Node {
			return out[i].key.Node < out[j].key.Node
		}
		return out[i].key.Provider < out[j].key.Provider
	})
	return out
}

// ProbeResult is the outcome of one recovery probe (SPEC H10). The values
// are bounded and safe for logs and metric labels.
type ProbeResult uint8

const (
	ProbeCleared     ProbeResult = iota // fresh available: the overlay goes
	ProbeUnavailable                    // fresh unavailable: kept
	ProbeUnknown                        // fresh unknown: kept
	ProbeStale                          // seq not above the last accepted: ignored
	ProbeMismatch                       // adapter_key or target not the probed binding
	ProbeMalformed                      // not ok, or a key missing or invalid
	ProbeError                          // no answer (timeout, queue full, session lost)
	ProbeNotReady                       // the generation is no longer current: record dropped
	ProbeSuperseded                     // the record changed while the probe ran
)

var probeNames = [...]string{"cleared", "unavailable", "unknown", "stale", "mismatch", "malformed", "error", "not_ready", "superseded"}

func (r ProbeResult) String() string {
	if int(r) < len(probeNames) {
		return probeNames[r]
	}
	return "invalid"
}

// probeVerdict is the decision on one probe answer.
type probeVerdict struct {
	result ProbeResult
	seq    uint64
	// clear: effect pool.ClearOverlay(key, gen, seq), then cleared.
	clear bool
}

// probe takes the answer to the CAPABILITIES command sent for pt (SPEC
// H10): resp and err are Command's results, notReady says err means the
// (node, gen) is no longer the current ready owner. Only an ok answer
// naming exactly pt's adapter and target, with a valid status and a seq
// above every accepted one, is accepted; only an accepted "available"
// asks to clear the overlay. Anything else changes nothing.
func (m *machine) probe(pt probeTarget, resp *iop.NodeCommandResponse, err error, notReady bool) probeVerdict {
	r := m.provs[pt.key]
	if r == nil || r.gen != pt.gen || !r.overlaid {
		return probeVerdict{result: ProbeSuperseded}
	}
	switch {
	case err != nil && notReady:
		delete(m.provs, pt.key) // the pool dropped the overlay with the generation (H9)
		return probeVerdict{result: ProbeNotReady}
	case err != nil:
		return probeVerdict{result: ProbeError}
	case resp == nil || !resp.GetOk():
		return probeVerdict{result: ProbeMalformed}
	}
	res := resp.GetResult()
	key, target, status := res[protocol.KeyAdapterKey], res[protocol.KeyTarget], res[protocol.KeyStatus]
	seq, perr := strconv.ParseUint(res[protocol.KeySeq], 10, 64)
	switch {
	case key == "" || target == "" || perr != nil || seq == 0:
		return probeVerdict{result: ProbeMalformed}
	case key != pt.key.Provider || target != pt.target:
		return probeVerdict{result: ProbeMismatch}
	}
	v := probeVerdict{seq: seq}
	switch status {
	case protocol.HealthAvailable:
		v.result = ProbeCleared
	case protocol.HealthUnavailable:
		v.result = ProbeUnavailable
	case protocol.HealthUnknown:
		v.result = ProbeUnknown
	default:
		return probeVerdict{result: ProbeMalformed}
	}
	if seq <= r.lastSeq {
		return probeVerdict{result: ProbeStale, seq: seq}
	}
	r.lastSeq = seq
	v.clear = v.result == ProbeCleared
	return v
}

// cleared records the pool's answer to ClearOverlay(k, gen, seq). It
// reports whether the provider went from overlaid to not overlaid. A
// refusal means the overlay was no longer in force at gen: the record is
// dropped so it is not probed again.
func (m *machine) cleared(k pool.Key, gen uint64, applied bool) bool {
	r := m.provs[k]
	if r == nil || r.gen != gen {
		return false
	}
	if !applied {
		delete(m.provs, k)
		return false
	}
	was := r.overlaid
	r.overlaid = false
	return was
}

// fenced drops every record of node at gen or older (SPEC H9: a newer
// generation never inherits an overlay). It returns how many overlaid
// records it dropped.
func (m *machine) fenced(node string, gen uint64) int {
	n := 0
	for k, r := range m.provs {
		if k.Node == node && r.gen <= gen {
			if r.overlaid {
				n++
			}
			delete(m.provs, k)
		}
	}
	return n
}
