package adapter

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/gopool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// goid is the running goroutine's id, from its stack header.
func goid() uint64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// superviseSet is the part of a Set supervise uses.
func superviseSet(t *testing.T) *Set {
	s := &Set{calls: gopool.New(4), log: slog.New(slog.DiscardHandler), grace: 20 * time.Millisecond,
		observing: make(chan struct{}, maxStuckObservations)}
	t.Cleanup(s.calls.Close)
	return s
}

// terminals records what supervise emitted.
type terminals struct {
	own, stall, ctx atomic.Int32
	ownOn           atomic.Uint64 // the goroutine own ran on
}

func (r *terminals) io(call func() func()) attemptIO {
	return attemptIO{
		call: call,
		fenced: func(st *stallTerminal, _ bool) {
			if st != nil {
				r.stall.Add(1)
			} else {
				r.ctx.Add(1)
			}
		},
		fence: func() {},
		probe: func(context.Context) string { return protocol.HealthAvailable },
	}
}

func (r *terminals) ownTerminal() func() {
	return func() { r.own.Add(1); r.ownOn.Store(goid()) }
}

// H1, H7: a call that returns before its stall timeout and before any
// cancel emits its own terminal on the caller's goroutine, and no
// watchdog loop ever ran (the Set's pool never got a goroutine).
func TestH1CallReturnsFirstNoWatchdogGoroutine(t *testing.T) {
	leakcheck.Check(t)
	s := superviseSet(t)
	var got terminals
	for range 3 {
		a := &attempt{stall: time.Hour}
		a.begin(context.Background())
		s.supervise(context.Background(), a, "r1", "llama", "tiny", got.io(func() func() { return got.ownTerminal() }))
		a.cancel(nil)
	}
	if got.own.Load() != 3 || got.stall.Load() != 0 || got.ctx.Load() != 0 {
		t.Fatalf("terminals own %d stall %d ctx %d, want 3 own", got.own.Load(), got.stall.Load(), got.ctx.Load())
	}
	if on := got.ownOn.Load(); on != goid() {
		t.Fatalf("own terminal on goroutine %d, want the caller's %d", on, goid())
	}
	if n := s.calls.Idle(); n != 0 {
		t.Fatalf("%d watchdog goroutines ran for calls that returned first, want 0", n)
	}
}

// H7: a cancel while the call runs (the watchdog loop takes over, or the
// call's return wins the race to it) leaves the call that then returns
// within the close grace its own terminal, emitted once.
func TestH7CancelCallKeepsItsTerminal(t *testing.T) {
	leakcheck.Check(t)
	s := superviseSet(t)
	s.grace = time.Hour
	for range 20 {
		var got terminals
		ctx, cancel := context.WithCancel(context.Background())
		a := &attempt{stall: time.Hour}
		a.begin(ctx)
		s.supervise(ctx, a, "r1", "llama", "tiny", got.io(func() func() {
			cancel()
			<-a.ctx.Done()
			return got.ownTerminal()
		}))
		a.cancel(nil)
		if got.own.Load() != 1 || got.stall.Load() != 0 || got.ctx.Load() != 0 {
			t.Fatalf("terminals own %d stall %d ctx %d, want 1 own", got.own.Load(), got.stall.Load(), got.ctx.Load())
		}
	}
}

// H1: a call that outlives the stall timeout without activity is fenced by
// the watchdog loop that took over: one stall terminal, no own terminal.
func TestH1StallTakesOverAndFences(t *testing.T) {
	leakcheck.Check(t)
	s := superviseSet(t)
	var got terminals
	a := &attempt{stall: 10 * time.Millisecond}
	a.begin(context.Background())
	s.supervise(context.Background(), a, "r1", "llama", "tiny", got.io(func() func() {
		<-a.ctx.Done() // the watchdog's cancel (errStalled)
		return got.ownTerminal()
	}))
	a.cancel(nil)
	if got.stall.Load() != 1 || got.own.Load() != 0 || got.ctx.Load() != 0 {
		t.Fatalf("terminals own %d stall %d ctx %d, want 1 stall", got.own.Load(), got.stall.Load(), got.ctx.Load())
	}
}
