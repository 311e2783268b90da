package pool

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/routing"
)

type outcome struct {
	name string
	l    *Lease
	err  error
}

// start runs Acquire on its own goroutine and, inside a synctest bubble,
// returns once that goroutine is blocked or done, so arrival order is the
// order of start calls.
func start(ctx context.Context, p *Pool, name string, r Request, out chan<- outcome) {
	go func() {
		l, err := p.Acquire(ctx, r)
		out <- outcome{name, l, err}
	}()
	synctest.Wait()
}

func wantStats(t *testing.T, p *Pool, leases, waiters int) {
	t.Helper()
	if l, w := p.Stats(); l != leases || w != waiters {
		t.Fatalf("Stats() = %d leases, %d waiters; want %d, %d", l, w, leases, waiters)
	}
}

func mustAcquire(t *testing.T, p *Pool, r Request) *Lease {
	t.Helper()
	l, err := p.Acquire(context.Background(), r)
	if err != nil {
		t.Fatalf("Acquire(%+v): %v", r, err)
	}
	return l
}

func noOutcome(t *testing.T, out <-chan outcome) {
	t.Helper()
	select {
	case o := <-out:
		t.Fatalf("%s returned (%v, %v) while it should still wait", o.name, o.l, o.err)
	default:
	}
}

