package edge

import (
	"context"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
)

// sampleSeries feeds the operator page's provider rings from the pool
// every access.SeriesSampleInterval until ctx is done: each provider's leases
// held and effective capacity (SPEC N3, Q8), and the configured model
// groups, so that the series follow a reload.
func sampleSeries(ctx context.Context, p *pool.Pool, s *access.Series) {
	var groups []string
	var samples []access.ProviderSample
	sample := func(now time.Time) {
		groups, samples = groups[:0], samples[:0]
		for _, g := range p.Groups() {
			groups = append(groups, g.Name)
		}
		for _, n := range p.Snapshot() {
			for _, ps := range n.Providers {
				samples = append(samples, access.ProviderSample{
					ProviderKey: access.ProviderKey{Node: n.Node, Provider: ps.ProviderId},
					InFlight:    ps.InFlight, Capacity: ps.Capacity,
				})
			}
		}
		s.Sample(now, groups, samples)
	}
	t := time.NewTicker(access.SeriesSampleInterval)
	defer t.Stop()
	sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			sample(now)
		}
	}
}
