package keys

import (
	"bufio"
	"io"
	"sort"
	"strconv"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/keystore"
	"iop/internal/edge/limit"
)

// KeyStatus is one principal in /status (K7): never its key or hash.
type KeyStatus struct {
	Name      string `json:"name"`
	Source    string `json:"source"`
	Status    string `json:"status"` // active, expired, revoked
	Hint      string `json:"hint,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
	// Models is the scope; absent = every model.
	Models           []string `json:"models,omitempty"`
	Requests         int64    `json:"requests"`
	PromptTokens     int64    `json:"prompt_tokens"`
	CompletionTokens int64    `json:"completion_tokens"`
	// EstimatedTokens were charged from estimates: answers whose backend
	// reported no usage.
	EstimatedTokens int64 `json:"estimated_tokens"`
	Refused         int64 `json:"refused"`
	InFlight        int   `json:"in_flight"`
	// TokensToday is what the current UTC day counted, limit or not.
	TokensToday int64 `json:"tokens_today"`
	// The bounds this Edge enforces (K8) and what is left of them.
	Limits *StatusLimits `json:"limits,omitempty"`
}

// StatusLimits are a principal's bounds on this Edge and what is left.
type StatusLimits struct {
	RequestsPerMinute int64 `json:"requests_per_minute,omitempty"`
	MaxConcurrent     int64 `json:"max_concurrent,omitempty"`
	TokensPerMinute   int64 `json:"tokens_per_minute,omitempty"`
	TokensPerDay      int64 `json:"tokens_per_day,omitempty"`
	TokensMinuteLeft  int64 `json:"tokens_per_minute_remaining,omitempty"`
	TokensDayLeft     int64 `json:"tokens_per_day_remaining,omitempty"`
}

// Status lists every principal's usage at now, by name.
func (r *Registry) Status(now time.Time) []KeyStatus {
	s := r.set.Load()
	out := make([]KeyStatus, 0, len(s.names))
	for _, n := range s.names {
		out = append(out, r.status(s.byName[n], now))
	}
	return out
}

// StatusOf is one principal's usage at now; ok is false for an unknown
// name.
func (r *Registry) StatusOf(name string, now time.Time) (KeyStatus, bool) {
	p := r.set.Load().byName[name]
	if p == nil {
		return KeyStatus{}, false
	}
	return r.status(p, now), true
}

func (r *Registry) status(p *Principal, now time.Time) KeyStatus {
	ks := KeyStatus{Name: p.Name, Source: p.Source, Status: "active", Hint: p.Hint, Models: p.Models,
		InFlight: r.rate.InFlight(p.Name)}
	switch {
	case !p.RevokedAt.IsZero():
		ks.Status = "revoked"
	case !p.ExpiresAt.IsZero() && !now.Before(p.ExpiresAt):
		ks.Status = "expired"
	}
	if !p.ExpiresAt.IsZero() {
		ks.ExpiresAt = p.ExpiresAt.UTC().Format(time.RFC3339)
	}
	r.mu.Lock()
	c := r.usage[p.Name]
	r.mu.Unlock()
	if c != nil {
		ks.Requests, ks.PromptTokens, ks.CompletionTokens = c.requests.Load(), c.prompt.Load(), c.completion.Load()
		ks.EstimatedTokens, ks.Refused = c.estimated.Load(), c.refused.Load()
	}
	ts := r.tokens.State(p.Name, p.tokenLimit(), now)
	ks.TokensToday = ts.DayUsed
	if l := p.Limits; l != (keystore.Limits{}) {
		ks.Limits = &StatusLimits{RequestsPerMinute: l.RequestsPerMinute, MaxConcurrent: l.MaxConcurrent,
			TokensPerMinute: l.TokensPerMinute, TokensPerDay: l.TokensPerDay}
		if l.TokensPerMinute > 0 {
			ks.Limits.TokensMinuteLeft = ts.MinuteRemaining
		}
		if l.TokensPerDay > 0 {
			ks.Limits.TokensDayLeft = ts.DayRemaining
		}
	}
	return ks
}

// Dirty reports whether any counter changed since the last Usage call
// that cleared it (the Persister writes only then).
func (r *Registry) Dirty() bool { return r.dirty.Load() }

// Usage is every principal's counters and settled budgets at now, as the
// usage file holds them (K7), and clears Dirty. Reservations of requests
// in flight are not part of it.
func (r *Registry) Usage(now time.Time) *keystore.Usage {
	r.dirty.Store(false)
	snaps := map[string]limit.TokenSnapshot{}
	for _, s := range r.tokens.Snapshot(now) {
		snaps[s.Principal] = s
	}
	u := &keystore.Usage{Version: 1, SavedAt: now.UTC()}
	r.mu.Lock()
	defer r.mu.Unlock()
	names := map[string]bool{}
	for n := range r.usage {
		names[n] = true
	}
	for n := range snaps {
		names[n] = true
	}
	for n := range names {
		if !keystore.ValidName(n) {
			continue // an api_keys principal the file cannot name: counted, not persisted
		}
		ku := keystore.KeyUsage{Name: n}
		if c := r.usage[n]; c != nil {
			ku.Requests, ku.PromptTokens, ku.CompletionTokens = c.requests.Load(), c.prompt.Load(), c.completion.Load()
			ku.Refused = c.refused.Load()
			if ns := c.since.Load(); ns != 0 {
				ku.Since = time.Unix(0, ns).UTC()
			}
			ku.EstimatedTokens = c.estimated.Load()
		}
		if s, ok := snaps[n]; ok {
			if !s.MinuteEmptyAt.IsZero() {
				ku.MinuteEmptyAt = s.MinuteEmptyAt.UTC()
			}
			if s.DayUsed > 0 {
				ku.Day, ku.DayTokens = s.Day.Format(time.DateOnly), s.DayUsed
			}
		}
		u.Keys = append(u.Keys, ku)
	}
	sort.Slice(u.Keys, func(i, j int) bool { return u.Keys[i].Name < u.Keys[j].Name })
	return u
}

// Restore sets the counters and settled budgets of the principals the
// current set names from u (an Edge starting, K7), as of now; the others
// are dropped. Call it before serving.
func (r *Registry) Restore(u *keystore.Usage, now time.Time) {
	s := r.set.Load()
	var snaps []limit.TokenSnapshot
	r.mu.Lock()
	for _, ku := range u.Keys {
		if s.byName[ku.Name] == nil {
			continue
		}
		c := r.usage[ku.Name] // Swap made one for every principal
		c.requests.Store(ku.Requests)
		c.prompt.Store(ku.PromptTokens)
		c.completion.Store(ku.CompletionTokens)
		c.estimated.Store(ku.EstimatedTokens)
		c.refused.Store(ku.Refused)
		if !ku.Since.IsZero() {
			c.since.Store(ku.Since.UnixNano())
		}
		ts := limit.TokenSnapshot{Principal: ku.Name, MinuteEmptyAt: ku.MinuteEmptyAt}
		if d, err := time.Parse(time.DateOnly, ku.Day); err == nil {
			ts.Day, ts.DayUsed = d, ku.DayTokens
		}
		snaps = append(snaps, ts)
	}
	r.mu.Unlock()
	r.tokens.Restore(snaps, now)
}

// WritePrometheus writes the per-key families (K7) in the text format
// 0.0.4, one series per configured principal (the label is its name:
// configured names only, never a key):
//
//	iop_edge_key_requests_total{key}            admitted requests
//	iop_edge_key_tokens_total{key,direction}    prompt, completion (reported), estimated
//	iop_edge_key_refused_total{key}             429s of its limits
func (r *Registry) WritePrometheus(w io.Writer) error {
	bw := bufio.NewWriter(w)
	s := r.set.Load()
	type row struct {
		name string
		c    *counters
	}
	rows := make([]row, 0, len(s.names))
	r.mu.Lock()
	for _, n := range s.names {
		rows = append(rows, row{n, r.usage[n]})
	}
	r.mu.Unlock()
	get := func(c *counters, f func(*counters) int64) string {
		if c == nil {
			return "0"
		}
		return strconv.FormatInt(f(c), 10)
	}
	family := func(name, help string) {
		bw.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n")
	}
	family("iop_edge_key_requests_total", "Requests admitted per API key (the key's name; configured keys only).")
	for _, x := range rows {
		bw.WriteString(`iop_edge_key_requests_total{key="` + access.EscapeLabel(x.name) + `"} ` + get(x.c, func(c *counters) int64 { return c.requests.Load() }) + "\n")
	}
	family("iop_edge_key_tokens_total", "Tokens per API key: prompt and completion as the backends reported them, estimated where an answer reported none.")
	for _, x := range rows {
		l := access.EscapeLabel(x.name)
		bw.WriteString(`iop_edge_key_tokens_total{key="` + l + `",direction="completion"} ` + get(x.c, func(c *counters) int64 { return c.completion.Load() }) + "\n")
		bw.WriteString(`iop_edge_key_tokens_total{key="` + l + `",direction="estimated"} ` + get(x.c, func(c *counters) int64 { return c.estimated.Load() }) + "\n")
		bw.WriteString(`iop_edge_key_tokens_total{key="` + l + `",direction="prompt"} ` + get(x.c, func(c *counters) int64 { return c.prompt.Load() }) + "\n")
	}
	family("iop_edge_key_refused_total", "Requests refused by an API key's own limits (429: requests per minute, in flight, tokens per minute or per day).")
	for _, x := range rows {
		bw.WriteString(`iop_edge_key_refused_total{key="` + access.EscapeLabel(x.name) + `"} ` + get(x.c, func(c *counters) int64 { return c.refused.Load() }) + "\n")
	}
	return bw.Flush()
}
