package node

import (
	"fmt"
	"log/slog"
	"time"

	"iop/internal/node/adapter"
	"iop/internal/node/config"
	"iop/internal/node/managed"
)

// startManaged starts a managed.Backend per managed[] entry of cfg (SPEC
// U1-U5): its preloads begin loading now; each step of one notifies
// residency. The returned close stops every
// process; call it after the last request ended.
func startManaged(cfg *config.Config, log *slog.Logger, residency *adapter.Signal) (map[string]adapter.ManagedBackend, func(), error) {
	var started []*managed.Backend
	closeAll := func() {
		for _, b := range started {
			b.Close()
		}
	}
	if len(cfg.Managed) == 0 {
		return nil, closeAll, nil
	}
	out := map[string]adapter.ManagedBackend{}
	for _, m := range cfg.Managed {
		b, err := managed.New(managed.Config{
			Name: m.Name, Command: m.Command, ModelsDir: m.ModelsDir, Models: m.Models, Env: m.Env,
			HealthPath:   m.HealthPath,
			ReadyTimeout: time.Duration(m.ReadyTimeoutMs) * time.Millisecond,
			IdleUnload:   time.Duration(m.IdleUnloadMs) * time.Millisecond,
			MaxLoaded:    m.MaxLoaded, BudgetMB: m.MemoryBudgetMB, Preload: m.Preload,
			PortFirst: m.PortRange[0], PortLast: m.PortRange[1],
			Logger:   log,
			OnChange: residency.Notify, // SPEC U6: reported at once
		})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("node %s: %w", cfg.NodeID, err)
		}
		started = append(started, b)
		out[m.Name] = b
		log.Info("managed backend ready", "managed", m.Name, "command", m.Command[0], "max_loaded", m.MaxLoaded,
			"memory_budget_mb", m.MemoryBudgetMB, "preload", m.Preload)
	}
	return out, closeAll, nil
}
