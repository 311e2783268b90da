package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/dispatch"
	"iop/internal/edge/health"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Re-dispatch before the first byte (SPEC H11).
//
// A request whose attempt fails before anything reached the client, in a
// way another provider may not share, goes to a candidate of its model
// group it has not tried yet: the pool is asked again with the providers
// already tried excluded (pool.Request.Exclude), so no provider gets the
// same request twice. The failures, each a retry reason (the label of
// iop_edge_request_retries_total):
//
//	connect         the node could not open a connection to the backend (upstream_connect)
//	reset           the backend closed or reset it before the response head (upstream_reset)
//	status          the backend answered one of outlier_detection.statuses (502, 503, 504)
//	rate_limited    the backend answered 429
//	stall           response_stalled with a confirmed handoff (SPEC H8, H11)
//	provider_error  the response broke after its head but before any byte reached the client (upstream_error)
//	over_capacity   the node's capacity gate refused it (SPEC E4)
//	node_lost       the node could not take it, its connection was lost (dispatch error, fence),
//	                or its drain timeout cut the work (node_shutdown)
//
// Bounds: at most models[].max_attempts providers per request (default:
// every provider of the group once); never after a byte was written (the
// body is dropped then); never once the client left. A re-dispatch after a
// stall waits at most Options.RedispatchWait for its lease; any other
// re-dispatch only until the request's deadline (its arrival plus
// queue.wait_timeout_ms), after which the failure is answered. When no
// candidate can take the request the client gets the last failure in its
// surface's shape: the upstream's own answer on the tunnel path (429 with
// its Retry-After, 503, …) and its class on the run path (errors.go
// nodeFailure); a stall is a 504.
//
// Passive health (internal/edge/outlier) hears every attempt's verdict
// before the re-dispatch, so the failed provider is already cooling when
// the pool picks again: connect, reset, status and rate_limited eject;
// any answer that is not one of those is a success.

// retryReason is why an attempt failed before the first byte.
type retryReason uint8

const (
	retryConnect retryReason = iota
	retryReset
	retryStatus
	retryRateLimited
	retryStall
	retryProviderError
	retryOverCapacity
	retryNodeLost
	nRetryReasons
)

var retryNames = [nRetryReasons]string{"connect", "reset", "status", "rate_limited", "stall", "provider_error",
	"over_capacity", "node_lost"}

func (r retryReason) String() string { return retryNames[r] }

// MetricRetries is the re-dispatch counter family.
const MetricRetries = "iop_edge_request_retries_total"

// Metric is one counter family: Samples maps a rendered, bounded label set
// to its value, every label value present. The shape matches admin.Counter.
type Metric struct {
	Name, Help string
	Samples    func() map[string]float64
}

// Metrics returns iop_edge_request_retries_total{reason}: requests sent to
// another provider after a failure before the first byte.
func (h *Handler) Metrics() []Metric {
	return []Metric{{MetricRetries,
		"Requests re-dispatched to a provider not tried yet after a failure before the first byte, by reason.",
		func() map[string]float64 {
			out := make(map[string]float64, nRetryReasons)
			for r := range nRetryReasons {
				out[`reason="`+r.String()+`"`] = float64(h.retries[r].Load())
			}
			return out
		}}}
}

// Outlier is passive health as the surface feeds it; *outlier.Detector
// satisfies it. Failure: provider k failed a request before the first
// byte (retryAfter: a 429's Retry-After, 0 = none); Success: it answered.
type Outlier interface {
	Failure(k pool.Key, r outlier.Reason, retryAfter time.Duration)
	Success(k pool.Key)
}

// retry is an attempt that failed before any byte reached the client.
// Its sink answers the request when no other candidate takes it: the
// envelopes it held back are handed to it (the upstream's own answer, or
// the ERROR terminal), or err is written when there are none.
type retry struct {
	reason retryReason
	sink   sink
	envs   []*iop.Envelope
	err    *apiError
	size   int // body bytes held
}

// maxHeldFailure bounds the body of a failing tunnel response held back
// for a possible re-dispatch (bytes); a larger one is passed through.
const maxHeldFailure = 64 << 10

// mayRetry reports whether x may still go to another provider: re-dispatch
// is on, its attempt bound is not used up, nothing was written (the body is
// still there), the client is there and, unless after a stall, its
// deadline has not passed.
func (h *Handler) mayRetry(x *exchange, stall bool) bool {
	switch {
	case h.o.RedispatchWait < 0, len(x.tried) >= x.bound, x.body == nil, x.ctx.Err() != nil:
		return false
	case !stall && !x.deadline.IsZero() && !time.Now().Before(x.deadline):
		return false
	}
	return true
}

// statusReason classifies an upstream status: rate_limited for 429,
// status for one of outlier_detection.statuses.
func (x *exchange) statusReason(status int) (retryReason, bool) {
	switch {
	case status == http.StatusTooManyRequests:
		return retryRateLimited, true
	case slices.Contains(x.statuses, status):
		return retryStatus, true
	}
	return 0, false
}

