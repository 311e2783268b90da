package keystore

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxPatternLen bounds one model name or pattern, in bytes.
const MaxPatternLen = 256

// MaxScopeEntries bounds a key's model scope, in names and patterns:
// every request of the key is matched against its patterns, and a fleet
// with more model groups than this for one key names them by pattern.
const MaxScopeEntries = 256

// ErrBadPattern: a model name or pattern of a key's scope is not one
// (docs/keys.md K4, K9).
var ErrBadPattern = errors.New("bad model pattern")

// ErrScopeTooLarge: a key's scope has more than MaxScopeEntries entries
// (K9).
var ErrScopeTooLarge = errors.New("model scope too large")

// checkScopeSize is ErrScopeTooLarge naming n when n > MaxScopeEntries.
func checkScopeSize(n int) error {
	if n > MaxScopeEntries {
		return fmt.Errorf("%w: %d entries, at most %d (name many models by a pattern: 'qwen3*')", ErrScopeTooLarge, n, MaxScopeEntries)
	}
	return nil
}

// ValidatePattern checks one entry of a key's model scope: a model group
// name, or a pattern where '*' stands for any run of characters (none
// included) and '?' for exactly one; 1–MaxPatternLen bytes of valid UTF-8
// without spaces, control characters, ',' (the -models separator) or the
// characters other glob syntaxes give a meaning ('[', ']', '{', '}',
// '\'), so that no pattern means something else than it seems. The error
// is ErrBadPattern naming the pattern and the problem.
func ValidatePattern(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: empty", ErrBadPattern)
	case len(p) > MaxPatternLen:
		return fmt.Errorf("%w %.32q…: longer than %d bytes", ErrBadPattern, p, MaxPatternLen)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w %q: not UTF-8", ErrBadPattern, p)
	}
	for _, r := range p {
		switch {
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return fmt.Errorf("%w %q: spaces and control characters are not allowed", ErrBadPattern, p)
		case strings.ContainsRune("[]{}\\,", r):
			return fmt.Errorf("%w %q: %q is not allowed (use '*' for any run of characters, '?' for one)", ErrBadPattern, p, r)
		}
	}
	return nil
}

// ParseModels splits a -models value ("tiny,qwen3*") into its entries,
// each checked by ValidatePattern, at most MaxScopeEntries of them
// (ErrScopeTooLarge); surrounding spaces are dropped and a repeated entry
// is kept once. "" is no scope (every model).
func ParseModels(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if err := ValidatePattern(f); err != nil {
			return nil, err
		}
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	if err := checkScopeSize(len(out)); err != nil {
		return nil, err
	}
	return out, nil
}

// IsPattern reports whether p has a wildcard ('*' or '?').
func IsPattern(p string) bool { return strings.ContainsAny(p, "*?") }

// Match reports whether model matches pattern p (ValidatePattern's
// syntax): '*' any run of characters, '?' exactly one character, every
// other character itself. It runs in O(len(p)·len(model)) at worst and
// allocates nothing.
func Match(p, model string) bool {
	// The classic two-pointer wildcard match: on a mismatch, go back to
	// the last '*' and let it take one more character.
	pi, mi := 0, 0
	star, starMi := -1, 0
	for mi < len(model) {
		if pi < len(p) {
			switch c := p[pi]; c {
			case '*':
				star, starMi = pi, mi
				pi++
				continue
			case '?':
				_, n := utf8.DecodeRuneInString(model[mi:])
				pi++
				mi += n
				continue
			default:
				if c == model[mi] {
					pi++
					mi++
					continue
				}
			}
		}
		if star < 0 {
			return false
		}
		pi = star + 1
		_, n := utf8.DecodeRuneInString(model[starMi:])
		starMi += n
		mi = starMi
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}
