package routing

import (
	"fmt"
	"testing"
)

// cold marks c's target not loaded (SPEC U6).
func cold(c Candidate) Candidate { c.Cold = true; return c }

// free returns a live candidate with a free slot.
func free(id uint64, load, weight, match int) Candidate {
	return Candidate{ID: id, Live: true, Free: true, Load: load, Weight: weight, Match: match}
}

// TestChoose: R1 — the decision table of prefix affinity.
func TestChoose(t *testing.T) {
	busy := func(c Candidate) Candidate { c.Free = false; return c }
	down := func(c Candidate) Candidate { c.Free, c.Live = false, false; return c }
	rows := []struct {
		name   string
		cands  []Candidate
		noKey  bool
		want   int // -2: any candidate, checked by result only
		result Result
	}{
		{name: "issue16 nobody free: the request waits",
			cands: []Candidate{busy(free(1, 4, 4, 3)), down(free(2, 0, 4, 0))}, want: -1, result: ResultFallback},
		{name: "issue16 the holder of the longest prefix wins",
			cands: []Candidate{free(1, 0, 4, 0), free(2, 0, 4, 2), free(3, 0, 4, 0)}, want: 1, result: ResultPrefixHit},
		{name: "issue16 longer match beats shorter",
			cands: []Candidate{free(1, 0, 4, 2), free(2, 0, 4, 5)}, want: 1, result: ResultPrefixHit},
		{name: "issue16 holder at capacity: another free candidate, never a wait",
			cands: []Candidate{busy(free(1, 4, 4, 3)), free(2, 0, 4, 0)}, want: 1, result: ResultFallback},
		{name: "issue16 holder above the load bound but free keeps its conversation",
			// m = 5+0+1 = 6, the bound = ⌈1.5·6/2⌉ = 5 < 5+1: a new
			// conversation would go to candidate 1, a held one stays
			cands: []Candidate{free(1, 5, 8, 3), free(2, 0, 8, 0)}, want: 0, result: ResultPrefixHit},
		{name: "issue16 three providers at low load: a holder with one in flight takes a second held conversation",
			// m = 1+0+0+1 = 2, the bound = ⌈1.5·2/3⌉ = 1 < 1+1
			cands: []Candidate{free(1, 1, 4, 2), free(2, 0, 4, 0), free(3, 0, 4, 0)}, want: 0, result: ResultPrefixHit},
		{name: "issue16 equal holders: the bounded hash decides among them, never a stranger",
			// m = 3+0+1+1 = 5, the bound = ⌈1.5·5/3⌉ = 3: candidate 0 is
			// out of bound, candidate 2 within, candidate 1 holds nothing
			cands: []Candidate{free(1, 3, 4, 2), free(2, 0, 4, 0), free(3, 1, 4, 2)}, want: 2, result: ResultPrefixHit},
		{name: "issue16 equal holders all above the bound: the least loaded holder",
			cands: []Candidate{free(1, 3, 4, 2), free(2, 0, 8, 0), free(3, 2, 4, 2)}, want: 2, result: ResultPrefixHit},
		{name: "issue16 holder cooling or overlaid (not live) is skipped, its match ignored",
			cands: []Candidate{down(free(1, 0, 4, 3)), free(2, 0, 4, 0), free(3, 0, 4, 0)}, want: -2, result: ResultHash},
		{name: "issue16 shorter holder beats a stranger when the longest is busy",
			cands: []Candidate{busy(free(1, 4, 4, 3)), free(2, 0, 4, 1), free(3, 0, 4, 0)}, want: 1, result: ResultFallback},
		{name: "issue16 no conversation: least loaded free candidate",
			cands: []Candidate{free(1, 2, 4, 0), free(2, 1, 4, 0), free(3, 3, 4, 0)}, noKey: true, want: 1, result: ResultFallback},
		{name: "issue16 no match: the hash decides",
			cands: []Candidate{free(1, 0, 4, 0), free(2, 0, 4, 0)}, want: -2, result: ResultHash},
		{name: "U6 a loaded candidate before a cold holder of the prefix",
			cands: []Candidate{cold(free(1, 0, 4, 3)), free(2, 0, 4, 0)}, want: 1, result: ResultFallback},
		{name: "U6 no conversation: the loaded candidate although busier",
			cands: []Candidate{cold(free(1, 0, 4, 0)), free(2, 3, 4, 0)}, noKey: true, want: 1, result: ResultFallback},
		{name: "U6 every free candidate cold: decided as without residency",
			cands: []Candidate{cold(free(1, 2, 4, 0)), cold(free(2, 1, 4, 0)), busy(free(3, 4, 4, 0))}, noKey: true, want: 1, result: ResultFallback},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			got, res := Choose(r.cands, Turn{HasKey: !r.noKey, Key: 0xfeed}, Policy{Epsilon: 0.5}) // the bounds in the rows' comments
			if r.want != -2 && got != r.want || r.want == -2 && got < 0 {
				t.Errorf("chose %d, want %d", got, r.want)
			}
			if res != r.result {
				t.Errorf("result %s, want %s", res, r.result)
			}
		})
	}
}

