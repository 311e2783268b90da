package adapter

import (
	"context"
	"fmt"
	"runtime/debug"
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
func (s *Set) Probe(ctx context.Context, adapter, target string) (status string) {
	inst, err := s.lookup(adapter, TypeOllama)
	if err != nil || target == "" {
		return HealthUnknown
	}
	ctx, cancel := context.WithTimeout(ctx, s.probeTO)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("adapter probe panicked", "adapter", inst.name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			status = HealthUnknown
		}
	}()
	switch st := inst.runner.Probe(ctx, target); st {
	case HealthAvailable, HealthUnavailable:
		return st
	}
	return HealthUnknown
}
