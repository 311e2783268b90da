package keys

import (
	"net/http"
	"strconv"
	"time"

	"iop/internal/edge/limit"
)

// Window is one bound as the rate-limit headers report it (K6): the
// limit this Edge enforces, what is left of it (the requests in flight's
// token reservations count as spent), and how long until it is back to
// its initial state. Set is false for a bound the principal does not have.
type Window struct {
	Set              bool
	Limit, Remaining int64
	Reset            time.Duration
	text             string // Limit formatted (Principal.text), or ""
}

func (w *Window) limitText() string {
	if w.text != "" {
		return w.text
	}
	return strconv.FormatInt(w.Limit, 10)
}

// RateLimit is a principal's state for one answer's headers: Requests is
// requests_per_minute; Tokens the most restrictive token window in effect
// (tokens_per_minute or tokens_per_day, whichever has less left; on a tie
// the one that resets later), as Anthropic defines its tokens headers.
type RateLimit struct {
	Requests, Tokens Window
}

func (rl *RateLimit) setRequests(p *Principal, s limit.RateState) {
	rl.Requests = Window{Set: true, Limit: p.Limits.RequestsPerMinute, Remaining: int64(s.Remaining), Reset: s.Reset, text: p.text[0]}
}

// stateOf is p's token window for the headers from the budgets' state.
func stateOf(p *Principal, s limit.TokenState, now time.Time) RateLimit {
	var rl RateLimit
	if n := p.Limits.TokensPerMinute; n > 0 {
		rl.Tokens = Window{Set: true, Limit: n, Remaining: s.MinuteRemaining, Reset: s.MinuteReset, text: p.text[1]}
	}
	if n := p.Limits.TokensPerDay; n > 0 && (!rl.Tokens.Set || s.DayRemaining < rl.Tokens.Remaining ||
		s.DayRemaining == rl.Tokens.Remaining && s.DayReset > rl.Tokens.Reset) {
		rl.Tokens = Window{Set: true, Limit: n, Remaining: s.DayRemaining, Reset: s.DayReset, text: p.text[2]}
	}
	return rl
}

// Header names (OpenAI API reference, "Rate limits in headers";
// Anthropic API reference, "Rate limits: response headers").
const (
	HeaderLimitRequests     = "X-Ratelimit-Limit-Requests"
	HeaderRemainingRequests = "X-Ratelimit-Remaining-Requests"
	HeaderResetRequests     = "X-Ratelimit-Reset-Requests"
	HeaderLimitTokens       = "X-Ratelimit-Limit-Tokens"
	HeaderRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	HeaderResetTokens       = "X-Ratelimit-Reset-Tokens"

	HeaderAnthropicRequestsLimit     = "Anthropic-Ratelimit-Requests-Limit"
	HeaderAnthropicRequestsRemaining = "Anthropic-Ratelimit-Requests-Remaining"
	HeaderAnthropicRequestsReset     = "Anthropic-Ratelimit-Requests-Reset"
	HeaderAnthropicTokensLimit       = "Anthropic-Ratelimit-Tokens-Limit"
	HeaderAnthropicTokensRemaining   = "Anthropic-Ratelimit-Tokens-Remaining"
	HeaderAnthropicTokensReset       = "Anthropic-Ratelimit-Tokens-Reset"
)

// WriteOpenAI sets OpenAI's headers for every bound the principal has:
// x-ratelimit-limit-, -remaining- and -reset-requests and -tokens, the
// reset as a duration ("1s", "6m0s", "250ms"), rounded up to the
// millisecond. Without any bound it sets nothing.
func (rl *RateLimit) WriteOpenAI(h http.Header) {
	rl.write(h, [6]string{HeaderLimitRequests, HeaderRemainingRequests, HeaderResetRequests,
		HeaderLimitTokens, HeaderRemainingTokens, HeaderResetTokens}, func(d time.Duration) string { return resetDuration(d) })
}

// WriteAnthropic sets Anthropic's headers (on /v1/messages) for every
// bound the principal has: anthropic-ratelimit-requests-limit,
// -remaining, -reset and the tokens three, the reset as an RFC 3339 time
// (now + reset, rounded up to the second).
func (rl *RateLimit) WriteAnthropic(h http.Header, now time.Time) {
	rl.write(h, [6]string{HeaderAnthropicRequestsLimit, HeaderAnthropicRequestsRemaining, HeaderAnthropicRequestsReset,
		HeaderAnthropicTokensLimit, HeaderAnthropicTokensRemaining, HeaderAnthropicTokensReset}, func(d time.Duration) string { return resetTime(now, d) })
}

// write sets the three names of each window that is set, the values in
// one backing array (one allocation besides the numbers' strings).
func (rl *RateLimit) write(h http.Header, names [6]string, reset func(time.Duration) string) {
	if !rl.Requests.Set && !rl.Tokens.Set {
		return
	}
	back := make([]string, 0, 6) // never grown: the slices below stay views of it
	for i, w := range [2]*Window{&rl.Requests, &rl.Tokens} {
		if !w.Set {
			continue
		}
		back = append(back, w.limitText(), strconv.FormatInt(w.Remaining, 10), reset(w.Reset))
		n := len(back)
		for k := range 3 {
			h[names[3*i+k]] = back[n-3+k : n-2+k : n-2+k]
		}
	}
}

func resetDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
}

func resetTime(now time.Time, d time.Duration) string {
	t := now.Add(max(d, 0))
	if t.Nanosecond() != 0 {
		t = t.Truncate(time.Second).Add(time.Second)
	}
	return t.UTC().Format(time.RFC3339)
}
