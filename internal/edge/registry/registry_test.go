package registry

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"iop/internal/edge/events"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// step is one transition applied to the registry.
type step struct {
	op   string // "register", "ready", "close", "timeout", "reconfigure"
	conn ConnID
	node string
	cert string   // register: certificate name (defaults to node)
	ids  []string // reconfigure
	at   int      // seconds after t0
}

func reg(c ConnID, id string) step { return step{op: "register", conn: c, node: id, cert: id} }
func regAs(c ConnID, id, cert string) step {
	return step{op: "register", conn: c, node: id, cert: cert}
}
func ready(c ConnID, id string) step { return step{op: "ready", conn: c, node: id} }
func closed(c ConnID) step           { return step{op: "close", conn: c} }
func timeout(c ConnID) step          { return step{op: "timeout", conn: c} }
func reconfigure(ids ...string) step { return step{op: "reconfigure", ids: ids} }
func (s step) after(sec int) step    { s.at = sec; return s }
func fx(k EffectKind, c ConnID, gen uint64) Effect {
	return Effect{Kind: k, Conn: c, Node: "gpu-1", Gen: gen}
}

func (s step) apply(r *Registry) (Result, []Effect) {
	now := t0.Add(time.Duration(s.at) * time.Second)
	switch s.op {
	case "register":
		return r.Register(s.conn, s.node, s.cert, now)
	case "ready":
		return r.Ready(s.conn, s.node, now)
	case "close":
		return Result{}, r.ConnClosed(s.conn, now)
	case "timeout":
		return Result{}, r.HeartbeatTimeout(s.conn, now)
	case "reconfigure":
		return Result{}, r.Reconfigure(s.ids, now)
	}
	panic("unknown op " + s.op)
}

func fenced(c ConnID, gen uint64, wasReady bool, cause error) Effect {
	e := fx(Fence, c, gen)
	e.WasReady, e.Err = wasReady, cause
	return e
}

func emit(typ string, gen uint64, at int, reason string) Effect {
	return Effect{Kind: Emit, Node: "gpu-1", Gen: gen,
		Event: events.Event{Type: typ, Node: "gpu-1", Time: t0.Add(time.Duration(at) * time.Second), Reason: reason}}
}

func closing(c ConnID, gen uint64, cause error) Effect {
	e := fx(Close, c, gen)
	e.Err = cause
	return e
}

