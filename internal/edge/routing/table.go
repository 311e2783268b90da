package routing

import "math"

// DefaultTableEntries is a provider's affinity table size when the config
// says nothing: 16384 prefix hashes, about 1 MiB (TableEntryBytes each).
const DefaultTableEntries = 16384

// TableEntryBytes is the approximate memory of one table entry in bytes:
// the entry (8-byte hash, two int32 LRU links, an int32 token estimate) and
// its map slot (8-byte key, int32 value, control byte and load-factor
// slack). Measured by BenchmarkTableMemory.
const TableEntryBytes = 64

// Table is one provider's affinity table: the prefix hashes of the
// requests recently routed to it, at most its limit, least recently used
// evicted first. It belongs to one node generation (Gen): a backend behind
// a reconnected node may have restarted and lost its cache, so the pool
// resets the table when the generation changes. Not safe for concurrent
// use (the pool calls it under its lock).
type Table struct {
	gen   uint64
	limit int
	idx   map[uint64]int32
	ents  []entry
	head  int32 // most recently used, -1 when empty
	tail  int32 // least recently used, -1 when empty
}

type entry struct {
	hash       uint64
	prev, next int32 // towards head / towards tail; -1 = none
	tokens     int32 // estimated prompt tokens up to this boundary (Record)
}

// NewTable returns an empty table for node generation gen holding at most
// limit hashes (limit <= 0 means DefaultTableEntries). Memory grows with
// use up to limit × TableEntryBytes.
func NewTable(gen uint64, limit int) *Table {
	if limit <= 0 {
		limit = DefaultTableEntries
	}
	return &Table{gen: gen, limit: limit, idx: make(map[uint64]int32), head: -1, tail: -1}
}

// Gen is the node generation the table's entries belong to.
func (t *Table) Gen() uint64 { return t.gen }

// Len is the number of hashes held.
func (t *Table) Len() int { return len(t.idx) }

// Reset empties the table for generation gen, keeping its storage.
func (t *Table) Reset(gen uint64) {
	t.gen = gen
	clear(t.idx)
	t.ents = t.ents[:0]
	t.head, t.tail = -1, -1
}

// Longest returns how many leading boundaries of prefix the table holds: i+1
// for the largest i with prefix[i] held, 0 when none is. It does not touch
// the LRU order (looking at a candidate is not using it). Cost: at most
// len(prefix) map lookups, longest first.
func (t *Table) Longest(prefix []uint64) int {
	for i := len(prefix) - 1; i >= 0; i-- {
		if _, ok := t.idx[prefix[i]]; ok {
			return i + 1
		}
	}
	return 0
}

// Held is Longest with the estimated prompt tokens of the request up to
// that boundary (the tokens Record stored for it; 0 when none is held): the
// part of the request's prompt the provider is expected to find in its
// prefix cache. Cost: as Longest.
func (t *Table) Held(prefix []uint64) (match, tokens int) {
	for i := len(prefix) - 1; i >= 0; i-- {
		if e, ok := t.idx[prefix[i]]; ok {
			return i + 1, int(t.ents[e].tokens)
		}
	}
	return 0, 0
}

// Record marks every boundary of prefix as held, the longest most recently
// used, evicting the least recently used hashes beyond the limit. tokens is
// the request's estimated prompt tokens (pool.EstimatePromptTokens): the
// last boundary is the whole prompt and holds all of them; an earlier
// boundary i of n that was not held yet gets the share tokens·(i+1)/n (a
// boundary already held keeps its estimate: it was, or was estimated as,
// an earlier request's whole prompt).
func (t *Table) Record(prefix []uint64, tokens int) {
	tokens = min(max(tokens, 0), math.MaxInt32)
	for k, h := range prefix {
		last := k == len(prefix)-1
		if i, ok := t.idx[h]; ok {
			if last {
				t.ents[i].tokens = int32(tokens)
			}
			t.unlink(i)
			t.pushFront(i)
			continue
		}
		var i int32
		if len(t.ents) < t.limit {
			i = int32(len(t.ents))
			t.ents = append(t.ents, entry{})
		} else {
			i = t.tail
			t.unlink(i)
			delete(t.idx, t.ents[i].hash)
		}
		t.ents[i].hash = h
		t.ents[i].tokens = int32(tokens)
		if !last {
			t.ents[i].tokens = int32(int64(tokens) * int64(k+1) / int64(len(prefix)))
		}
		t.idx[h] = i
		t.pushFront(i)
	}
}

func (t *Table) unlink(i int32) {
	e := &t.ents[i]
	if e.prev >= 0 {
		t.ents[e.prev].next = e.next
	} else {
		t.head = e.next
	}
	if e.next >= 0 {
		t.ents[e.next].prev = e.prev
	} else {
		t.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (t *Table) pushFront(i int32) {
	e := &t.ents[i]
	e.prev, e.next = -1, t.head
	if t.head >= 0 {
		t.ents[t.head].prev = i
	}
	t.head = i
	if t.tail < 0 {
		t.tail = i
	}
}
