package edge

import (
	"testing"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/pool"
	"iop/internal/edge/routing"
	"iop/internal/protocol"
)

// Q3 cost of a turn: a finished request's access record calibrates its
// provider's prefill speed only when its first byte was a first token (a
// completed streamed answer on its first attempt); other records only pair
// with their lease.
func TestObserveFirstByte(t *testing.T) {
	k := pool.Key{Node: "gpu-1", Provider: "llama"}
	streamed := access.Record{Node: k.Node, Provider: k.Provider, Path: access.PathTunnel, Outcome: access.OK,
		QueueWait: 100 * time.Millisecond, TTFB: 2100 * time.Millisecond, Duration: 3 * time.Second}
	rows := []struct {
		name    string
		rec     func(r access.Record) access.Record
		changes bool
	}{
		{"a streamed answer calibrates", func(r access.Record) access.Record { return r }, true},
		{"a non-streamed answer (first byte with the body) does not",
			func(r access.Record) access.Record { r.Duration = r.TTFB + time.Millisecond; return r }, false},
		{"a retried request does not", func(r access.Record) access.Record { r.Retries = 1; return r }, false},
		{"a failed request does not", func(r access.Record) access.Record { r.Outcome = access.UpstreamError; return r }, false},
		{"a request without a lease does not", func(r access.Record) access.Record { r.Node, r.Path = "", access.PathNone; return r }, false},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			p := pool.New(pool.Config{Nodes: []string{"gpu-1"}, MaxWaiters: 1,
				Resources: []pool.Resource{{Key: k, Type: "openai_compat", Capacity: 1, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}}},
				Groups:    []pool.Group{{Name: "conv", Routing: routing.PrefixAffinity, Balance: 1, Candidates: []pool.Candidate{{Key: k, Target: "m"}}}}},
				pool.SystemClock())
			p.NodeReady("gpu-1", 1)
			l, err := p.Acquire(t.Context(), pool.Request{Model: "conv", Operation: protocol.OpChatCompletions, PromptTokens: 1000, Prefix: []uint64{1}})
			if err != nil {
				t.Fatal(err)
			}
			p.Release(l)
			before := p.PrefillEstimates()[0].TokensPerSecond
			rec := r.rec(streamed)
			observeFirstByte(p, &rec)
			after := p.PrefillEstimates()[0].TokensPerSecond
			if changed := after != before; changed != r.changes {
				t.Errorf("prefill speed %g → %g tokens/s; want changed = %v", before, after, r.changes)
			}
		})
	}
}
