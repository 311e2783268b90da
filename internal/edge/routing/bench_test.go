package routing

import (
	"runtime"
	"testing"
)

// BenchmarkChoose: one prefix_affinity decision over three candidates
// whose tables hold 10,000 hashes, for a 12-message conversation.
func BenchmarkChoose(b *testing.B) {
	tables := []*Table{NewTable(1, 0), NewTable(1, 0), NewTable(1, 0)}
	x := uint64(1)
	for i := range 10000 {
		x = mix(x)
		tables[i%3].Record([]uint64{x}, 0)
	}
	prefix := make([]uint64, 12)
	for i := range prefix {
		x = mix(x)
		prefix[i] = x
	}
	tables[1].Record(prefix[:8], 0)
	cands := make([]Candidate, 3)
	b.ReportAllocs()
	for b.Loop() {
		for i, tb := range tables {
			cands[i] = Candidate{ID: uint64(i + 1), Live: true, Free: true, Load: 1, Weight: 8, Match: tb.Longest(prefix)}
		}
		Choose(cands, Turn{HasKey: true, Key: prefix[0]}, Policy{Epsilon: DefaultEpsilon})
	}
}

// BenchmarkTableRecord: recording a 12-boundary prefix into a full table
// (every hash new: 12 evictions).
func BenchmarkTableRecord(b *testing.B) {
	tb := NewTable(1, 4096)
	prefix := make([]uint64, 12)
	x := uint64(1)
	b.ReportAllocs()
	for b.Loop() {
		for i := range prefix {
			x = mix(x)
			prefix[i] = x
		}
		tb.Record(prefix, 0)
	}
}

// BenchmarkTableMemory reports the heap bytes per entry of a full table at
// the default limit (the figure TableEntryBytes states).
func BenchmarkTableMemory(b *testing.B) {
	var before, after runtime.MemStats
	var keep *Table
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&before)
		tb := NewTable(1, DefaultTableEntries)
		x := uint64(1)
		for range DefaultTableEntries {
			x = mix(x)
			tb.Record([]uint64{x}, 0)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		keep = tb
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(keep.Len()), "B/entry")
}

// BenchmarkChain: hashing one 400-byte message into a chain.
func BenchmarkChain(b *testing.B) {
	hs := NewHasher()
	msg := make([]byte, 400)
	for i := range msg {
		msg[i] = 'a' + byte(i%26)
	}
	ch := hs.Start("tiny")
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		ch.Add(msg)
	}
}
