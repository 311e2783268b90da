package access

import (
	"math"
	"strconv"
	"time"
	"unsafe"
)

const (
	sizeofGroup    = unsafe.Sizeof(groupRing{})
	sizeofProvider = unsafe.Sizeof(providerRing{})
)

// JSON is AppendJSON at the clock's now (NewSeries).
func (s *Series) JSON() []byte {
	return s.AppendJSON(make([]byte, 0, 4096), s.now())
}

// AppendJSON appends the series as the admin listener's GET /series
// serves them and returns the extended buffer:
//
//	{"step_ms":10000,"slots":90,"start_ms":…,"now_ms":…,
//	 "models":[{"name":"tiny","requests_per_s":[…],"errors_per_s":[…],
//	   "ttfb_p50_ms":[…],"ttfb_p99_ms":[…],
//	   "prompt_tokens_per_s":[…],"completion_tokens_per_s":[…]}],
//	 "providers":[{"node":"gpu-1","provider":"ollama",
//	   "in_flight_mean":[…],"in_flight_max":[…],"capacity":[…]}],
//	 "classes":[{"name":"interactive","requests_per_s":[…],
//	   "wait_p50_ms":[…],"wait_p99_ms":[…]}]}
//
// Every array has SeriesSlots values on one time axis: value i is the slot that
// starts at start_ms + i·step_ms (Unix ms), the last one the slot holding
// now_ms, which is still filling: its rates are over the part of it that
// has passed (at least 1 s). A configured group without a request since
// the edge started has its name only. Rates are per second; a quantile is null in a
// slot without a request that ended ok with a byte written, a provider
// value null in a slot without a sample. Models are the configured groups
// in config order, then OtherModel; providers in the order the
// last Sample gave them; classes the priority classes a request that
// reached the queue had, highest first, each with the requests that left
// the queue per second and their queue wait's p50 and p99 (SPEC G6).
func (s *Series) AppendJSON(b []byte, now time.Time) []byte {
	cur := slotOf(now)
	first := cur - SeriesSlots + 1
	start := time.Unix(0, first*int64(SeriesStep))
	x := axis{first: first, cur: cur, elapsed: max(now.Sub(time.Unix(0, cur*int64(SeriesStep))), time.Second)}
	s.mu.Lock()
	defer s.mu.Unlock()
	b = append(b, `{"step_ms":`...)
	b = strconv.AppendInt(b, SeriesStep.Milliseconds(), 10)
	b = append(b, `,"slots":`...)
	b = strconv.AppendInt(b, SeriesSlots, 10)
	b = append(b, `,"start_ms":`...)
	b = strconv.AppendInt(b, start.UnixMilli(), 10)
	b = append(b, `,"now_ms":`...)
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	b = append(b, `,"models":[`...)
	for gi, name := range s.sortedGroups() {
		if gi > 0 {
			b = append(b, ',')
		}
		b = x.appendModel(b, name, s.groups[name])
	}
	b = append(b, `],"providers":[`...)
	for pi, k := range s.porder {
		if pi > 0 {
			b = append(b, ',')
		}
		b = x.appendProvider(b, k, s.providers[k])
	}
	b = append(b, `],"classes":[`...)
	k := 0
	for i, g := range s.classes {
		if g == nil {
			continue
		}
		if k > 0 {
			b = append(b, ',')
		}
		k++
		b = x.appendClass(b, ClassNames[i], g)
	}
	return append(b, "]}\n"...)
}

// axis is the time axis of one AppendJSON: the slots first..cur (slot
// numbers, slotOf), cur still filling for elapsed (at least 1 s).
type axis struct {
	first, cur int64
	elapsed    time.Duration
}

// perSec is v, counted in slot n, per second: over elapsed for the slot
// still filling, over SeriesStep for the others.
func (x axis) perSec(n int64, v float64) float64 {
	if n == x.cur {
		return v / x.elapsed.Seconds()
	}
	return v / SeriesStep.Seconds()
}

// at is slot n of g, or nil when g holds none for it.
func (g *groupRing) at(n int64) *groupSlot {
	if !g.valid || n > g.head || n <= g.head-SeriesSlots {
		return nil
	}
	return &g.slots[index(n)]
}

