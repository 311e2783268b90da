package exchange

import (
	"fmt"
	"iop/internal/edge/reply"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/outlier"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// class is what one envelope of a node stream says, read once by
// classify: whether it ends the stream, its passive-health verdict, the
// retry reason of a failure before the first byte that another provider
// may not share, and the stall evidence. The client error of an ERROR or
// CANCELLED terminal is runFailure's and nodeFailure's (below; the sinks
// write it).
type class struct {
	terminal bool
	body     int // a tunnel BODY's bytes
	verdict  verdict
	// retryable: a failure another candidate may answer, for retry;
	// holdStart: it is a tunnel RESPONSE_START, held until its END.
	retry     retryReason
	retryable bool
	holdStart bool
	// stall: a response_stalled terminal (SPEC H1); failure is its
	// ExecutionFailure, nil when the node sent none.
	stall   bool
	failure *iop.ExecutionFailure
	// adapter, target: the envelope's typed identity (SPEC H8), which the
	// attempt checks against its lease before any health effect; a tunnel
	// BODY carries none (and no verdict).
	adapter, target string
	// spans: a terminal's relayed node spans (tracing).
	spans []*iop.NodeSpan
}

// classify reads env once (SPEC H1, H8, H11, T2, E3). statuses are the
// upstream statuses that count as a provider failure
// (outlier_detection.statuses); now is the clock a Retry-After date is
// counted from, read only for a failing RESPONSE_START. Failure codes are
// read through their protocol.Failures row: its retry class and health
// class.
func classify(env *iop.Envelope, statuses []int, now func() time.Time) class {
	var c class
	switch k := env.GetKind().(type) {
	case *iop.Envelope_RunEvent:
		ev := k.RunEvent
		c.adapter, c.target = ev.GetAdapter(), ev.GetTarget()
		c.spans = ev.GetTraceSpans()
		switch ev.GetType() {
		case iop.RunEventType_RUN_EVENT_DELTA:
			c.verdict = verdict{kind: verdictSuccess, accepted: true}
		case iop.RunEventType_RUN_EVENT_COMPLETE:
			c.terminal, c.verdict = true, verdict{kind: verdictSuccess, accepted: true}
		case iop.RunEventType_RUN_EVENT_CANCELLED:
			c.terminal = true
		case iop.RunEventType_RUN_EVENT_ERROR:
			c.terminal = true
			status := int(ev.GetUpstreamStatus())
			c.failureCode(ev.GetFailureCode(), status, statuses, ev.GetFailure())
			if c.verdict.kind == verdictFailure && (c.verdict.reason == outlier.ReasonRateLimited || c.verdict.reason == outlier.ReasonStatus) {
				c.verdict.retryAfter = time.Duration(ev.GetRetryAfterMs()) * time.Millisecond
			}
		}
	case *iop.Envelope_TunnelFrame:
		f := k.TunnelFrame
		c.adapter, c.target = f.GetAdapter(), f.GetTarget()
		c.spans = f.GetTraceSpans()
		switch f.GetKind() {
		case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
			status := int(f.GetStatus())
			c.verdict = statusVerdict(status, statuses)
			if c.verdict.kind == verdictFailure {
				c.verdict.retryAfter = parseRetryAfter(headerValue(f.GetHeaders(), "Retry-After"), now())
			}
			c.retry, c.retryable = statusRetry(status, statuses)
			c.holdStart = c.retryable
		case iop.TunnelFrameKind_TUNNEL_FRAME_BODY:
			c.body = len(f.GetBody())
		case iop.TunnelFrameKind_TUNNEL_FRAME_END:
			c.terminal = true
		case iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
			c.terminal = true
			c.failureCode(f.GetFailureCode(), 0, statuses, f.GetFailure())
		}
	}
	return c
}

// failureCode fills c from an ERROR terminal's failure code by its row of
// protocol.Failures; status is the upstream's (run path), 0 when none.
func (c *class) failureCode(code string, status int, statuses []int, f *iop.ExecutionFailure) {
	row, _ := protocol.Lookup(code)
	switch row.Health {
	case protocol.HealthConnect:
		c.verdict = verdict{kind: verdictFailure, reason: outlier.ReasonConnect}
	case protocol.HealthReset:
		c.verdict = verdict{kind: verdictFailure, reason: outlier.ReasonReset, input: true}
	case protocol.HealthByStatus:
		c.verdict = statusVerdict(status, statuses)
	}
	c.retryable = true
	switch row.Retry {
	case protocol.RetryConnect:
		c.retry = retryConnect
	case protocol.RetryReset:
		c.retry = retryReset
	case protocol.RetryProviderError:
		c.retry = retryProviderError
	case protocol.RetryOverCapacity:
		c.retry = retryOverCapacity
	case protocol.RetryNodeLost:
		c.retry = retryNodeLost // the node went away; nothing reached the client
	case protocol.RetryModelUnavailable:
		c.retry = retryModelUnavailable // SPEC U2, U3: another provider, never the same one again
	case protocol.RetryByStatus:
		c.retry, c.retryable = statusRetry(status, statuses)
	case protocol.RetryStall:
		c.retryable = false // only with validated evidence (attempt: phaseChecking)
		c.stall, c.failure = true, f
	default:
		c.retryable = false
	}
}

// statusRetry classifies an upstream status for re-dispatch: rate_limited
// for 429, status for one of statuses.
func statusRetry(status int, statuses []int) (retryReason, bool) {
	switch {
	case status == http.StatusTooManyRequests:
		return retryRateLimited, true
	case slices.Contains(statuses, status):
		return retryStatus, true
	}
	return 0, false
}

// statusVerdict is passive health's verdict on an upstream status: a
// failure for 429 and statuses, a success for any other answer (accepted
// below 400). A 429, 502 or 503 is the upstream's own state (rate
// limited, its backend unreachable, unavailable); any other failing
// status (500, 504, …) may be the request's input's and is a suspicion
// (verdict.input; docs/operating.md, "Passive health").
func statusVerdict(status int, statuses []int) verdict {
	switch r, ok := statusRetry(status, statuses); {
	case !ok:
		return verdict{kind: verdictSuccess, accepted: status < 400}
	case r == retryRateLimited:
		return verdict{kind: verdictFailure, reason: outlier.ReasonRateLimited}
	}
	return verdict{kind: verdictFailure, reason: outlier.ReasonStatus,
		input: status != http.StatusBadGateway && status != http.StatusServiceUnavailable}
}

// The client error of a node's ERROR or CANCELLED terminal, written by the
// sinks (run.go, tunnel.go).

// runFailure is the client-visible error of a run's ERROR event.
func runFailure(ev *iop.RunEvent) *reply.Error {
	e := nodeFailure(ev.FailureCode, ev.Message, ev.Error, ev.UpstreamStatus, ev.Failure)
	if ra := time.Duration(ev.RetryAfterMs) * time.Millisecond; ra > 0 && ev.UpstreamStatus > 0 {
		e.RetryAfter = ra
	}
	// An invalid request the node refused may name its field
	// (RunEvent.param): the client's 400 says it in "param".
	if p := ev.GetParam(); ev.FailureCode == protocol.CodeInvalidRequest.String() && p != "" && len(p) <= 64 {
		e.Param = p
	}
	return e
}

// nodeFailure maps a node's ERROR terminal to the client-visible error:
// the code's row of protocol.Failures (its status, code and words, with the
// terminal's message where the row takes one), except that an upstream
// status on the terminal (run path only) keeps its class for the codes
// that are not the node's own state (SPEC T5): 429 with a Retry-After (the
// upstream's, else 1 s), 503 and 504, a client error (400, 413, 422 …) with
// the upstream's message, any other 5xx 502 with it; 401, 403, 404 and 407
// describe the provider's own setup and are 502. A stall names its idle
// time (SPEC H1). message is the terminal's message field, never its
// legacy error string: that one names the adapter instance and goes to the
// operator's log only (detail).
func nodeFailure(code, message, legacy string, upstreamStatus int32, failure *iop.ExecutionFailure) *reply.Error {
	f, _ := protocol.Lookup(code)
	st := int(upstreamStatus)
	if legacy == "" {
		legacy = "unknown error"
	}
	with := func(words string) string {
		if message == "" {
			return strings.TrimSuffix(words, ": ")
		}
		return words + message
	}
	switch {
	case !f.Fixed && st == http.StatusTooManyRequests:
		return &reply.Error{Status: st, Type: "rate_limit_error", Code: "rate_limited", RetryAfter: time.Second,
			Message: with("the provider is rate limited: "), Detail: legacy}
	case !f.Fixed && passThroughStatus(st):
		return &reply.Error{Status: st, Type: "invalid_request_error", Code: code, Message: with("provider rejected the request: "),
			Detail: legacy}
	case !f.Fixed && (st == http.StatusServiceUnavailable || st == http.StatusGatewayTimeout):
		return &reply.Error{Status: st, Type: "server_error", Code: "provider_unavailable",
			Message: with("the provider is unavailable: "), Detail: legacy}
	case !f.Fixed && st >= 500 && st <= 599:
		return &reply.Error{Status: http.StatusBadGateway, Type: "server_error", Code: "provider_error",
			Message: with("the provider failed: "), Detail: legacy}
	}
	e := &reply.Error{Status: f.Status, Type: errorType(f.Status), Code: f.ClientCode, Message: f.Message,
		RetryAfter: time.Duration(f.RetryAfter) * time.Second, Detail: legacy}
	switch {
	case f.Code == protocol.CodeResponseStalled && failure != nil && failure.IdleMs > 0:
		e.Message = fmt.Sprintf("the provider stopped responding: no output for %d ms (response stalled)", failure.IdleMs)
	case strings.HasSuffix(f.Message, ": "):
		e.Message = with(f.Message)
	}
	return e
}

// errorType is the OpenAI error type of a status.
func errorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 400 && status < 500:
		return "invalid_request_error"
	}
	return "server_error"
}