// TestConversationStaysOnItsProvider: R1 — the later turns of a
// conversation go to the provider that served its first turn, through the
// tables, while it has a free slot: every turn of the 60 conversations is
// in flight at once (each request stays until the turn ends), so the
// holders' loads are uneven all the time (the arrival order changes every
// turn).
func TestConversationStaysOnItsProvider(t *testing.T) {
	hs := NewHasher()
	ids := []uint64{ProviderID("gpu-1/a"), ProviderID("gpu-1/b"), ProviderID("gpu-2/a")}
	tables := []*Table{NewTable(1, 0), NewTable(1, 0), NewTable(1, 0)}
	home := map[int]int{}
	for turn := range 5 {
		load := make([]int, len(ids))
		for k := range 60 {
			conv := (k + 17*turn) % 60 // a different arrival order each turn
			ch := hs.Start("tiny")
			ch.Add([]byte(`{"role":"system","content":"shared"}`))
			var prefix []uint64
			for k := 0; k <= 2*turn; k++ {
				role := "user"
				if k%2 == 1 {
					role = "assistant"
				}
				prefix = append(prefix, ch.Add(fmt.Appendf(nil, `{"role":%q,"content":"conv %d msg %d"}`, role, conv, k)))
			}
			cands := make([]Candidate, len(ids))
			for i := range ids {
				cands[i] = free(ids[i], load[i], 64, tables[i].Longest(prefix))
			}
			got, res := Choose(cands, Turn{HasKey: true, Key: prefix[0]}, Policy{Epsilon: DefaultEpsilon})
			tables[got].Record(prefix, 0)
			load[got]++
			if turn == 0 {
				if res != ResultHash {
					t.Fatalf("conv %d turn 0: result %s, want hash", conv, res)
				}
				home[conv] = got
				continue
			}
			if got != home[conv] || res != ResultPrefixHit {
				t.Fatalf("conv %d turn %d: provider %d (%s), want %d (prefix_hit)", conv, turn, got, res, home[conv])
			}
		}
	}
	count := make([]int, len(ids))
	for _, p := range home {
		count[p]++
	}
	for i, n := range count {
		if n < 10 || n > 30 {
			t.Errorf("provider %d is home of %d of 60 conversations, want 10-30 (the hash spreads them)", i, n)
		}
	}
}

