package protocol

import "net/http"

// Code is a failure code: RunEvent.failure_code and
// ProviderTunnelFrame.failure_code of an ERROR (or CANCELLED) terminal, and
// ExecutionFailure.code of a stall (SPEC H1, H4). The wire carries it as a
// string; String gives it.
type Code string

func (c Code) String() string { return string(c) }

// The failure codes. Each one's emitter, terminal, retry and passive-health
// class and client status are in Failures (one row each); Lookup reads them.
const (
	CodeResponseStalled      Code = "response_stalled"
	CodeUnknownAdapter       Code = "unknown_adapter"
	CodeOverCapacity         Code = "over_capacity"
	CodeInvalidRequest       Code = "invalid_request"
	CodeUnsupportedOperation Code = "unsupported_operation"
	CodeCredentialRequired   Code = "credential_required"
	CodeCredentialInvalid    Code = "credential_invalid"
	CodeUpstreamStatus       Code = "upstream_status"
	CodeUpstreamConnect      Code = "upstream_connect"
	CodeUpstreamReset        Code = "upstream_reset"
	CodeUpstreamError        Code = "upstream_error"
	CodeTimeout              Code = "timeout"
	CodeCancelled            Code = "cancelled"
	CodeNodeShutdown         Code = "node_shutdown"
	CodeModelUnavailable     Code = "model_unavailable"
	CodeInternal             Code = "internal_error"
)

// Retry is what a failure before the first byte says about sending the
// request to another provider of its model group (SPEC H11; the Edge's
// re-dispatch). The Edge turns a class into its retry reason (the label of
// iop_edge_request_retries_total).
type Retry uint8

const (
	RetryNever         Retry = iota // the failure is the request's own or would recur anywhere
	RetryConnect                    // no connection to the backend could be opened
	RetryReset                      // the backend closed or reset the connection before the response head
	RetryByStatus                   // decided by the upstream's status: 429, or one of outlier_detection.statuses
	RetryStall                      // a stall; only with a confirmed handoff (SPEC H8, H11)
	RetryProviderError              // the response broke after its head, before any byte reached the client
	RetryOverCapacity               // the node's capacity gate refused it (SPEC E4)
	RetryNodeLost                   // the node went away (its drain timeout cut the work)
	// RetryModelUnavailable: the node's managed backend could not have the
	// model loaded (SPEC U2, U3): an attempt like any other, so the request
	// goes to another provider of its group, never back to the same one.
	RetryModelUnavailable
)

// Health is what a failure says to passive health (internal/edge/outlier):
// an ejecting failure of the provider, a verdict by status, or nothing (the
// verdict stays open: the failure is not the backend's).
type Health uint8

const (
	HealthNone    Health = iota // no verdict
	HealthConnect               // a connect failure: nothing of the request reached the backend; ejects
	// HealthReset: a reset before the response head; the request's own
	// input may cause one, so the Edge counts it only when corroborated.
	HealthReset
	// HealthByStatus: 429 and a failing status (outlier_detection.statuses)
	// are failures (429, 502 and 503 the upstream's own state; others
	// corroborated first, like a reset); any other status is a success.
	HealthByStatus
)

// Failure is what one failure code means to both sides.
type Failure struct {
	Code Code
	// Emitter is the part of the Node that puts the code on a terminal:
	// "adapter" (internal/node/adapter: its boundary checks, the provider
	// call, the stall watchdog) and/or "session" (internal/node/session:
	// before any adapter, e.g. a duplicate run id).
	Emitter string
	// Cancelled: the code rides a RunEvent CANCELLED terminal; otherwise
	// an ERROR (RunEvent or ProviderTunnelFrame). Every code ends its
	// stream (SPEC E3, T2).
	Cancelled bool
	Retry     Retry
	Health    Health
	// Status is the client's HTTP status before any byte. An upstream
	// status on the terminal (RunEvent.upstream_status) decides instead
	// (the run path's class rules, SPEC T5) unless Fixed: the code is the
	// node's own state (a stall, its capacity, its shutdown, a refused
	// lease). ClientCode and Message are the client error's "code" and
	// words; a Message ending in ": " is followed by the terminal's own
	// message (RunEvent.message, ProviderTunnelFrame.message).
	Status     int
	Fixed      bool
	ClientCode string
	Message    string
	// RetryAfter: the client's Retry-After in seconds (0 = none).
	RetryAfter int
}

