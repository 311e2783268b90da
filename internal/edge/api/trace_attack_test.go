package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/edge/tracing"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// hostileSpan is the k-th way (of hostileKinds) a node's span may lie,
// for a request whose attempt span is parent and whose node RUN span is
// run: a repeated id, a foreign parent (another request's attempt), a
// zero id, an UPSTREAM under nobody or under the attempt itself, a
// negative offset, a path with a query and a NUL, a failure code of 1
// KiB, an unknown kind, a 10 KiB path, a method with CR/LF, a 7-byte id.
func hostileSpan(k int, parent, run []byte) *iop.NodeSpan {
	other := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	id := []byte{0xee, 0, 0, 0, 0, 0, 9, byte(k)}
	switch k % hostileKinds {
	case 0:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: run, ParentSpanId: parent}
	case 1:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: id, ParentSpanId: other}
	case 2:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_TUNNEL, SpanId: make([]byte, 8), ParentSpanId: parent}
	case 3:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: id, ParentSpanId: other, Method: "GET", Path: "/"}
	case 4:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: id, ParentSpanId: parent, Method: "GET", Path: "/"}
	case 5:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: id, ParentSpanId: parent, StartOffsetNs: -1}
	case 6:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: id, ParentSpanId: run, Method: "GET", Path: "/a?key=v\x00"}
	case 7:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: id, ParentSpanId: parent, FailureCode: strings.Repeat("f", 1024)}
	case 8:
		return &iop.NodeSpan{Kind: 99, SpanId: id, ParentSpanId: parent}
	case 9:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: id, ParentSpanId: run, Method: "POST", Path: "/" + strings.Repeat("p", 10<<10)}
	case 10:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: id, ParentSpanId: run, Method: "GET\r\nX-Evil: 1", Path: "/x"}
	default:
		return &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: id[:7], ParentSpanId: parent}
	}
}

const hostileKinds = 12

// hostileNodeSpans is what a lying node relays on a terminal: 1,000
// spans, of which the first four are read — a RUN span under the attempt
// with offsets of 2^62 ns, hostile kind k, an UPSTREAM span under the RUN
// one, hostile kind k+1 — and the rest more of them.
func hostileNodeSpans(k int, parent []byte) []*iop.NodeSpan {
	run := []byte{0xee, 0, 0, 0, 0, 0, 0, 1}
	out := []*iop.NodeSpan{
		{Kind: iop.NodeSpanKind_NODE_SPAN_RUN, SpanId: run, ParentSpanId: parent, StartOffsetNs: 1 << 62, DurationNs: 1 << 62},
		hostileSpan(k, parent, run),
		{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: []byte{0xee, 0, 0, 0, 0, 0, 0, 2}, ParentSpanId: run, Method: "POST",
			Path: "/api/chat", StatusCode: 200, FirstByteNs: 1 << 62},
		hostileSpan(k+1, parent, run),
	}
	for i := 0; len(out) < 1000; i++ {
		out = append(out, hostileSpan(i, parent, run))
	}
	return out
}

