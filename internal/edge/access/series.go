package access

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// The ring geometry: SeriesSlots slots of SeriesStep each, 15 minutes.
const (
	SeriesStep  = 10 * time.Second
	SeriesSlots = 90
)

// SeriesSampleInterval is how often the Edge samples its providers (Sample);
// a slot holds up to SeriesStep / SeriesSampleInterval samples.
const SeriesSampleInterval = time.Second

// slotOf is the absolute slot number of t: Unix time in SeriesSteps.
func slotOf(t time.Time) int64 {
	return floorDiv(t.UnixNano(), int64(SeriesStep))
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// ring is the bookkeeping of a fixed array of SeriesSlots slots: which absolute
// slot number the newest one holds. Slot n lives at index n mod SeriesSlots while
// head-SeriesSlots < n <= head.
type ring struct {
	head  int64 // absolute slot number of the newest slot
	valid bool  // head has been set
}

// index is where absolute slot n lives.
func index(n int64) int {
	i := int(n % SeriesSlots)
	if i < 0 {
		i += SeriesSlots
	}
	return i
}

// advance makes n the newest slot when it is newer than head, calling
// clear for every index that now holds a new, empty slot (at most SeriesSlots
// of them, however long the gap), and reports where n lives: ok is false
// when n is older than the window (a sample that came too late, or a
// clock that went back further than 15 minutes).
func (r *ring) advance(n int64, clear func(i int)) (i int, ok bool) {
	switch {
	case !r.valid:
		for j := range SeriesSlots {
			clear(j)
		}
		r.head, r.valid = n, true
	case n > r.head:
		gap := min(n-r.head, SeriesSlots)
		for k := n - gap + 1; k <= n; k++ {
			clear(index(k))
		}
		r.head = n
	case n <= r.head-SeriesSlots:
		return 0, false
	}
	return index(n), true
}

// Series is the operator page's recent history: for each model group the
// last 15 minutes of requests/s, errors/s, time to first byte (p50 and
// p99) and tokens/s, and for each provider its requests in flight against
// its capacity, in fixed-size in-memory rings of SeriesSlots slots of
// SeriesStep each. Nothing grows with traffic: memory is bounded by the
// configured model groups (plus OtherModel) and providers (SeriesBytes).
//
// It is fed from two places and does no I/O: the per-request Record at the
// request's end (Observe; Metrics calls it as an Observer), and provider
// samples the Edge takes from its pool on a ticker (Sample). A Record
// brings its own time (Start + Duration) and Sample takes the sampling
// time, so the rings are pure functions of what they were given; the clock
// given to NewSeries is read only to place "now" when the series are read
// (JSON). Labels are bounded as the metrics' are (SPEC O3): a model is a
// configured group or OtherModel, a provider a configured one; no request
// id, principal or body is kept (SPEC P4).
//
// Safe for concurrent use: one mutex, held for a few map lookups and
// additions per call (Observe is on every request's path). The zero value
// is not ready; use NewSeries.
type Series struct {
	now func() time.Time

	mu        sync.Mutex
	groups    map[string]*groupRing
	order     []string // the configured groups, config order (Sample)
	providers map[ProviderKey]*providerRing
	porder    []ProviderKey // the providers of the last Sample, in its order
	// classes are the queue waits per priority class (SPEC G6), in
	// ClassNames order: a groupRing whose TTFB is the queue wait.
	classes [len(ClassNames)]*groupRing
}

// ClassNames are the priority classes the series keep a queue-wait ring
// for, highest first (SPEC G2).
var ClassNames = [...]string{"critical", "interactive", "batch"}

// NewSeries returns empty Series; now is the clock JSON reads ("now" on the
// time axis; time.Now in the Edge, a fake in tests).
func NewSeries(now func() time.Time) *Series {
	return &Series{now: now, groups: map[string]*groupRing{}, providers: map[ProviderKey]*providerRing{}}
}

// Observe adds one finished request (the access record the HTTP layer
// wrote at its end) to its model group's slot of Start + Duration: one
// request; an error unless its outcome is ok or client_cancelled (what the
// operator page's "Last errors" lists); its time to first byte when it
// ended ok with a byte written; its prompt and completion tokens. It
// satisfies Observer. No allocation once the group exists.
func (s *Series) Observe(r *Record) {
	end := r.Start.Add(r.Duration)
	model := ModelLabel(r.Model, r.Known)
	failed := r.Outcome != OK && r.Outcome != ClientCancelled && r.Outcome != ""
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[model]
	if g == nil {
		g = &groupRing{}
		s.groups[model] = g
	}
	g.add(slotOf(end), failed, r.Outcome == OK && r.TTFB > 0, r.TTFB, r.PromptTokens, r.CompletionTokens)
	if r.Class != "" {
		for i, c := range ClassNames {
			if c == r.Class {
				if s.classes[i] == nil {
					s.classes[i] = &groupRing{}
				}
				s.classes[i].add(slotOf(r.Start.Add(r.QueueWait)), false, true, r.QueueWait, 0, 0)
			}
		}
	}
}

// ProviderKey names a provider: its node and adapter instance.
type ProviderKey struct{ Node, Provider string }

// ProviderSample is one provider's state at a sampling instant: leases
// held and effective capacity (0 while offline, overlaid or cooling;
// SPEC N3, Q8).
type ProviderSample struct {
	ProviderKey
	InFlight, Capacity int32
}

// Sample records the providers' state at now and sets the model groups
// the series keep, in the order the page lists them (the configured
// groups; OtherModel is always kept). A provider or group that is
// no longer given (a reload removed it) is forgotten, so memory follows
// the config.
func (s *Series) Sample(now time.Time, groups []string, samples []ProviderSample) {
	n := slotOf(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.order = append(s.order[:0], groups...)
	for name := range s.groups {
		if name != OtherModel && !slices.Contains(groups, name) {
			delete(s.groups, name)
		}
	}
	s.porder = s.porder[:0]
	seen := make(map[ProviderKey]bool, len(samples))
	for _, ps := range samples {
		if seen[ps.ProviderKey] {
			continue
		}
		seen[ps.ProviderKey] = true
		s.porder = append(s.porder, ps.ProviderKey)
		p := s.providers[ps.ProviderKey]
		if p == nil {
			p = &providerRing{}
			s.providers[ps.ProviderKey] = p
		}
		p.add(n, ps.InFlight, ps.Capacity)
	}
	for k := range s.providers {
		if !seen[k] {
			delete(s.providers, k)
		}
	}
}

// group is one model group's ring.
type groupRing struct {
	ring
	slots [SeriesSlots]groupSlot
	hist  ttfbHist // the TTFBs of the newest slot, folded into it when it closes
}

// groupSlot is one SeriesStep of a model group.
type groupSlot struct {
	requests, errors               uint32
	promptTokens, completionTokens uint64
	// ttfbN counts the TTFBs the slot's quantiles are over; ttfbP50 and
	// ttfbP99 (ms) are set when the slot closes (the newest slot's come
	// from the group's histogram when read).
	ttfbN            uint32
	ttfbP50, ttfbP99 float32
}

func (g *groupRing) add(n int64, failed, timed bool, ttfb time.Duration, prompt, completion int64) {
	head, had := g.head, g.valid
	if had && n > head {
		g.close(index(head))
	}
	i, ok := g.advance(n, func(i int) { g.slots[i] = groupSlot{} })
	if !ok {
		return
	}
	sl := &g.slots[i]
	sl.requests++
	if failed {
		sl.errors++
	}
	sl.promptTokens += uint64(max(prompt, 0))
	sl.completionTokens += uint64(max(completion, 0))
	// A late request (its slot already closed) is counted but its TTFB
	// is left out: the closed slot's quantiles are final.
	if timed && n == g.head {
		g.hist.add(ttfb)
	}
}

// close folds the histogram into slot i (the newest) and empties it.
func (g *groupRing) close(i int) {
	sl := &g.slots[i]
	sl.ttfbN = g.hist.n
	sl.ttfbP50, sl.ttfbP99 = float32(g.hist.quantile(0.5)), float32(g.hist.quantile(0.99))
	g.hist = ttfbHist{}
}

// provider is one provider's ring.
type providerRing struct {
	ring
	slots [SeriesSlots]providerSlot
}

// providerSlot is one SeriesStep of samples of a provider.
type providerSlot struct {
	samples     uint32
	inFlightSum int64
	inFlightMax int32
	capacity    int32 // the last sample's
}

func (p *providerRing) add(n int64, inFlight, capacity int32) {
	i, ok := p.advance(n, func(i int) { p.slots[i] = providerSlot{} })
	if !ok {
		return
	}
	sl := &p.slots[i]
	sl.samples++
	sl.inFlightSum += int64(inFlight)
	sl.inFlightMax = max(sl.inFlightMax, inFlight)
	sl.capacity = capacity
}

// ttfbHist is a log-scale histogram of times to first byte: bucket i
// holds values up to ttfbBase·2^(i/4) (four buckets per octave, so a
// quantile read from it is within ±9 % of the true value), from 0.25 ms to
// about 220 s; the last bucket takes anything longer.
type ttfbHist struct {
	counts [ttfbBuckets + 1]uint32
	n      uint32
}

const (
	ttfbBuckets = 80
	ttfbBase    = 0.25 // ms
)

// ttfbBound is bucket i's upper bound, ms.
func ttfbBound(i int) float64 { return ttfbBase * math.Exp2(float64(i)/4) }

func (h *ttfbHist) add(d time.Duration) {
	ms := float64(d) / float64(time.Millisecond)
	i := 0
	if ms > ttfbBase {
		i = min(int(math.Ceil(4*math.Log2(ms/ttfbBase)-1e-9)), ttfbBuckets)
	}
	h.counts[i]++
	h.n++
}

// quantile is the q-quantile (0 < q <= 1) in ms: the geometric middle of
// the bucket holding the rank-⌈q·n⌉ value; NaN without values.
func (h *ttfbHist) quantile(q float64) float64 {
	if h.n == 0 {
		return math.NaN()
	}
	rank := uint32(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var cum uint32
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			switch {
			case i == 0:
				return ttfbBase
			case i == ttfbBuckets:
				return ttfbBound(ttfbBuckets)
			}
			return ttfbBound(i) * math.Exp2(-1.0/8)
		}
	}
	return ttfbBound(ttfbBuckets)
}

// Bytes is the memory the rings hold for groups model groups and
// providers providers (the arrays; map and name overhead come on top,
// BENCHMARKS.md measures both).
func SeriesBytes(groups, providers int) int {
	return groups*int(sizeofGroup) + providers*int(sizeofProvider)
}

// sortedGroups lists the groups to show: the configured ones in order
// (with or without a ring), then any other observed (OtherModel; groups observed before the
// first Sample) by name.
func (s *Series) sortedGroups() []string {
	out := make([]string, 0, len(s.groups)+len(s.order))
	out = append(out, s.order...)
	var rest []string
	for name := range s.groups {
		if !slices.Contains(s.order, name) {
			rest = append(rest, name)
		}
	}
	slices.SortFunc(rest, func(a, b string) int {
		if (a == OtherModel) != (b == OtherModel) {
			if a == OtherModel {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	return append(out, rest...)
}
