package adapter

import (
	"fmt"
	"testing"
	"time"
)

// E4: the gate between edges, step by step on a clock the test moves: a
// free slot goes to any edge's request (work-conserving), but the last
// free slots — one per edge whose retry is due (refused below its fair
// share within holdWindow, nothing of it admitted since) — are held for
// those retries against an edge at or above its share; the hold ends at
// the retry's admission or after holdWindow. A capacity share is a hard
// split.
func TestE4GateTieBreakForTheLastSlots(t *testing.T) {
	type step struct {
		edge    int           // 0, 1, 2: which edge
		release bool          // release one of its slots instead of acquiring
		after   time.Duration // the clock moves this much first
		want    refusal
		fair    int64 // the refusal's fair share (checked when want != admitted)
	}
	for _, tc := range []struct {
		name     string
		capacity int64
		shares   []float64 // per edge
		steps    []step
	}{
		{name: "a due retry holds the slot the other edge frees", capacity: 2, shares: []float64{0, 0}, steps: []step{
			{edge: 0}, {edge: 0},
			{edge: 1, want: refusedFull, fair: 1}, // below its share of 1: its retry is due
			{edge: 0, release: true},
			{edge: 0, after: 10 * time.Millisecond, want: refusedHeld, fair: 1},
			{edge: 1, after: 40 * time.Millisecond}, // the retry takes it
			{edge: 1, release: true},
			{edge: 0}, // the hold ended with the retry's admission: any edge takes a free slot
		}},
		{name: "the hold lapses after holdWindow: a free slot is never idle for an edge that stopped asking", capacity: 2, shares: []float64{0, 0}, steps: []step{
			{edge: 0}, {edge: 0},
			{edge: 1, want: refusedFull, fair: 1},
			{edge: 0, release: true},
			{edge: 0, after: holdWindow},
		}},
		{name: "no hold without a due edge: the edge above its share takes every free slot", capacity: 4, shares: []float64{0, 0}, steps: []step{
			{edge: 1}, {edge: 0}, {edge: 0}, {edge: 0}, // 3 of 4 for edge 0, fair share 2
			{edge: 1, release: true},
			{edge: 0},
		}},
		{name: "one held slot per due edge: the others stay free to take", capacity: 4, shares: []float64{0, 0}, steps: []step{
			{edge: 0}, {edge: 0}, {edge: 0}, {edge: 0},
			{edge: 1, want: refusedFull, fair: 2},
			{edge: 0, release: true}, {edge: 0, release: true},
			{edge: 0, after: time.Millisecond},             // 2 free: it takes one
			{edge: 0, want: refusedHeld, fair: 2},          // the last is edge 1's
			{edge: 1}, {edge: 0, release: true}, {edge: 0}, // the retry in, no hold
		}},
		{name: "an edge at its fair share takes the last slot; only one above it is held back", capacity: 4, shares: []float64{0, 0, 0}, steps: []step{
			{edge: 0}, {edge: 0}, {edge: 1}, {edge: 1},
			{edge: 2, want: refusedFull, fair: 2}, // ceil(4/3)
			{edge: 1, release: true},
			{edge: 1},                                                     // back to 2, its share
			{edge: 1, release: true}, {edge: 0, release: true}, {edge: 0}, // edge 0 back to 2 of 4, one slot free
			{edge: 0, want: refusedHeld, fair: 2}, // above its share: the last is edge 2's
			{edge: 2}, {edge: 0, want: refusedFull, fair: 2},
		}},
		{name: "an edge refused above its share is not due", capacity: 2, shares: []float64{0, 0}, steps: []step{
			{edge: 1}, {edge: 0},
			{edge: 0, want: refusedFull, fair: 1}, // it holds 1, its share: not below
			{edge: 1, release: true},
			{edge: 1}, // no hold for edge 0's retry
		}},
		{name: "a lone edge is never held back", capacity: 2, shares: []float64{0}, steps: []step{
			{edge: 0}, {edge: 0}, {edge: 0, want: refusedFull, fair: 2},
			{edge: 0, release: true}, {edge: 0},
		}},
		{name: "capacity_share is a hard split: refused at its share with slots free", capacity: 4, shares: []float64{0.5, 0.5}, steps: []step{
			{edge: 0}, {edge: 0}, {edge: 0, want: refusedShare, fair: 2},
			{edge: 1}, {edge: 1}, {edge: 1, want: refusedShare, fair: 2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := int64(time.Hour)
			c := NewCapacity()
			c.clock = func() int64 { return now }
			c.mu.Lock()
			gates := make([]gate, len(tc.shares))
			for i, sh := range tc.shares {
				gates[i] = c.gateLocked("one", fmt.Sprintf("edge-%d", i), tc.capacity, sh)
			}
			c.mu.Unlock()
			for i, st := range tc.steps {
				now += int64(st.after)
				g := &gates[st.edge]
				if st.release {
					g.release()
					continue
				}
				why, fair := g.tryAcquire()
				if why != st.want || (why != admitted && fair != st.fair) {
					t.Fatalf("E4: step %d, edge %d: refusal %d fair share %d (%s), want %d fair share %d",
						i, st.edge, why, fair, g.full(why, fair), st.want, st.fair)
				}
			}
		})
	}
}