// appendModel appends model group name's object, g its ring (nil: a
// configured group without a request yet, which has its name only).
func (x axis) appendModel(b []byte, name string, g *groupRing) []byte {
	b = append(b, `{"name":`...)
	b = strconv.AppendQuote(b, name)
	if g == nil { // configured, no request yet
		return append(b, '}')
	}
	// field writes one array; empty is the value of a slot g holds
	// nothing for (0 for a rate, null for a quantile).
	field := func(key string, empty float64, get func(n int64, sl *groupSlot) float64) {
		b = appendArray(b, key, x.first, x.cur, func(n int64) float64 {
			if sl := g.at(n); sl != nil {
				return get(n, sl)
			}
			return empty
		})
	}
	quantile := func(n int64, sl *groupSlot, q float64, closed float32) float64 {
		if n == g.head {
			return g.hist.quantile(q)
		}
		if sl.ttfbN == 0 {
			return math.NaN()
		}
		return float64(closed)
	}
	nan := math.NaN()
	field("requests_per_s", 0, func(n int64, sl *groupSlot) float64 { return x.perSec(n, float64(sl.requests)) })
	field("errors_per_s", 0, func(n int64, sl *groupSlot) float64 { return x.perSec(n, float64(sl.errors)) })
	field("ttfb_p50_ms", nan, func(n int64, sl *groupSlot) float64 { return quantile(n, sl, 0.5, sl.ttfbP50) })
	field("ttfb_p99_ms", nan, func(n int64, sl *groupSlot) float64 { return quantile(n, sl, 0.99, sl.ttfbP99) })
	field("prompt_tokens_per_s", 0, func(n int64, sl *groupSlot) float64 { return x.perSec(n, float64(sl.promptTokens)) })
	field("completion_tokens_per_s", 0, func(n int64, sl *groupSlot) float64 { return x.perSec(n, float64(sl.completionTokens)) })
	return append(b, '}')
}

// appendProvider appends provider k's object, p its ring.
func (x axis) appendProvider(b []byte, k ProviderKey, p *providerRing) []byte {
	b = append(b, `{"node":`...)
	b = strconv.AppendQuote(b, k.Node)
	b = append(b, `,"provider":`...)
	b = strconv.AppendQuote(b, k.Provider)
	field := func(key string, get func(sl *providerSlot) float64) {
		b = appendArray(b, key, x.first, x.cur, func(n int64) float64 {
			if p.valid && n <= p.head && n > p.head-SeriesSlots {
				if sl := &p.slots[index(n)]; sl.samples > 0 {
					return get(sl)
				}
			}
			return math.NaN()
		})
	}
	field("in_flight_mean", func(sl *providerSlot) float64 { return float64(sl.inFlightSum) / float64(sl.samples) })
	field("in_flight_max", func(sl *providerSlot) float64 { return float64(sl.inFlightMax) })
	field("capacity", func(sl *providerSlot) float64 { return float64(sl.capacity) })
	return append(b, '}')
}

// appendClass appends priority class name's object, g its queue-wait
// ring: the requests that left the queue per second and their wait's p50
// and p99 (SPEC G6).
func (x axis) appendClass(b []byte, name string, g *groupRing) []byte {
	b = append(b, `{"name":`...)
	b = strconv.AppendQuote(b, name)
	b = appendArray(b, "requests_per_s", x.first, x.cur, func(n int64) float64 {
		if sl := g.at(n); sl != nil {
			return x.perSec(n, float64(sl.requests))
		}
		return 0
	})
	for _, q := range []struct {
		key string
		q   float64
	}{{"wait_p50_ms", 0.5}, {"wait_p99_ms", 0.99}} {
		b = appendArray(b, q.key, x.first, x.cur, func(n int64) float64 {
			sl := g.at(n)
			switch {
			case sl == nil:
				return math.NaN()
			case n == g.head:
				return g.hist.quantile(q.q)
			case sl.ttfbN == 0:
				return math.NaN()
			case q.q == 0.5:
				return float64(sl.ttfbP50)
			}
			return float64(sl.ttfbP99)
		})
	}
	return append(b, '}')
}

// appendArray appends ,"key":[v(first),…,v(last)].
func appendArray(b []byte, key string, first, last int64, v func(n int64) float64) []byte {
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":[`...)
	for n := first; n <= last; n++ {
		if n > first {
			b = append(b, ',')
		}
		b = appendNum(b, v(n))
	}
	return append(b, ']')
}

// appendNum appends v with at most 4 significant digits, null for NaN.
func appendNum(b []byte, v float64) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, v, 'g', 4, 64)
}
