package protocol

import iop "iop/proto/gen/iop"

// Priority classes of the Edge's queue (SPEC G2, G4) as
// RunRequest.priority_class and ProviderTunnelRequest.priority_class name
// them. "" (an older Edge, a direct call) and any other value count as
// ClassInteractive.
const (
	ClassCritical    = "critical"
	ClassInteractive = "interactive"
	ClassBatch       = "batch"
)

// Schemes of an openai_compat adapter's profile_overrides.priority_field
// (SPEC G7): how the backend orders its own "priority" body field.
//
//   - PriorityLowerFirst: a lower value is served first — vLLM with
//     --scheduling-policy priority (its default value is 0), SGLang with
//     --enable-priority-scheduling --schedule-low-priority-values-first.
//     critical -1, interactive 0, batch 1.
//   - PriorityHigherFirst: a higher value is served first — SGLang with
//     --enable-priority-scheduling alone. critical 1, interactive 0,
//     batch -1.
//
// interactive is 0 under both, the value a request without the field has
// on either server, so requests that reach the backend another way rank
// with the interactive class.
const (
	PriorityLowerFirst  = "lower_first"
	PriorityHigherFirst = "higher_first"
)

// PriorityFieldOf is the class → value table of scheme (PriorityLowerFirst
// or PriorityHigherFirst) that the Edge puts in the adapter's
// ConcreteProtocolProfile.priority_field; ok is false for any other
// scheme, "" included.
func PriorityFieldOf(scheme string) (f *iop.PriorityField, ok bool) {
	switch scheme {
	case PriorityLowerFirst:
		return &iop.PriorityField{Critical: -1, Interactive: 0, Batch: 1}, true
	case PriorityHigherFirst:
		return &iop.PriorityField{Critical: 1, Interactive: 0, Batch: -1}, true
	}
	return nil, false
}

// PriorityValue is f's value for class: f.critical for ClassCritical,
// f.batch for ClassBatch, f.interactive for anything else (SPEC G7).
func PriorityValue(f *iop.PriorityField, class string) int32 {
	switch class {
	case ClassCritical:
		return f.GetCritical()
	case ClassBatch:
		return f.GetBatch()
	}
	return f.GetInteractive()
}