func TestRegistryTransitions(t *testing.T) {
	none := NodeState{ID: "gpu-1"}
	pending := func(gen uint64) NodeState { return NodeState{ID: "gpu-1", Phase: Pending, Gen: gen} }
	readyAt := func(gen uint64, at int) NodeState {
		return NodeState{ID: "gpu-1", Phase: Ready, Gen: gen, ReadySince: t0.Add(time.Duration(at) * time.Second)}
	}
	tests := []struct {
		name    string
		setup   []step
		do      step
		wantOK  bool
		wantErr error // errors.Is on Result.Err
		closeIt bool  // Result.CloseAfterReply
		wantGen uint64
		wantFx  []Effect
		want    NodeState // gpu-1 afterwards
	}{
		{name: "L3 accepted registration is pending generation 1, no event",
			do: reg(1, "gpu-1"), wantOK: true, wantGen: 1, want: pending(1)},
		{name: "L1 second registration of the same id on one connection",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1").after(1)},
			do:    reg(1, "gpu-1").after(2), wantErr: ErrAlreadyRegistered, wantGen: 1, want: readyAt(1, 1)},
		{name: "L1 second registration of another id on one connection",
			setup: []step{reg(1, "gpu-1")},
			do:    regAs(1, "gpu-2", "gpu-2"), wantErr: ErrAlreadyRegistered, wantGen: 1, want: pending(1)},
		{name: "L1 registration on a connection whose registration was rejected",
			setup: []step{regAs(1, "gpu-2", "gpu-1")},
			do:    reg(1, "gpu-1"), wantErr: ErrRegistrationRejected, want: none},
		{name: "L2 unknown node id is refused with a reason and closed",
			do: reg(1, "gpu-9"), wantErr: ErrUnknownNode, closeIt: true, want: none},
		{name: "L2 node removed by reload is unknown",
			setup: []step{reconfigure("gpu-2")},
			do:    reg(1, "gpu-1"), wantErr: ErrUnknownNode, closeIt: true},
		{name: "I3 certificate for gpu-1 cannot register gpu-2",
			do: regAs(1, "gpu-2", "gpu-1"), wantErr: ErrNameMismatch, closeIt: true, want: none},
		{name: "I3 refused impostor leaves the ready owner alone",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1").after(1)},
			do:    regAs(2, "gpu-1", "gpu-2"), wantErr: ErrNameMismatch, closeIt: true, want: readyAt(1, 1)},
		{name: "L5 first ready activates and emits node.connected",
			setup: []step{reg(1, "gpu-1")},
			do:    ready(1, "gpu-1").after(3), wantOK: true, wantGen: 1,
			wantFx: []Effect{fx(Activate, 1, 1), emit(events.TypeConnected, 1, 3, "")},
			want:   readyAt(1, 3)},
		{name: "L5 duplicate ready of the ready owner is true without effects",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1").after(3)},
			do:    ready(1, "gpu-1").after(4), wantOK: true, wantGen: 1, want: readyAt(1, 3)},
		{name: "L6 ready naming another node id",
			setup: []step{reg(1, "gpu-1")},
			do:    ready(1, "gpu-2"), wantErr: ErrWrongNode, wantGen: 1, want: pending(1)},
		{name: "L6 ready on a connection that never registered",
			do: ready(5, "gpu-1"), wantErr: ErrNotRegistered, want: none},
		{name: "L6 ready after a rejected registration",
			setup: []step{reg(1, "gpu-9")},
			do:    ready(1, "gpu-9"), wantErr: ErrRegistrationRejected, want: none},
		{name: "L6 L9 ready from a superseded connection",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1").after(1), reg(2, "gpu-1").after(2)},
			do:    ready(1, "gpu-1").after(3), wantErr: ErrSuperseded, wantGen: 1, want: pending(2)},
		{name: "L6 L9 stale pending ready after takeover",
			setup: []step{reg(1, "gpu-1"), reg(2, "gpu-1").after(1)},
			do:    ready(1, "gpu-1").after(2), wantErr: ErrSuperseded, wantGen: 1, want: pending(2)},
		{name: "L4 L8 takeover fences the ready generation, emits and closes the old connection",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1").after(1)},
			do:    reg(2, "gpu-1").after(5), wantOK: true, wantGen: 2,
			wantFx: []Effect{fenced(1, 1, true, ErrSuperseded), emit(events.TypeDisconnected, 1, 5, ErrSuperseded.Error()),
				closing(1, 1, ErrSuperseded)},
			want: pending(2)},
		{name: "L4 L3 takeover of a pending owner fences without an event",
			setup: []step{reg(1, "gpu-1")},
			do:    reg(2, "gpu-1").after(1), wantOK: true, wantGen: 2,
			wantFx: []Effect{fenced(1, 1, false, ErrSuperseded), closing(1, 1, ErrSuperseded)},
			want:   pending(2)},
		{name: "L9 close of the old connection after the new one became ready",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1"), reg(2, "gpu-1").after(1), ready(2, "gpu-1").after(2)},
			do:    closed(1).after(3), want: readyAt(2, 2)},
		{name: "L9 heartbeat timeout of the old connection after takeover",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1"), reg(2, "gpu-1").after(1), ready(2, "gpu-1").after(2)},
			do:    timeout(1).after(3), want: readyAt(2, 2)},
		{name: "L9 close of a rejected connection",
			setup: []step{reg(1, "gpu-9")},
			do:    closed(1), want: none},
		{name: "L9 close of an unknown connection",
			do: closed(7), want: none},
		{name: "L8 close of the ready owner fences and emits node.disconnected",
			setup:  []step{reg(1, "gpu-1"), ready(1, "gpu-1")},
			do:     closed(1).after(9),
			wantFx: []Effect{fenced(1, 1, true, ErrConnClosed), emit(events.TypeDisconnected, 1, 9, ErrConnClosed.Error())},
			want:   none},
		{name: "L3 close of a pending owner fences without an event",
			setup: []step{reg(1, "gpu-1")},
			do:    closed(1), wantFx: []Effect{fenced(1, 1, false, ErrConnClosed)}, want: none},
		{name: "L7 heartbeat timeout of the ready owner fences, emits and closes",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1")},
			do:    timeout(1).after(20),
			wantFx: []Effect{fenced(1, 1, true, ErrHeartbeatTimeout), emit(events.TypeDisconnected, 1, 20, ErrHeartbeatTimeout.Error()),
				closing(1, 1, ErrHeartbeatTimeout)},
			want: none},
		{name: "L7 L3 heartbeat timeout of a pending owner emits nothing",
			setup: []step{reg(1, "gpu-1")},
			do:    timeout(1), wantFx: []Effect{fenced(1, 1, false, ErrHeartbeatTimeout), closing(1, 1, ErrHeartbeatTimeout)},
			want: none},
		{name: "L9 second timeout after the fence changes nothing",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1"), timeout(1)},
			do:    timeout(1), want: none},
		{name: "L6 ready after the connection closed",
			setup: []step{reg(1, "gpu-1"), closed(1)},
			do:    ready(1, "gpu-1"), wantErr: ErrNotRegistered, want: none},
		{name: "L4 generation is never reused after close",
			setup: []step{reg(1, "gpu-1"), closed(1)},
			do:    reg(2, "gpu-1"), wantOK: true, wantGen: 2, want: pending(2)},
		{name: "L4 generation is never reused after removal and re-add",
			setup: []step{reg(1, "gpu-1"), reconfigure("gpu-2"), reconfigure("gpu-1", "gpu-2")},
			do:    reg(2, "gpu-1"), wantOK: true, wantGen: 2, want: pending(2)},
		{name: "L8 reload removing a ready node fences, emits and closes",
			setup: []step{reg(1, "gpu-1"), ready(1, "gpu-1")},
			do:    reconfigure("gpu-2").after(4),
			wantFx: []Effect{fenced(1, 1, true, ErrRemoved), emit(events.TypeDisconnected, 1, 4, ErrRemoved.Error()),
				closing(1, 1, ErrRemoved)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New([]string{"gpu-1", "gpu-2"})
			var all []Effect
			for i, s := range tc.setup {
				_, f := s.apply(r)
				all = append(all, f...)
				checkInvariants(t, fmt.Sprintf("setup step %d", i), all)
			}
			res, got := tc.do.apply(r)
			all = append(all, got...)
			checkInvariants(t, "do", all)

			if res.OK != tc.wantOK {
				t.Errorf("OK = %v, want %v (err %v)", res.OK, tc.wantOK, res.Err)
			}
			if tc.wantErr != nil && !errors.Is(res.Err, tc.wantErr) {
				t.Errorf("Err = %v, want %v", res.Err, tc.wantErr)
			}
			if tc.wantOK && res.Err != nil {
				t.Errorf("Err = %v on success", res.Err)
			}
			if replies := tc.do.op == "register" || tc.do.op == "ready"; replies && !tc.wantOK && res.Reason() == "" {
				t.Errorf("refusal has no reason (L2, L6)")
			}
			if res.CloseAfterReply != tc.closeIt {
				t.Errorf("CloseAfterReply = %v, want %v", res.CloseAfterReply, tc.closeIt)
			}
			if res.Gen != tc.wantGen {
				t.Errorf("Gen = %d, want %d", res.Gen, tc.wantGen)
			}
			compareEffects(t, got, tc.wantFx)
			if tc.want.ID != "" {
				st, ok := r.Node("gpu-1")
				if !ok || !reflect.DeepEqual(st, tc.want) {
					t.Errorf("gpu-1 state = %+v (configured %v), want %+v", st, ok, tc.want)
				}
				// P3: only a ready owner is dispatchable, and only at its generation.
				for gen := uint64(0); gen <= 3; gen++ {
					_, cur := r.Current("gpu-1", gen)
					if want := tc.want.Phase == Ready && gen == tc.want.Gen; cur != want {
						t.Errorf("Current(gpu-1, %d) = %v, want %v", gen, cur, want)
					}
				}
			}
		})
	}
}

