package access

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

// seriesT0 is a slot boundary.
var seriesT0 = time.Unix(1767225600, 0)

// modelView is one model of /series as a client decodes it.
type modelView struct {
	Name       string     `json:"name"`
	Requests   []*float64 `json:"requests_per_s"`
	Errors     []*float64 `json:"errors_per_s"`
	P50        []*float64 `json:"ttfb_p50_ms"`
	P99        []*float64 `json:"ttfb_p99_ms"`
	Prompt     []*float64 `json:"prompt_tokens_per_s"`
	Completion []*float64 `json:"completion_tokens_per_s"`
}

// view is /series as a client decodes it (null → nil).
type view struct {
	StepMs    int64       `json:"step_ms"`
	Slots     int         `json:"slots"`
	StartMs   int64       `json:"start_ms"`
	NowMs     int64       `json:"now_ms"`
	Models    []modelView `json:"models"`
	Providers []struct {
		Node     string     `json:"node"`
		Provider string     `json:"provider"`
		Mean     []*float64 `json:"in_flight_mean"`
		Max      []*float64 `json:"in_flight_max"`
		Capacity []*float64 `json:"capacity"`
	} `json:"providers"`
}

func decode(t *testing.T, s *Series, now time.Time) view {
	t.Helper()
	b := s.AppendJSON(nil, now)
	var v view
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("/series is not JSON: %v\n%s", err, b)
	}
	if v.StepMs != SeriesStep.Milliseconds() || v.Slots != SeriesSlots || v.NowMs != now.UnixMilli() {
		t.Fatalf("header %+v", v)
	}
	for _, m := range v.Models {
		if m.Requests == nil && m.Errors == nil && m.P50 == nil && m.P99 == nil && m.Prompt == nil && m.Completion == nil {
			continue // a configured group without a request yet: its name only
		}
		for _, a := range [][]*float64{m.Requests, m.Errors, m.P50, m.P99, m.Prompt, m.Completion} {
			if len(a) != SeriesSlots {
				t.Fatalf("model %s: %d values, want %d", m.Name, len(a), SeriesSlots)
			}
		}
	}
	return v
}

// rec is a finished request ending at end.
func rec(model string, end time.Time, outcome Outcome, ttfb time.Duration, prompt, completion int64) *Record {
	d := 50 * time.Millisecond
	return &Record{Start: end.Add(-d), Duration: d, Model: model, Known: model != "nope", Outcome: outcome,
		TTFB: ttfb, PromptTokens: prompt, CompletionTokens: completion}
}

