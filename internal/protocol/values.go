package protocol

import "math"

// DefaultStallTimeoutMs is the response-stall timeout (ms) of a request
// whose model provider and adapter set none (SPEC Q6), and of one that
// carries 0 (SPEC E2). The Edge resolves a request's timeout once —
// model provider, then adapter, then this (config.EffectiveStallTimeoutMs)
// — and sends it with every pool call; the Node takes a request's value as
// it is and applies this only to a request that carries 0 (a direct call).
const DefaultStallTimeoutMs = 300000

// Health evidence: ExecutionFailure.provider_health, the CAPABILITIES
// result provider_status and a probe's answer (SPEC H2, H10). Anything else
// is read as HealthUnknown (fail closed).
const (
	HealthAvailable   = "available"
	HealthUnavailable = "unavailable"
	HealthUnknown     = "unknown"
)

// Liveness classifications (ExecutionFailure.liveness_classification),
// each paired with exactly one health value (SPEC H2): available →
// request_stalled, unavailable → provider_unhealthy, unknown →
// health_unknown.
const (
	LivenessRequestStalled    = "request_stalled"
	LivenessProviderUnhealthy = "provider_unhealthy"
	LivenessHealthUnknown     = "health_unknown"
)

// Liveness pairs a health value with its classification (SPEC H2).
func Liveness(health string) string {
	switch health {
	case HealthAvailable:
		return LivenessRequestStalled
	case HealthUnavailable:
		return LivenessProviderUnhealthy
	}
	return LivenessHealthUnknown
}

// Fence values of ExecutionFailure.fence (SPEC H7): confirmed when the
// provider call returned within the close grace, unconfirmed otherwise.
const (
	FenceConfirmed   = "confirmed"
	FenceUnconfirmed = "unconfirmed"
)

// Residency of a model on its provider (SPEC U2, U3): what the node reports
// for each model of a managed backend (from its lifecycle machine) and of
// an Ollama adapter (GET /api/ps). A stopping model still holds its memory
// and serves nothing new.
const (
	ResidencyUnloaded = "unloaded"
	ResidencyLoading  = "loading"
	ResidencyLoaded   = "loaded"
	ResidencyStopping = "stopping"
	ResidencyFailed   = "failed"
)

// HandoffConfirmed is the ExecutionFailure.recovery_handoff the Edge adds
// to a validated stall (SPEC H8). It is a capability hint, never replay
// approval.
const HandoffConfirmed = "confirmed"

// Allow-listed metadata keys of a stall terminal (SPEC H3); the Node's
// session adds MetaObservationSeq (SPEC H5). Nothing else is ever put
// there.
const (
	MetaIdleMs                 = "idle_ms"
	MetaRunID                  = "run_id"
	MetaAttemptID              = "attempt_id"
	MetaFence                  = "fence"
	MetaAdapter                = "adapter"
	MetaTarget                 = "target"
	MetaProviderHealth         = "provider_health"
	MetaLivenessClassification = "liveness_classification"
	MetaObservationSeq         = "health_observation_seq"
)

// Metadata keys of a COMPLETE run event (SPEC E8, E9).
const (
	// MetaToolCalls holds a JSON array of tool calls in OpenAI's shape
	// (id, type "function", function name and arguments as a JSON string).
	MetaToolCalls = "openai_tool_calls"
	// MetaTextToolFallback is "true" when the run used the text tool-call
	// fallback of SPEC E9.
	MetaTextToolFallback = "openai_text_tool_fallback"
)

// Result keys of a CAPABILITIES NodeCommandResponse (SPEC N1, H10).
const (
	KeyAdapterKey = "adapter_key"            // the resolved instance name
	KeyTarget     = "target"                 // the probed target
	KeyStatus     = "provider_status"        // a health value
	KeySeq        = "health_observation_seq" // the connection's next observation sequence (SPEC H5)
	KeyAdapter    = "adapter"                // the adapter the command named (diagnostic)
	KeyInstance   = "instance_key"           // type "/" instance name (diagnostic)
)

// ShareOf is the part of an adapter's capacity one edge may use under a
// node's edges[].capacity_share (0 < share ≤ 1): ceil(capacity × share),
// at least 1 and at most capacity, computed the same way by the node's
// capacity gate and the edge's pool. A share ≤ 0 or above 1, or a capacity
// ≤ 0, gives capacity unchanged.
func ShareOf(capacity int64, share float64) int64 {
	if capacity <= 0 || share <= 0 || share > 1 {
		return capacity
	}
	n := int64(math.Ceil(float64(capacity)*share - 1e-9)) // 10 × 0.3 is 3, not 3.0000000000000004 → 4
	return min(max(n, 1), capacity)
}