// SPEC H8, B1, P4, attacked through tracing: clients send traceparent and
// tracestate of every odd size and form (two headers, uppercase, version
// ff, a future version with 8 KiB after it, all-zero ids, 54 and 56
// bytes, a tab, a tracestate of 100 members or 10 KiB), with an API key
// and a prompt marked so that they can be found; the node answers each
// request, on the run path and on the tunnel, with hostileNodeSpans (every
// hostile kind among the four spans the edge reads, on both paths). What
// the edge exports: at most the request, queue and attempt spans and 4
// node spans a request, all in the request's own trace (the client's
// only when its traceparent is valid, with its tracestate only when that
// is), node spans only under this request's attempt and inside its
// window, no attribute over 256 bytes, no CR or LF, and nowhere the key,
// the prompt or the client's headers.
func TestH8HostileTraceContextAndNodeSpans(t *testing.T) {
	const prompt = "PROMPT-MARK-91c3"
	good := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var members []string
	for i := range 100 {
		members = append(members, fmt.Sprintf("k%d=v", i))
	}
	rows := []struct {
		name      string
		tp, ts    []string
		wantValid bool
		wantState string
	}{
		{"valid with a tracestate", []string{good}, []string{"congo=t61"}, true, "congo=t61"},
		{"two traceparent headers", []string{good, good}, nil, false, ""},
		{"uppercase", []string{strings.ToUpper(good)}, nil, false, ""},
		{"version ff", []string{"ff" + good[2:]}, nil, false, ""},
		{"a future version with 8 KiB after it", []string{"01" + good[2:] + "-" + strings.Repeat("x", 8<<10)}, nil, true, ""},
		{"all-zero trace id", []string{"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, nil, false, ""},
		{"all-zero parent id", []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}, nil, false, ""},
		{"54 bytes", []string{good[:54]}, nil, false, ""},
		{"56 bytes", []string{good + "1"}, nil, false, ""},
		{"a tab", []string{good[:10] + "\t" + good[11:]}, nil, false, ""},
		{"100 tracestate members", []string{good}, []string{strings.Join(members, ",")}, true, ""},
		{"10 KiB of tracestate", []string{good}, []string{"a=" + strings.Repeat("v", 10<<10)}, true, ""},
		{"tracestate of another shape", []string{good}, []string{"A=b"}, true, ""},
	}
	cases := 0
	for ti, typ := range []string{protocol.TypeOllama, protocol.TypeOpenAICompat} {
		for ri, row := range rows {
			k := (ti*len(rows) + ri) % hostileKinds // each hostile kind among the four read, on both paths
			t.Run(typ+" "+row.name, func(t *testing.T) {
				cases++
				st := keystore.New()
				secret, err := st.Create(keystore.Spec{Name: "k"}, fixedNow().Add(-time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				set, err := keys.Build(nil, st, true, 1)
				if err != nil {
					t.Fatal(err)
				}
				r := &rig{fp: newFakePool(typ), st: newFakeStream("run-1"), cfg: testConfig(nil)}
				r.p, r.d = r.fp, newFakeDispatcher(r.st)
				ft := &fakeTracer{}
				cfg := r.cfg
				r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(),
					Tracer: ft, TraceRatio: 1, Keys: keys.New(set)})
				r.srv = httptest.NewServer(r.h)
				t.Cleanup(r.srv.Close)
				t.Cleanup(r.srv.Client().CloseIdleConnections)
				t.Cleanup(r.st.kill)
				go func() {
					select {
					case <-r.d.started:
					case <-r.st.dead:
						return
					}
					var parent []byte
					if typ == protocol.TypeOllama {
						parent = r.d.lastRun().GetTrace().GetParentSpanId()
						done := evComplete(2, "hello", "stop", usage(3, 2), nil)
						done.TraceSpans = hostileNodeSpans(k, parent)
						r.st.run(evStart(), done)
						return
					}
					parent = r.d.lastTunnel().GetTrace().GetParentSpanId()
					r.st.frames(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, Status: 200,
						Headers: []*iop.Header{{Name: "Content-Type", Value: "application/json"}}},
						&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: []byte(`{"choices":[]}`)},
						&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END, TraceSpans: hostileNodeSpans(k, parent)})
				}()
				body := `{"model":"tiny","messages":[{"role":"user","content":"` + prompt + `"}]}`
				req, _ := http.NewRequest("POST", r.srv.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+secret)
				req.Header.Set("X-Request-Id", "rid-"+strings.Repeat("r", 300)+"\t<x>")
				for _, v := range row.tp {
					req.Header.Add("traceparent", v)
				}
				for _, v := range row.ts {
					req.Header.Add("tracestate", v)
				}
				resp, err := r.srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				spans := ft.last(t)
				if len(spans) > 3+tracing.MaxNodeSpans {
					t.Fatalf("%d spans exported for one request, want at most %d", len(spans), 3+tracing.MaxNodeSpans)
				}
				reqs := byName(spans, "POST /v1/chat/completions")
				atts := byName(spans, "attempt")
				if len(reqs) != 1 || len(atts) != 1 {
					t.Fatalf("spans %+v", spans)
				}
				rs, att := reqs[0], atts[0]
				if row.wantValid != (rs.TraceID.String() == "4bf92f3577b34da6a3ce929d0e0e4736") ||
					row.wantValid != (rs.Parent.String() == "00f067aa0ba902b7") || rs.State != row.wantState {
					t.Errorf("request span trace %s parent %s state %q; want the client's context %v, state %q",
						rs.TraceID, rs.Parent, rs.State, row.wantValid, row.wantState)
				}
				nodes := 0
				for _, s := range spans {
					if s.TraceID != rs.TraceID {
						t.Errorf("span %q in trace %s, not the request's %s", s.Name, s.TraceID, rs.TraceID)
					}
					if s.Node != "" {
						nodes++
						if s.Start.Before(att.Start) || s.End.After(att.End) && s.End.After(rs.End) {
							t.Errorf("node span %q [%v, %v] outside the attempt [%v, %v]", s.Name, s.Start, s.End, att.Start, att.End)
						}
					}
					b, _ := json.Marshal(s)
					for _, bad := range []string{secret, prompt, "\\r", "\\n", "X-Evil", "key=v"} {
						if strings.Contains(string(b), bad) {
							t.Errorf("span %q carries %q: %s", s.Name, bad, b)
						}
					}
					for _, a := range s.Attrs {
						if len(a.Str) > 256 {
							t.Errorf("span %q attribute %s: %d bytes", s.Name, a.Key, len(a.Str))
						}
					}
				}
				if nodes != 2 || ft.dropped[tracing.DropNodeInvalid] != 998 {
					t.Errorf("hostile kinds %d and %d: %d node spans kept, %d dropped as node_invalid; want the RUN and UPSTREAM spans, 998 dropped",
						k%hostileKinds, (k+1)%hostileKinds, nodes, ft.dropped[tracing.DropNodeInvalid])
				}
			})
		}
	}
	t.Logf("%d requests, each with 1,000 node spans", cases)
}