func val(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// near reports whether got is within ±9 % of want (the histogram's
// resolution), or both are missing.
func near(got, want float64) bool {
	if math.IsNaN(want) {
		return math.IsNaN(got)
	}
	return math.Abs(got-want) <= 0.09*want
}

// The request rings, fed from access records (SPEC O3: a model label is a
// configured group or _other): rates per second over a 10 s slot (over
// the part that passed for the newest), errors as the page's "Last
// errors" counts them, time to first byte only for requests that ended
// ok, tokens per second; a gap longer than the window empties it; a
// record older than the window is dropped; a late one in the window
// counts.
func TestSeriesObserve(t *testing.T) {
	type obs struct {
		model   string
		at      time.Duration // end, from seriesT0
		outcome Outcome
		ttfb    time.Duration
		p, c    int64
	}
	type want struct {
		model      string
		slot       int     // index in the arrays
		requests   float64 // per s
		errors     float64
		p50, p99   float64 // ms; NaN = null
		completion float64
	}
	tests := []struct {
		name string
		obs  []obs
		now  time.Duration
		want []want
	}{
		{
			name: "one closed slot",
			obs: []obs{
				{"tiny", 1 * time.Second, OK, 100 * time.Millisecond, 10, 20},
				{"tiny", 2 * time.Second, OK, 100 * time.Millisecond, 10, 20},
				{"tiny", 3 * time.Second, UpstreamError, 0, 0, 0},
				{"tiny", 4 * time.Second, Rejected, time.Millisecond, 0, 0},     // an error, and no TTFB
				{"tiny", 5 * time.Second, ClientCancelled, time.Second, 0, 10},  // not an error, no TTFB
				{"tiny", 6 * time.Second, OK, 0, 0, 0},                          // no byte written: no TTFB
				{"tiny", 12 * time.Second, OK, 400 * time.Millisecond, 10, 100}, // the next slot closes the first
			},
			now: 15 * time.Second,
			want: []want{
				{"tiny", SeriesSlots - 2, 0.6, 0.2, 100, 100, 5},
				{"tiny", SeriesSlots - 1, 1.0 / 5, 0, 400, 400, 100.0 / 5}, // the newest: 5 s have passed
				{"tiny", SeriesSlots - 3, 0, 0, math.NaN(), math.NaN(), 0},
			},
		},
		{
			name: "quantiles of a slot",
			obs: func() []obs {
				var o []obs
				for i := 1; i <= 100; i++ { // 1..100 ms
					o = append(o, obs{"tiny", time.Duration(i) * 50 * time.Millisecond, OK, time.Duration(i) * time.Millisecond, 0, 0})
				}
				return append(o, obs{"tiny", 11 * time.Second, OK, time.Millisecond, 0, 0})
			}(),
			now:  11 * time.Second,
			want: []want{{"tiny", SeriesSlots - 2, 10, 0, 50, 99, 0}},
		},
		{
			name: "unknown models are _other",
			obs:  []obs{{"nope", time.Second, Rejected, 0, 0, 0}},
			now:  2 * time.Second,
			want: []want{{OtherModel, SeriesSlots - 1, 1.0 / 2, 1.0 / 2, math.NaN(), math.NaN(), 0}},
		},
		{
			name: "a gap longer than the window",
			obs: []obs{
				{"tiny", time.Second, OK, time.Millisecond, 0, 0},
				{"tiny", 20 * time.Minute, OK, 2 * time.Millisecond, 0, 0},
			},
			now: 20*time.Minute + 5*time.Second,
			want: []want{
				{"tiny", SeriesSlots - 1, 1.0 / 5, 0, 2, 2, 0},
				{"tiny", 0, 0, 0, math.NaN(), math.NaN(), 0},
			},
		},
		{
			name: "late and too-late records",
			obs: []obs{
				{"tiny", 20 * time.Minute, OK, time.Millisecond, 0, 0},
				{"tiny", 20*time.Minute - 30*time.Second, OK, time.Second, 0, 0}, // counts, TTFB left out
				{"tiny", 0, OK, time.Millisecond, 0, 0},                          // 20 min old: dropped
			},
			now: 20*time.Minute + 10*time.Second, // the slot of 20 min is now closed
			want: []want{
				{"tiny", SeriesSlots - 2, 0.1, 0, 1, 1, 0},
				{"tiny", SeriesSlots - 5, 0.1, 0, math.NaN(), math.NaN(), 0},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSeries(nil)
			for _, o := range tc.obs {
				s.Observe(rec(o.model, seriesT0.Add(o.at), o.outcome, o.ttfb, o.p, o.c))
			}
			v := decode(t, s, seriesT0.Add(tc.now))
			if len(v.Models) == 0 {
				t.Fatal("no models")
			}
			total := 0.0
			for _, m := range v.Models {
				for _, r := range m.Requests {
					total += val(r)
				}
			}
			for _, w := range tc.want {
				var m *modelView
				for i := range v.Models {
					if v.Models[i].Name == w.model {
						m = &v.Models[i]
					}
				}
				if m == nil {
					t.Fatalf("no model %s in %+v", w.model, v.Models)
				}
				i := w.slot
				got := []float64{val(m.Requests[i]), val(m.Errors[i]), val(m.P50[i]), val(m.P99[i]), val(m.Completion[i])}
				exp := []float64{w.requests, w.errors, w.p50, w.p99, w.completion}
				for j, name := range []string{"requests/s", "errors/s", "ttfb p50", "ttfb p99", "completion tokens/s"} {
					ok := near(got[j], exp[j])
					if j != 2 && j != 3 {
						ok = math.Abs(got[j]-exp[j]) < 1e-3
					}
					if !ok {
						t.Errorf("%s slot %d %s: got %v, want %v", w.model, i, name, got[j], exp[j])
					}
				}
			}
		})
	}
}

// The provider rings, fed from pool samples on the Edge's ticker: mean and
// max in flight per slot, the last capacity; null where nothing was
// sampled; a provider or model group the config no longer has is
// forgotten.
func TestSeriesSample(t *testing.T) {
	s := NewSeries(nil)
	a := ProviderKey{"gpu-1", "ollama"}
	b := ProviderKey{"gpu-1", "oa"}
	for i, inFlight := range []int32{0, 2, 4, 6} {
		s.Sample(seriesT0.Add(time.Duration(i)*time.Second), []string{"tiny", "tiny-oa"},
			[]ProviderSample{{a, inFlight, 8}, {b, 1, 4}, {a, 99, 99}}) // a duplicate key is ignored
	}
	s.Sample(seriesT0.Add(10*time.Second), []string{"tiny"}, []ProviderSample{{a, 1, 0}})
	s.Observe(rec("tiny", seriesT0, OK, time.Millisecond, 0, 0))
	s.Observe(rec("tiny-oa", seriesT0, OK, time.Millisecond, 0, 0)) // not configured since the last Sample
	v := decode(t, s, seriesT0.Add(11*time.Second))
	if len(v.Providers) != 1 || v.Providers[0].Node != "gpu-1" || v.Providers[0].Provider != "ollama" {
		t.Fatalf("providers %+v, want gpu-1/ollama only (oa was removed)", v.Providers)
	}
	p := v.Providers[0]
	check := func(name string, got *float64, want float64) {
		if !near(val(got), want) {
			t.Errorf("%s: got %v, want %v", name, val(got), want)
		}
	}
	check("mean, first slot", p.Mean[SeriesSlots-2], 3)
	check("max, first slot", p.Max[SeriesSlots-2], 6)
	check("capacity, first slot", p.Capacity[SeriesSlots-2], 8)
	check("capacity while cooling", p.Capacity[SeriesSlots-1], 0)
	check("no sample", p.Mean[0], math.NaN())
	// Observed before the Sample that removed it from the config: kept
	// until the next Sample; tiny first (config order).
	if len(v.Models) != 2 || v.Models[0].Name != "tiny" || v.Models[1].Name != "tiny-oa" {
		t.Errorf("models %v", v.Models)
	}
	s.Sample(seriesT0.Add(12*time.Second), []string{"tiny", "tiny-tool"}, nil)
	v = decode(t, s, seriesT0.Add(12*time.Second))
	if len(v.Models) != 2 || v.Models[0].Name != "tiny" || v.Models[1].Name != "tiny-tool" || v.Models[1].Requests != nil || len(v.Providers) != 0 {
		t.Errorf("after a Sample without them: models %+v, %d providers; want tiny and tiny-tool (name only), 0", v.Models, len(v.Providers))
	}
	s.Observe(rec("nope", seriesT0.Add(12*time.Second), Rejected, 0, 0, 0))
	s.Sample(seriesT0.Add(13*time.Second), []string{"tiny"}, nil)
	if v = decode(t, s, seriesT0.Add(13*time.Second)); len(v.Models) != 2 || v.Models[0].Name != "tiny" || v.Models[1].Name != OtherModel {
		t.Errorf("_other is kept after the configured groups: %v", v.Models)
	}
}

// The histogram's buckets: every value lands in a bucket whose middle is
// within ±9 % of it, across the range; below and above it clamp.
func TestTTFBHist(t *testing.T) {
	for _, ms := range []float64{0.3, 0.5, 1, 1.7, 9, 50, 99, 250, 1000, 3333, 60000, 200000} {
		var h ttfbHist
		h.add(time.Duration(ms * float64(time.Millisecond)))
		if got := h.quantile(0.5); !near(got, ms) {
			t.Errorf("%v ms: quantile %v", ms, got)
		}
	}
	var h ttfbHist
	if !math.IsNaN(h.quantile(0.5)) {
		t.Error("empty histogram: want NaN")
	}
	h.add(0)
	h.add(time.Hour)
	if lo, hi := h.quantile(0.5), h.quantile(1); lo != ttfbBase || hi != ttfbBound(ttfbBuckets) {
		t.Errorf("clamped: %v %v", lo, hi)
	}
}

// The slot arithmetic before 1970 and across the ring's wrap.
func TestSlotOf(t *testing.T) {
	tests := []struct {
		t    time.Time
		want int64
	}{
		{time.Unix(0, 0), 0},
		{time.Unix(9, 999999999), 0},
		{time.Unix(10, 0), 1},
		{time.Unix(-1, 0), -1},
		{time.Unix(-10, 0), -1},
		{time.Unix(-11, 0), -2},
	}
	for _, tc := range tests {
		if got := slotOf(tc.t); got != tc.want {
			t.Errorf("slotOf(%v) = %d, want %d", tc.t.Unix(), got, tc.want)
		}
	}
	for _, n := range []int64{-1, -SeriesSlots, SeriesSlots, 2*SeriesSlots + 3} {
		if i := index(n); i < 0 || i >= SeriesSlots {
			t.Errorf("index(%d) = %d", n, i)
		}
	}
}
