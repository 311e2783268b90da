package api

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	apisurface "iop/internal/edge/surface"
	"iop/internal/jsonscan"
)

// span is a JSON value's byte range in a body (jsonscan.Span).
type span = jsonscan.Span

// jsonString decodes the string value at v. ok is false when it is not a
// string. It allocates only the result (and a decode for escaped strings).
func jsonString(b []byte, v span) (string, bool) {
	if jsonscan.Kind(b, v) != '"' {
		return "", false
	}
	raw := b[v.Start+1 : v.End-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw), true
	}
	var s string
	if json.Unmarshal(b[v.Start:v.End], &s) != nil {
		return "", false
	}
	return s, true
}

// appendJSONString appends s as a JSON string (surface.AppendString).
func appendJSONString(dst []byte, s string) []byte { return apisurface.AppendString(dst, s) }

// jsonInt is the value at v when it is a JSON integer from 0 to 2^53
// written without fraction or exponent, else 0. It allocates nothing.
func jsonInt(b []byte, v span) int64 {
	raw := bytes.TrimSpace(b[v.Start:v.End])
	if len(raw) == 0 || len(raw) > 16 {
		return 0
	}
	var n int64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	return min(n, 1<<53)
}
