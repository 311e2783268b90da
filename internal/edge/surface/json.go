package surface

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string. It escapes what RFC 8259
// requires plus U+2028/U+2029 (as encoding/json does), replaces invalid
// UTF-8 with U+FFFD, and leaves '<', '>' and '&' alone (OpenAI's own output
// does not escape them). It allocates only when dst must grow.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendNullable appends s as a JSON string, or null when s is empty.
func AppendNullable(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return AppendString(dst, s)
}

// Present reports whether a raw JSON value was given and is not null.
func Present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// Skip is a request member the parser reads nothing from (the HTTP layer
// already read it, e.g. "model", "stream"); decoding it allocates nothing.
type Skip struct{}

// UnmarshalJSON implements json.Unmarshaler.
func (*Skip) UnmarshalJSON([]byte) error { return nil }

// Seen records whether a member was given with a value other than null,
// for members whose presence alone decides (refused or advisory ones);
// decoding it allocates nothing.
type Seen bool

// UnmarshalJSON implements json.Unmarshaler.
func (s *Seen) UnmarshalJSON(b []byte) error {
	*s = Seen(!bytes.Equal(b, []byte("null")))
	return nil
}

// StringValue decodes a JSON string value; ok is false when raw is not a
// string. A string without escapes costs one allocation (the result).
func StringValue(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// IsJSONObject reports whether s is the text of one JSON object (a tool
// call's arguments).
func IsJSONObject(s string) bool {
	t := bytes.TrimSpace([]byte(s))
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}
