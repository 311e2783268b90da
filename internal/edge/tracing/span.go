package tracing

import (
	"strconv"
	"time"

	iop "iop/proto/gen/iop"
)

// Kind is an OpenTelemetry SpanKind, numbered as OTLP's enum.
type Kind uint8

// The kinds the Edge records.
const (
	KindInternal Kind = 1
	KindServer   Kind = 2
	KindClient   Kind = 3
)

// Span is one finished span. Attribute values are the Edge's own words or
// bounded copies of what it already logs (never a body, a key or an
// upstream address, SPEC P4).
type Span struct {
	TraceID TraceID
	SpanID  SpanID
	Parent  SpanID // zero = a root span
	State   string // the trace's tracestate
	Name    string
	Kind    Kind
	Start   time.Time
	End     time.Time
	Attrs   []Attr
	Events  []Event
	// Error sets the span's status to ERROR with Message (a failure code);
	// otherwise the status is unset (OpenTelemetry's HTTP server rule: a
	// 4xx is the client's, not the server's, error).
	Error   bool
	Message string
	// Node is the node id whose spans these are ("" = the Edge's own): it
	// is the resource's service.instance.id, with service.name iop-node.
	Node string
}

// Attr is one span attribute: a string, an integer or a boolean.
type Attr struct {
	Key  string
	Str  string
	Int  int64
	Type AttrType
}

// AttrType is an Attr's value type.
type AttrType uint8

// The attribute value types (OTLP AnyValue's stringValue, intValue,
// boolValue).
const (
	AttrString AttrType = iota
	AttrInt
	AttrBool
)

// String, Int and Bool make attributes.
func String(k, v string) Attr { return Attr{Key: k, Str: v} }
func Int(k string, v int64) Attr {
	return Attr{Key: k, Int: v, Type: AttrInt}
}
func Bool(k string, v bool) Attr {
	a := Attr{Key: k, Type: AttrBool}
	if v {
		a.Int = 1
	}
	return a
}

// Event is a span event: a named instant.
type Event struct {
	Name string
	Time time.Time
}

// Bounds of the spans one node may relay on a terminal (NodeSpan): more
// spans, an unknown kind, a foreign parent, a repeated or zero id, or a
// string over its bound drop the span and count as node_invalid.
const (
	MaxNodeSpans      = 4
	maxNodePath       = 256
	maxNodeMethod     = 16
	maxNodeFailure    = 64
	nodeSpanRun       = "node run"
	nodeSpanTunnel    = "node tunnel"
	eventFirstByte    = "first_byte"
	attrFailureCode   = "iop.failure_code"
	attrNodeAdapter   = "iop.adapter"
	attrNodeTarget    = "iop.target"
	attrStatusCode    = "http.response.status_code"
	attrRequestMethod = "http.request.method"
	attrURLPath       = "url.path"
)

// NodeSpans converts the spans a node relayed on the terminal of the
// attempt whose span is attempt (SPEC H8's rule: trust the transport's
// identity, never the payload's): node is the lease's node id (the spans'
// resource), adapter and target the lease's. Offsets count from
// attempt.Start (the dispatch, on the Edge's clock); every span is clamped
// into [attempt.Start, end], where end is the terminal's receipt, so a node
// with a skewed clock or a lying one cannot place a span outside the
// attempt it served. It returns the spans kept and how many were dropped:
// beyond MaxNodeSpans, an unknown kind, a RUN/TUNNEL span whose parent is
// not the attempt or an UPSTREAM span whose parent is not one of those, a
// zero or repeated id, a negative offset or duration, or a string beyond its
// bound (the method must be an HTTP token, the path start with "/" and be
// printable ASCII).
func NodeSpans(attempt *Span, end time.Time, node, adapter, target string, in []*iop.NodeSpan) (out []Span, dropped int) {
	if len(in) > MaxNodeSpans {
		dropped, in = len(in)-MaxNodeSpans, in[:MaxNodeSpans]
	}
	if end.Before(attempt.Start) {
		end = attempt.Start
	}
	var servers [MaxNodeSpans]SpanID // the RUN/TUNNEL spans kept, parents of UPSTREAM
	nServers := 0
	seen := map[SpanID]bool{attempt.SpanID: true}
	// Two passes: a node may list an UPSTREAM span before its parent.
	for pass := range 2 {
		for _, ns := range in {
			upstream := ns.GetKind() == iop.NodeSpanKind_NODE_SPAN_UPSTREAM
			if upstream != (pass == 1) {
				continue
			}
			sp, ok := nodeSpan(attempt, end, ns)
			if ok && !upstream {
				ok = sp.Parent == attempt.SpanID
			}
			if ok && upstream {
				ok = false
				for _, s := range servers[:nServers] {
					ok = ok || sp.Parent == s
				}
			}
			if !ok || seen[sp.SpanID] {
				dropped++
				continue
			}
			seen[sp.SpanID] = true
			if !upstream {
				servers[nServers] = sp.SpanID
				nServers++
				sp.Attrs = append(sp.Attrs, String(attrNodeAdapter, adapter), String(attrNodeTarget, target))
			}
			sp.TraceID, sp.State, sp.Node = attempt.TraceID, attempt.State, node
			out = append(out, sp)
		}
	}
	return out, dropped
}