// codeReason classifies a node's failure code of an ERROR terminal by its
// retry class (protocol.Failures).
func codeReason(code string) (retryReason, bool) {
	f, _ := protocol.Lookup(code)
	switch f.Retry {
	case protocol.RetryConnect:
		return retryConnect, true
	case protocol.RetryReset:
		return retryReset, true
	case protocol.RetryProviderError:
		return retryProviderError, true
	case protocol.RetryOverCapacity:
		return retryOverCapacity, true
	case protocol.RetryNodeLost:
		return retryNodeLost, true // the node went away; nothing reached the client
	}
	return 0, false
}

// holdResult is what holdFailure did with an envelope.
type holdResult uint8

const (
	holdNone  holdResult = iota // not a failure: deliver passes env on
	holdKept                    // held back; relay reads on
	holdDone                    // the failing attempt ended: x.retry is set, relay stops
	holdFlush                   // held too much: pass everything held on, no re-dispatch
)

// holdFailure runs before the sink sees env and keeps a failure that may
// be re-dispatched away from the client: a tunnel RESPONSE_START with a
// failing status (and its body, up to maxHeldFailure, until END), or an
// ERROR terminal with a retryable failure code, while nothing was written.
func (h *Handler) holdFailure(x *exchange, s sink, env *iop.Envelope) holdResult {
	if r := x.holding; r != nil {
		r.envs = append(r.envs, env)
		if f := env.GetTunnelFrame(); f != nil {
			r.size += len(f.Body)
		}
		switch {
		case terminal(env):
			x.retry, x.holding = r, nil
			return holdDone
		case r.size > maxHeldFailure:
			return holdFlush
		}
		return holdKept
	}
	if s.wrote() {
		return holdNone
	}
	switch k := env.GetKind().(type) {
	case *iop.Envelope_TunnelFrame:
		f := k.TunnelFrame
		switch f.GetKind() {
		case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
			if reason, ok := x.statusReason(int(f.GetStatus())); ok && h.mayRetry(x, false) {
				x.holding = &retry{reason: reason, sink: s, envs: []*iop.Envelope{env}}
				return holdKept
			}
		case iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
			if reason, ok := codeReason(f.GetFailureCode()); ok && h.mayRetry(x, false) {
				x.retry = &retry{reason: reason, sink: s, envs: []*iop.Envelope{env}}
				return holdDone
			}
		}
	case *iop.Envelope_RunEvent:
		ev := k.RunEvent
		if ev.GetType() != iop.RunEventType_RUN_EVENT_ERROR {
			return holdNone
		}
		reason, ok := codeReason(ev.GetFailureCode())
		if ev.GetFailureCode() == protocol.CodeUpstreamStatus.String() {
			reason, ok = x.statusReason(int(ev.GetUpstreamStatus()))
		}
		if ok && h.mayRetry(x, false) {
			x.retry = &retry{reason: reason, sink: s, envs: []*iop.Envelope{env}}
			return holdDone
		}
	}
	return holdNone
}

// flushHeld gives up holding a failing response that grew too large: the
// sink gets everything held, in order, and relay goes on as usual.
func (h *Handler) flushHeld(x *exchange, st dispatch.Stream, s sink) bool {
	r := x.holding
	x.holding = nil
	for _, env := range r.envs {
		if h.pass(x, st, s, env) {
			return true
		}
	}
	return false
}

// retryLost keeps a lost node connection (fence, session loss) before any
// byte as a re-dispatchable failure; it reports whether it did.
func (h *Handler) retryLost(x *exchange, s sink, e *apiError) bool {
	if s.wrote() || !h.mayRetry(x, false) {
		return false
	}
	x.retry = &retry{reason: retryNodeLost, sink: s, err: e}
	return true
}

// reacquire re-dispatches x after a failed attempt (x.retry): the failed
// lease goes back first, then the pool picks again among the providers x
// has not tried (waiting at most RedispatchWait after a stall, else until
// x's deadline). With a lease it returns true and x runs again on it; with
// none — no untried candidate, none in time, the client left — the failure
// is answered and it returns false.
func (h *Handler) reacquire(x *exchange) bool {
	r := x.retry
	x.retry = nil
	first := x.lease
	h.releaseLease(x)
	stall := r.reason == retryStall
	var ctx context.Context
	var cancel context.CancelFunc
	if stall || x.deadline.IsZero() {
		ctx, cancel = context.WithTimeout(x.ctx, h.o.RedispatchWait)
	} else {
		ctx, cancel = context.WithDeadline(x.ctx, x.deadline)
	}
	queued := time.Now()
	l, err := h.o.Pool.Acquire(ctx, x.poolRequest())
	setLease(x.acc, l, time.Since(queued))
	cancel()
	if err != nil {
		if stall {
			h.o.Health.RecoveryOutcome(first, nil, x.model, health.RecoveryNoLease)
		}
		if x.ctx.Err() != nil {
			if shuttingDown(x.ctx) {
				writeError(x.out.w, x.ep.surface, shutdownError())
				return false
			}
			x.acc.leave()
			h.log.Debug("client left during re-dispatch", "model", x.model, "request_id", x.acc.rec.RequestID)
			return false
		}
		h.answerRetry(x, r, first, err)
		return false
	}
	h.retries[r.reason].Add(1)
	x.acc.rec.Retries++
	h.log.LogAttrs(x.ctx, slog.LevelInfo, "request re-dispatched", slog.String("request_id", x.acc.rec.RequestID),
		slog.String("model", x.model), slog.String("reason", r.reason.String()),
		slog.String("from_node", first.Node), slog.String("from_provider", first.Provider),
		slog.String("node", l.Node), slog.String("provider", l.Provider), slog.Int("attempt", len(x.tried)+1))
	x.lease, x.released, x.observed = l, false, false
	x.tried = append(x.tried, l.Key)
	if stall {
		x.stallFirst = first
	}
	return true
}