// TestLoadNeverExceedsBound: R2 — under any mix of arrivals and
// departures, with equal capacities, every hash decision (a conversation
// no free candidate holds) stays within ⌈(1+ε)·m/n⌉, and a conversation
// whose holder is overloaded stays on it while it has a free slot: its
// capacity, not the bound, limits it.
func TestLoadNeverExceedsBound(t *testing.T) {
	for _, eps := range []float64{0, 0.1, 0.25, 1} {
		t.Run(fmt.Sprintf("issue16 epsilon %g", eps), func(t *testing.T) {
			const n, capacity = 4, 64
			load := make([]int, n)
			match := make([]int, n)
			x := uint64(42)
			hits, hashes := 0, 0
			for step := range 20000 {
				x = mix(x + uint64(step))
				total := 0
				for _, l := range load {
					total += l
				}
				if (x%2 == 0 || total == n*capacity) && total > 0 { // a departure
					i := int(x>>8) % n
					for load[i] == 0 {
						i = (i + 1) % n
					}
					load[i]--
					continue
				}
				// Skewed affinity: candidate 0 holds most conversations.
				clear(match)
				if x%4 != 0 {
					match[0] = 3
				}
				cands := make([]Candidate, n)
				for i := range cands {
					cands[i] = Candidate{ID: uint64(i + 1), Live: true, Free: load[i] < capacity, Load: load[i], Weight: capacity, Match: match[i]}
				}
				got, res := Choose(cands, Turn{HasKey: true, Key: x}, Policy{Epsilon: eps})
				if got < 0 {
					t.Fatalf("step %d: nothing chosen with loads %v", step, load)
				}
				switch bound := int(ceilDiv(float64(total+1)*(1+eps), n)); {
				case match[0] > 0 && load[0] < capacity:
					if got != 0 || res != ResultPrefixHit {
						t.Fatalf("step %d: loads %v, holder 0 free, chose %d (%s)", step, load, got, res)
					}
					hits++
				case match[0] > 0:
					if res != ResultFallback {
						t.Fatalf("step %d: holder at capacity, result %s, want fallback", step, res)
					}
				case load[got]+1 > bound:
					t.Fatalf("step %d: loads %v, chose %d → %d, above bound %d", step, load, got, load[got]+1, bound)
				default:
					hashes++
				}
				load[got]++
			}
			if hits == 0 || hashes == 0 {
				t.Fatalf("%d prefix hits, %d hash decisions: the walk missed a case", hits, hashes)
			}
		})
	}
}

func ceilDiv(a float64, n int) float64 {
	q := a / float64(n)
	if q != float64(int(q)) {
		return float64(int(q) + 1)
	}
	return q
}

// TestLeavingProviderMovesOnlyItsConversations: R1 — when a provider
// leaves or cools, only the conversations it held move; every other
// conversation keeps its provider (by its table and by the hash alike).
func TestLeavingProviderMovesOnlyItsConversations(t *testing.T) {
	ids := []uint64{ProviderID("n1/a"), ProviderID("n2/a"), ProviderID("n3/a"), ProviderID("n4/a")}
	assign := func(keys int, gone int, withTables []*Table) []int {
		out := make([]int, keys)
		for k := range keys {
			key := mix(uint64(k) + 7)
			cands := make([]Candidate, len(ids))
			for i := range ids {
				cands[i] = free(ids[i], 0, 4, 0)
				if withTables != nil {
					cands[i].Match = withTables[i].Longest([]uint64{key})
				}
				if i == gone {
					cands[i].Live, cands[i].Free = false, false
				}
			}
			out[k], _ = Choose(cands, Turn{HasKey: true, Key: key}, Policy{Epsilon: DefaultEpsilon})
		}
		return out
	}
	for _, withTables := range []bool{false, true} {
		t.Run(fmt.Sprintf("issue16 tables %t", withTables), func(t *testing.T) {
			var tables []*Table
			before := assign(2000, -1, nil)
			if withTables {
				tables = []*Table{NewTable(1, 0), NewTable(1, 0), NewTable(1, 0), NewTable(1, 0)}
				for k, p := range before {
					tables[p].Record([]uint64{mix(uint64(k) + 7)}, 0)
				}
			}
			for gone := range ids {
				after := assign(2000, gone, tables)
				moved := 0
				for k := range before {
					switch {
					case before[k] == gone && after[k] == gone:
						t.Fatalf("key %d stayed on the gone provider %d", k, gone)
					case before[k] == gone:
						moved++
					case after[k] != before[k]:
						t.Fatalf("provider %d left: key %d moved from %d to %d", gone, k, before[k], after[k])
					}
				}
				if moved == 0 {
					t.Fatalf("provider %d held no key", gone)
				}
			}
		})
	}
}
