package exchange

// attemptEnded ends the trace's current attempt after the attempt machine
// stepped evRelayEnded with effects fx.
func (x *Exchange) attemptEnded(fx *effects) {
	t := &x.Acc.Trace
	switch {
	case fx.redispatch:
		t.EndAttempt(fx.reason.String(), true)
	case x.ok || x.Acc.Gone():
		t.EndAttempt("", false)
	default:
		code := x.Acc.Rec.Code
		if code == "" {
			code = "failed"
		}
		t.EndAttempt(code, false)
	}
}
