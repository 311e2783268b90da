package edge

import (
	"context"
	"log/slog"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/batch"
	"iop/internal/edge/config"
	"iop/internal/edge/keys"
	"iop/internal/edge/pool"
)

// openBatches opens batches.dir and returns the Batch and Files API's
// Manager (SPEC X1-X6), nil when batches.dir is not set. Each line runs
// as its batch's key through the client handler (Manager.Bind), and a
// batch stops when its key can no longer make requests.
func openBatches(cfg *config.Config, log *slog.Logger, reg *keys.Registry) (*batch.Manager, error) {
	b := cfg.Batches
	if !b.Enabled() {
		return nil, nil
	}
	st, err := batch.Open(b.Dir, batch.Limits{MaxFileBytes: b.MaxFileBytes, MaxLines: b.MaxLines, MaxStorageBytes: b.MaxStorageBytes,
		MaxKeyStorageBytes: b.MaxStorageBytesPerKey, MaxKeyFiles: b.MaxFilesPerKey}, nil)
	if err != nil {
		return nil, err
	}
	return batch.New(batch.Options{
		Store: st,
		// G4: the lines are in the batch class (api.WithPriority, ahead of
		// the Iop-Priority header the lines also carry).
		AsPrincipal: func(ctx context.Context, name string) context.Context {
			return api.WithPriority(api.AsPrincipal(ctx, name), pool.PriorityBatch)
		},
		Owner: func(ctx context.Context) (string, bool) { return api.PrincipalFromContext(ctx) },
		KeyActive: func(name string) error {
			if reg.OpenMode() {
				return nil
			}
			_, err := reg.Lookup(name, time.Now())
			return err
		},
		MaxInFlight: b.MaxInFlight,
		MaxPerKey:   b.MaxPerKey,
		// A line is a request: its body is bounded as a client's (the
		// handler answers a larger one 413); the rest of the line
		// (custom_id, method, url) gets 64 KiB.
		MaxLineBytes: cfg.HTTP.MaxBodyBytes + 64<<10,
		Logger:       log,
	}), nil
}
