package managed

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// step is one event of a script and the effects it must produce.
type step struct {
	at    time.Duration // since t0
	kind  EventKind
	model string
	w     uint64
	want  []string // Effect.String of every effect, in order
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func req(at time.Duration, m string, w uint64, want ...string) step {
	return step{at: at, kind: EvRequest, model: m, w: w, want: want}
}
func ev(at time.Duration, k EventKind, m string, want ...string) step {
	return step{at: at, kind: k, model: m, want: want}
}

// U2, U3, U4: the lifecycle decision as a pure machine, time an event.
func TestMachine(t *testing.T) {
	const s, ms = time.Second, time.Millisecond
	two := Limits{MaxLoaded: 2, IdleUnload: 10 * s, BackoffMin: s, BackoffMax: 4 * s}
	mem := Limits{MaxLoaded: 8, BudgetMB: 1000, IdleUnload: 10 * s, BackoffMin: s, BackoffMax: 4 * s}
	sizes := map[string]int64{"a": 400, "b": 400, "c": 400, "big": 1200}
	tests := []struct {
		name    string
		lim     Limits
		preload []string
		steps   []step
		final   map[string]State
	}{
		{name: "U2 first request starts the model, its ready grants every waiter", lim: two, steps: []step{
			req(0, "a", 1, "start a"),
			req(ms, "a", 2),
			ev(500*ms, EvReady, "a", "grant 1 a", "grant 2 a"),
			req(600*ms, "a", 3, "grant 3 a"),
		}, final: map[string]State{"a": Loaded}},
		{name: "U2 an unknown model fails at once", lim: two, steps: []step{
			req(0, "zzz", 1, "fail 1 zzz: this node serves no model of that name"),
		}},
		{name: "U3 room for two: the third evicts the least recently used idle one", lim: two, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"), ev(2*s, EvDone, "a"),
			req(2*s, "b", 2, "start b"), ev(3*s, EvReady, "b", "grant 2 b"), ev(3*s, EvDone, "b"),
			req(4*s, "a", 3, "grant 3 a"), ev(4*s, EvDone, "a"), // a is now the more recent
			req(5*s, "c", 4, "stop b (evict)"),
			ev(5*s+100*ms, EvStopped, "b", "start c"),
			ev(6*s, EvReady, "c", "grant 4 c"),
		}, final: map[string]State{"a": Loaded, "b": Unloaded, "c": Loaded}},
		{name: "U3 a model with a request in flight is never evicted: the request waits", lim: two, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"),
			req(s, "b", 2, "start b"), ev(2*s, EvReady, "b", "grant 2 b"),
			req(3*s, "c", 3), // both in flight: nothing stops
			req(3*s, "c", 4),
			ev(4*s, EvDone, "b", "stop b (evict)"),
			ev(4*s, EvStopped, "b", "start c"),
			ev(5*s, EvReady, "c", "grant 3 c", "grant 4 c"),
		}, final: map[string]State{"a": Loaded, "b": Unloaded, "c": Loaded}},
		{name: "U3 a waiter that gives up leaves the queue", lim: two, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"),
			req(s, "b", 2, "start b"), ev(2*s, EvReady, "b", "grant 2 b"),
			req(3*s, "c", 3),
			{at: 4 * s, kind: EvCancel, model: "c", w: 3},
			ev(5*s, EvDone, "b"), // nobody waits: nothing is evicted
		}, final: map[string]State{"a": Loaded, "b": Loaded, "c": Unloaded}},
		{name: "U3 memory: evict until it fits, never more", lim: mem, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"), ev(s, EvDone, "a"),
			req(2*s, "b", 2, "start b"), ev(3*s, EvReady, "b", "grant 2 b"), ev(3*s, EvDone, "b"),
			req(4*s, "c", 3, "stop a (evict)"), // 400+400+400 > 1000: one stop is enough
			ev(4*s, EvStopped, "a", "start c"),
		}, final: map[string]State{"a": Unloaded, "b": Loaded, "c": Loading}},
		{name: "U3 a model that can never fit the budget fails at once", lim: mem, steps: []step{
			req(0, "big", 1, "fail 1 big: the model needs 1200 MiB, more than memory_budget_mb (1000)"),
		}},
		{name: "U3 FIFO: the first request that waits for room holds the later ones", lim: Limits{MaxLoaded: 1, IdleUnload: 10 * s}, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"),
			req(s, "b", 2),
			req(s, "c", 3),
			ev(2*s, EvDone, "a", "stop a (evict)"),
			ev(2*s, EvStopped, "a", "start b"),
			ev(3*s, EvReady, "b", "grant 2 b"),
			ev(4*s, EvDone, "b", "stop b (evict)"),
			ev(4*s, EvStopped, "b", "start c"),
		}},
		{name: "U4 a preload larger than the budget stays unloaded and holds no request up", lim: mem, preload: []string{"big"}, steps: []step{
			ev(0, EvTick, ""),
			req(s, "a", 1, "start a"),
			ev(2*s, EvReady, "a", "grant 1 a"),
		}, final: map[string]State{"big": Unloaded, "a": Loaded}},
		{name: "U3 a request that cannot fit beside the preloaded models fails at once and holds none up", lim: Limits{MaxLoaded: 8, BudgetMB: 1000, IdleUnload: 10 * s},
			preload: []string{"a", "b"}, steps: []step{
				ev(0, EvTick, "", "start a", "start b"),
				ev(s, EvReady, "a"), ev(s, EvReady, "b"),
				req(2*s, "c", 1, "fail 1 c: the model needs 400 MiB and the preloaded models hold 800 MiB: together more than memory_budget_mb (1000)"),
			}, final: map[string]State{"a": Loaded, "b": Loaded, "c": Unloaded}},
		{name: "U4 idle unload after idle_unload_ms without a request", lim: two, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"), ev(2*s, EvDone, "a"),
			ev(11*s, EvTick, ""), // 9 s idle
			ev(12*s, EvTick, "", "stop a (idle)"),
			ev(12*s, EvStopped, "a"),
		}, final: map[string]State{"a": Unloaded}},
		{name: "U4 never idle-unloaded while in flight", lim: two, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"),
			ev(time.Hour, EvTick, ""),
		}, final: map[string]State{"a": Loaded}},
		{name: "U4 a preloaded model loads at the first tick, is never unloaded or evicted", lim: Limits{MaxLoaded: 2, IdleUnload: s}, preload: []string{"a"}, steps: []step{
			ev(0, EvTick, "", "start a"),
			ev(s, EvReady, "a"),
			req(s, "b", 1, "start b"), ev(2*s, EvReady, "b", "grant 1 b"), ev(2*s, EvDone, "b"),
			req(3*s, "c", 2, "stop b (evict)"), // b, not the older preloaded a
			ev(3*s, EvStopped, "b", "start c"),
			ev(time.Hour, EvTick, ""),
		}, final: map[string]State{"a": Loaded, "b": Unloaded, "c": Loading}},
		{name: "U5 a failed load fails its waiters; the next request waits for the backoff, which doubles", lim: two, steps: []step{
			req(0, "a", 1, "start a"), req(0, "a", 2),
			ev(s, EvLoadFailed, "a", "fail 1 a: its process failed to load: exit status 1", "fail 2 a: its process failed to load: exit status 1"),
			req(s+500*ms, "a", 3), // backoff 1 s: until 2 s
			ev(2*s, EvTick, "", "start a"),
			ev(2*s+ms, EvLoadFailed, "a", "fail 3 a: its process failed to load: exit status 1"),
			req(3*s, "a", 4),
			ev(3*s+ms, EvTick, ""), // backoff 2 s: until 4 s
			ev(4*s+ms, EvTick, "", "start a"),
			ev(5*s, EvReady, "a", "grant 4 a"),
		}, final: map[string]State{"a": Loaded}},
		{name: "U5 a crash of a loaded model is restarted by the next request after the backoff", lim: two, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvReady, "a", "grant 1 a"), ev(s, EvDone, "a"),
			ev(2*s, EvExited, "a"),
			req(2*s, "a", 2),
			ev(3*s, EvTick, "", "start a"),
			ev(4*s, EvReady, "a", "grant 2 a"),
		}, final: map[string]State{"a": Loaded}},
		{name: "U5 a model in its backoff does not hold up another", lim: two, steps: []step{
			req(0, "a", 1, "start a"), ev(s, EvLoadFailed, "a", "fail 1 a: its process failed to load: exit status 1"),
			req(s, "a", 2),
			req(s, "b", 3, "start b"),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMachine(tt.lim)
			m.SetModels(sizes, tt.preload)
			for i, st := range tt.steps {
				e := Event{Kind: st.kind, Model: st.model, Waiter: st.w, Now: t0.Add(st.at)}
				if st.kind == EvLoadFailed {
					e.Err = "exit status 1"
				}
				var got []string
				for _, f := range m.Step(e) {
					got = append(got, f.String())
				}
				if !slices.Equal(got, st.want) {
					t.Fatalf("step %d (%v %q w%d at %v): effects\n  %s\nwant\n  %s", i, st.kind, st.model, st.w, st.at,
						strings.Join(got, "\n  "), strings.Join(st.want, "\n  "))
				}
				n, _ := m.used()
				if n > tt.lim.MaxLoaded {
					t.Fatalf("step %d: %d processes, max_loaded %d", i, n, tt.lim.MaxLoaded)
				}
			}
			for _, r := range m.Residency() {
				if want, ok := tt.final[r.Model]; ok && r.State != want {
					t.Errorf("model %s: state %v, want %v", r.Model, r.State, want)
				}
			}
		})
	}
}