// nodeSpan converts one NodeSpan, without its trace id and resource; ok
// is false when it breaks a bound.
func nodeSpan(attempt *Span, end time.Time, ns *iop.NodeSpan) (Span, bool) {
	var sp Span
	if len(ns.GetSpanId()) != 8 || len(ns.GetParentSpanId()) != 8 || ns.GetStartOffsetNs() < 0 || ns.GetDurationNs() < 0 ||
		ns.GetFirstByteNs() < 0 || len(ns.GetFailureCode()) > maxNodeFailure || !printable(ns.GetFailureCode()) {
		return sp, false
	}
	copy(sp.SpanID[:], ns.GetSpanId())
	copy(sp.Parent[:], ns.GetParentSpanId())
	if sp.SpanID.IsZero() {
		return sp, false
	}
	clamp := func(t time.Time) time.Time {
		if t.After(end) {
			return end
		}
		return t
	}
	start := attempt.Start.Add(time.Duration(min(ns.GetStartOffsetNs(), int64(end.Sub(attempt.Start)))))
	sp.Start = clamp(start)
	sp.End = clamp(start.Add(time.Duration(min(ns.GetDurationNs(), int64(end.Sub(start))))))
	switch ns.GetKind() {
	case iop.NodeSpanKind_NODE_SPAN_RUN:
		sp.Name, sp.Kind = nodeSpanRun, KindServer
	case iop.NodeSpanKind_NODE_SPAN_TUNNEL:
		sp.Name, sp.Kind = nodeSpanTunnel, KindServer
	case iop.NodeSpanKind_NODE_SPAN_UPSTREAM:
		m, p := ns.GetMethod(), ns.GetPath()
		if m == "" || len(m) > maxNodeMethod || !token(m) || len(p) > maxNodePath || p != "" && (p[0] != '/' || !printable(p)) {
			return sp, false
		}
		sp.Name, sp.Kind = m, KindClient
		if p != "" {
			sp.Name = m + " " + p
			sp.Attrs = append(sp.Attrs, String(attrURLPath, p))
		}
		sp.Attrs = append(sp.Attrs, String(attrRequestMethod, m))
		if st := ns.GetStatusCode(); st >= 100 && st <= 999 {
			sp.Attrs = append(sp.Attrs, Int(attrStatusCode, int64(st)))
			if st >= 400 { // OpenTelemetry's HTTP client rule: 4xx and 5xx are errors
				sp.Error, sp.Message = true, strconv.Itoa(int(st))
			}
		}
		if fb := ns.GetFirstByteNs(); fb > 0 {
			sp.Events = append(sp.Events, Event{Name: eventFirstByte, Time: clamp(sp.Start.Add(time.Duration(min(fb, int64(sp.End.Sub(sp.Start))))))})
		}
	default:
		return sp, false
	}
	if code := ns.GetFailureCode(); code != "" {
		sp.Error, sp.Message = true, code
		sp.Attrs = append(sp.Attrs, String(attrFailureCode, code))
	}
	return sp, true
}

// token reports whether s is an RFC 9110 token (an HTTP method).
func token(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '!' ||
			c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~') {
			return false
		}
	}
	return true
}

// printable reports whether s is printable ASCII (0x20–0x7e).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
