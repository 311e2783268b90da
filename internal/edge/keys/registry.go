// Package keys is the Edge's side of client API keys (docs/keys.md
// K1–K9): who a key is (Authenticate), which models it may call
// (Principal.Allows, FilterModels), whether a request of it is admitted
// under its request rate, requests in flight and token budgets (Admit),
// what the rate-limit headers say (RateLimit), what it used (Ticket.Finish,
// Status, the metrics) and how that survives a restart (Usage, Restore).
// Loader keeps the key set current from the config and the key store file
// (SIGHUP and a poll of the file); Persister writes the usage file.
//
// The HTTP surface calls it, per model request:
//
//	p, err := reg.Authenticate(key, now)          // 401 on error
//	t, refusal := reg.Admit(p, now)                // 429 + Retry-After on refusal
//	… read the body …
//	if !p.Allows(model) { … }                      // the unknown model's 404
//	refusal = t.Reserve(keys.Estimate(…), now)     // 429 + Retry-After on refusal
//	t.RateLimit.WriteOpenAI(h) / WriteAnthropic(h, now)
//	… serve …
//	t.Finish(keys.Outcome{…}, now)                 // exactly once, refused or not
//
// Registry reads no clock (every call takes the time), does no I/O and
// logs nothing; it never holds or shows a key, only names and hashes.
// Safe for concurrent use.
package keys

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/limit"
)

// Errors of Authenticate; test with errors.Is. Each is a 401: the client
// sent no key the Edge accepts.
var (
	ErrNoKey      = errors.New("missing API key")
	ErrUnknownKey = errors.New("invalid API key")
	ErrRevoked    = errors.New("API key revoked")
	ErrExpired    = errors.New("API key expired")
	ErrRotated    = errors.New("API key replaced by a rotation")
)

// Registry holds the current key Set and every principal's counters.
type Registry struct {
	set    atomic.Pointer[Set]
	rate   limit.Keys   // requests_per_minute, max_concurrent
	tokens limit.Tokens // tokens_per_minute, tokens_per_day

	mu    sync.Mutex
	usage map[string]*counters // guarded by mu; the values are atomic
	dirty atomic.Bool          // counters changed since the last Usage

	// onMiss, when set (Loader.Registry), is called for a key no entry
	// matches and looks at the store file (reporting whether it swapped in
	// a newer Set): a key created a moment ago is then found at once
	// instead of at the next poll.
	onMiss func() bool
}

// counters are one principal's usage since it was first counted.
type counters struct {
	requests, prompt, completion, estimated, refused atomic.Int64
	since                                            atomic.Int64 // Unix ns of the first count; 0 = none yet
}

// New returns a Registry serving s.
func New(s *Set) *Registry {
	r := &Registry{usage: map[string]*counters{}}
	r.Swap(s)
	return r
}

// Swap makes s current: the next Authenticate sees it; requests admitted
// under the previous set finish under it (K2). The counters and budgets
// of the principals s still names are kept, those of the others dropped.
// A Set belongs to one Registry: Swap gives its principals their counters.
func (r *Registry) Swap(s *Set) {
	keep := func(name string) bool { return s.byName[name] != nil }
	r.mu.Lock()
	for n := range r.usage {
		if !keep(n) {
			delete(r.usage, n)
		}
	}
	for n, p := range s.byName {
		c := r.usage[n]
		if c == nil {
			c = &counters{}
			r.usage[n] = c
		}
		p.c = c
	}
	r.mu.Unlock()
	r.set.Store(s)
	r.rate.Retain(keep)
	r.tokens.Retain(keep)
}

// Set is the current key set.
func (r *Registry) Set() *Set { return r.set.Load() }

// OpenMode reports whether no key and no key store are configured.
func (r *Registry) OpenMode() bool { return r.set.Load().Open() }

// Authenticate returns the principal of key at now (K3): the SHA-256 of
// key looked up among the configured ones (a map on the hash: the time
// taken says nothing about any configured key); an unknown key makes the
// Loader look at the store file first (at most every MissPollInterval).
// Errors: ErrNoKey (key ""),
// ErrUnknownKey, ErrRevoked, ErrExpired (at and after expires_at),
// ErrRotated (a rotated key after its grace).
func (r *Registry) Authenticate(key string, now time.Time) (*Principal, error) {
	if key == "" {
		return nil, ErrNoKey
	}
	sum := sha256.Sum256([]byte(key))
	set := r.set.Load()
	c, ok := set.byHash[sum]
	if !ok && r.onMiss != nil {
		// Look again whenever the set changed, not only when this miss's
		// poll swapped it: the background poll may have swapped in the
		// key's store meanwhile (K2).
		if r.onMiss(); r.set.Load() != set {
			c, ok = r.set.Load().byHash[sum]
		}
	}
	switch {
	case !ok:
		return nil, ErrUnknownKey
	case !c.p.RevokedAt.IsZero():
		return nil, ErrRevoked
	case !c.p.ExpiresAt.IsZero() && !now.Before(c.p.ExpiresAt):
		return nil, fmt.Errorf("%w at %s", ErrExpired, c.p.ExpiresAt.UTC().Format(time.RFC3339))
	case !c.graceUntil.IsZero() && !now.Before(c.graceUntil):
		return nil, ErrRotated
	}
	return c.p, nil
}

