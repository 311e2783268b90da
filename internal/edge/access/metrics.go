package access

import (
	"bufio"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// OtherModel is the model label of requests that named no configured model
// group, so that label values stay bounded by the config.
const OtherModel = "_other"

// Histogram bucket upper bounds, seconds.
var (
	// DurationBuckets: whole requests, from a fast error to a long stream.
	DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	// TTFBBuckets: time to the first response byte (queue wait, prefill).
	TTFBBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// QueueBuckets: time waiting for a provider lease.
	QueueBuckets = []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30}
)

// Metrics are the request metrics, fed one finished Record at a time
// (Observe) and the in-flight gauge (Begin/End). Safe for concurrent use;
// the zero value is not ready, use NewMetrics.
//
// Families (Prometheus text format 0.0.4, WritePrometheus):
//
//	iop_edge_requests_total{model,surface,path,code,outcome}      counter
//	iop_edge_request_duration_seconds{model,path}                 histogram
//	iop_edge_time_to_first_byte_seconds{model,path}               histogram
//	iop_edge_queue_wait_seconds{model,path}                       histogram
//	iop_edge_key_queue_wait_seconds{key,class}                    histogram
//	iop_edge_tokens_total{model,direction="prompt"|"completion"}  counter
//	iop_edge_requests_in_flight{model}                            gauge
//	iop_edge_ignored_fields_total{surface,field}                  counter
//
// model is a configured group name or OtherModel; surface, path, code and
// outcome come from fixed sets; field is a field-table row name (or
// "top_level" for a member no row knows), never the client's own words;
// so every label is bounded. key is an authenticated request's principal
// (a configured api_keys name or key store key) or OpenKey, class a
// priority class (SPEC G6).
type Metrics struct {
	mu       sync.Mutex
	requests map[reqKey]uint64
	duration map[mpKey]*histogram
	ttfb     map[mpKey]*histogram
	queue    map[mpKey]*histogram
	keyQueue map[kcKey]*histogram // fairmetrics.go
	tokens   map[tokKey]uint64
	inFlight map[string]int64
	// also are told of every Record Observe counts (set once by
	// NewMetrics, read without the lock).
	also    []Observer
	ignored map[ignKey]uint64
}

// Observer is told of every finished request Metrics.Observe counts
// (Series keeps the operator page's recent history from them). Observe
// must be quick and must not keep r.
type Observer interface {
	Observe(r *Record)
}

type ignKey struct{ surface, field string }

// IgnoredTopLevel is the field label of an ignored member that no table
// row knows.
const IgnoredTopLevel = "top_level"

type reqKey struct {
	model, surface, path string
	code                 int
	outcome              Outcome
}

type mpKey struct{ model, path string }

type tokKey struct{ model, direction string }

type histogram struct {
	counts []uint64 // per bucket, not cumulative; last = +Inf
	sum    float64
	n      uint64
}

func (h *histogram) observe(bounds []float64, v float64) {
	i, _ := slices.BinarySearch(bounds, v) // first bound >= v
	h.counts[i]++
	h.sum += v
	h.n++
}

// NewMetrics returns empty Metrics that also tell also of every request
// they observe.
func NewMetrics(also ...Observer) *Metrics {
	return &Metrics{
		also:     also,
		requests: map[reqKey]uint64{},
		duration: map[mpKey]*histogram{},
		ttfb:     map[mpKey]*histogram{},
		queue:    map[mpKey]*histogram{},
		keyQueue: map[kcKey]*histogram{},
		tokens:   map[tokKey]uint64{},
		inFlight: map[string]int64{},
		ignored:  map[ignKey]uint64{},
	}
}

// ModelLabel is the model label of a request for model (known: it is a
// configured group).
func ModelLabel(model string, known bool) string {
	if known {
		return model
	}
	return OtherModel
}

// Begin counts one more request in flight for the model label.
func (m *Metrics) Begin(model string) {
	m.mu.Lock()
	m.inFlight[model]++
	m.mu.Unlock()
}

// End counts one request fewer in flight for the model label.
func (m *Metrics) End(model string) {
	m.mu.Lock()
	m.inFlight[model]--
	m.mu.Unlock()
}

// Observe counts one finished request (and tells the Observers given to
// NewMetrics): the requests counter, the duration
// histogram, the time-to-first-byte histogram (only when a byte was
// written), the queue-wait histogram (only when it reached the queue, i.e.
// Path is not PathNone or QueueWait > 0) and the tokens.
func (m *Metrics) Observe(r *Record) {
	model := ModelLabel(r.Model, r.Known)
	path := r.Path
	if path == "" {
		path = PathNone
	}
	mp := mpKey{model, path}
	for _, o := range m.also {
		o.Observe(r)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[reqKey{model, r.Surface, path, r.Status, r.Outcome}]++
	hist(m.duration, mp, DurationBuckets).observe(DurationBuckets, r.Duration.Seconds())
	if r.TTFB > 0 {
		hist(m.ttfb, mp, TTFBBuckets).observe(TTFBBuckets, r.TTFB.Seconds())
	}
	if path != PathNone || r.QueueWait > 0 {
		hist(m.queue, mp, QueueBuckets).observe(QueueBuckets, r.QueueWait.Seconds())
		m.observeKeyQueue(r)
	}
	if r.PromptTokens > 0 {
		m.tokens[tokKey{model, "prompt"}] += uint64(r.PromptTokens)
	}
	if r.CompletionTokens > 0 {
		m.tokens[tokKey{model, "completion"}] += uint64(r.CompletionTokens)
	}
	for _, row := range r.IgnoredRows {
		if row == "" {
			row = IgnoredTopLevel
		}
		m.ignored[ignKey{r.Surface, row}]++
	}
}

func hist(m map[mpKey]*histogram, k mpKey, bounds []float64) *histogram {
	h := m[k]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(bounds)+1)}
		m[k] = h
	}
	return h
}

