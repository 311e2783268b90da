package outlier

import (
	"testing"
	"time"

	"iop/internal/edge/pool"
)

var (
	kA = pool.Key{Node: "gpu-1", Provider: "a"}
	kB = pool.Key{Node: "gpu-2", Provider: "b"}
)

// step is one event of a script and the effect it must produce.
type step struct {
	at         time.Duration // since t0
	ev         string        // fail, suspect, ok, expire
	k          pool.Key
	principal  string // suspect
	r          Reason
	retryAfter time.Duration
	want       Op
	until      time.Duration // of the effect, since t0 (OpEject, OpExtend, OpRearm)
	level      int           // of the effect (OpEject)
}

// TestMachine is the passive-health transition table: each row
// is a script of events with the effect each one must produce.
func TestMachine(t *testing.T) {
	pol := Policy{Base: time.Second, Max: 8 * time.Second}
	s := time.Second
	rows := []struct {
		name  string
		pol   Policy
		steps []step
	}{
		{"each ejection reason ejects a live provider for the base window", pol, []step{
			{at: 0, ev: "fail", k: kA, r: ReasonConnect, want: OpEject, until: s, level: 1},
			{at: 0, ev: "fail", k: kB, r: ReasonReset, want: OpEject, until: s, level: 1},
		}},
		{"consecutive failures double the window up to the cap; a success resets it", pol, []step{
			{at: 0, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: s, level: 1},
			{at: s, ev: "expire", k: kA, want: OpReadmit},
			{at: s, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: 3 * s, level: 2},
			{at: 3 * s, ev: "expire", k: kA, want: OpReadmit},
			{at: 3 * s, ev: "fail", k: kA, r: ReasonReset, want: OpEject, until: 7 * s, level: 3},
			{at: 7 * s, ev: "expire", k: kA, want: OpReadmit},
			{at: 7 * s, ev: "fail", k: kA, r: ReasonConnect, want: OpEject, until: 15 * s, level: 4},
			{at: 15 * s, ev: "expire", k: kA, want: OpReadmit},
			{at: 15 * s, ev: "fail", k: kA, r: ReasonConnect, want: OpEject, until: 23 * s, level: 5}, // capped at 8 s
			{at: 23 * s, ev: "expire", k: kA, want: OpReadmit},
			{at: 23 * s, ev: "ok", k: kA},
			{at: 23 * s, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: 24 * s, level: 1},
		}},
		{"a failure while cooling belongs to a request started before the window: no new ejection, no doubling", pol, []step{
			{at: 0, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: s, level: 1},
			{at: s / 2, ev: "fail", k: kA, r: ReasonStatus},
			{at: s / 2, ev: "fail", k: kA, r: ReasonConnect},
			{at: s, ev: "expire", k: kA, want: OpReadmit},
			{at: s, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: 3 * s, level: 2},
		}},
		{"429 honours Retry-After, at most the cap; without one it backs off like the rest", pol, []step{
			{at: 0, ev: "fail", k: kA, r: ReasonRateLimited, retryAfter: 5 * s, want: OpEject, until: 5 * s, level: 1},
			{at: 5 * s, ev: "expire", k: kA, want: OpReadmit},
			{at: 5 * s, ev: "fail", k: kA, r: ReasonRateLimited, retryAfter: time.Hour, want: OpEject, until: 13 * s, level: 2},
			{at: 13 * s, ev: "expire", k: kA, want: OpReadmit},
			{at: 13 * s, ev: "fail", k: kA, r: ReasonRateLimited, want: OpEject, until: 17 * s, level: 3},
		}},
		{"a 429 asking for longer extends a running window; a shorter one does not", pol, []step{
			{at: 0, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: s, level: 1},
			{at: s / 2, ev: "fail", k: kA, r: ReasonRateLimited, retryAfter: s / 4},
			{at: s / 2, ev: "fail", k: kA, r: ReasonRateLimited, retryAfter: 3 * s, want: OpExtend, until: 3*s + s/2},
			{at: s, ev: "expire", k: kA, want: OpRearm, until: 3*s + s/2},
			{at: 3*s + s/2, ev: "expire", k: kA, want: OpReadmit},
		}},
		{"a success while cooling resets the streak but the window runs to its end", pol, []step{
			{at: 0, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: s, level: 1},
			{at: s / 2, ev: "ok", k: kA},
			{at: s / 2, ev: "expire", k: kA, want: OpRearm, until: s},
			{at: s, ev: "expire", k: kA, want: OpReadmit},
			{at: s, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: 2 * s, level: 1},
		}},
		{"providers are independent; a stale timer and a success on a clean provider change nothing", pol, []step{
			{at: 0, ev: "expire", k: kB},
			{at: 0, ev: "ok", k: kB},
			{at: 0, ev: "fail", k: kA, r: ReasonStatus, want: OpEject, until: s, level: 1},
			{at: 0, ev: "fail", k: kB, r: ReasonStatus, want: OpEject, until: s, level: 1},
			{at: s, ev: "expire", k: kA, want: OpReadmit},
			{at: s, ev: "expire", k: kA},
		}},
		{"disabled: failures eject nothing", Policy{Base: time.Second, Max: time.Minute, Disabled: true}, []step{
			{at: 0, ev: "fail", k: kA, r: ReasonConnect},
			{at: 0, ev: "fail", k: kA, r: ReasonRateLimited, retryAfter: s},
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus, principal: "p"},
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus, principal: "q"},
		}},
		{"one principal's suspicions never eject, however many", pol, []step{
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus, principal: "team-a"},
			{at: s, ev: "suspect", k: kA, r: ReasonStatus, principal: "team-a"},
			{at: 2 * s, ev: "suspect", k: kA, r: ReasonReset, principal: "team-a"},
		}},
		{"open mode: every suspicion is principal \"\", none ejects", pol, []step{
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus},
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus},
		}},
		{"a second principal's suspicion corroborates: ejected for the base window, the streak counted", pol, []step{
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus, principal: "team-a"},
			{at: s, ev: "suspect", k: kA, r: ReasonReset, principal: "team-b", want: OpEject, until: 2 * s, level: 1},
			{at: 2 * s, ev: "expire", k: kA, want: OpReadmit},
			{at: 2 * s, ev: "suspect", k: kA, r: ReasonStatus, principal: "team-b"}, // the ejection used the record up
			{at: 2 * s, ev: "suspect", k: kA, r: ReasonStatus, principal: "team-c", want: OpEject, until: 4 * s, level: 2},
		}},
		{"a success drops the suspicion on record; suspicions while cooling change nothing", pol, []step{
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus, principal: "team-a"},
			{at: 0, ev: "ok", k: kA},
			{at: 0, ev: "suspect", k: kA, r: ReasonStatus, principal: "team-b"},
			{at: 0, ev: "fail", k: kB, r: ReasonConnect, want: OpEject, until: s, level: 1},
			{at: 0, ev: "suspect", k: kB, r: ReasonStatus, principal: "team-a"},
			{at: 0, ev: "suspect", k: kB, r: ReasonStatus, principal: "team-b"},
			{at: s, ev: "expire", k: kB, want: OpReadmit},
			{at: s, ev: "suspect", k: kB, r: ReasonStatus, principal: "team-c"},
		}},
	}
	t0 := time.Unix(1000, 0)
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			m := NewMachine(r.pol)
			for i, st := range r.steps {
				now := t0.Add(st.at)
				var fx Effect
				switch st.ev {
				case "fail":
					fx = m.Failure(st.k, st.r, st.retryAfter, now)
				case "suspect":
					fx = m.Suspect(st.k, st.r, st.principal, now)
				case "ok":
					m.Success(st.k)
				case "expire":
					fx = m.Expire(st.k, now)
				}
				if fx.Op != st.want {
					t.Fatalf("step %d (%s %v at %v): op %v, want %v", i, st.ev, st.k, st.at, fx.Op, st.want)
				}
				if st.want == OpNone {
					continue
				}
				if fx.Key != st.k {
					t.Fatalf("step %d: effect on %v, want %v", i, fx.Key, st.k)
				}
				if st.want != OpReadmit && !fx.Until.Equal(t0.Add(st.until)) {
					t.Fatalf("step %d: until +%v, want +%v", i, fx.Until.Sub(t0), st.until)
				}
				if st.want == OpEject && (fx.Level != st.level || fx.Reason != st.r) {
					t.Fatalf("step %d: level %d reason %v, want %d %v", i, fx.Level, fx.Reason, st.level, st.r)
				}
			}
		})
	}
}

// The machine keeps no entry for a provider with a clean record, so
// Detector.Success stays lock-free in steady state.
func TestMachineForgetsCleanProviders(t *testing.T) {
	m := NewMachine(Policy{Base: time.Second, Max: time.Minute})
	now := time.Unix(1000, 0)
	m.Failure(kA, ReasonStatus, 0, now)
	if m.Len() != 1 {
		t.Fatalf("Len %d after a failure, want 1", m.Len())
	}
	m.Expire(kA, now.Add(time.Second))
	if m.Len() != 1 {
		t.Fatalf("Len %d after re-admission with a streak, want 1 (the streak is kept)", m.Len())
	}
	m.Success(kA)
	if m.Len() != 0 {
		t.Fatalf("Len %d after a success, want 0", m.Len())
	}
	if _, ok := m.Cooling(kA); ok {
		t.Fatal("Cooling after re-admission")
	}
}
