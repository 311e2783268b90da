// Package access owns the Edge's per-request accounting: the access record
// the HTTP layer fills while it serves one client request, the outcome
// classification (ok, client_cancelled, upstream_error, stalled, rejected,
// timeout, rate_limited), the one slog JSON access-log line written at the
// request's end, the request metrics (iop_edge_requests_total, the
// duration, time-to-first-byte and queue-wait histograms, tokens, requests
// in flight), the bounded list of the last errors the operator page shows,
// the page's last 15 minutes in fixed rings (Series: requests, errors, time
// to first byte, tokens per model group; providers' in-flight against
// capacity, sampled by the Edge), and the request id (X-Request-Id) rules.
//
// It must never see a request or response body, an API key, a lease or any
// other secret (SPEC P4): a Record holds names, numbers and codes only, and
// every metric label value comes from a fixed set or from the configured
// model names (unconfigured models are counted under OtherModel). It does
// no I/O besides the log line and never blocks the request: Observe takes
// one short mutex.
package access

import (
	"context"
	"encoding/hex"
	"iop/internal/protocol"
	"log/slog"
	"time"
	"unicode/utf8"
)

// Outcome is how one request ended; every request gets exactly one.
type Outcome string

// The outcomes. The HTTP layer sets ClientCancelled itself;
// Classify derives the others from the response.
const (
	// OK: the response was complete (2xx/3xx, no error event).
	OK Outcome = "ok"
	// ClientCancelled: the client went away (disconnect, failed write)
	// before the response was complete, whether queued or streaming.
	ClientCancelled Outcome = "client_cancelled"
	// UpstreamError: the provider, its node or the connection to it failed
	// (502, a provider 5xx, an error event after bytes, a cut body).
	UpstreamError Outcome = "upstream_error"
	// Stalled: the provider stopped producing output (failure_code
	// response_stalled, SPEC H1): 504 or an error event.
	Stalled Outcome = "stalled"
	// Rejected: the request was refused for what it is or when it came:
	// bad input, authentication, unknown model or path, too large, or the
	// Edge is draining (4xx other than 408 and 429; 503 draining).
	Rejected Outcome = "rejected"
	// Timeout: an Edge-side wait ran out: no provider within
	// queue.wait_timeout_ms (503), the response-wait timeout (504), the
	// body read timeout (408), or a drain timeout ended the stream (the
	// Edge's, edge_shutdown, or its node's, node_shutdown).
	Timeout Outcome = "timeout"
	// RateLimited: 429, from the queue bound or a per-key limit (the
	// provider's own 429 on the tunnel path too), or the Edge's own load
	// shedding (503 too_many_connections, server_overloaded).
	RateLimited Outcome = "rate_limited"
)

// Outcomes lists every Outcome, in a fixed order (metrics, tests).
var Outcomes = [...]Outcome{OK, ClientCancelled, UpstreamError, Stalled, Rejected, Timeout, RateLimited}

// Paths a request takes to a provider (SPEC Q3); PathNone when it never got
// a lease.
const (
	PathTunnel = "tunnel"
	PathRun    = "run"
	PathNone   = "none"
)

// Error codes whose outcome is not told by the status alone.
const (
	// CodeStalled is failure_code response_stalled (SPEC H1).
	CodeStalled = string(protocol.CodeResponseStalled)
	// CodeResponseTimeout is the Edge's response-wait timeout.
	CodeResponseTimeout = "response_timeout"
	// CodeNoProvider is a queue wait that ran out (SPEC Q4).
	CodeNoProvider = "no_provider_available"
	// CodeDraining answers a request that came after SIGTERM (503).
	CodeDraining = "edge_draining"
	// CodeShutdown ends a request the drain timeout cut (SPEC: surface's
	// error event, 503 before any byte).
	CodeShutdown = "edge_shutdown"
	// CodeNodeShutdown ends a request its node's own drain timeout cut
	// (the node's SIGTERM; 503 or an error event).
	CodeNodeShutdown = string(protocol.CodeNodeShutdown)
	// CodeTooManyConnections and CodeOverloaded are the Edge's own load
	// shedding (http.max_connections, http.max_inflight_body_bytes; 503
	// with Retry-After, internal/edge/api limits.go): rate_limited.
	CodeTooManyConnections = "too_many_connections"
	CodeOverloaded         = "server_overloaded"
)

// StatusClientClosed is the status recorded for a request whose client
// left before any response was written (nginx's 499): nothing was sent.
const StatusClientClosed = 499

// Classify returns the outcome of a response with HTTP status (the status
// line sent, 200 for a stream that later failed) whose error, if any, had
// code (failed reports whether an error response or error event was
// written, or the response was cut). The HTTP layer sets ClientCancelled
// itself; Classify never returns it.
func Classify(status int, code string, failed bool) Outcome {
	switch code {
	case CodeStalled:
		return Stalled
	case CodeResponseTimeout, CodeNoProvider, CodeShutdown, CodeNodeShutdown:
		return Timeout
	case CodeDraining:
		return Rejected
	case CodeTooManyConnections, CodeOverloaded:
		return RateLimited
	}
	switch {
	case status == 429:
		return RateLimited
	case status == 408 || status == 504:
		return Timeout
	case status >= 500:
		return UpstreamError
	case status >= 400:
		return Rejected
	case failed:
		return UpstreamError // an error event or a cut body after a 2xx
	}
	return OK
}

