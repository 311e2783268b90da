package api

import "iop/internal/edge/reply"

// Tracer takes the spans of every sampled request (internal/edge/tracing;
// *tracing.Exporter satisfies it): Export never blocks, Drop counts spans
// dropped before Export (a node's invalid ones).
type Tracer = reply.Tracer

// attemptEnded ends the trace's current attempt after the attempt machine
// stepped evRelayEnded with effects fx.
func (x *exchange) attemptEnded(fx *effects) {
	t := &x.acc.Trace
	switch {
	case fx.redispatch:
		t.EndAttempt(fx.reason.String(), true)
	case x.ok || x.acc.Gone():
		t.EndAttempt("", false)
	default:
		code := x.acc.Rec.Code
		if code == "" {
			code = "failed"
		}
		t.EndAttempt(code, false)
	}
}
