package batch

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// KeyBatches are one key's batches that have not ended, for /status and
// the operator page (SPEC X6).
type KeyBatches struct {
	Principal string `json:"principal"` // "" in open mode
	Batches   int    `json:"batches"`
	// Lines, Completed, Failed and InFlight sum those batches' lines.
	Lines     int64 `json:"lines"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
	InFlight  int64 `json:"in_flight"`
	// Oldest is the oldest of them (the first a client asks about).
	Oldest  string `json:"oldest"`
	Status  Status `json:"oldest_status"`
	Created int64  `json:"oldest_created_at"`
}

// InProgress lists the keys with batches that have not ended, by name.
func (m *Manager) InProgress() []KeyBatches {
	m.mu.Lock()
	live := make([]*active, 0, len(m.live))
	for _, a := range m.live {
		live = append(live, a)
	}
	m.mu.Unlock()
	by := map[string]*KeyBatches{}
	for _, a := range live {
		r := a.snapshot()
		if r.Status.Terminal() {
			continue
		}
		k := by[r.Owner]
		if k == nil {
			k = &KeyBatches{Principal: r.Owner}
			by[r.Owner] = k
		}
		k.Batches++
		k.Lines += r.Counts.Total
		k.Completed += r.Counts.Completed
		k.Failed += r.Counts.Failed
		k.InFlight += a.inFlight.Load()
		if k.Oldest == "" || r.CreatedAt < k.Created || r.CreatedAt == k.Created && r.ID < k.Oldest {
			k.Oldest, k.Status, k.Created = r.ID, r.Status, r.CreatedAt
		}
	}
	out := make([]KeyBatches, 0, len(by))
	for _, k := range by {
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b KeyBatches) int { return strings.Compare(a.Principal, b.Principal) })
	return out
}

// WritePrometheus writes the batch metrics (SPEC X6) in the text format:
//
//	iop_edge_batches_in_progress{principal}          gauge: batches not ended
//	iop_edge_batch_lines_in_flight{principal}        gauge
//	iop_edge_batch_lines_total{principal,outcome}    counter: completed (2xx) or failed, since start
//	iop_edge_batch_line_retries_total{principal}     counter: lines refused for now (429, 503) and run again
//	iop_edge_batch_storage_bytes                     gauge: bytes under batches.dir
//
// principal is a key's name (bounded by the key set; "" in open mode).
func (m *Manager) WritePrometheus(w io.Writer) error {
	in := m.InProgress()
	var b strings.Builder
	b.WriteString("# HELP iop_edge_batches_in_progress Batches that have not ended (validating, in_progress, finalizing, cancelling), per key.\n# TYPE iop_edge_batches_in_progress gauge\n")
	for _, k := range in {
		fmt.Fprintf(&b, "iop_edge_batches_in_progress{principal=%q} %d\n", k.Principal, k.Batches)
	}
	b.WriteString("# HELP iop_edge_batch_lines_in_flight Lines of batches in flight, per key.\n# TYPE iop_edge_batch_lines_in_flight gauge\n")
	for _, k := range in {
		fmt.Fprintf(&b, "iop_edge_batch_lines_in_flight{principal=%q} %d\n", k.Principal, k.InFlight)
	}
	m.mu.Lock()
	names := make([]string, 0, len(m.lines))
	for n := range m.lines {
		names = append(names, n)
	}
	counts := make(map[string][3]int64, len(m.lines))
	for n, c := range m.lines {
		counts[n] = [3]int64{c.completed.Load(), c.failed.Load(), c.retried.Load()}
	}
	m.mu.Unlock()
	slices.Sort(names)
	b.WriteString("# HELP iop_edge_batch_lines_total Batch lines answered since start, per key and outcome (completed: a 2xx answer, in the output file; failed: in the error file).\n# TYPE iop_edge_batch_lines_total counter\n")
	for _, n := range names {
		fmt.Fprintf(&b, "iop_edge_batch_lines_total{principal=%q,outcome=\"completed\"} %d\n", n, counts[n][0])
		fmt.Fprintf(&b, "iop_edge_batch_lines_total{principal=%q,outcome=\"failed\"} %d\n", n, counts[n][1])
	}
	b.WriteString("# HELP iop_edge_batch_line_retries_total Batch lines refused for now (429, 503) that waited and ran again, per key.\n# TYPE iop_edge_batch_line_retries_total counter\n")
	for _, n := range names {
		fmt.Fprintf(&b, "iop_edge_batch_line_retries_total{principal=%q} %d\n", n, counts[n][2])
	}
	fmt.Fprintf(&b, "# HELP iop_edge_batch_storage_bytes Bytes of files and journals under batches.dir.\n# TYPE iop_edge_batch_storage_bytes gauge\niop_edge_batch_storage_bytes %d\n", m.o.Store.Used())
	_, err := io.WriteString(w, b.String())
	return err
}