// Refusal is a request Admit refused: a 429 with Retry-After (K5, K6).
type Refusal struct {
	Principal string
	// Err is limit.ErrConcurrency, limit.ErrRate, limit.ErrTokensMinute
	// or limit.ErrTokensDay.
	Err        error
	Limit      int // the bound that refused, as this Edge enforces it
	RetryAfter time.Duration
	// RateLimit is the principal's state for the headers of the 429.
	RateLimit RateLimit
}

func (e *Refusal) Error() string {
	return fmt.Sprintf("principal %q: %v (limit %d)", e.Principal, e.Err, e.Limit)
}

func (e *Refusal) Unwrap() error { return e.Err }

// Bound names the refusing bound for a message: "requests_per_minute 60".
func (e *Refusal) Bound() string {
	name, _ := e.names()
	return name + " " + strconv.Itoa(e.Limit)
}

// What says in words what the key has too many of: "requests per minute".
func (e *Refusal) What() string {
	_, what := e.names()
	return what
}

func (e *Refusal) names() (config, words string) {
	switch e.Err {
	case limit.ErrRate:
		return "requests_per_minute", "requests per minute"
	case limit.ErrTokensMinute:
		return "tokens_per_minute", "tokens per minute"
	case limit.ErrTokensDay:
		return "tokens_per_day", "tokens per day"
	}
	return "max_concurrent", "requests in flight"
}

// Ticket is one admitted request: Admit makes it (the requests in flight
// and the request rate), Reserve adds its token estimate once the body is
// read, Finish ends it exactly once (later calls do nothing). A nil
// *Ticket (open mode) is valid. It belongs to its request's goroutine.
type Ticket struct {
	r    *Registry
	p    *Principal
	c    *counters
	slot *limit.Slot
	res  *limit.Reservation
	done atomic.Bool
	// RateLimit is what the answer's rate-limit headers say (K6): the
	// state right after Admit, with the token windows right after Reserve.
	RateLimit RateLimit
}

// Admit admits one request of p at now under its requests in flight and
// its request rate, checked in that order (a request refused for being
// one too many in flight spends no request token), or refuses it. Call it
// as soon as the key is known, before the body is read: a client over its
// bounds holds no body on the edge. The admitted request holds its slot
// until Finish.
func (r *Registry) Admit(p *Principal, now time.Time) (*Ticket, *Refusal) {
	c := p.c
	c.since.CompareAndSwap(0, now.UnixNano())
	slot, err := r.rate.Acquire(p.Name, p.keyLimit(), now)
	if err != nil {
		return nil, r.refuse(p, c, err.(*limit.RefusedError), now)
	}
	c.requests.Add(1)
	r.dirty.Store(true)
	t := &Ticket{r: r, p: p, c: c, slot: slot}
	t.RateLimit = stateOf(p, r.tokens.State(p.Name, p.tokenLimit(), now), now)
	if slot != nil && p.Limits.RequestsPerMinute > 0 {
		t.RateLimit.setRequests(p, slot.Rate)
	}
	return t, nil
}

// Reserve checks t's token budgets at now, per day first (the longer
// wait), and reserves estimate tokens (Estimate: the prompt's estimate
// and the completion it may take) until Finish settles them (K5). On a
// refusal t is ended as if it had never been admitted: out of the
// in-flight count, its request token given back, counted as refused, not
// as a request. Call it at most once; nil-safe (open mode).
func (t *Ticket) Reserve(estimate int64, now time.Time) *Refusal {
	if t == nil || t.res != nil || t.done.Load() {
		return nil
	}
	res, err := t.r.tokens.Reserve(t.p.Name, t.p.tokenLimit(), estimate, now)
	if err != nil {
		t.done.Store(true)
		t.slot.Cancel()
		t.c.requests.Add(-1)
		return t.r.refuse(t.p, t.c, err.(*limit.RefusedError), now)
	}
	t.res = res
	req := t.RateLimit.Requests
	t.RateLimit = stateOf(t.p, res.State, now)
	t.RateLimit.Requests = req
	return nil
}

