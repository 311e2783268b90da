package adapter

import (
	"context"
	"fmt"
	"time"

	"iop/internal/protocol"
)

// ListTimeout bounds one ListModels (at least: Options.ProbeTimeout if
// longer).
const ListTimeout = 5 * time.Second

// ListModels lists the models adapter's backend serves, for discovery
// (SPEC D1): Ollama's GET /api/tags, an openai_compat profile's models
// path; sorted, without duplicates, bounded (upstream.ListModels). It takes
// no capacity slot and lasts at most ListTimeout or ctx. The
// request carries the adapter's own credential (api_key_env), never a
// lease. Errors: an unknown adapter, or the listing's.
func (s *Set) ListModels(ctx context.Context, adapter string) ([]string, error) {
	inst, err := s.lookup(adapter, protocol.TypeOllama)
	if err != nil {
		return nil, err
	}
	if inst.managed != nil {
		return inst.managed.Models() // SPEC U1, D1: its models_dir's files
	}
	l, ok := inst.runner.(interface {
		Models(context.Context) ([]string, error)
	})
	if !ok {
		return nil, fmt.Errorf("adapter %q cannot list models", inst.name)
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.probeTO, ListTimeout))
	defer cancel()
	return l.Models(ctx)
}
