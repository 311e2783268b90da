package api

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	apisurface "iop/internal/edge/surface"
)

// span is a half-open byte range [start, end) of a JSON value in a body.
// The zero span means "absent".
type span struct{ start, end int }

func (s span) ok() bool { return s.end > s.start }

// members iterates over the members of one JSON object without allocating.
// The input must be valid JSON (checked with json.Valid first); the iterator
// then needs no error handling beyond "not an object".
type members struct {
	b []byte
	i int
}

// newMembers starts an iteration over the object in b[v.start:v.end]. ok is
// false when the value is not an object.
func newMembers(b []byte, v span) (members, bool) {
	i := skipWS(b, v.start)
	if i >= v.end || b[i] != '{' {
		return members{}, false
	}
	return members{b: b[:v.end], i: i + 1}, true
}

// next returns the raw key (escapes intact, without quotes) and the value's
// span of the next member, or ok=false after the last one.
func (m *members) next() (key []byte, val span, ok bool) {
	b := m.b
	i := skipWS(b, m.i)
	if i < len(b) && b[i] == ',' {
		i = skipWS(b, i+1)
	}
	if i >= len(b) || b[i] != '"' {
		m.i = len(b)
		return nil, span{}, false
	}
	ke := skipString(b, i)
	key = b[i+1 : ke-1]
	i = skipWS(b, ke)
	i = skipWS(b, i+1) // ':'
	ve := skipValue(b, i)
	m.i = ve
	return key, span{i, ve}, true
}

// elements iterates over the values of one JSON array without allocating.
// Like members, it needs valid JSON.
type elements struct {
	b []byte
	i int
}

// newElements starts an iteration over the array in b[v.start:v.end]; a
// value that is not an array yields no elements.
func newElements(b []byte, v span) elements {
	i := skipWS(b, v.start)
	if i >= v.end || b[i] != '[' {
		return elements{b: b[:v.end], i: v.end}
	}
	return elements{b: b[:v.end], i: i + 1}
}

// next returns the span of the next element, or ok=false after the last.
func (e *elements) next() (val span, ok bool) {
	b := e.b
	i := skipWS(b, e.i)
	if i < len(b) && b[i] == ',' {
		i = skipWS(b, i+1)
	}
	if i >= len(b) || b[i] == ']' {
		e.i = len(b)
		return span{}, false
	}
	ve := skipValue(b, i)
	e.i = ve
	return span{i, ve}, true
}

// keyIs reports whether the raw key equals name, decoding escapes when the
// key has any (a client may spell "model" as "mod\u0065l").
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	var s string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	return json.Unmarshal(q, &s) == nil && s == name
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	default:
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
		}
		return i
	}
}

// kind is the JSON type of the value at v: one of '"', '{', '[', 't' (true),
// 'f' (false), 'n' (null), '0' (number), or 0 when absent.
func kind(b []byte, v span) byte {
	if !v.ok() {
		return 0
	}
	switch c := b[v.start]; c {
	case '"', '{', '[', 't', 'f', 'n':
		return c
	default:
		return '0'
	}
}

// jsonString decodes the string value at v. ok is false when it is not a
// string. It allocates only the result (and a decode for escaped strings).
func jsonString(b []byte, v span) (string, bool) {
	if kind(b, v) != '"' {
		return "", false
	}
	raw := b[v.start+1 : v.end-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw), true
	}
	var s string
	if json.Unmarshal(b[v.start:v.end], &s) != nil {
		return "", false
	}
	return s, true
}

// spliceModel returns body with every value span in spans replaced by the
// JSON string target: one allocation of the final size and one copy, every
// other byte unchanged (SPEC Q3: the client's body with only "model"
// replaced). spans are in ascending order and do not overlap.
func spliceModel(body []byte, spans []span, target string) []byte {
	var q [128]byte
	quoted := appendJSONString(q[:0], target)
	n := len(body)
	for _, s := range spans {
		n += len(quoted) - (s.end - s.start)
	}
	out := make([]byte, 0, n)
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s.start]...)
		out = append(out, quoted...)
		prev = s.end
	}
	return append(out, body[prev:]...)
}

// appendJSONString appends s as a JSON string (surface.AppendString).
func appendJSONString(dst []byte, s string) []byte { return apisurface.AppendString(dst, s) }
