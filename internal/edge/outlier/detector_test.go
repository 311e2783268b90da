package outlier

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/pool"
	"iop/internal/proctest"
	"iop/internal/protocol"
)

func testPool() *pool.Pool {
	p := pool.New(pool.Config{
		Nodes:      []string{"gpu-1"},
		Resources:  []pool.Resource{{Key: kA, Type: "ollama", Capacity: 1, LongCapacity: 1, Operations: []string{protocol.OpChatCompletions}}},
		Groups:     []pool.Group{{Name: "m", Candidates: []pool.Candidate{{Key: kA, Target: "t"}}}},
		MaxWaiters: 8, WaitTimeout: time.Hour,
	}, nil)
	p.NodeReady("gpu-1", 1)
	return p
}

// the Detector ejects in the pool at once, re-admits on its timer
// (pumping a request that waited because every candidate was cooling, with
// no polling in between), logs one line per ejection and re-admission and
// counts ejections by reason.
func TestDetectorEjectsAndReadmits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testPool()
		var logs proctest.Log
		d := New(Options{Pool: p, Policy: Policy{Base: time.Second, Max: time.Minute},
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
		defer d.Close()

		d.Failure(kA, ReasonStatus, 0)
		s := p.Snapshot()[0].Providers[0]
		if s.Health != pool.HealthCooling || s.CoolingReason != "status" || s.CoolingUntil == "" {
			t.Fatalf("after a failure: %v, want cooling with its window", s)
		}
		got := make(chan error, 1)
		go func() {
			l, err := p.Acquire(context.Background(), pool.Request{Model: "m", Operation: protocol.OpChatCompletions})
			if err == nil {
				p.Release(l)
			}
			got <- err
		}()
		synctest.Wait()
		select {
		case err := <-got:
			t.Fatalf("Acquire returned %v while the only provider cools", err)
		default:
		}
		time.Sleep(time.Second) // the bubble's fake clock: the cooling window passes
		synctest.Wait()
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("Acquire after re-admission: %v", err)
			}
		default:
			t.Fatal("re-admission did not pump the waiting request")
		}
		if s := p.Snapshot()[0].Providers[0]; s.Health != pool.HealthHealthy {
			t.Fatalf("after the window: %v, want healthy", s)
		}
		// The streak is kept: the next failure cools for 2 s; a success
		// before it would have reset it.
		d.Failure(kA, ReasonRateLimited, 0)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if s := p.Snapshot()[0].Providers[0]; s.Health != pool.HealthCooling {
			t.Fatalf("1.5 s into a second (2 s) window: %v, want cooling", s)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		d.Success(kA)
		d.Failure(kA, ReasonConnect, 0)
		time.Sleep(time.Second)
		synctest.Wait()
		if s := p.Snapshot()[0].Providers[0]; s.Health != pool.HealthHealthy {
			t.Fatalf("a success reset the streak, so 1 s re-admits: %v", s)
		}
		out := logs.String()
		if n, m := strings.Count(out, `msg="provider ejected"`), strings.Count(out, `msg="provider re-admitted"`); n != 3 || m != 3 {
			t.Fatalf("%d ejection and %d re-admission lines, want 3 and 3:\n%s", n, m, out)
		}
		samples := d.Metrics()[0].Samples()
		for reason, want := range map[string]float64{"status": 1, "rate_limited": 1, "connect": 1, "reset": 0} {
			if v := samples[`reason="`+reason+`"`]; v != want {
				t.Errorf("%s{reason=%q} = %v, want %v", MetricEjections, reason, v, want)
			}
		}
	})
}

// Close stops the pending timers: nothing runs after it (the bubble would
// report a goroutine still waiting), and later calls change nothing.
func TestDetectorClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testPool()
		d := New(Options{Pool: p, Policy: Policy{Base: time.Minute, Max: time.Hour}})
		d.Failure(kA, ReasonReset, 0)
		d.Close()
		d.Failure(kB, ReasonReset, 0)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if s := p.Snapshot()[0].Providers[0]; s.Health != pool.HealthCooling {
			t.Fatalf("after Close the window is not ended by a timer: %v", s)
		}
	})
}