// passThroughStatus says which upstream statuses on the run path reach the
// client as they are: client errors that describe the client's request. 401,
// 403, 404 and 407 describe the provider's own setup and become 502.
func passThroughStatus(s int) bool {
	switch s {
	case 401, 403, 404, 407:
		return false
	}
	return s >= 400 && s < 500
}

// terminal reports whether env ends its stream (SPEC E3, T2).
func terminal(env *iop.Envelope) bool {
	switch k := env.GetKind().(type) {
	case *iop.Envelope_RunEvent:
		switch k.RunEvent.GetType() {
		case iop.RunEventType_RUN_EVENT_COMPLETE, iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
			return true
		}
	case *iop.Envelope_TunnelFrame:
		switch k.TunnelFrame.GetKind() {
		case iop.TunnelFrameKind_TUNNEL_FRAME_END, iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
			return true
		}
	}
	return false
}

func headerValue(hs []*iop.Header, name string) string {
	for _, h := range hs {
		if strings.EqualFold(h.GetName(), name) {
			return h.GetValue()
		}
	}
	return ""
}

// maxRetryAfter bounds a parsed Retry-After (a day).
const maxRetryAfter = 24 * time.Hour

// parseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3):
// delay-seconds or an HTTP date, counted from now. 0 for an empty,
// malformed or past value; at most maxRetryAfter.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		if n > uint64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return max(0, min(d, maxRetryAfter))
}
