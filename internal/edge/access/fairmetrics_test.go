package access

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestKeyQueueWait: the queue wait per key and priority class (SPEC G6):
// a histogram per (principal, class), _open without a principal, nothing
// for a request that never reached the queue; the operator page's series
// keep each class's wait quantiles.
func TestKeyQueueWait(t *testing.T) {
	s := NewSeries(func() time.Time { return seriesT0.Add(15 * time.Second) })
	m := NewMetrics(s)
	at := seriesT0.Add(time.Second)
	for _, r := range []Record{
		{Principal: "team-a", Class: "batch", Model: "tiny", Known: true, Path: PathRun, QueueWait: 3 * time.Second, Start: at},
		{Principal: "team-a", Class: "batch", Model: "tiny", Known: true, Path: PathRun, QueueWait: time.Second, Start: at},
		{Principal: "team-b", Class: "interactive", Model: "tiny", Known: true, Path: PathRun, QueueWait: 2 * time.Millisecond, Start: at},
		{Class: "interactive", Model: "tiny", Known: true, Path: PathTunnel, Start: at},
		{Principal: "team-c", Model: "tiny", Known: true, Status: 400, Start: at}, // refused before the queue
	} {
		m.Observe(&r)
	}
	var buf bytes.Buffer
	if err := m.WritePrometheus(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"# TYPE iop_edge_key_queue_wait_seconds histogram",
		`iop_edge_key_queue_wait_seconds_count{key="team-a",class="batch"} 2`,
		`iop_edge_key_queue_wait_seconds_sum{key="team-a",class="batch"} 4`,
		`iop_edge_key_queue_wait_seconds_bucket{key="team-b",class="interactive",le="0.005"} 1`,
		`iop_edge_key_queue_wait_seconds_count{key="_open",class="interactive"} 1`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("G6 missing line %s", want)
		}
	}
	if strings.Contains(out, `key="team-c"`) {
		t.Error("G6 a request that never reached the queue was counted")
	}
	js := string(s.JSON())
	for _, want := range []string{`"classes":[{"name":"interactive","requests_per_s":[`, `{"name":"batch","requests_per_s":[`, `"wait_p50_ms":[`, `"wait_p99_ms":[`} {
		if !strings.Contains(js, want) {
			t.Errorf("G6 series lack %s: %s", want, js[strings.Index(js, `"classes"`):])
		}
	}
	if strings.Contains(js, `"name":"critical"`) {
		t.Error("G6 series list a class no request had")
	}
}
