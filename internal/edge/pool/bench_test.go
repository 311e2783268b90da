package pool

import (
	"context"
	"testing"

	"iop/internal/edge/routing"
	"iop/internal/protocol"
)

// BenchmarkAcquireRelease: one uncontended admit and release (issue target:
// <= 1 µs and <= 2 allocs: the Lease and its Fenced channel).
func BenchmarkAcquireRelease(b *testing.B) {
	p := New(stressConfig(), SystemClock())
	for _, n := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		p.NodeReady(n, 1)
	}
	ctx := context.Background()
	r := Request{Model: "m", Operation: protocol.OpChatCompletions, PromptTokens: 10}
	b.ReportAllocs()
	for b.Loop() {
		l, err := p.Acquire(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		p.Release(l)
	}
}

// BenchmarkAcquireReleaseAffinity: the same under prefix_affinity (issue
// 16), three candidates whose tables hold 1,000 conversations of 12
// boundaries, for a request on its 12th boundary: the table lookups, the
// rendezvous choice and recording the prefix.
func BenchmarkAcquireReleaseAffinity(b *testing.B) {
	cfg := stressConfig()
	cfg.Groups[0].Routing = routing.PrefixAffinity
	cfg.Groups[0].Epsilon = routing.DefaultEpsilon
	p := New(cfg, SystemClock())
	for _, n := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		p.NodeReady(n, 1)
	}
	ctx := context.Background()
	prefix := func(conv uint64) []uint64 {
		out := make([]uint64, 12)
		for i := range out {
			out[i] = conv<<16 | uint64(i)
		}
		return out
	}
	for c := range uint64(1000) {
		l, err := p.Acquire(ctx, Request{Model: "m", Operation: protocol.OpChatCompletions, Prefix: prefix(c)})
		if err != nil {
			b.Fatal(err)
		}
		p.Release(l)
	}
	r := Request{Model: "m", Operation: protocol.OpChatCompletions, PromptTokens: 10, Prefix: prefix(7)}
	b.ReportAllocs()
	for b.Loop() {
		l, err := p.Acquire(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		p.Release(l)
	}
}

// BenchmarkAcquireReleaseParallel: the same from GOMAXPROCS goroutines over
// 12 slots, for the cost of the mutex under contention (no waiting: at most
// GOMAXPROCS leases are held at once).
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	p := New(stressConfig(), SystemClock())
	for _, n := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		p.NodeReady(n, 1)
	}
	r := Request{Model: "m", Operation: protocol.OpChatCompletions, PromptTokens: 10}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			l, err := p.Acquire(ctx, r)
			if err != nil {
				b.Error(err)
				return
			}
			p.Release(l)
		}
	})
}

// BenchmarkPump10000Waiters: 10,000 queued waiters pumped in FIFO order
// through the wrapper (grants handed over their channels), one op = the
// whole queue. "release": capacity 1, each Release grants the next waiter.
// "ready": capacity 10,000, one NodeReady grants them all.
func BenchmarkPump10000Waiters(b *testing.B) {
	const n = 10_000
	setup := func(b *testing.B, capacity int) (*Pool, []*waiter) {
		cfg := stressConfig()
		cfg.Resources = cfg.Resources[:1]
		cfg.Resources[0].Capacity = capacity
		cfg.MaxWaiters = n
		p := New(cfg, SystemClock())
		ws := make([]*waiter, n)
		r := Request{Model: "m", Operation: protocol.OpChatCompletions}
		p.mu.Lock()
		for i := range ws {
			_, c, err := p.s.admit(r)
			if c == nil {
				b.Fatalf("waiter %d not queued: %v", i, err)
			}
			ws[i] = &waiter{model: r.Model, op: r.Operation, ch: make(chan result, 1)}
			p.s.enqueue(c, ws[i], 0)
		}
		p.mu.Unlock()
		return p, ws
	}
	b.Run("release", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			p, ws := setup(b, 1)
			p.NodeReady("gpu-1", 1) // grants ws[0]
			b.StartTimer()
			for i, w := range ws {
				res := <-w.ch // FIFO: waiter i holds the lease now
				if res.l == nil {
					b.Fatalf("waiter %d: %v", i, res.err)
				}
				p.Release(res.l)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/waiter")
	})
	b.Run("ready", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			p, ws := setup(b, n)
			b.StartTimer()
			p.NodeReady("gpu-1", 1)
			for i, w := range ws {
				select {
				case res := <-w.ch:
					if res.l == nil {
						b.Fatalf("waiter %d: %v", i, res.err)
					}
				default:
					b.Fatalf("waiter %d not granted", i)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/waiter")
	})
}
