package adapter

import (
	"context"
	"fmt"
	"runtime/debug"

	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Probe runs one bounded, fail-closed exact-target health probe of an
// adapter instance (SPEC H1, H2, H10) and returns "available",
// "unavailable" or "unknown". Ollama: GET /api/tags lists target
// (tag-aware: "tiny" matches "tiny:latest"). openai_compat: the profile's
// health_path answers 2xx and, when the profile has a models path, the
// models list names target. An unknown adapter or an empty target is
// "unknown". The probe takes no capacity slot (it runs beside a stalled
// attempt) and lasts at most Options.ProbeTimeout (2 s by default) or ctx,
// whichever ends first.
//
// Credentials (SPEC C3, H10): with the credential plane on, the Edge sends
// a recovery probe (CAPABILITIES) with a lease for this adapter and target,
// which Probe opens like a request's and puts into the probe's auth
// header, so a models path that needs the key (OpenAI, vLLM --api-key)
// answers the probe instead of 401. A lease that does not open, or one
// sent with the plane off, makes the probe "unknown" without calling the
// upstream; no lease probes without a credential (a public health path).
// The stall probe of a request uses that request's credential.
func (s *Set) Probe(ctx context.Context, adapter, target string, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) (status string) {
	inst, err := s.lookup(adapter, protocol.TypeOllama)
	if err != nil || target == "" {
		return protocol.HealthUnknown
	}
	r, ep := inst.runner, inst.ep
	if l != nil || b != nil {
		if _, err := s.checkPresence(l, b); err != nil {
			s.log.Warn("credential lease rejected", "adapter", inst.name, "probe", true, "err", err)
			return protocol.HealthUnknown
		}
	}
	if l != nil {
		var err error
		ep, err = s.credential(inst, target, l, b)
		if err != nil {
			s.log.Warn("credential lease rejected", "adapter", inst.name, "probe", true, "err", err)
			return protocol.HealthUnknown
		}
		r = inst.runnerFor(ep)
	}
	if inst.managed != nil {
		return s.probeManaged(ctx, inst, ep, target)
	}
	return s.probeWith(ctx, inst, r, target)
}

// probeWith is Probe with the runner that calls the upstream (the
// instance's, or one carrying a request's or a probe lease's credential).
func (s *Set) probeWith(ctx context.Context, inst *instance, r runner, target string) (status string) {
	ctx, cancel := context.WithTimeout(ctx, s.probeTO)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("adapter probe panicked", "adapter", inst.name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			status = protocol.HealthUnknown
		}
	}()
	switch st := r.Probe(ctx, target); st {
	case protocol.HealthAvailable, protocol.HealthUnavailable:
		return st
	}
	return protocol.HealthUnknown
}
