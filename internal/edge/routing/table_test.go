package routing

import (
	"slices"
	"testing"
)

// TestTable: R1 — the affinity table remembers the prefixes routed
// to a provider, answers the longest held prefix, evicts least recently
// used hashes beyond its limit and forgets everything on Reset (a new node
// generation).
func TestTable(t *testing.T) {
	rows := []struct {
		name   string
		limit  int
		record [][]uint64
		reset  bool
		query  []uint64
		want   int
		len    int
	}{
		{name: "issue16 empty table holds nothing", limit: 4, query: []uint64{1, 2}, want: 0},
		{name: "issue16 later turn matches the whole earlier conversation",
			limit: 8, record: [][]uint64{{1, 2}}, query: []uint64{1, 2, 3, 4}, want: 2, len: 2},
		{name: "issue16 longest prefix wins over a shorter one",
			limit: 8, record: [][]uint64{{1}, {1, 2, 3}}, query: []uint64{1, 2, 3, 4, 5}, want: 3, len: 3},
		{name: "issue16 another conversation does not match",
			limit: 8, record: [][]uint64{{1, 2}}, query: []uint64{7, 8}, want: 0, len: 2},
		{name: "issue16 limit evicts the least recently used",
			limit: 3, record: [][]uint64{{1, 2}, {5, 6}}, query: []uint64{1}, want: 0, len: 3},
		{name: "issue16 a re-recorded hash is used again and survives eviction",
			limit: 3, record: [][]uint64{{1, 2}, {5}, {1}, {9}}, query: []uint64{1}, want: 1, len: 3},
		{name: "issue16 reset for a new generation forgets everything",
			limit: 8, record: [][]uint64{{1, 2}}, reset: true, query: []uint64{1, 2}, want: 0, len: 0},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			tb := NewTable(1, r.limit)
			for _, p := range r.record {
				tb.Record(p, 0)
			}
			if r.reset {
				tb.Reset(2)
				if tb.Gen() != 2 {
					t.Fatalf("Gen after Reset(2) = %d, want 2", tb.Gen())
				}
			}
			if got := tb.Longest(r.query); got != r.want {
				t.Errorf("Longest(%v) = %d, want %d", r.query, got, r.want)
			}
			if tb.Len() != r.len {
				t.Errorf("Len = %d, want %d", tb.Len(), r.len)
			}
			checkLinks(t, tb)
		})
	}
}

// TestTableBounded: R2 — memory is bounded: any number of records
// keeps at most limit entries, and the links stay a consistent list.
func TestTableBounded(t *testing.T) {
	tb := NewTable(1, 64)
	x := uint64(1)
	for i := range 10000 {
		p := make([]uint64, 1+i%7)
		for j := range p {
			x = mix(x)
			p[j] = x % 300 // repeats on purpose
		}
		tb.Record(p, 0)
		if tb.Len() > 64 || len(tb.ents) > 64 {
			t.Fatalf("after %d records: Len %d, entries %d, want ≤ 64", i+1, tb.Len(), len(tb.ents))
		}
	}
	checkLinks(t, tb)
}

// checkLinks walks the LRU list both ways and compares it with the map.
func checkLinks(t *testing.T, tb *Table) {
	t.Helper()
	var fwd []uint64
	prev := int32(-1)
	for i := tb.head; i >= 0; i = tb.ents[i].next {
		if tb.ents[i].prev != prev {
			t.Fatalf("entry %d: prev %d, want %d", i, tb.ents[i].prev, prev)
		}
		fwd = append(fwd, tb.ents[i].hash)
		prev = i
		if len(fwd) > len(tb.ents) {
			t.Fatal("LRU list has a cycle")
		}
	}
	if prev != tb.tail {
		t.Fatalf("tail %d, want %d", tb.tail, prev)
	}
	if len(fwd) != len(tb.idx) {
		t.Fatalf("list holds %d hashes, map %d", len(fwd), len(tb.idx))
	}
	for _, h := range fwd {
		if _, ok := tb.idx[h]; !ok {
			t.Fatalf("hash %d in the list, not in the map", h)
		}
	}
	slices.Sort(fwd)
	if len(slices.Compact(fwd)) != len(tb.idx) {
		t.Fatal("duplicate hash in the LRU list")
	}
}

// TestTableHeld: Q3 — the table's estimate of the prompt tokens a provider
// holds of a request: a whole earlier prompt holds all its tokens, an
// earlier boundary first recorded inside a longer prompt its share.
func TestTableHeld(t *testing.T) {
	rows := []struct {
		name       string
		record     [][]uint64
		tokens     []int
		query      []uint64
		wantMatch  int
		wantTokens int
	}{
		{name: "nothing held", query: []uint64{1}, wantMatch: 0, wantTokens: 0},
		{name: "the previous turn's whole prompt",
			record: [][]uint64{{1}, {1, 2, 3}}, tokens: []int{500, 900}, query: []uint64{1, 2, 3, 4, 5}, wantMatch: 3, wantTokens: 900},
		{name: "a boundary first seen inside a longer prompt holds its share",
			record: [][]uint64{{1, 2, 3}}, tokens: []int{900}, query: []uint64{1, 2, 7}, wantMatch: 2, wantTokens: 600},
		{name: "a boundary keeps the estimate of the prompt it ended",
			record: [][]uint64{{1}, {1, 2, 3}}, tokens: []int{500, 900}, query: []uint64{1, 9}, wantMatch: 1, wantTokens: 500},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			tb := NewTable(1, 16)
			for i, p := range r.record {
				tb.Record(p, r.tokens[i])
			}
			if m, n := tb.Held(r.query); m != r.wantMatch || n != r.wantTokens {
				t.Errorf("Held = %d boundaries, %d tokens; want %d, %d", m, n, r.wantMatch, r.wantTokens)
			}
		})
	}
}
