package api

// MetricRetries is the re-dispatch counter family.
const MetricRetries = "iop_edge_request_retries_total"

// MetricFallbacks counts the moves of requests to another model group
// (SPEC V1), by from (the group left), to and reason.
const MetricFallbacks = "iop_edge_fallbacks_total"

// Metric is one counter family: Samples maps a rendered, bounded label set
// to its value, every label value present. The shape matches admin.Counter.
type Metric struct {
	Name, Help string
	Samples    func() map[string]float64
}
