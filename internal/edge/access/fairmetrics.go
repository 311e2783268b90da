package access

import (
	"bufio"
	"math"
	"strings"
)

// The queue wait per key and priority class (SPEC G6): who waits how long
// when keys share a model group's queue.

// OpenKey is the key label of requests without a principal (open mode).
const OpenKey = "_open"

type kcKey struct{ key, class string }

// observeKeyQueue adds r's queue wait to its key and class's histogram;
// a request with no class (it never reached the queue) counts nothing.
// Called with m.mu held.
func (m *Metrics) observeKeyQueue(r *Record) {
	if r.Class == "" {
		return
	}
	k := kcKey{r.Principal, r.Class}
	if k.key == "" {
		k.key = OpenKey
	}
	h := m.keyQueue[k]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(QueueBuckets)+1)}
		m.keyQueue[k] = h
	}
	h.observe(QueueBuckets, r.QueueWait.Seconds())
}

// writeKeyQueue writes iop_edge_key_queue_wait_seconds. Called with m.mu
// held.
func (m *Metrics) writeKeyQueue(w *bufio.Writer) {
	const name = "iop_edge_key_queue_wait_seconds"
	header(w, name, "histogram", "Time a request waited for a provider lease, seconds, by key (principal; _open without one) and priority class.")
	keys := sortedKeys(m.keyQueue, func(a, b kcKey) int {
		return cmpAll(strings.Compare(a.key, b.key), strings.Compare(a.class, b.class))
	})
	for _, k := range keys {
		h := m.keyQueue[k]
		labels := []string{"key", k.key, "class", k.class, "le", ""}
		var cum uint64
		for i, c := range h.counts {
			cum += c
			le := math.Inf(1)
			if i < len(QueueBuckets) {
				le = QueueBuckets[i]
			}
			labels[5] = formatFloat(le)
			series(w, name+"_bucket", labels, float64(cum))
		}
		series(w, name+"_sum", labels[:4], h.sum)
		series(w, name+"_count", labels[:4], float64(h.n))
	}
}
