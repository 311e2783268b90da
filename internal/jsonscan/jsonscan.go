// Package jsonscan walks JSON text that is already known to be valid
// (json.Valid) without allocating: the members of an object, the elements
// of an array, the kind of a value. The Edge reads a request body's top
// level with it before it queues (api: model, stream, the conversation
// prefix) and checks the members of a request's objects against a
// surface's field tables (surface.CheckMembers).
//
// It owns no state and never decodes a value. It must never be given
// invalid JSON: on such input its results are unspecified, but it never
// panics, never reads outside the slice, every Span it returns is
// non-empty and lies within it, a string Span is quoted at both ends (its
// content is b[Start+1 : End-1]), and every iteration ends (FuzzAnyBytes
// holds that).
package jsonscan

import (
	"bytes"
	"encoding/json"
)

// Span is a half-open byte range [Start, End) of a JSON value in a body.
// The zero Span means "absent".
type Span struct{ Start, End int }

// OK reports whether s holds a value.
func (s Span) OK() bool { return s.End > s.Start }

// All is the Span of the whole of b.
func All(b []byte) Span { return Span{0, len(b)} }

// Members iterates over the members of one JSON object without allocating.
type Members struct {
	b []byte
	i int
}

// NewMembers starts an iteration over the object in b[v.Start:v.End]. ok
// is false when the value is not an object.
func NewMembers(b []byte, v Span) (Members, bool) {
	i := SkipSpace(b, v.Start)
	if i >= v.End || b[i] != '{' {
		return Members{}, false
	}
	return Members{b: b[:v.End], i: i + 1}, true
}

// Next returns the raw key (escapes intact, without quotes) and the
// value's Span of the next member, or ok=false after the last one.
func (m *Members) Next() (key []byte, val Span, ok bool) {
	b := m.b
	i := SkipSpace(b, m.i)
	if i < len(b) && b[i] == ',' {
		i = SkipSpace(b, i+1)
	}
	if i >= len(b) || b[i] != '"' {
		m.i = len(b)
		return nil, Span{}, false
	}
	ke := SkipString(b, i)
	if ke < i+2 || b[ke-1] != '"' { // an unterminated key: only in invalid JSON
		m.i = len(b)
		return nil, Span{}, false
	}
	key = b[i+1 : ke-1]
	i = SkipSpace(b, ke)
	if i >= len(b) || b[i] != ':' {
		m.i = len(b)
		return nil, Span{}, false
	}
	i = SkipSpace(b, i+1)
	if i >= len(b) {
		m.i = len(b)
		return nil, Span{}, false
	}
	ve := SkipValue(b, i)
	if !whole(b, i, ve) {
		m.i = len(b)
		return nil, Span{}, false
	}
	m.i = ve
	return key, Span{i, ve}, true
}

// whole reports whether b[i:ve] can be a value: not empty (",," in invalid
// JSON leaves no value), and a string both opened and closed, so that a
// string's content is always b[Start+1 : End-1]. Anything else is invalid
// JSON, where the iteration stops.
func whole(b []byte, i, ve int) bool {
	if ve <= i {
		return false
	}
	return b[i] != '"' || (ve-i >= 2 && b[ve-1] == '"')
}

// Elements iterates over the values of one JSON array without allocating.
type Elements struct {
	b []byte
	i int
}

// NewElements starts an iteration over the array in b[v.Start:v.End]; a
// value that is not an array yields no elements.
func NewElements(b []byte, v Span) Elements {
	i := SkipSpace(b, v.Start)
	if i >= v.End || b[i] != '[' {
		return Elements{b: b[:v.End], i: v.End}
	}
	return Elements{b: b[:v.End], i: i + 1}
}

// Next returns the Span of the next element, or ok=false after the last.
func (e *Elements) Next() (val Span, ok bool) {
	b := e.b
	i := SkipSpace(b, e.i)
	if i < len(b) && b[i] == ',' {
		i = SkipSpace(b, i+1)
	}
	if i >= len(b) || b[i] == ']' {
		e.i = len(b)
		return Span{}, false
	}
	ve := SkipValue(b, i)
	if !whole(b, i, ve) {
		e.i = len(b)
		return Span{}, false
	}
	e.i = ve
	return Span{i, ve}, true
}

// KeyIs reports whether the raw key equals name, decoding escapes when the
// key has any (a client may spell "model" as "mod\u0065l"); only such a
// key costs an allocation.
func KeyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	return Key(raw) == name
}

// Key returns the raw key decoded (escapes resolved); it allocates only for
// a key with escapes. An undecodable key yields itself.
func Key(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	var s string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	if json.Unmarshal(q, &s) != nil {
		return string(raw)
	}
	return s
}

// Kind is the JSON type of the value at v: one of '"', '{', '[', 't'
// (true), 'f' (false), 'n' (null), '0' (number), or 0 when absent.
func Kind(b []byte, v Span) byte {
	if !v.OK() {
		return 0
	}
	switch c := b[v.Start]; c {
	case '"', '{', '[', 't', 'f', 'n':
		return c
	default:
		return '0'
	}
}

// SkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func SkipSpace(b []byte, i int) int {
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

// SkipString returns the index just past the string starting at
// b[i] == '"'.
func SkipString(b []byte, i int) int {
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

// SkipValue returns the index just past the value starting at b[i].
func SkipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = SkipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
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
