package tracing

import (
	"strings"
	"testing"
	"time"

	iop "iop/proto/gen/iop"
)

// SPEC H8's rule for traces: the spans a node relays are its own word about
// its own timing, nothing more. The Edge keeps at most MaxNodeSpans, only
// kinds it knows, parents inside the attempt, bounded strings, and clamps
// every span into the attempt's window.
func TestNodeSpans(t *testing.T) {
	t0 := time.Unix(1767225600, 0)
	end := t0.Add(100 * time.Millisecond)
	att := &Span{TraceID: NewTraceID(), SpanID: SpanID{1, 1, 1, 1, 1, 1, 1, 1}, Start: t0, State: "k=v"}
	runID, upID := []byte{2, 2, 2, 2, 2, 2, 2, 2}, []byte{3, 3, 3, 3, 3, 3, 3, 3}
	run := func(mod ...func(*iop.NodeSpan)) *iop.NodeSpan {
		s := &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: runID, ParentSpanId: att.SpanID[:],
			StartOffsetNs: int64(time.Millisecond), DurationNs: int64(90 * time.Millisecond)}
		for _, m := range mod {
			m(s)
		}
		return s
	}
	up := func(mod ...func(*iop.NodeSpan)) *iop.NodeSpan {
		s := &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: upID, ParentSpanId: runID,
			StartOffsetNs: int64(2 * time.Millisecond), DurationNs: int64(80 * time.Millisecond), FirstByteNs: int64(10 * time.Millisecond),
			Method: "POST", Path: "/api/chat", StatusCode: 200}
		for _, m := range mod {
			m(s)
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		in      []*iop.NodeSpan
		kept    []string // names
		dropped int
	}{
		{"run and upstream", []*iop.NodeSpan{run(), up()}, []string{"node run", "POST /api/chat"}, 0},
		{"upstream listed first", []*iop.NodeSpan{up(), run()}, []string{"node run", "POST /api/chat"}, 0},
		{"tunnel", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.Kind = iop.NodeSpanKind_NODE_SPAN_TUNNEL })}, []string{"node tunnel"}, 0},
		{"five spans", []*iop.NodeSpan{run(), up(), up(), up(), up()}, []string{"node run", "POST /api/chat"}, 3},
		{"foreign parent", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.ParentSpanId = []byte{9, 9, 9, 9, 9, 9, 9, 9} }), up()}, nil, 2},
		{"upstream without its parent", []*iop.NodeSpan{up()}, nil, 1},
		{"upstream parented on the attempt", []*iop.NodeSpan{run(), up(func(s *iop.NodeSpan) { s.ParentSpanId = att.SpanID[:] })}, []string{"node run"}, 1},
		{"repeated id", []*iop.NodeSpan{run(), up(func(s *iop.NodeSpan) { s.SpanId = runID })}, []string{"node run"}, 1},
		{"the attempt's own id", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.SpanId = att.SpanID[:] })}, nil, 1},
		{"zero id", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.SpanId = make([]byte, 8) })}, nil, 1},
		{"short id", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.SpanId = []byte{1} })}, nil, 1},
		{"unknown kind", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.Kind = 9 })}, nil, 1},
		{"negative offset", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.StartOffsetNs = -1 })}, nil, 1},
		{"bad method", []*iop.NodeSpan{run(), up(func(s *iop.NodeSpan) { s.Method = "PO ST" })}, []string{"node run"}, 1},
		{"long path", []*iop.NodeSpan{run(), up(func(s *iop.NodeSpan) { s.Path = "/" + strings.Repeat("a", 300) })}, []string{"node run"}, 1},
		{"path with a host", []*iop.NodeSpan{run(), up(func(s *iop.NodeSpan) { s.Path = "http://10.0.0.1/x" })}, []string{"node run"}, 1},
		{"failure code with a newline", []*iop.NodeSpan{run(func(s *iop.NodeSpan) { s.FailureCode = "a\nb" })}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, dropped := NodeSpans(att, end, "gpu-1", "ollama", "tiny", tc.in)
			var names []string
			for _, s := range out {
				names = append(names, s.Name)
				if s.TraceID != att.TraceID || s.Node != "gpu-1" || s.State != "k=v" {
					t.Errorf("%s: trace %s node %q state %q", s.Name, s.TraceID, s.Node, s.State)
				}
				if s.Start.Before(t0) || s.End.After(end) || s.End.Before(s.Start) {
					t.Errorf("%s: [%v, %v] outside the attempt [%v, %v]", s.Name, s.Start, s.End, t0, end)
				}
			}
			if strings.Join(names, ",") != strings.Join(tc.kept, ",") || dropped != tc.dropped {
				t.Errorf("kept %v dropped %d, want %v and %d", names, dropped, tc.kept, tc.dropped)
			}
		})
	}
	// Offsets beyond the attempt are clamped into it.
	out, _ := NodeSpans(att, end, "gpu-1", "ollama", "tiny", []*iop.NodeSpan{run(func(s *iop.NodeSpan) {
		s.StartOffsetNs, s.DurationNs = int64(time.Hour), int64(time.Hour)
	}), up(func(s *iop.NodeSpan) { s.DurationNs, s.FirstByteNs = int64(time.Hour), int64(time.Hour) })})
	if len(out) != 2 || !out[0].Start.Equal(end) || !out[0].End.Equal(end) || !out[1].End.Equal(end) || !out[1].Events[0].Time.Equal(end) {
		t.Errorf("clamped spans %+v", out)
	}
	if a := out[0].Attrs; len(a) != 2 || a[0].Str != "ollama" || a[1].Str != "tiny" {
		t.Errorf("node span attributes %+v, want the lease's adapter and target", a)
	}
}
