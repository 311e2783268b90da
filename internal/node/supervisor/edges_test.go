package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
)

// edgeScript is how one fake edge answers: up (a session that becomes
// ready and lasts until ctx ends or the edge goes down) from upAt to
// downAt (fake time since the start; zero downAt = never down), refusing
// every attempt otherwise. fatalAt > 0: the attempt at that time is fatal.
// hangUntil > 0: an attempt started before it hangs until then and fails
// (a dial timing out). giveUp: every attempt says retrying cannot help.
type edgeScript struct {
	upAt, downAt time.Duration
	up           bool
	fatalAt      time.Duration
	hangUntil    time.Duration
	giveUp       bool
}

// S1, S2, S4 per edge: several edges, each with its own supervisor under
// the one policy; attempts count only while no edge is ready, and the
// node gives up only when every edge used them up.
func TestRunEdges(t *testing.T) {
	fatal := MarkFatal(errors.New("open node.key: permission denied"))
	p := Policy{Interval: time.Second, MaxAttempts: 3}
	rows := []struct {
		name        string
		p           Policy
		edges       []edgeScript
		cancelAfter time.Duration
		wantErr     error
		wantDials   []int
		wantElapsed time.Duration
		// wantAfter: dials per edge that started at or after
		// afterTime (zero wantAfter = not checked).
		afterTime time.Duration
		wantAfter []int
	}{
		{
			name: "S2 one edge down for good: given up after its attempts, like Run",
			p:    p, edges: []edgeScript{{}},
			wantErr: ErrExhausted, wantDials: []int{3}, wantElapsed: 2 * time.Second,
		},
		{
			name: "S2 both edges down for good: exhausted once both used their attempts",
			p:    p, edges: []edgeScript{{}, {}},
			wantErr: ErrExhausted, wantDials: []int{3, 3}, wantElapsed: 2 * time.Second,
		},
		{
			name: "S2 one edge down while the other serves: retried every interval, never exhausted",
			p:    p, edges: []edgeScript{{up: true}, {}},
			cancelAfter: 100*time.Second + time.Millisecond,
			wantErr:     nil, wantDials: []int{1, 101}, wantElapsed: 100*time.Second + time.Millisecond,
		},
		{
			name: "S2 an exhausted edge is tried again when another edge becomes ready",
			p:    p,
			// edge 0 fails at t=0,1,2 and waits; edge 1's first attempt
			// hangs until t=5 and fails, its second (t=6) is ready: edge
			// 0 is tried again one interval later, at t=7,8,9,10.
			edges:       []edgeScript{{}, {hangUntil: 5 * time.Second, upAt: 6 * time.Second, up: true}},
			cancelAfter: 10*time.Second + time.Millisecond,
			wantErr:     nil, wantDials: []int{3 + 4, 2}, wantElapsed: 10*time.Second + time.Millisecond,
		},
		{
			name: "S2 exactly max_attempts per edge after the last ready session is lost: (3, 3), not (3, 2)",
			p:    p,
			// edge 1 serves until t=10.5 while edge 2 fails at t=0..10,
			// none of which count; after the loss each edge has its
			// three: edge 1 at t=11.5,12.5,13.5, edge 2 at t=11,12,13.
			edges:   []edgeScript{{up: true, downAt: 10*time.Second + 500*time.Millisecond}, {}},
			wantErr: ErrExhausted, wantDials: []int{1 + 3, 11 + 3}, wantElapsed: 13*time.Second + 500*time.Millisecond,
			afterTime: 10*time.Second + 500*time.Millisecond, wantAfter: []int{3, 3},
		},
		{
			name: "S2 an attempt that overlapped another edge's ready session does not count",
			p:    p,
			// edge 2's first attempt hangs from t=0 to t=4 across edge
			// 1's session (t=0 to t=2.5): it is not one of edge 2's
			// three, which are t=5,6,7; edge 1's are t=3.5,4.5,5.5.
			edges:   []edgeScript{{up: true, downAt: 2*time.Second + 500*time.Millisecond}, {hangUntil: 4 * time.Second}},
			wantErr: ErrExhausted, wantDials: []int{1 + 3, 1 + 3}, wantElapsed: 7 * time.Second,
			afterTime: 2*time.Second + 500*time.Millisecond, wantAfter: []int{3, 3},
		},
		{
			name: "S2 N6 an edge that says retrying cannot help is given up; the other goes on",
			p:    Policy{Interval: time.Second}, edges: []edgeScript{{up: true}, {giveUp: true}},
			cancelAfter: 5 * time.Second,
			wantErr:     nil, wantDials: []int{1, 1}, wantElapsed: 5 * time.Second,
		},
		{
			name: "S2 N6 with one edge, that edge given up is the node's exit",
			p:    Policy{Interval: time.Second}, edges: []edgeScript{{giveUp: true}},
			wantErr: ErrExhausted, wantDials: []int{1}, wantElapsed: 0,
		},
		{
			name: "S3 a fatal attempt at one edge stops every edge",
			p:    Policy{Interval: time.Second}, edges: []edgeScript{{up: true}, {fatalAt: 5 * time.Second}},
			wantErr: ErrFatal, wantDials: []int{1, 6}, wantElapsed: 5 * time.Second,
		},
		{
			name: "S4 shutdown: every edge returns nil",
			p:    Policy{Interval: time.Second}, edges: []edgeScript{{up: true}, {}},
			cancelAfter: 3*time.Second + time.Millisecond,
			wantErr:     nil, wantDials: []int{1, 4}, wantElapsed: 3*time.Second + time.Millisecond,
		},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if row.cancelAfter > 0 {
					time.AfterFunc(row.cancelAfter, cancel)
				}
				start := time.Now()
				var mu sync.Mutex
				dials := make([]int, len(row.edges))
				after := make([]int, len(row.edges))
				edges := make([]Edge, len(row.edges))
				for i, sc := range row.edges {
					edges[i] = Edge{Name: fmt.Sprintf("edge-%d", i+1), Connect: func(ctx context.Context, ready func()) (bool, error) {
						mu.Lock()
						dials[i]++
						now := time.Since(start)
						if now >= row.afterTime {
							after[i]++
						}
						mu.Unlock()
						if now < sc.hangUntil {
							select { // synctest's clock: a dial that times out
							case <-time.After(sc.hangUntil - now):
							case <-ctx.Done():
							}
							return false, errDial
						}
						if sc.giveUp {
							return false, MarkGiveUp(errDial)
						}
						if sc.fatalAt > 0 && now >= sc.fatalAt {
							return false, fatal
						}
						if !sc.up || now < sc.upAt || (sc.downAt > 0 && now >= sc.downAt) {
							return false, errDial
						}
						ready()
						var down <-chan time.Time
						if sc.downAt > 0 {
							down = time.After(sc.downAt - now)
						}
						select {
						case <-ctx.Done():
						case <-down:
						}
						return true, ErrSessionLost
					}}
				}
				err := RunEdges(ctx, row.p, edges)
				elapsed := time.Since(start)
				switch {
				case row.wantErr == nil && err != nil:
					t.Errorf("RunEdges = %v, want nil", err)
				case row.wantErr != nil && !errors.Is(err, row.wantErr):
					t.Errorf("RunEdges = %v, want an error wrapping %v", err, row.wantErr)
				}
				if row.wantErr == ErrExhausted && !strings.Contains(err.Error(), "edge-1") {
					t.Errorf("RunEdges = %v, want it to name the edges", err)
				}
				mu.Lock()
				defer mu.Unlock()
				if fmt.Sprint(dials) != fmt.Sprint(row.wantDials) {
					t.Errorf("dials = %v, want %v", dials, row.wantDials)
				}
				if row.wantAfter != nil && fmt.Sprint(after) != fmt.Sprint(row.wantAfter) {
					t.Errorf("dials from %v on = %v, want %v", row.afterTime, after, row.wantAfter)
				}
				if elapsed != row.wantElapsed {
					t.Errorf("returned after %v, want %v", elapsed, row.wantElapsed)
				}
			})
		})
	}
}

// ErrSessionLost stands for a live session's end in these scripts.
var ErrSessionLost = errors.New("session lost")