func compareEffects(t *testing.T, got, want []Effect) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("effects = %v, want %v", got, want)
	}
	for i := range got {
		g, w := got[i], want[i]
		gErr, wErr := g.Err, w.Err
		g.Err, w.Err = nil, nil
		if !reflect.DeepEqual(g, w) {
			t.Errorf("effect %d = %+v, want %+v", i, g, w)
		}
		if (wErr == nil) != (gErr == nil) || wErr != nil && !errors.Is(gErr, wErr) {
			t.Errorf("effect %d Err = %v, want %v", i, gErr, wErr)
		}
	}
}

// checkInvariants: every generation is fenced at most once and activated at
// most once, never activated after its fence, and a node's generation g+1 is
// never activated before g is fenced (SPEC L4, L5, L8, L9).
func checkInvariants(t *testing.T, where string, all []Effect) {
	t.Helper()
	type key struct {
		node string
		gen  uint64
	}
	fencedAt, activeAt := map[key]int{}, map[key]int{}
	for i, e := range all {
		k := key{e.Node, e.Gen}
		switch e.Kind {
		case Fence:
			if _, dup := fencedAt[k]; dup {
				t.Errorf("%s: %s generation %d fenced twice", where, e.Node, e.Gen)
			}
			fencedAt[k] = i
		case Activate:
			if _, dup := activeAt[k]; dup {
				t.Errorf("%s: %s generation %d activated twice", where, e.Node, e.Gen)
			}
			if _, f := fencedAt[k]; f {
				t.Errorf("%s: %s generation %d activated after its fence", where, e.Node, e.Gen)
			}
			activeAt[k] = i
			for prev, at := range activeAt {
				if prev.node == e.Node && prev.gen < e.Gen {
					if f, ok := fencedAt[prev]; !ok || f > i {
						t.Errorf("%s: %s generation %d activated before generation %d (activated at %d) was fenced",
							where, e.Node, e.Gen, prev.gen, at)
					}
				}
			}
		case Emit:
			if e.Event.Node != e.Node || e.Event.Type != events.TypeConnected && e.Event.Type != events.TypeDisconnected {
				t.Errorf("%s: bad event %+v", where, e.Event)
			}
		}
	}
}