// Failures is every failure code, each once. The client words never name
// an adapter instance, an upstream address or a Go type (SPEC P4).
var Failures = [...]Failure{
	// The stall watchdog (SPEC H1): idle for the stall timeout; carries
	// ExecutionFailure. The Edge validates it first (SPEC H8).
	{Code: CodeResponseStalled, Emitter: "adapter", Fixed: true, Retry: RetryStall, Status: http.StatusGatewayTimeout, ClientCode: string(CodeResponseStalled),
		Message: "the provider stopped responding (response stalled)"},
	// No adapter instance of that name (SPEC E1); the session's CAPABILITIES
	// answer uses it too.
	{Code: CodeUnknownAdapter, Emitter: "adapter, session", Status: http.StatusBadGateway, ClientCode: "provider_error", Message: "the provider failed to answer"},
	// The instance's capacity gate is full (SPEC E4).
	{Code: CodeOverCapacity, Emitter: "adapter", Fixed: true, Retry: RetryOverCapacity, Status: http.StatusServiceUnavailable, ClientCode: string(CodeOverCapacity),
		Message: "the provider is at capacity; retry later", RetryAfter: 1},
	// The request cannot be served as sent: a bad stall timeout or
	// timeout_sec (SPEC E2), no target or input, input the driver cannot
	// convert (RunEvent.param may name the field), a duplicate run id.
	{Code: CodeInvalidRequest, Emitter: "adapter, session", Status: http.StatusBadRequest, ClientCode: string(CodeInvalidRequest), Message: "invalid request: "},
	// The profile has no path for the operation (SPEC T1).
	{Code: CodeUnsupportedOperation, Emitter: "adapter", Status: http.StatusBadGateway, ClientCode: "provider_error", Message: "the provider failed to answer"},
	// The credential plane is on and the request carries no lease (SPEC C4).
	{Code: CodeCredentialRequired, Emitter: "adapter", Fixed: true, Status: http.StatusBadGateway, ClientCode: "credential_rejected",
		Message: "the provider's node refused the request's credential lease: "},
	// The lease does not open, verify or bind (SPEC C3, C4).
	{Code: CodeCredentialInvalid, Emitter: "adapter", Fixed: true, Status: http.StatusBadGateway, ClientCode: "credential_rejected",
		Message: "the provider's node refused the request's credential lease: "},
	// Run path: the upstream answered a non-2xx status (RunEvent
	// upstream_status, retry_after_ms, message). A tunnel passes the
	// status through as RESPONSE_START instead.
	{Code: CodeUpstreamStatus, Emitter: "adapter", Retry: RetryByStatus, Health: HealthByStatus, Status: http.StatusBadGateway,
		ClientCode: "provider_error", Message: "the provider failed to answer"},
	// The dial failed: refused, unreachable, DNS, dial timeout.
	{Code: CodeUpstreamConnect, Emitter: "adapter", Retry: RetryConnect, Health: HealthConnect, Status: http.StatusBadGateway,
		ClientCode: "provider_unreachable", Message: "the provider could not be reached"},
	// Closed or reset after the dial, before the response head.
	{Code: CodeUpstreamReset, Emitter: "adapter", Retry: RetryReset, Health: HealthReset, Status: http.StatusBadGateway,
		ClientCode: "provider_error", Message: "the provider closed the connection without answering"},
	// After the response head: reset mid-body, a malformed stream, an
	// answer over the node's bounds.
	// An answer in a content coding the node cannot decode says which
	// (RunEvent/ProviderTunnelFrame.message, SPEC B3).
	{Code: CodeUpstreamError, Emitter: "adapter", Retry: RetryProviderError, Status: http.StatusBadGateway, ClientCode: "provider_error",
		Message: "the provider failed to answer: "},
	// The request's timeout_sec expired.
	{Code: CodeTimeout, Emitter: "adapter", Status: http.StatusBadGateway, ClientCode: "provider_error", Message: "the provider failed to answer"},
	// The run's context was cancelled: the Edge's CancelRequest or the
	// session's loss (SPEC E5, E6, T3).
	{Code: CodeCancelled, Emitter: "adapter", Cancelled: true, Status: http.StatusBadGateway, ClientCode: "run_cancelled",
		Message: "the provider run was cancelled"},
	// The node's own drain timeout passed (its SIGTERM): nothing reached
	// the client from this provider.
	{Code: CodeNodeShutdown, Emitter: "adapter", Fixed: true, Retry: RetryNodeLost, Status: http.StatusServiceUnavailable, ClientCode: string(CodeNodeShutdown),
		Message: "the provider's node shut down before the response was complete; retry", RetryAfter: 1},
	// A managed backend could not get the request's model loaded (SPEC
	// U2, U3): no room within the request's deadline, a model that never
	// fits the memory budget, a load that failed, the node closing it.
	// Another provider may have it loaded or room for it; the one that
	// answered it is not asked again for the request (a model that never
	// fits or that it does not have would fail the same at once).
	{Code: CodeModelUnavailable, Emitter: "adapter", Fixed: true, Retry: RetryModelUnavailable, Status: http.StatusServiceUnavailable, ClientCode: string(CodeModelUnavailable),
		Message: "the model could not be loaded on its provider (no memory for it, or its load failed); retry later", RetryAfter: 1},
	// A driver panicked.
	{Code: CodeInternal, Emitter: "adapter", Status: http.StatusBadGateway, ClientCode: "provider_error", Message: "the provider failed to answer"},
}

// Unknown is the row of a code not in Failures (a newer node, a broken
// one): no retry, no health verdict, a 502.
var Unknown = Failure{Status: http.StatusBadGateway, ClientCode: "provider_error", Message: "the provider failed to answer"}

// Lookup returns the row of code; ok is false (and the row Unknown) for a
// code not in Failures.
func Lookup(code string) (f Failure, ok bool) {
	for i := range Failures {
		if string(Failures[i].Code) == code {
			return Failures[i], true
		}
	}
	u := Unknown
	u.Code = Code(code)
	return u, false
}

var retryNames = [...]string{"never", "connect", "reset", "by status", "stall (validated)", "provider_error", "over_capacity", "node_lost", "model_unavailable"}

func (r Retry) String() string {
	if int(r) < len(retryNames) {
		return retryNames[r]
	}
	return "unknown"
}

var healthNames = [...]string{"none", "connect (ejects)", "reset (ejects)", "by status"}

func (h Health) String() string {
	if int(h) < len(healthNames) {
		return healthNames[h]
	}
	return "unknown"
}
