package pool

import (
	"context"
	"testing"
	"time"

	"iop/internal/edge/routing"
)

// SPEC V1: the predicted wait is the time until the slot the request
// needs frees: 0 while a slot is free for it, else the remaining service
// time of the leases in flight in order, a full service time for every
// round of them the waiters ahead take first.
func TestPredictWait(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, row := range []struct {
		name          string
		ahead, free   int
		ages          []time.Duration
		service, want time.Duration
	}{
		{"a slot is free", 0, 1, []time.Duration{ms(10)}, ms(100), 0},
		{"free slots for every waiter ahead and this one", 2, 3, nil, ms(100), 0},
		{"no slot free: the lease nearest its end", 0, 0, []time.Duration{ms(10), ms(70)}, ms(100), ms(30)},
		{"one ahead: the second lease to end", 1, 0, []time.Duration{ms(10), ms(70)}, ms(100), ms(90)},
		{"a round of waiters ahead: a service time later", 2, 0, []time.Duration{ms(10), ms(70)}, ms(100), ms(130)},
		{"two rounds ahead, capacity 1", 2, 0, []time.Duration{ms(40)}, ms(100), ms(260)},
		{"the free slots go to those ahead first", 3, 2, []time.Duration{ms(50)}, ms(100), ms(150)},
		{"a lease past the service time ends any moment", 0, 0, []time.Duration{ms(500)}, ms(100), 0},
		{"nothing in flight and no slot (limited to none)", 0, 0, nil, ms(100), ms(100)},
	} {
		if got := PredictWait(row.ahead, row.free, row.ages, row.service); got != row.want {
			t.Errorf("%s: PredictWait(%d, %d, %v, %v) = %v, want %v", row.name, row.ahead, row.free, row.ages, row.service, got, row.want)
		}
	}
}

// SPEC V1, V3: a group's state as a fallback decision reads it, from the
// pool without changing it: unavailable (unknown, no live provider, none
// local for a local-only key), queue full, and a predicted wait that
// follows the measured service time of the group's leases (its prior
// before the first one ends, nothing for a group with no wait_ms).
func TestGroupState(t *testing.T) {
	clk := newFakeClock()
	cfg := remoteConfig() // tiny: gpu-1/ollama local (cap 2), gpu-2/llama remote (cap 2); big: llama only
	cfg.Groups[1].Timed = true
	cfg.MaxWaiters = 1
	p := New(cfg, clk)
	state := func(r Request) routing.GroupState { return p.GroupState(r) }
	if got := state(chat("nope", 0)); !got.Unavailable {
		t.Fatalf("an unknown group: %+v, want unavailable", got)
	}
	if got := state(chat("big", 0)); !got.Unavailable {
		t.Fatalf("big before its node is ready: %+v, want unavailable", got)
	}
	p.NodeReady("gpu-1", 1)
	p.NodeReady("gpu-2", 1)
	if got := state(localOnly(chat("big", 0))); !got.Unavailable {
		t.Fatalf("big (remote only) for a local-only key: %+v, want unavailable", got)
	}
	if got := state(chat("big", 0)); got != (routing.GroupState{}) {
		t.Fatalf("big idle: %+v, want a free slot", got)
	}
	ctx := context.Background()
	acquire := func(r Request) *Lease {
		t.Helper()
		l, err := p.Acquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// The first lease ends after 400 ms: big's service time is measured.
	first := acquire(chat("big", 0))
	clk.Advance(400 * time.Millisecond)
	p.Release(first)
	a, b := acquire(chat("big", 0)), acquire(chat("big", 0)) // big (llama, cap 2) full
	clk.Advance(100 * time.Millisecond)
	if got := state(chat("big", 0)); got.Unavailable || got.QueueFull || got.PredictedWait != 300*time.Millisecond {
		t.Fatalf("big full, leases 100 ms old, 400 ms measured: %+v, want a predicted wait of 300ms", got)
	}
	if got := state(localOnly(chat("tiny", 0))); got != (routing.GroupState{}) {
		t.Fatalf("tiny's local route is free for a local-only key: %+v", got)
	}
	if got := state(chat("tiny", 0)); got.PredictedWait != 0 {
		t.Fatalf("tiny is not timed: %+v, want no predicted wait", got)
	}
	p.Release(a)
	p.Release(b)
	if leases, waiters := p.Stats(); leases != 0 || waiters != 0 {
		t.Fatalf("GroupState changed the pool: %d leases, %d waiters", leases, waiters)
	}
}

// SPEC V1: with no slot free, a queue at queue.max_waiters is full for the
// next request, and each waiter ahead moves its predicted wait on.
func TestGroupStateQueueFull(t *testing.T) {
	cfg := baseConfig()
	cfg.Groups[1].Timed = true
	cfg.MaxWaiters = 1
	h := newHarness(t, cfg)
	h.ready("gpu-2", 1, true)
	h.acq("a", chat("big", 0))
	h.acq("b", chat("big", 0))
	if got := h.s.groupState(chat("big", 0)); got.QueueFull || got.PredictedWait != DefaultServiceTime {
		t.Fatalf("big full, nothing measured yet: %+v, want room in the queue and the prior %v", got, DefaultServiceTime)
	}
	h.acq("c", chat("big", 0))
	h.wantQueued("c")
	if got := h.s.groupState(chat("big", 0)); !got.QueueFull || got.PredictedWait != DefaultServiceTime {
		t.Fatalf("big full with one waiting (max_waiters 1): %+v, want the queue full", got)
	}
}
