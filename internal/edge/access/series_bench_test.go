package access

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Observe is on every request's path: no allocation once the group exists.
func TestSeriesObserveAllocs(t *testing.T) {
	s := NewSeries(nil)
	r := rec("tiny", seriesT0, OK, 30*time.Millisecond, 10, 20)
	s.Observe(r)
	if n := testing.AllocsPerRun(1000, func() { s.Observe(r) }); n != 0 {
		t.Errorf("Observe: %v allocations, want 0", n)
	}
}

func BenchmarkSeriesObserve(b *testing.B) {
	s := NewSeries(nil)
	r := rec("tiny", seriesT0, OK, 30*time.Millisecond, 10, 20)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.Start = seriesT0.Add(time.Duration(i) * time.Millisecond) // crosses a slot every 10,000
		s.Observe(r)
	}
}

// BenchmarkMemory measures the heap the rings hold with every slot used
// (BENCHMARKS.md): B/group for 100 model groups, B/provider for 100
// providers (maps, names and the Series included), next to the arrays'
// computed sizes (SeriesBytes).
func BenchmarkSeriesMemory(b *testing.B) {
	const n = 100
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	names := func(prefix string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s-%03d", prefix, i)
		}
		return out
	}
	groups := names("model")
	var samples []ProviderSample
	for _, p := range names("provider") {
		samples = append(samples, ProviderSample{ProviderKey{"node-1", p}, 1, 4})
	}
	r := rec("", seriesT0, OK, 30*time.Millisecond, 10, 20)
	for b.Loop() {
		before := heap()
		g := NewSeries(nil)
		for slot := range SeriesSlots {
			now := seriesT0.Add(time.Duration(slot) * SeriesStep)
			g.Sample(now, groups, nil)
			for _, name := range groups {
				r.Model, r.Start = name, now.Add(-r.Duration)
				g.Observe(r)
			}
		}
		mid := heap()
		p := NewSeries(nil)
		for slot := range SeriesSlots {
			p.Sample(seriesT0.Add(time.Duration(slot)*SeriesStep), nil, samples)
		}
		end := heap()
		b.ReportMetric(float64(mid-before)/n, "B/group")
		b.ReportMetric(float64(end-mid)/n, "B/provider")
		b.ReportMetric(float64(SeriesBytes(1, 0)), "B/group-array")
		b.ReportMetric(float64(SeriesBytes(0, 1)), "B/provider-array")
		runtime.KeepAlive(g)
		runtime.KeepAlive(p)
	}
}
