package tracing

import (
	"encoding/hex"
	"strconv"
	"unicode/utf8"
)

// Resource names the Edge process in an export (OTLP Resource; the
// OpenTelemetry semantic conventions' service.* attributes).
type Resource struct {
	// Version is service.version (the build's version).
	Version string
}

// Service names of the two binaries (service.name).
const (
	ServiceEdge = "iop-edge"
	ServiceNode = "iop-node"
)

// scopeName is the instrumentation scope of every span.
const scopeName = "iop"

// AppendExport appends spans to b as one OTLP ExportTraceServiceRequest in
// the OTLP/HTTP JSON encoding (OTLP specification 1.x, "JSON Protobuf
// Encoding"): the protobuf JSON mapping with lowerCamelCase field names and
// OTLP's deviations — traceId, spanId and parentSpanId are lowercase hex,
// not base64; enums (kind, status.code) are integers; 64-bit integers
// (…UnixNano, intValue) are decimal strings; empty fields are left out.
// The Edge's spans go under one resourceSpans entry (service.name
// iop-edge), each node's under its own (service.name iop-node,
// service.instance.id the node id), so a trace viewer shows which host did
// what. Written with appends, not reflection, like /metrics.
func AppendExport(b []byte, r Resource, spans []Span) []byte {
	b = append(b, `{"resourceSpans":[`...)
	var nodes []string // node resources, in order of appearance
	edge := false
	for i := range spans {
		n := spans[i].Node
		if n == "" {
			edge = true
			continue
		}
		known := false
		for _, m := range nodes {
			known = known || m == n
		}
		if !known {
			nodes = append(nodes, n)
		}
	}
	first := true
	if edge {
		b = appendResourceSpans(b, r, ServiceEdge, "", spans)
		first = false
	}
	for _, n := range nodes {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendResourceSpans(b, r, ServiceNode, n, spans)
	}
	return append(b, "]}"...)
}

// appendResourceSpans appends the resourceSpans entry of the spans whose
// Node is node.
func appendResourceSpans(b []byte, r Resource, service, node string, spans []Span) []byte {
	b = append(b, `{"resource":{"attributes":[`...)
	b = appendAttr(b, String("service.name", service))
	if node != "" {
		b = append(b, ',')
		b = appendAttr(b, String("service.instance.id", node))
	}
	if r.Version != "" && node == "" {
		b = append(b, ',')
		b = appendAttr(b, String("service.version", r.Version))
	}
	b = append(b, `]},"scopeSpans":[{"scope":{"name":"`+scopeName+`"`...)
	if r.Version != "" {
		b = append(b, `,"version":`...)
		b = appendString(b, r.Version)
	}
	b = append(b, `},"spans":[`...)
	first := true
	for i := range spans {
		if spans[i].Node != node {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendSpan(b, &spans[i])
	}
	return append(b, "]}]}"...)
}

func appendSpan(b []byte, s *Span) []byte {
	b = append(b, `{"traceId":"`...)
	b = hex.AppendEncode(b, s.TraceID[:])
	b = append(b, `","spanId":"`...)
	b = hex.AppendEncode(b, s.SpanID[:])
	b = append(b, '"')
	if !s.Parent.IsZero() {
		b = append(b, `,"parentSpanId":"`...)
		b = hex.AppendEncode(b, s.Parent[:])
		b = append(b, '"')
	}
	if s.State != "" {
		b = append(b, `,"traceState":`...)
		b = appendString(b, s.State)
	}
	b = append(b, `,"name":`...)
	b = appendString(b, s.Name)
	b = append(b, `,"kind":`...)
	b = strconv.AppendUint(b, uint64(s.Kind), 10)
	b = append(b, `,"startTimeUnixNano":"`...)
	b = strconv.AppendInt(b, s.Start.UnixNano(), 10)
	b = append(b, `","endTimeUnixNano":"`...)
	b = strconv.AppendInt(b, s.End.UnixNano(), 10)
	b = append(b, '"')
	if len(s.Attrs) > 0 {
		b = append(b, `,"attributes":[`...)
		for i, a := range s.Attrs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendAttr(b, a)
		}
		b = append(b, ']')
	}
	if len(s.Events) > 0 {
		b = append(b, `,"events":[`...)
		for i, e := range s.Events {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"timeUnixNano":"`...)
			b = strconv.AppendInt(b, e.Time.UnixNano(), 10)
			b = append(b, `","name":`...)
			b = appendString(b, e.Name)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if s.Error {
		b = append(b, `,"status":{"code":2`...) // STATUS_CODE_ERROR
		if s.Message != "" {
			b = append(b, `,"message":`...)
			b = appendString(b, s.Message)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendAttr(b []byte, a Attr) []byte {
	b = append(b, `{"key":`...)
	b = appendString(b, a.Key)
	switch a.Type {
	case AttrInt:
		b = append(b, `,"value":{"intValue":"`...)
		b = strconv.AppendInt(b, a.Int, 10)
		b = append(b, `"}}`...)
	case AttrBool:
		b = append(b, `,"value":{"boolValue":`...)
		b = strconv.AppendBool(b, a.Int != 0)
		b = append(b, "}}"...)
	default:
		b = append(b, `,"value":{"stringValue":`...)
		b = appendString(b, a.Str)
		b = append(b, "}}"...)
	}
	return b
}

// appendString appends s as a JSON string (RFC 8259 §7): quotes,
// backslashes and control characters escaped, invalid UTF-8 replaced by
// U+FFFD.
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}
