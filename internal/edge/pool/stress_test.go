package pool

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// stressConfig: one model over three providers of capacity 4 on three nodes.
func stressConfig() Config {
	var cfg Config
	var cands []Candidate
	for _, k := range []Key{kOllama, kLlama, kVLLM} {
		cfg.Resources = append(cfg.Resources, Resource{Key: k, Type: "openai_compat", Capacity: 4, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}})
		cands = append(cands, Candidate{Key: k, Target: "m"})
	}
	cfg.Groups = []Group{{Name: "m", LongContextTokens: 1000, Candidates: cands}}
	cfg.MaxWaiters = 100_000
	return cfg
}

// Q2 Q4: 1,000 goroutines acquire and release over 3 providers of capacity
// 4, some leaving while queued; no provider ever holds more than 4 (nor 1
// long), every lease returns once, and the pool ends empty.
func TestStressCapacity(t *testing.T) {
	leakcheck.Check(t)
	p := New(stressConfig(), SystemClock())
	for _, n := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		p.NodeReady(n, 1)
	}
	var (
		inUse, longInUse [3]atomic.Int32
		over             atomic.Int32
		granted          atomic.Int64
		wg               sync.WaitGroup
	)
	index := map[Key]int{kOllama: 0, kLlama: 1, kVLLM: 2}
	for g := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 5 {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(8) == 0 {
					go cancel() // leave while queued, or race the grant
				}
				tokens := 0
				if rng.IntN(10) == 0 {
					tokens = 1000
				}
				l, err := p.Acquire(ctx, Request{Model: "m", Operation: protocol.OpChatCompletions, PromptTokens: tokens})
				if err != nil {
					cancel()
					continue
				}
				granted.Add(1)
				i := index[l.Key]
				if inUse[i].Add(1) > 4 {
					over.Add(1)
				}
				if l.Long && longInUse[i].Add(1) > 1 {
					over.Add(1)
				}
				runtime.Gosched()
				if l.Long {
					longInUse[i].Add(-1)
				}
				inUse[i].Add(-1)
				if !p.Release(l) {
					t.Error("Q2: Release of a held lease = false")
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if n := over.Load(); n != 0 {
		t.Fatalf("Q2: capacity exceeded %d times", n)
	}
	if granted.Load() == 0 {
		t.Fatal("no lease granted at all")
	}
	wantStats(t, p, 0, 0)
}

// L8 Q2: while one node is fenced and made ready again and again, every
// lease is returned exactly once: by Release (true) or by the fence (then
// Release is false and Fenced is closed), and the fences' counts match the
// leases their holders found fenced.
func TestStressFence(t *testing.T) {
	leakcheck.Check(t)
	p := New(stressConfig(), SystemClock())
	p.NodeReady("gpu-2", 1)
	p.NodeReady("gpu-3", 1)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var fencedReturns, fenceCount atomic.Int64
	wg.Add(1)
	go func() { // the registry's role
		defer wg.Done()
		for gen := uint64(1); ; gen++ {
			p.NodeReady("gpu-1", gen)
			runtime.Gosched()
			fenceCount.Add(int64(p.NodeFenced("gpu-1", gen)))
			select {
			case <-stop:
				p.NodeReady("gpu-1", gen+1)
				return
			default:
			}
		}
	}()
	var workers sync.WaitGroup
	for g := range 200 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for range 20 {
				l, err := p.Acquire(context.Background(), Request{Model: "m", Operation: protocol.OpChatCompletions, PromptTokens: g % 2 * 1000})
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				runtime.Gosched()
				released := p.Release(l)
				if released {
					continue
				}
				select {
				case <-l.Fenced():
					fencedReturns.Add(1)
				default:
					t.Error("L8: Release = false for a lease that was not fenced")
				}
			}
		}()
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	if fencedReturns.Load() != fenceCount.Load() {
		t.Fatalf("L8: fences returned %d leases, holders saw %d fenced", fenceCount.Load(), fencedReturns.Load())
	}
	wantStats(t, p, 0, 0)
}
