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
}

// RateLimit is a principal's state for one answer's headers: Requests is
// requests_per_minute; Tokens the most restrictive token window in effect
// (tokens_per_minute or tokens_per_day, whichever has less left; on a tie
// the one that resets later), as Anthropic defines its tokens headers.
type RateLimit struct {
	Requests, Tokens Window
}

func (rl *RateLimit) setRequests(limit int64, s limit.RateState) {
	rl.Requests = Window{Set: true, Limit: limit, Remaining: int64(s.Remaining), Reset: s.Reset}
}

// stateOf is p's token window for the headers from the budgets' state.
func stateOf(p *Principal, s limit.TokenState, now time.Time) RateLimit {
	var rl RateLimit
	if n := p.Limits.TokensPerMinute; n > 0 {
		rl.Tokens = Window{Set: true, Limit: n, Remaining: s.MinuteRemaining, Reset: s.MinuteReset}
	}
	if n := p.Limits.TokensPerDay; n > 0 && (!rl.Tokens.Set || s.DayRemaining < rl.Tokens.Remaining ||
		s.DayRemaining == rl.Tokens.Remaining && s.DayReset > rl.Tokens.Reset) {
		rl.Tokens = Window{Set: true, Limit: n, Remaining: s.DayRemaining, Reset: s.DayReset}
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
	if w := rl.Requests; w.Set {
		h[HeaderLimitRequests] = []string{strconv.FormatInt(w.Limit, 10)}
		h[HeaderRemainingRequests] = []string{strconv.FormatInt(w.Remaining, 10)}
		h[HeaderResetRequests] = []string{resetDuration(w.Reset)}
	}
	if w := rl.Tokens; w.Set {
		h[HeaderLimitTokens] = []string{strconv.FormatInt(w.Limit, 10)}
		h[HeaderRemainingTokens] = []string{strconv.FormatInt(w.Remaining, 10)}
		h[HeaderResetTokens] = []string{resetDuration(w.Reset)}
	}
}

// WriteAnthropic sets Anthropic's headers (on /v1/messages) for every
// bound the principal has: anthropic-ratelimit-requests-limit,
// -remaining, -reset and the tokens three, the reset as an RFC 3339 time
// (now + reset, rounded up to the second).
func (rl *RateLimit) WriteAnthropic(h http.Header, now time.Time) {
	if w := rl.Requests; w.Set {
		h[HeaderAnthropicRequestsLimit] = []string{strconv.FormatInt(w.Limit, 10)}
		h[HeaderAnthropicRequestsRemaining] = []string{strconv.FormatInt(w.Remaining, 10)}
		h[HeaderAnthropicRequestsReset] = []string{resetTime(now, w.Reset)}
	}
	if w := rl.Tokens; w.Set {
		h[HeaderAnthropicTokensLimit] = []string{strconv.FormatInt(w.Limit, 10)}
		h[HeaderAnthropicTokensRemaining] = []string{strconv.FormatInt(w.Remaining, 10)}
		h[HeaderAnthropicTokensReset] = []string{resetTime(now, w.Reset)}
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