// WritePrometheus writes every family in the text exposition format 0.0.4,
// series sorted by label values. A family with no series yet still gets
// its HELP and TYPE lines.
func (m *Metrics) WritePrometheus(w io.Writer) error {
	bw := bufio.NewWriter(w)
	m.mu.Lock()
	m.writeLocked(bw)
	m.mu.Unlock()
	return bw.Flush()
}

func (m *Metrics) writeLocked(w *bufio.Writer) {
	header(w, "iop_edge_requests_total", "counter", "Client requests by model, surface, path (tunnel, run, none), HTTP status code and outcome; one per request at its end.")
	rk := sortedKeys(m.requests, func(a, b reqKey) int {
		return cmpAll(strings.Compare(a.model, b.model), strings.Compare(a.surface, b.surface), strings.Compare(a.path, b.path),
			a.code-b.code, strings.Compare(string(a.outcome), string(b.outcome)))
	})
	for _, k := range rk {
		series(w, "iop_edge_requests_total", []string{"model", k.model, "surface", k.surface, "path", k.path,
			"code", strconv.Itoa(k.code), "outcome", string(k.outcome)}, float64(m.requests[k]))
	}
	writeHist(w, "iop_edge_request_duration_seconds", "Time from request arrival to the end of its response, seconds.", m.duration, DurationBuckets)
	writeHist(w, "iop_edge_time_to_first_byte_seconds", "Time from request arrival to the first response byte, seconds.", m.ttfb, TTFBBuckets)
	writeHist(w, "iop_edge_queue_wait_seconds", "Time a request waited for a provider lease, seconds.", m.queue, QueueBuckets)
	m.writeKeyQueue(w)
	header(w, "iop_edge_tokens_total", "counter", "Tokens the providers reported, by model and direction (prompt, completion).")
	tk := sortedKeys(m.tokens, func(a, b tokKey) int {
		return cmpAll(strings.Compare(a.model, b.model), strings.Compare(a.direction, b.direction))
	})
	for _, k := range tk {
		series(w, "iop_edge_tokens_total", []string{"model", k.model, "direction", k.direction}, float64(m.tokens[k]))
	}
	header(w, "iop_edge_requests_in_flight", "gauge", "Client requests being served (queued or streaming), by model.")
	fk := sortedKeys(m.inFlight, strings.Compare)
	for _, k := range fk {
		series(w, "iop_edge_requests_in_flight", []string{"model", k}, float64(m.inFlight[k]))
	}
	header(w, "iop_edge_ignored_fields_total", "counter", "Request members the run path accepted and did not send to the backend (http.unknown_fields report, tools the model is not offered), by surface and the field-table row they are under (top_level: no row); at most 8 per request.")
	ik := sortedKeys(m.ignored, func(a, b ignKey) int {
		return cmpAll(strings.Compare(a.surface, b.surface), strings.Compare(a.field, b.field))
	})
	for _, k := range ik {
		series(w, "iop_edge_ignored_fields_total", []string{"surface", k.surface, "field", k.field}, float64(m.ignored[k]))
	}
}

func writeHist(w *bufio.Writer, name, help string, hs map[mpKey]*histogram, bounds []float64) {
	header(w, name, "histogram", help)
	keys := sortedKeys(hs, func(a, b mpKey) int {
		return cmpAll(strings.Compare(a.model, b.model), strings.Compare(a.path, b.path))
	})
	for _, k := range keys {
		h := hs[k]
		labels := []string{"model", k.model, "path", k.path, "le", ""}
		var cum uint64
		for i, c := range h.counts {
			cum += c
			le := math.Inf(1)
			if i < len(bounds) {
				le = bounds[i]
			}
			labels[5] = formatFloat(le)
			series(w, name+"_bucket", labels, float64(cum))
		}
		series(w, name+"_sum", labels[:4], h.sum)
		series(w, name+"_count", labels[:4], float64(h.n))
	}
}

func header(w *bufio.Writer, name, typ, help string) {
	w.WriteString("# HELP ")
	w.WriteString(name)
	w.WriteByte(' ')
	w.WriteString(help)
	w.WriteString("\n# TYPE ")
	w.WriteString(name)
	w.WriteByte(' ')
	w.WriteString(typ)
	w.WriteByte('\n')
}

// series writes `name{k="v",…} value`; labels alternate names and values.
func series(w *bufio.Writer, name string, labels []string, v float64) {
	w.WriteString(name)
	if len(labels) > 0 {
		w.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(labels[i])
			w.WriteString(`="`)
			w.WriteString(EscapeLabel(labels[i+1]))
			w.WriteByte('"')
		}
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(formatFloat(v))
	w.WriteByte('\n')
}

// EscapeLabel escapes a label value for the text format: backslash, double
// quote and line feed (Prometheus exposition format 0.0.4).
func EscapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func sortedKeys[K comparable, V any](m map[K]V, cmp func(a, b K) int) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp)
	return keys
}

func cmpAll(cs ...int) int {
	for _, c := range cs {
		if c != 0 {
			return c
		}
	}
	return 0
}