// State is p's rate-limit state at now without admitting anything: the
// headers of an answer that is not a model request (GET /v1/models).
func (r *Registry) State(p *Principal, now time.Time) RateLimit { return r.refusedState(p, now) }

// refuse counts a refusal of p and describes it.
func (r *Registry) refuse(p *Principal, c *counters, re *limit.RefusedError, now time.Time) *Refusal {
	c.refused.Add(1)
	r.dirty.Store(true)
	return &Refusal{Principal: p.Name, Err: re.Err, Limit: re.Limit, RetryAfter: re.RetryAfter, RateLimit: r.refusedState(p, now)}
}

// refusedState is p's rate-limit state at now for a refusal's headers.
func (r *Registry) refusedState(p *Principal, now time.Time) RateLimit {
	rl := stateOf(p, r.tokens.State(p.Name, p.tokenLimit(), now), now)
	if n := p.Limits.RequestsPerMinute; n > 0 {
		rl.setRequests(p, r.rate.Rate(p.Name, clampInt(n), now))
	}
	return rl
}

// Outcome is how an admitted request ended, for Finish.
type Outcome struct {
	// PromptTokens and CompletionTokens are what the backend reported;
	// Reported says whether it reported any usage at all.
	PromptTokens, CompletionTokens int64
	Reported                       bool
	// Answered: the client got a model's answer (a success status, or a
	// stream that began); a request refused or failed before that costs
	// nothing when no usage was reported.
	Answered bool
	// Relayed is what an answer without usage is known to have cost at
	// least, in tokens: the prompt's estimate plus what its relay carried
	// (one per event of a stream; reply.Recorder.MinTokens). It is
	// charged when it is more than the estimate, so that streams which
	// report no usage and set no max_tokens cannot take more than their
	// key's budget for the price of their estimates.
	Relayed int64
}

// Finish ends t at now (K5): the request leaves the in-flight count and
// its reservation is replaced by what it cost — the usage the backend
// reported; without a report, when it was answered (a stream without
// usage), its estimate or o.Relayed if more; else nothing. A stream that used more than its
// budget had left is charged in full: the next request is refused until
// the window has room. Idempotent, nil-safe.
func (t *Ticket) Finish(o Outcome, now time.Time) {
	if t == nil || !t.done.CompareAndSwap(false, true) {
		return
	}
	t.slot.Release()
	if t.res == nil { // ended before its body was read (a bad request, the client gone): no tokens
		t.r.dirty.Store(true)
		return
	}
	var used int64
	switch {
	case o.Reported:
		used = max(o.PromptTokens, 0) + max(o.CompletionTokens, 0)
		t.c.prompt.Add(max(o.PromptTokens, 0))
		t.c.completion.Add(max(o.CompletionTokens, 0))
	case o.Answered:
		used = max(t.res.Estimate(), min(max(o.Relayed, 0), limit.MaxEstimate))
		t.c.estimated.Add(used)
	}
	t.res.Settle(used, now)
	t.r.dirty.Store(true)
}

// Principal is the ticket's principal.
func (t *Ticket) Principal() *Principal { return t.p }

// Estimate is the tokens the ticket reserved.
func (t *Ticket) Estimate() int64 { return t.res.Estimate() }

// DefaultCompletionEstimate is the completion, in tokens, reserved for a
// request that sets no maximum (K5); its settlement replaces it with what
// the backend reported.
const DefaultCompletionEstimate = 256

// Estimate is what a request reserves (K5): its body's bytes ÷ 4 (the
// prompt, as models[].long_context_tokens estimates it) plus its maximum
// completion (max_tokens, max_completion_tokens or max_output_tokens), or
// DefaultCompletionEstimate when it sets none.
func Estimate(bodyBytes int, maxTokens int64) int64 {
	if maxTokens <= 0 {
		maxTokens = DefaultCompletionEstimate
	}
	return int64(max(bodyBytes, 0)/4) + min(maxTokens, limit.MaxEstimate)
}

// Lookup returns the principal named name at now, with Authenticate's
// checks but without its key: for a request the edge makes itself on a
// key's behalf (a batch's lines, SPEC X4). Errors: ErrUnknownKey (no such
// name: removed from the config or the store), ErrRevoked, ErrExpired.
func (r *Registry) Lookup(name string, now time.Time) (*Principal, error) {
	p := r.set.Load().Principal(name)
	switch {
	case p == nil:
		return nil, ErrUnknownKey
	case !p.RevokedAt.IsZero():
		return nil, ErrRevoked
	case !p.ExpiresAt.IsZero() && !now.Before(p.ExpiresAt):
		return nil, fmt.Errorf("%w at %s", ErrExpired, p.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return p, nil
}