// TestPool drives the concurrency wrapper inside synctest bubbles (which
// also fail the test if a goroutine is left blocked) with a fake clock for
// the wait timeout.
func TestPool(t *testing.T) {
	rows := []struct {
		name string
		run  func(t *testing.T, p *Pool, clk *fakeClock)
	}{
		{"Q4 Q5 a queued Acquire gets the lease a Release hands over", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-2", 1)
			a := mustAcquire(t, p, chat("big", 0))
			mustAcquire(t, p, chat("big", 0))
			out := make(chan outcome, 1)
			start(context.Background(), p, "w", chat("big", 0), out)
			noOutcome(t, out)
			wantStats(t, p, 2, 1)
			if !p.Release(a) {
				t.Fatal("Release(a) = false, want true")
			}
			o := <-out
			if o.err != nil || o.l.Key != kLlama || o.l.Target != "big-l" || o.l.StallTimeoutMs != 5000 {
				t.Fatalf("w got (%+v, %v), want a lease on gpu-2/llama target big-l stall 5000", o.l, o.err)
			}
			if n := clk.pending(); n != 0 {
				t.Fatalf("%d wait timers still armed after the grant, want 0", n)
			}
			wantStats(t, p, 2, 0)
		}},
		{"Q4 FIFO order across goroutines", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-2", 1)
			held := []*Lease{mustAcquire(t, p, chat("big", 0)), mustAcquire(t, p, chat("big", 0))}
			out := make(chan outcome, 5)
			names := []string{"w1", "w2", "w3", "w4", "w5"}
			for _, n := range names {
				start(context.Background(), p, n, chat("big", 0), out)
			}
			for _, want := range names {
				p.Release(held[0])
				o := <-out
				if o.name != want || o.err != nil {
					t.Fatalf("granted %s (err %v), want %s", o.name, o.err, want)
				}
				held = append(held[1:], o.l)
			}
			for _, l := range held {
				p.Release(l)
			}
			wantStats(t, p, 0, 0)
		}},
		{"Q4 a client leaving while queued removes the waiter and leaks nothing", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-2", 1)
			a := mustAcquire(t, p, chat("big", 0))
			b := mustAcquire(t, p, chat("big", 0))
			ctx, cancel := context.WithCancel(context.Background())
			out := make(chan outcome, 2)
			start(ctx, p, "gone", chat("big", 0), out)
			start(context.Background(), p, "next", chat("big", 0), out)
			cancel()
			if o := <-out; o.name != "gone" || !errors.Is(o.err, context.Canceled) || o.l != nil {
				t.Fatalf("%s got (%v, %v), want gone with context.Canceled", o.name, o.l, o.err)
			}
			wantStats(t, p, 2, 1)
			p.Release(a)
			if o := <-out; o.name != "next" || o.err != nil {
				t.Fatalf("%s got err %v, want next granted", o.name, o.err)
			} else {
				p.Release(o.l)
			}
			p.Release(b)
			wantStats(t, p, 0, 0)
			if n := clk.pending(); n != 0 {
				t.Fatalf("%d wait timers still armed, want 0", n)
			}
		}},
		{"Q4 wait timeout expires on the injected clock", func(t *testing.T, p *Pool, clk *fakeClock) {
			out := make(chan outcome, 1)
			start(context.Background(), p, "w", chat("tiny", 0), out)
			clk.Advance(30*time.Second - time.Nanosecond)
			synctest.Wait()
			noOutcome(t, out)
			clk.Advance(time.Nanosecond)
			o := <-out
			var wt *WaitTimeoutError
			if !errors.As(o.err, &wt) || wt.Model != "tiny" || wt.Waited != 30*time.Second ||
				!strings.Contains(wt.Reason, "node gpu-1 not ready") {
				t.Fatalf("err = %v, want a WaitTimeoutError for tiny after 30s naming gpu-1", o.err)
			}
			wantStats(t, p, 0, 0)
		}},
		{"Q4 queue full through Acquire", func(t *testing.T, p *Pool, clk *fakeClock) {
			out := make(chan outcome, 8)
			for i := range 8 {
				start(context.Background(), p, string(rune('a'+i)), chat("tiny", 0), out)
			}
			_, err := p.Acquire(context.Background(), chat("big", 0))
			var qf *QueueFullError
			if !errors.As(err, &qf) || qf.RetryAfter != QueueFullRetryAfter {
				t.Fatalf("err = %v, want *QueueFullError with Retry-After %s", err, QueueFullRetryAfter)
			}
			clk.Advance(time.Minute)
			for range 8 {
				if o := <-out; !errors.Is(o.err, ErrWaitTimeout) {
					t.Fatalf("%s: err %v, want ErrWaitTimeout", o.name, o.err)
				}
			}
		}},
		{"L8 NodeFenced closes Fenced() and returns each lease once", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-1", 1)
			p.NodeReady("gpu-2", 1)
			a := mustAcquire(t, p, chat("tiny", 0)) // ollama
			b := mustAcquire(t, p, chat("tiny", 0)) // llama
			if got := p.NodeFenced("gpu-1", 1); got != 1 {
				t.Fatalf("NodeFenced returned %d leases, want 1", got)
			}
			select {
			case <-a.Fenced():
			default:
				t.Fatal("Fenced() of the gpu-1 lease is open, want closed")
			}
			select {
			case <-b.Fenced():
				t.Fatal("Fenced() of the gpu-2 lease is closed, want open")
			default:
			}
			if p.Release(a) {
				t.Fatal("Release after fence = true, want false (already returned)")
			}
			if got := p.NodeFenced("gpu-1", 1); got != 0 {
				t.Fatalf("second NodeFenced returned %d, want 0", got)
			}
			if !p.Release(b) {
				t.Fatal("Release(b) = false, want true")
			}
			wantStats(t, p, 0, 0)
		}},
		{"L4 L8 a newer generation's NodeReady fences leases of the older one", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-2", 1)
			a := mustAcquire(t, p, chat("big", 0))
			p.NodeReady("gpu-2", 2)
			select {
			case <-a.Fenced():
			default:
				t.Fatal("Fenced() of the generation-1 lease is open after generation 2 became ready")
			}
			if p.Release(a) {
				t.Fatal("Release of the superseded lease = true, want false")
			}
			b := mustAcquire(t, p, chat("big", 0))
			select {
			case <-b.Fenced():
				t.Fatal("Fenced() of the generation-2 lease is closed")
			default:
			}
			p.Release(b)
			wantStats(t, p, 0, 0)
		}},
		{"L9 a stale NodeReady does not activate an old generation", func(t *testing.T, p *Pool, clk *fakeClock) {
			if !p.NodeReady("gpu-2", 2) || p.NodeReady("gpu-2", 1) || p.NodeReady("gpu-2", 2) {
				t.Fatal("want NodeReady gen 2 true, stale gen 1 false, duplicate gen 2 false")
			}
			if got := mustAcquire(t, p, chat("big", 0)).Generation; got != 2 {
				t.Fatalf("lease generation %d, want 2", got)
			}
		}},
		{"Q4 a lease granted as the client leaves is returned, never leaked", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-2", 1)
			a := mustAcquire(t, p, chat("big", 0))
			mustAcquire(t, p, chat("big", 0))
			for range 50 {
				ctx, cancel := context.WithCancel(context.Background())
				out := make(chan outcome, 1)
				start(ctx, p, "w", chat("big", 0), out)
				cancel()
				p.Release(a) // both the grant and ctx.Done are ready for w
				o := <-out
				switch {
				case o.err == nil:
					a = o.l // w won the race and owns the lease
				case errors.Is(o.err, context.Canceled):
					a = mustAcquire(t, p, chat("big", 0)) // w gave it back
				default:
					t.Fatalf("err %v", o.err)
				}
				wantStats(t, p, 2, 0)
			}
		}},
		{"Q5 Reconfigure fails the waiters of a removed model", func(t *testing.T, p *Pool, clk *fakeClock) {
			out := make(chan outcome, 1)
			start(context.Background(), p, "w", chat("big", 0), out)
			cfg := baseConfig()
			cfg.Groups = cfg.Groups[:1]
			p.Reconfigure(cfg)
			if o := <-out; !errors.Is(o.err, ErrUnknownModel) {
				t.Fatalf("err %v, want ErrUnknownModel", o.err)
			}
			wantStats(t, p, 0, 0)
		}},
		{"H8 H10 Q5 overlay excludes a provider; a fresh clear pumps", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-2", 1)
			if !p.SetOverlay(kLlama, 1, 1) {
				t.Fatal("SetOverlay(seq 1) = false, want true")
			}
			out := make(chan outcome, 1)
			start(context.Background(), p, "w", chat("big", 0), out)
			noOutcome(t, out)
			if p.ClearOverlay(kLlama, 1, 1) {
				t.Fatal("ClearOverlay with a seq not above the last = true, want false")
			}
			noOutcome(t, out)
			if !p.ClearOverlay(kLlama, 1, 2) {
				t.Fatal("ClearOverlay(seq 2) = false, want true")
			}
			if o := <-out; o.err != nil || o.l.Key != kLlama {
				t.Fatalf("w got (%v, %v), want a lease on gpu-2/llama", o.l, o.err)
			} else {
				p.Release(o.l)
			}
		}},
		{"issue16 affinity wait: a pinned Acquire takes the other provider when the wait expires; no timer stays armed", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.Reconfigure(affinityConfig(routing.PrefixAffinity, true)())
			p.NodeReady("gpu-1", 1)
			p.NodeReady("gpu-2", 1)
			home := mustAcquire(t, p, turn(7, 1)).Key
			if k := mustAcquire(t, p, turn(7, 1)).Key; k != home {
				t.Fatalf("the same conversation went to %v, want its holder %v", k, home)
			}
			out := make(chan outcome, 1)
			start(context.Background(), p, "t2", turn(7, 3), out)
			noOutcome(t, out)
			clk.Advance(49 * time.Millisecond)
			noOutcome(t, out)
			clk.Advance(time.Millisecond)
			if o := <-out; o.err != nil || o.l.Key != other(home) {
				t.Fatalf("t2 got (%v, %v), want a lease on %v", o.l, o.err, other(home))
			}
			if n := clk.pending(); n != 0 {
				t.Fatalf("%d timers still armed, want 0", n)
			}
			if r := p.Routing(); r[0].Model != "tiny" || r[0].Mode != "prefix_affinity" || r[0].PrefixHit != 1 || r[0].Hash != 1 || r[0].Fallback != 1 {
				t.Fatalf("Routing()[0] = %+v, want tiny prefix_affinity: 1 hash (first), 1 prefix hit (second), 1 fallback (the expired wait)", r[0])
			}
		}},
		{"issue16 affinity wait: a queued Acquire pinned by the pump waits for its holder, then takes any provider; no timer stays armed", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.Reconfigure(affinityConfig(routing.PrefixAffinity, true)())
			p.NodeReady("gpu-1", 1)
			p.NodeReady("gpu-2", 1)
			t1 := mustAcquire(t, p, turn(7, 1))
			home := t1.Key
			held := map[Key][]*Lease{home: {t1}}
			for c := range uint64(3) { // every other slot, by other conversations
				l := mustAcquire(t, p, turn(20+c, 1))
				held[l.Key] = append(held[l.Key], l)
			}
			out := make(chan outcome, 1)
			start(context.Background(), p, "t2", turn(7, 3), out) // queued: nothing is free
			p.Release(held[other(home)][0])                       // the other frees first: t2 is pinned to its holder
			noOutcome(t, out)
			clk.Advance(49 * time.Millisecond)
			noOutcome(t, out)
			p.Release(held[home][0]) // its holder frees within the affinity wait
			o := <-out
			if o.err != nil || o.l.Key != home {
				t.Fatalf("t2 got (%v, %v), want a lease on its holder %v", o.l, o.err, home)
			}
			if n := clk.pending(); n != 0 {
				t.Fatalf("%d timers still armed after the grant, want 0", n)
			}
			start(context.Background(), p, "t3", turn(7, 5), out) // queued again: the holder is full
			p.Release(held[other(home)][1])
			noOutcome(t, out)
			clk.Advance(50 * time.Millisecond) // the affinity wait expires: any provider
			if o := <-out; o.err != nil || o.l.Key != other(home) {
				t.Fatalf("t3 got (%v, %v), want a lease on %v", o.l, o.err, other(home))
			}
		}},
		{"Q4 a done context is refused before admission", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-2", 1)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := p.Acquire(ctx, chat("big", 0)); !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want context.Canceled", err)
			}
			wantStats(t, p, 0, 0)
		}},
		{"N3 Snapshot is served through the wrapper", func(t *testing.T, p *Pool, clk *fakeClock) {
			p.NodeReady("gpu-1", 1)
			s := p.Snapshot()
			if len(s) != 2 || !s[0].Connected || !s[0].ReadySince.Equal(clk.Now()) || s[1].Connected {
				t.Fatalf("snapshot %+v, want gpu-1 connected since now, gpu-2 not", s)
			}
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clk := newFakeClock()
				row.run(t, New(baseConfig(), clk), clk)
			})
		})
	}
}

// The real clock arms and stops timers.
func TestSystemClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := SystemClock()
		fired := make(chan struct{})
		clk.AfterFunc(time.Second, func() { close(fired) })
		stop := clk.AfterFunc(time.Second, func() { t.Error("stopped timer fired") })
		if !stop() {
			t.Fatal("stop() = false for an armed timer, want true")
		}
		start := clk.Now()
		<-fired
		if got := clk.Now().Sub(start); got != time.Second {
			t.Fatalf("timer fired after %s, want 1s", got)
		}
	})
}