// U3: whatever the arrivals, the machine never stops a model with a
// request in flight and never holds more than max_loaded processes or the
// memory budget; every request ends granted or failed once its model's
// fate is known.
func TestMachineNeverEvictsInFlight(t *testing.T) {
	lim := Limits{MaxLoaded: 2, BudgetMB: 1000, IdleUnload: 3 * time.Second, BackoffMin: time.Second}
	m := NewMachine(lim)
	m.SetModels(map[string]int64{"a": 400, "b": 500, "c": 300, "d": 600}, nil)
	models := []string{"a", "b", "c", "d"}
	rnd := uint64(1)
	next := func(n int) int { rnd = rnd*6364136223846793005 + 1442695040888963407; return int(rnd>>33) % n }
	now := t0
	inflight := map[uint64]string{} // granted, not done
	loading := map[string]bool{}
	stopping := map[string]bool{}
	var w uint64
	check := func(fx []Effect) {
		for _, f := range fx {
			switch f.Kind {
			case FxStop:
				for _, mm := range inflight {
					if mm == f.Model {
						t.Fatalf("stop %s with a request in flight", f.Model)
					}
				}
				stopping[f.Model] = true
			case FxStart:
				loading[f.Model] = true
			case FxGrant:
				inflight[f.Waiter] = f.Model
			}
		}
		n, mb := m.used()
		if n > lim.MaxLoaded || mb > lim.BudgetMB {
			t.Fatalf("%d processes, %d MiB", n, mb)
		}
	}
	for i := 0; i < 20000; i++ {
		now = now.Add(time.Duration(next(500)) * time.Millisecond)
		switch r := next(10); {
		case r < 4:
			w++
			check(m.Step(Event{Kind: EvRequest, Model: models[next(4)], Waiter: w, Now: now}))
		case r < 7 && len(inflight) > 0:
			for id, mm := range inflight {
				delete(inflight, id)
				check(m.Step(Event{Kind: EvDone, Model: mm, Now: now}))
				break
			}
		case r < 8:
			for mm := range loading {
				delete(loading, mm)
				check(m.Step(Event{Kind: EvReady, Model: mm, Now: now}))
				break
			}
		case r < 9:
			for mm := range stopping {
				delete(stopping, mm)
				check(m.Step(Event{Kind: EvStopped, Model: mm, Now: now}))
				break
			}
		default:
			check(m.Step(Event{Kind: EvTick, Now: now}))
		}
	}
	if st := m.Stats(); st.Loads == 0 || st.Evictions == 0 {
		t.Fatalf("the run exercised nothing: %+v", st)
	}
}
