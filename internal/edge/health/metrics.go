package health

import "iop/internal/protocol"

// Metric label values (SPEC H12): every label of every family below takes
// one of these fixed values, never an id, payload, credential or caller
// identity; node and provider names appear in the log events only.
const (
	srcStall = iota // a response_stalled terminal
	srcProbe        // a CAPABILITIES recovery probe
)

var sourceNames = [...]string{"stall", "probe"}

const (
	evAvailable   = iota // accepted, fresh "available"
	evUnavailable        // accepted, fresh "unavailable"
	evUnknown            // accepted, fresh "unknown"
	evStale              // valid, but seq not fresh (or absent)
	evRejected           // invalid or mismatched evidence
	evError              // no answer to a probe
	nEvidence
)

var evidenceNames = [...]string{"available", "unavailable", "unknown", "stale", "rejected", "error"}

func evidenceOf(health string) int {
	switch health {
	case protocol.HealthAvailable:
		return evAvailable
	case protocol.HealthUnavailable:
		return evUnavailable
	default:
		return evUnknown
	}
}

// probeEvidence maps a probe result to its evidence label.
var probeEvidence = [...]int{
	ProbeCleared:     evAvailable,
	ProbeUnavailable: evUnavailable,
	ProbeUnknown:     evUnknown,
	ProbeStale:       evStale,
	ProbeMismatch:    evRejected,
	ProbeMalformed:   evRejected,
	ProbeError:       evError,
	ProbeNotReady:    evError,
	ProbeSuperseded:  evStale,
}

const (
	toUnavailable = iota
	toAvailable
)

var transitionNames = [...]string{protocol.HealthUnavailable, protocol.HealthAvailable}

// Metric names (SPEC H12).
const (
	MetricEvidence    = "iop_edge_provider_health_evidence_total"
	MetricTransitions = "iop_edge_provider_health_transitions_total"
	MetricEligibility = "iop_edge_liveness_recovery_eligibility_total"
	MetricResults     = "iop_edge_liveness_recovery_results_total"
)

// Metric is one counter family: Samples maps a rendered, bounded label set
// (e.g. `source="stall",evidence="unavailable"`) to its value. Every label
// combination is present, zero or not. The shape matches admin.Counter.
type Metric struct {
	Name, Help string
	Samples    func() map[string]float64
}

// Metrics returns the Tracker's four counter families (SPEC H12).
func (t *Tracker) Metrics() []Metric {
	return []Metric{
		{MetricEvidence, "Provider health evidence by source (stall terminal or recovery probe) and verdict (SPEC H8, H10).",
			func() map[string]float64 {
				out := make(map[string]float64, 2*nEvidence)
				for s := range sourceNames {
					for e := range evidenceNames {
						out[`source="`+sourceNames[s]+`",evidence="`+evidenceNames[e]+`"`] = float64(t.evidence[s][e].Load())
					}
				}
				return out
			}},
		{MetricTransitions, "Runtime-unavailable overlay transitions of a provider (SPEC H8-H10).",
			func() map[string]float64 {
				out := make(map[string]float64, len(transitionNames))
				for i, n := range transitionNames {
					out[`to="`+n+`"`] = float64(t.transitions[i].Load())
				}
				return out
			}},
		{MetricEligibility, "Re-dispatch decisions on stalled requests (SPEC H11).",
			func() map[string]float64 {
				out := make(map[string]float64, nEligibility)
				for i, n := range eligibilityNames {
					out[`result="`+n+`"`] = float64(t.eligibility[i].Load())
				}
				return out
			}},
		{MetricResults, "Outcomes of re-dispatched stalled requests (SPEC H11).",
			func() map[string]float64 {
				out := make(map[string]float64, nResults)
				for i, n := range resultNames {
					out[`result="`+n+`"`] = float64(t.results[i].Load())
				}
				return out
			}},
	}
}