// answerRetry answers x with the failure r of its last attempt on lease
// last, after no other candidate could take it (why).
func (h *Handler) answerRetry(x *exchange, r *retry, last *pool.Lease, why error) {
	detail := "no other provider: " + why.Error()
	if errors.Is(why, pool.ErrAllTried) {
		detail = "every provider of the model was tried"
	}
	if len(r.envs) == 0 {
		if r.sink != nil {
			_ = r.sink.fail(r.err)
		} else {
			writeError(x.out.w, x.ep.surface, r.err)
		}
	}
	for _, env := range r.envs {
		if done, err := r.sink.handle(env); done || err != nil {
			break
		}
	}
	status := 0
	if e := r.err; e != nil {
		status = e.status
	}
	if r.sink != nil {
		if e := r.sink.failure(); e != nil {
			status = e.status
			x.acc.fail(e)
		}
	}
	if f := r.envs; len(f) > 0 {
		if fr := f[0].GetTunnelFrame(); fr != nil && fr.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START {
			status = int(fr.GetStatus())
		}
	}
	h.log.LogAttrs(x.ctx, slog.LevelWarn, "request failed", slog.String("request_id", x.acc.rec.RequestID),
		slog.String("model", x.model), slog.String("node", last.Node), slog.String("provider", last.Provider),
		slog.String("reason", r.reason.String()), slog.Int("status", status), slog.Int("attempts", len(x.tried)),
		slog.String("detail", detail))
}

// observe gives passive health the verdict of x's current attempt, once:
// a failure before the first byte (connect, reset, a failing status, 429
// with its Retry-After) or a success (the upstream answered anything
// else: a response head, a delta, a completion, a client error).
// Envelopes that say nothing yet (START, USAGE, a stall, a node-side
// error) leave it open.
func (h *Handler) observe(x *exchange, env *iop.Envelope) {
	if x.observed || h.o.Outlier == nil {
		return
	}
	var reason outlier.Reason
	var retryAfter time.Duration
	fail := false
	switch k := env.GetKind().(type) {
	case *iop.Envelope_RunEvent:
		ev := k.RunEvent
		switch ev.GetType() {
		case iop.RunEventType_RUN_EVENT_DELTA, iop.RunEventType_RUN_EVENT_COMPLETE:
		case iop.RunEventType_RUN_EVENT_ERROR:
			f, _ := protocol.Lookup(ev.GetFailureCode())
			switch f.Health {
			case protocol.HealthConnect:
				reason, fail = outlier.ReasonConnect, true
			case protocol.HealthReset:
				reason, fail = outlier.ReasonReset, true
			case protocol.HealthByStatus:
				reason, fail = statusOutlier(x, int(ev.GetUpstreamStatus()))
				retryAfter = time.Duration(ev.GetRetryAfterMs()) * time.Millisecond
			default:
				return
			}
		default:
			return
		}
	case *iop.Envelope_TunnelFrame:
		f := k.TunnelFrame
		switch f.GetKind() {
		case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
			reason, fail = statusOutlier(x, int(f.GetStatus()))
			if fail {
				retryAfter = parseRetryAfter(headerValue(f.GetHeaders(), "Retry-After"), time.Now())
			}
		case iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
			switch c, _ := protocol.Lookup(f.GetFailureCode()); c.Health {
			case protocol.HealthConnect:
				reason, fail = outlier.ReasonConnect, true
			case protocol.HealthReset:
				reason, fail = outlier.ReasonReset, true
			default:
				return
			}
		default:
			return
		}
	default:
		return
	}
	x.observed = true
	if fail {
		h.o.Outlier.Failure(x.lease.Key, reason, retryAfter)
		return
	}
	h.o.Outlier.Success(x.lease.Key)
}

// statusOutlier says whether an upstream status is a provider failure for
// passive health, and which.
func statusOutlier(x *exchange, status int) (outlier.Reason, bool) {
	switch r, ok := x.statusReason(status); {
	case !ok:
		return 0, false
	case r == retryRateLimited:
		return outlier.ReasonRateLimited, true
	}
	return outlier.ReasonStatus, true
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
