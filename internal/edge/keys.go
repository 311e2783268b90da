package edge

import (
	"fmt"
	"log/slog"

	"iop/internal/edge/config"
	"iop/internal/edge/keys"
)

// keyRuntime is the edge's side of client API keys (docs/keys.md): the
// Loader that keeps the Registry current from api_keys and the key store
// (SIGHUP, a poll of the file; K2), and the Persister of this edge's usage
// file (K7), nil without one.
type keyRuntime struct {
	loader  *keys.Loader
	reg     *keys.Registry
	persist *keys.Persister
}

// loadKeys reads cfg's api_keys, key store and usage file; a store or a
// usage file that does not load is an error (there is nothing previous to
// keep at start). log may be nil (edge -check).
func loadKeys(cfg *config.Config, log *slog.Logger) (*keyRuntime, error) {
	l, reg, err := keys.NewLoader(cfg, log)
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	kr := &keyRuntime{loader: l, reg: reg}
	if cfg.Keys.UsageFile != "" {
		kr.persist = keys.NewPersister(reg, cfg.Keys.UsageFile, cfg.Keys.UsageFlush(), nil, log)
		if err := kr.persist.Restore(); err != nil {
			return nil, fmt.Errorf("keys: %w", err)
		}
	}
	return kr, nil
}
