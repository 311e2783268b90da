package tracing

import (
	"encoding/hex"
	"math/rand/v2"
	"strings"
)

// TraceID is a W3C trace-id: 16 bytes, not all zero (W3C Trace Context
// §3.2.2.3).
type TraceID [16]byte

// SpanID is a W3C parent-id / OpenTelemetry span id: 8 bytes, not all zero
// (§3.2.2.4).
type SpanID [8]byte

// IsZero reports whether id is all zeros (invalid).
func (id TraceID) IsZero() bool { return id == TraceID{} }

// IsZero reports whether id is all zeros (invalid).
func (id SpanID) IsZero() bool { return id == SpanID{} }

// String is the lowercase hex form (32 characters).
func (id TraceID) String() string { return hex.EncodeToString(id[:]) }

// String is the lowercase hex form (16 characters).
func (id SpanID) String() string { return hex.EncodeToString(id[:]) }

// NewTraceID returns a random trace id whose rightmost 7 bytes are random,
// as W3C Trace Context Level 2's random flag asks and Sample relies on.
// The generator is math/rand/v2's (ChaCha8 per thread, no lock): ids need
// to be unique, not secret.
func NewTraceID() TraceID {
	var id TraceID
	for id.IsZero() {
		putUint64(id[:8], rand.Uint64())
		putUint64(id[8:], rand.Uint64())
	}
	return id
}

// NewSpanID returns a random span id, never all zeros.
func NewSpanID() SpanID {
	var id SpanID
	for id.IsZero() {
		putUint64(id[:], rand.Uint64())
	}
	return id
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}

// Sample reports whether a new trace with id is sampled at ratio (0 to 1):
// the trace id's rightmost 56 bits, read as an integer, are below
// ratio × 2⁵⁶ — the random bits of W3C Trace Context Level 2, the threshold
// OpenTelemetry's TraceIdRatioBased sampler compares, so every Edge of a
// fleet decides the same way for the same trace. ratio ≥ 1 samples every
// trace, ≤ 0 none.
func Sample(id TraceID, ratio float64) bool {
	switch {
	case ratio >= 1:
		return true
	case ratio <= 0:
		return false
	}
	var low uint64
	for _, b := range id[9:] {
		low = low<<8 | uint64(b)
	}
	return low < uint64(ratio*(1<<56))
}

// Context is a W3C trace context as the Edge received or continues it.
type Context struct {
	TraceID TraceID
	// SpanID is the parent-id of the traceparent header: the caller's
	// span.
	SpanID  SpanID
	Sampled bool
	// State is the tracestate header (validated, members joined by ","),
	// "" when absent or dropped.
	State string
}

// Header names (W3C Trace Context §3.2, §3.3). net/http canonicalizes them.
const (
	HeaderTraceparent = "Traceparent"
	HeaderTracestate  = "Tracestate"
)

// Bounds of a tracestate the Edge keeps (W3C Trace Context §3.3.1.1: at
// most 32 list members; a vendor propagates at least 512 bytes). A longer
// header or more members drops the whole tracestate, never the trace.
const (
	MaxTracestateBytes   = 512
	MaxTracestateMembers = 32
)

// Parse reads the traceparent and tracestate header values of a request
// (W3C Trace Context §3.2, §3.3) and reports whether the traceparent is
// valid. Invalid (ok false, nothing of it is kept): no header, more than
// one, a version other than two lowercase hex digits or "ff", a length
// other than 55 for version 00, a future version shorter than 55 or not
// followed by "-", uppercase or non-hex digits, an all-zero trace-id or
// parent-id. tracestate is kept only with a valid traceparent and only
// when every list member is well formed and the whole fits
// MaxTracestateBytes and MaxTracestateMembers; several tracestate headers
// are one list (RFC 9110 §5.3). Parse does not allocate for a request
// without tracestate.
func Parse(traceparent, tracestate []string) (Context, bool) {
	var c Context
	if len(traceparent) != 1 {
		return c, false
	}
	s := traceparent[0]
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return c, false
	}
	ver, ok := hexByte(s[0], s[1])
	if !ok || ver == 0xff || ver == 0 && len(s) != 55 || ver != 0 && len(s) > 55 && s[55] != '-' {
		return c, false
	}
	if !decodeHex(c.TraceID[:], s[3:35]) || !decodeHex(c.SpanID[:], s[36:52]) || c.TraceID.IsZero() || c.SpanID.IsZero() {
		return Context{}, false
	}
	flags, ok := hexByte(s[53], s[54])
	if !ok {
		return Context{}, false
	}
	c.Sampled = flags&1 == 1
	c.State = joinTracestate(tracestate)
	return c, true
}

// joinTracestate returns the tracestate values as one list, or "" when
// absent, malformed or over the bounds.
func joinTracestate(vs []string) string {
	var s string
	switch len(vs) {
	case 0:
		return ""
	case 1:
		s = vs[0]
	default:
		s = strings.Join(vs, ",")
	}
	s = strings.Trim(s, " \t")
	if len(s) > MaxTracestateBytes || !validTracestate(s) {
		return ""
	}
	return s
}

// validTracestate checks a tracestate list (W3C Trace Context §3.3.1):
// list-members separated by "," with optional spaces or tabs around them,
// empty members allowed, at most MaxTracestateMembers non-empty ones, each
// "key=value" with key a simple-key or tenant@system multi-tenant key and
// value 1-256 printable ASCII characters but "," and "=", not ending in a
// space.
func validTracestate(s string) bool {
	members := 0
	for m := range strings.SplitSeq(s, ",") {
		m = strings.Trim(m, " \t")
		if m == "" {
			continue
		}
		if members++; members > MaxTracestateMembers {
			return false
		}
		k, v, ok := strings.Cut(m, "=")
		if !ok || !validKey(k) || !validValue(v) {
			return false
		}
	}
	return true
}

// validKey: simple-key = lcalpha 0*255(lcalpha / DIGIT / "_" / "-" / "*" /
// "/"); multi-tenant-key = tenant-id "@" system-id, tenant-id = (lcalpha /
// DIGIT) 0*240(keychar), system-id = lcalpha 0*13(keychar).
func validKey(k string) bool {
	keychar := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '*' || c == '/'
	}
	word := func(s string, firstDigit bool, max int) bool {
		if s == "" || len(s) > max {
			return false
		}
		if c := s[0]; !(c >= 'a' && c <= 'z' || firstDigit && c >= '0' && c <= '9') {
			return false
		}
		for i := 1; i < len(s); i++ {
			if !keychar(s[i]) {
				return false
			}
		}
		return true
	}
	tenant, system, multi := strings.Cut(k, "@")
	if !multi {
		return word(k, false, 256)
	}
	return word(tenant, true, 241) && word(system, false, 14)
}

// validValue: value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr;
// nblk-chr = %x21-2B / %x2D-3C / %x3E-7E.
func validValue(v string) bool {
	if v == "" || len(v) > 256 || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ',' || c == '=' {
			return false
		}
	}
	return true
}

func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexDigit(hi)
	l, ok2 := hexDigit(lo)
	return h<<4 | l, ok1 && ok2
}

// hexDigit accepts lowercase hex only (W3C Trace Context §3.2.2: HEXDIGLC).
func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func decodeHex(dst []byte, s string) bool {
	for i := range dst {
		b, ok := hexByte(s[2*i], s[2*i+1])
		if !ok {
			return false
		}
		dst[i] = b
	}
	return true
}