// N3: Nodes lists configured ids in config order and follows reloads.
func TestNodesConfigOrder(t *testing.T) {
	r := New([]string{"gpu-2", "gpu-1", "gpu-2"})
	r.Register(1, "gpu-1", "gpu-1", t0)
	r.Ready(1, "gpu-1", t0)
	got := r.Nodes()
	want := []NodeState{{ID: "gpu-2"}, {ID: "gpu-1", Phase: Ready, Gen: 1, ReadySince: t0}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Nodes() = %+v, want %+v", got, want)
	}
	if !got[1].Connected() || got[0].Connected() {
		t.Fatalf("Connected() = %v, %v; want false, true", got[0].Connected(), got[1].Connected())
	}
	r.Reconfigure([]string{"gpu-3", "gpu-1"}, t0)
	if got := r.Nodes(); len(got) != 2 || got[0].ID != "gpu-3" || got[1].ID != "gpu-1" || !got[1].Connected() {
		t.Fatalf("Nodes() after reload = %+v, want gpu-3 then connected gpu-1", got)
	}
	if node, gen, cur := r.Binding(1); node != "gpu-1" || gen != 1 || !cur {
		t.Fatalf("Binding(1) = %q, %d, %v; want gpu-1, 1, true", node, gen, cur)
	}
}

// L4 (a bound on takeovers): with LimitRegistrations(2, 10 s), one node
// id registers at most twice at once and then once per 10 s; a
// registration beyond that is refused and closed, and leaves the current
// owner, its generation and its phase as they were (no fence, no event).
// Another node id has its own allowance.
func TestRegistrationRateLimit(t *testing.T) {
	r := New([]string{"gpu-1", "gpu-2"})
	r.LimitRegistrations(2, 10*time.Second)
	rows := []struct {
		name   string
		s      step
		ok     bool
		owner  ConnID
		gen    uint64
		effect bool
	}{
		{"L3 first registration", reg(1, "gpu-1"), true, 1, 1, false},
		{"L4 a takeover within the burst", reg(2, "gpu-1"), true, 2, 2, true},
		{"L4 beyond the burst: refused, owner kept", reg(3, "gpu-1"), false, 2, 2, false},
		{"L4 another node id is not limited by this one", reg(4, "gpu-2"), true, 2, 2, false},
		{"L4 still refused 9 s later", reg(5, "gpu-1").after(9), false, 2, 2, false},
		{"L4 one registration per 10 s", reg(6, "gpu-1").after(10), true, 6, 3, true},
		{"L4 not two", reg(7, "gpu-1").after(10), false, 6, 3, false},
		{"L4 after a quiet while the burst is back", reg(8, "gpu-1").after(40), true, 8, 4, true},
		{"L4 burst of two", reg(9, "gpu-1").after(40), true, 9, 5, true},
		{"L4 and not three", reg(10, "gpu-1").after(40), false, 9, 5, false},
	}
	for _, row := range rows {
		res, fx := row.s.apply(r)
		if res.OK != row.ok || (len(fx) > 0) != row.effect {
			t.Fatalf("%s: result %+v, effects %v; want ok=%v effects=%v", row.name, res, fx, row.ok, row.effect)
		}
		if !row.ok && (!errors.Is(res.Err, ErrRegistrationRateLimited) || !res.CloseAfterReply) {
			t.Fatalf("%s: %v (close %v), want ErrRegistrationRateLimited and the connection closed", row.name, res.Err, res.CloseAfterReply)
		}
		if n, _ := r.Node("gpu-1"); n.Gen != row.gen {
			t.Fatalf("%s: gpu-1 generation %d, want %d", row.name, n.Gen, row.gen)
		}
		if _, gen, cur := r.Binding(row.owner); !cur || gen != row.gen {
			t.Fatalf("%s: conn %d is not the current owner of generation %d", row.name, row.owner, row.gen)
		}
	}
	r.LimitRegistrations(0, 0)
	for c := ConnID(20); c < 30; c++ {
		if res, _ := r.Register(c, "gpu-1", "gpu-1", t0); !res.OK {
			t.Fatalf("without a limit: registration %d refused: %v", c, res.Err)
		}
	}
}
