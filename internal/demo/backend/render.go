package backend

import (
	"math"
	"strconv"
	"time"
)

// Appenders for the hand-rendered JSON. They allocate only when dst grows.

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal (RFC 8259 §7). s is
// valid UTF-8 (it comes from encoding/json or from constants), so only the
// quote, the backslash and control characters need escaping.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
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
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// needsEscape reports whether appendJSONString would change s; constants
// that are pasted raw into JSON are checked with it in New.
func needsEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			return true
		}
	}
	return false
}

// appendFloat appends f the way nlohmann::json (llama-server) prints a
// double: shortest round-trip digits, fixed notation for magnitudes in
// [1e-4, 1e15) with ".0" on integral values, exponent notation otherwise.
func appendFloat(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	if a := math.Abs(f); a != 0 && (a < 1e-4 || a >= 1e15) {
		return strconv.AppendFloat(dst, f, 'e', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	for _, c := range dst[start:] {
		if c == '.' {
			return dst
		}
	}
	return append(dst, '.', '0')
}

// appendTime appends t in UTC as an RFC 3339 string with nanoseconds and
// trailing zeros trimmed, as Ollama's created_at and expires_at.
func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	dst = t.UTC().AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"')
}

// Alphabets of the generated ids.
const (
	alnum62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	lower36 = "abcdefghijklmnopqrstuvwxyz0123456789"
)

// appendID appends n random-looking characters of alphabet derived
// deterministically from (seed, stream): the same seed, request number and
// purpose always give the same id.
func appendID(dst []byte, seed, stream uint64, alphabet string, n int) []byte {
	x := seed ^ (stream * 0x9e3779b97f4a7c15)
	base := uint64(len(alphabet))
	for n > 0 {
		r := splitmix64(&x)
		for j := 0; j < 10 && n > 0; j++ {
			dst = append(dst, alphabet[r%base])
			r /= base
			n--
		}
	}
	return dst
}

// splitmix64 is Steele, Lea and Flood's SplitMix64 step (2014).
func splitmix64(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// timings renders llama-server's "timings" object from the cached and
// evaluated prompt counts, the completion count (tokens) and their
// processing times.
func appendTimings(dst []byte, cached, prompt, predicted int, promptDur, predDur time.Duration) []byte {
	pms := msOf(promptDur)
	gms := msOf(predDur)
	dst = append(dst, `{"cache_n":`...)
	dst = strconv.AppendInt(dst, int64(cached), 10)
	dst = append(dst, `,"prompt_n":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"prompt_ms":`...)
	dst = appendFloat(dst, pms)
	dst = append(dst, `,"prompt_per_token_ms":`...)
	dst = appendFloat(dst, pms/float64(max(prompt, 1)))
	dst = append(dst, `,"prompt_per_second":`...)
	dst = appendFloat(dst, float64(prompt)*1000/pms)
	dst = append(dst, `,"predicted_n":`...)
	dst = strconv.AppendInt(dst, int64(predicted), 10)
	dst = append(dst, `,"predicted_ms":`...)
	dst = appendFloat(dst, gms)
	dst = append(dst, `,"predicted_per_token_ms":`...)
	dst = appendFloat(dst, gms/float64(max(predicted, 1)))
	dst = append(dst, `,"predicted_per_second":`...)
	dst = appendFloat(dst, float64(predicted)*1000/gms)
	return append(dst, '}')
}

// msOf converts d to milliseconds with a floor of 1 µs, so rates stay finite.
func msOf(d time.Duration) float64 {
	return max(float64(d)/1e6, 0.001)
}