// Record is one request's access record. The HTTP layer fills it as the
// request goes (one goroutine at a time: the request's own), and writes it
// once at the end with Log and Metrics.Observe. Durations are zero when the
// step did not happen; TTFB is zero when nothing was written.
//
// A field another part of the HTTP layer adds (say, a rate-limit bucket)
// goes here with its log key in Attrs.
type Record struct {
	// Start is when the request arrived.
	Start time.Time
	// RequestID is the X-Request-Id (the client's, sanitized, or minted).
	RequestID string
	// Principal is the api_keys entry's name; "" in open mode or before
	// authentication.
	Principal string
	// Class is the request's priority class in the queue (critical,
	// interactive or batch; SPEC G4), "" when it never reached the queue.
	Class string
	// Surface is the endpoint's operation: chat_completions, responses,
	// messages, count_tokens, models, or "other" (404s, healthz).
	Surface string
	// Model is the model the client named (at most MaxModelLen bytes);
	// Known says whether it is a configured model group.
	Model string
	Known bool
	// ServedModel is the model group that served the request when a
	// fallback moved it from Model (SPEC V1), else ""; Fallback the
	// condition that did (unavailable, queue_full, context, wait_ms).
	ServedModel, Fallback string
	// Node and Provider of the (last) lease; empty without one.
	Node, Provider string
	// Path is PathTunnel, PathRun or PathNone.
	Path string
	// Status is the HTTP status sent (StatusClientClosed when the client
	// left before any byte).
	Status int
	// Outcome: exactly one per request.
	Outcome Outcome
	// Code is the error code of the failure written, if any (e.g.
	// "queue_full", "response_stalled").
	Code string
	// Error is the message of that failure as the client saw it (never
	// a body, a key or an upstream address).
	Error string
	// QueueWait is the time spent in Pool.Acquire (all attempts).
	QueueWait time.Duration
	// TTFB is from Start to the first response byte (the status line).
	TTFB time.Duration
	// Duration is from Start to the end of the response.
	Duration time.Duration
	// PromptTokens and CompletionTokens as the provider reported them
	// (SPEC T2 USAGE, E8 usage); 0 when it reported none.
	PromptTokens, CompletionTokens int64
	// Retries counts dispatches after the first (SPEC H11 re-dispatch).
	Retries int
	// IgnoredFields lists what the run path accepted and did not send to
	// the backend (surface.Ignored.Header: at most 8 sanitized paths and a
	// count); "" when nothing. IgnoredRows are the field-table rows of the
	// listed paths ("" for a top-level member), the metric's bounded label.
	IgnoredFields string
	IgnoredRows   []string
	// TraceID is the request's trace (W3C trace-id), zero with tracing
	// off; logged as 32 hex digits, "" when zero.
	TraceID [16]byte
}

// MaxModelLen bounds the model name kept in a Record, bytes.
const MaxModelLen = 128

// MaxErrorLen bounds the error message kept in a Record, bytes: a message
// may quote the client's input (an unknown model or field name, up to
// http.max_body_bytes), and the record goes to the log and the last
// errors of /status.
const MaxErrorLen = 512

// BoundError shortens msg to at most MaxErrorLen bytes, cut at a UTF-8
// boundary and marked with "…".
func BoundError(msg string) string {
	if len(msg) <= MaxErrorLen {
		return msg
	}
	n := MaxErrorLen - len("…")
	for n > 0 && !utf8.RuneStart(msg[n]) {
		n--
	}
	return msg[:n] + "…"
}

// Msg is the access-log line's message.
const Msg = "access"

// Log writes r as one Info line with message Msg: every field under a
// snake_case key, durations in whole ms (queue_wait_ms, ttfb_ms,
// duration_ms). The attributes are built on Log's stack (Attrs would put
// them on the heap): the line costs one allocation, slog's record overflow
// past its 5 inline attributes.
func (r *Record) Log(ctx context.Context, l *slog.Logger) {
	if l == nil || !l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	var a [nAttrs]slog.Attr
	r.fill(&a)
	l.LogAttrs(ctx, slog.LevelInfo, Msg, a[:]...)
}

// nAttrs is the number of attributes of an access line.
const nAttrs = 21

// Attrs are r's log attributes (those Log writes).
func (r *Record) Attrs() []slog.Attr {
	var a [nAttrs]slog.Attr
	r.fill(&a)
	return a[:]
}

func (r *Record) fill(a *[nAttrs]slog.Attr) {
	path := r.Path
	if path == "" {
		path = PathNone
	}
	*a = [nAttrs]slog.Attr{
		slog.String("request_id", r.RequestID),
		slog.String("principal", r.Principal),
		slog.String("surface", r.Surface),
		slog.String("model", r.Model),
		slog.String("served_model", r.ServedModel),
		slog.String("fallback", r.Fallback),
		slog.String("node", r.Node),
		slog.String("provider", r.Provider),
		slog.String("path", path),
		slog.Int("status", r.Status),
		slog.String("outcome", string(r.Outcome)),
		slog.String("code", r.Code),
		slog.String("error", r.Error),
		slog.Int64("queue_wait_ms", ms(r.QueueWait)),
		slog.Int64("ttfb_ms", ms(r.TTFB)),
		slog.Int64("duration_ms", ms(r.Duration)),
		slog.Int64("prompt_tokens", r.PromptTokens),
		slog.Int64("completion_tokens", r.CompletionTokens),
		slog.Int("retries", r.Retries),
		slog.String("ignored_fields", r.IgnoredFields),
		slog.String("trace_id", traceID(&r.TraceID)),
	}
}

// traceID is id in lowercase hex, "" when all zero.
func traceID(id *[16]byte) string {
	if *id == [16]byte{} {
		return ""
	}
	return hex.EncodeToString(id[:])
}

// ms is d in whole milliseconds, rounded to the nearest (the histograms
// keep the precise seconds). Integers because slog's JSON handler encodes
// a float through encoding/json, several times the cost of an integer.
func ms(d time.Duration) int64 {
	return int64((d + time.Millisecond/2) / time.Millisecond)
}
