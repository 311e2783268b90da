package keys

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keystore"
	"iop/internal/edge/limit"
)

// noon is 12:00 UTC: the UTC day ends 12 h later.
var noon = time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC)

// storeWith returns a store holding one key per spec and the keys by name.
func storeWith(t testing.TB, specs ...keystore.Spec) (*keystore.Store, map[string]string) {
	t.Helper()
	st := keystore.New()
	secrets := map[string]string{}
	for _, s := range specs {
		k, err := st.Create(s, noon.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		secrets[s.Name] = k
	}
	return st, secrets
}

func mustBuild(t testing.TB, api []config.APIKey, st *keystore.Store, edges int) *Set {
	t.Helper()
	s, err := Build(api, st, st != nil, edges)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// K3: who a key is, at the edges of its expiry and of a rotation's grace;
// a revoked key is refused; api_keys and the store serve side by side.
func TestAuthenticate(t *testing.T) {
	exp := noon.Add(time.Hour)
	st, sec := storeWith(t, keystore.Spec{Name: "a", ExpiresAt: exp}, keystore.Spec{Name: "b"}, keystore.Spec{Name: "gone"})
	old := sec["b"]
	rotated, err := st.Rotate("b", 10*time.Minute, noon)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Revoke("gone", noon); err != nil {
		t.Fatal(err)
	}
	cfgKey := "iop-config-key"
	reg := New(mustBuild(t, []config.APIKey{{Principal: "ops", KeySHA256: keystore.Hash(cfgKey)}}, st, 1))
	rows := []struct {
		name, key string
		at        time.Time
		want      string
		err       error
	}{
		{"a valid key", sec["a"], noon, "a", nil},
		{"one nanosecond before expires_at", sec["a"], exp.Add(-1), "a", nil},
		{"at expires_at", sec["a"], exp, "", ErrExpired},
		{"after expires_at", sec["a"], exp.Add(time.Hour), "", ErrExpired},
		{"the rotated key", rotated, noon, "b", nil},
		{"the previous key within its grace", old, noon.Add(10*time.Minute - 1), "b", nil},
		{"the previous key at the end of its grace", old, noon.Add(10 * time.Minute), "", ErrRotated},
		{"revoked", sec["gone"], noon, "", ErrRevoked},
		{"unknown", "iop-NOTAKEY", noon, "", ErrUnknownKey},
		{"a key differing in one character", sec["a"][:len(sec["a"])-1] + "x", noon, "", ErrUnknownKey},
		{"empty", "", noon, "", ErrNoKey},
		{"an api_keys key", cfgKey, noon, "ops", nil},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			p, err := reg.Authenticate(row.key, row.at)
			if !errors.Is(err, row.err) || (err == nil && p.Name != row.want) {
				t.Fatalf("got %v, %v; want %q, %v", p, err, row.want, row.err)
			}
			if err != nil && strings.Contains(err.Error(), row.key) && row.key != "" {
				t.Fatal("P4: the error holds the key")
			}
		})
	}
	if reg.OpenMode() {
		t.Error("open mode with keys")
	}
	if !New(mustBuild(t, nil, nil, 1)).OpenMode() {
		t.Error("no keys, no store: want open mode")
	}
	if New(mustBuild(t, nil, keystore.New(), 1)).OpenMode() {
		t.Error("K1: an empty key store is no open mode")
	}
}

// K1: api_keys and the store may not name the same principal or key.
func TestBuildConflicts(t *testing.T) {
	st, sec := storeWith(t, keystore.Spec{Name: "team"})
	if _, err := Build([]config.APIKey{{Principal: "team", KeySHA256: keystore.Hash("other")}}, st, true, 1); !errors.Is(err, ErrConflict) ||
		!strings.Contains(err.Error(), `"team"`) {
		t.Errorf("same name: got %v", err)
	}
	if _, err := Build([]config.APIKey{{Principal: "ops", KeySHA256: keystore.Hash(sec["team"])}}, st, true, 1); !errors.Is(err, ErrConflict) {
		t.Errorf("same key: got %v", err)
	}
}

// K4: the model scope: names, patterns, the same answer as a missing
// model for anything else, /v1/models filtered.
func TestScope(t *testing.T) {
	st, sec := storeWith(t, keystore.Spec{Name: "s", Models: []string{"tiny", "qwen3*", "*-oa"}}, keystore.Spec{Name: "all"})
	reg := New(mustBuild(t, nil, st, 1))
	groups := []string{"tiny", "tiny-tool", "tiny-oa", "qwen3", "qwen3:8b", "llama3"}
	rows := []struct {
		key   string
		model string
		want  bool
	}{
		{"s", "tiny", true},
		{"s", "qwen3:8b", true},
		{"s", "tiny-oa", true},
		{"s", "tiny-tool", false},
		{"s", "llama3", false},
		{"s", "no-such-model", false},
		{"all", "llama3", true},
		{"all", "no-such-model", true}, // the pool answers its 404
	}
	for _, row := range rows {
		p, err := reg.Authenticate(sec[row.key], noon)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Allows(row.model); got != row.want {
			t.Errorf("%s allows %q = %v, want %v", row.key, row.model, got, row.want)
		}
	}
	p, _ := reg.Authenticate(sec["s"], noon)
	if got, want := p.FilterModels(groups), []string{"tiny", "tiny-oa", "qwen3", "qwen3:8b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("/v1/models of s: %q, want %q", got, want)
	}
	p, _ = reg.Authenticate(sec["all"], noon)
	if got := p.FilterModels(groups); !reflect.DeepEqual(got, groups) {
		t.Errorf("/v1/models of all: %q", got)
	}
}

// step is one request of a budget table: admitted at at with estimate,
// then (unless open) finished with the outcome.
type step struct {
	at       time.Duration // since noon
	estimate int64
	finish   *Outcome // nil: left in flight
	wantErr  error
	wantRA   time.Duration
	// wantHdr: the OpenAI headers of the answer (admitted or refused).
	wantHdr map[string]string
}

func used(p, c int64) *Outcome {
	return &Outcome{PromptTokens: p, CompletionTokens: c, Reported: true, Answered: true}
}

// admit is the whole admission of one request: Admit, then Reserve.
func admit(reg *Registry, p *Principal, estimate int64, now time.Time) (*Ticket, *Refusal) {
	t, ref := reg.Admit(p, now)
	if ref != nil {
		return nil, ref
	}
	if ref := t.Reserve(estimate, now); ref != nil {
		return nil, ref
	}
	return t, nil
}

// K5, K6: budgets per minute and per day, a stream crossing the budget,
// requests without reported usage, and the header values against the
// limits after every step.
func TestBudgets(t *testing.T) {
	rows := []struct {
		name   string
		limits keystore.Limits
		edges  int
		steps  []step
	}{
		{"per minute: spent → 429 with the exact Retry-After", keystore.Limits{TokensPerMinute: 600}, 1, []step{
			// the reset counts the request's own reservation, as the remaining does (100 at 10 a second)
			{0, 100, used(50, 250), nil, 0, map[string]string{HeaderLimitTokens: "600", HeaderRemainingTokens: "500", HeaderResetTokens: "10s"}},
			{0, 100, used(100, 200), nil, 0, map[string]string{HeaderRemainingTokens: "200", HeaderResetTokens: "40s"}},
			{0, 1, nil, limit.ErrTokensMinute, time.Second / 10, map[string]string{HeaderRemainingTokens: "0", HeaderResetTokens: "1m0s"}},
			{100 * time.Millisecond, 1, used(1, 0), nil, 0, map[string]string{HeaderRemainingTokens: "0"}},
		}},
		{"a stream crossing the budget is finished; the next request is refused", keystore.Limits{TokensPerMinute: 1000, TokensPerDay: 1500}, 1, []step{
			{0, 200, used(100, 1400), nil, 0, map[string]string{HeaderLimitTokens: "1000", HeaderRemainingTokens: "800"}},
			{time.Second, 10, nil, limit.ErrTokensDay, 12*time.Hour - time.Second, map[string]string{HeaderLimitTokens: "1500", HeaderRemainingTokens: "0", HeaderResetTokens: "11h59m59s"}},
			{12 * time.Hour, 10, used(5, 5), nil, 0, map[string]string{HeaderLimitTokens: "1000", HeaderRemainingTokens: "990"}},
		}},
		{"per day: the tighter window is the headers' tokens", keystore.Limits{TokensPerMinute: 1000, TokensPerDay: 300}, 1, []step{
			{0, 100, used(100, 100), nil, 0, map[string]string{HeaderLimitTokens: "300", HeaderRemainingTokens: "200", HeaderResetTokens: "12h0m0s"}},
			{0, 50, used(50, 50), nil, 0, map[string]string{HeaderRemainingTokens: "50"}},
			{0, 1, nil, limit.ErrTokensDay, 12 * time.Hour, nil},
		}},
		{"no usage reported: an answer costs its estimate, a failure nothing", keystore.Limits{TokensPerDay: 100}, 1, []step{
			{0, 60, &Outcome{Answered: true}, nil, 0, map[string]string{HeaderRemainingTokens: "40"}},
			{0, 30, &Outcome{}, nil, 0, map[string]string{HeaderRemainingTokens: "10"}},
			{0, 30, used(5, 5), nil, 0, map[string]string{HeaderRemainingTokens: "10"}}, // the failure gave its 30 back
			{0, 1, used(1, 0), nil, 0, map[string]string{HeaderRemainingTokens: "29"}},
		}},
		{"requests per minute and in flight: headers count down", keystore.Limits{RequestsPerMinute: 2, MaxConcurrent: 1}, 1, []step{
			{0, 0, used(0, 0), nil, 0, map[string]string{HeaderLimitRequests: "2", HeaderRemainingRequests: "1", HeaderResetRequests: "30s"}},
			{0, 0, nil, nil, 0, map[string]string{HeaderRemainingRequests: "0", HeaderResetRequests: "1m0s"}},
			{0, 0, nil, limit.ErrConcurrency, time.Second, map[string]string{HeaderRemainingRequests: "0"}},
		}},
		{"rate refusal spends no token reservation", keystore.Limits{RequestsPerMinute: 1, TokensPerDay: 100}, 1, []step{
			{0, 10, used(5, 5), nil, 0, map[string]string{HeaderRemainingRequests: "0", HeaderRemainingTokens: "90"}},
			{0, 50, nil, limit.ErrRate, time.Minute, map[string]string{HeaderRemainingTokens: "90"}},
		}},
		{"a token refusal gives its request token back", keystore.Limits{RequestsPerMinute: 2, TokensPerDay: 10}, 1, []step{
			{0, 5, used(5, 5), nil, 0, map[string]string{HeaderRemainingRequests: "1", HeaderRemainingTokens: "5"}},
			{0, 5, nil, limit.ErrTokensDay, 12 * time.Hour, map[string]string{HeaderRemainingRequests: "1", HeaderRemainingTokens: "0"}},
		}},
		{"K8: three edges enforce a third each, rounded up", keystore.Limits{TokensPerDay: 1000, RequestsPerMinute: 10}, 3, []step{
			{0, 100, used(100, 0), nil, 0, map[string]string{HeaderLimitTokens: "334", HeaderRemainingTokens: "234", HeaderLimitRequests: "4"}},
		}},
		{"no bounds: no headers", keystore.Limits{}, 1, []step{
			{0, 1 << 30, used(1, 1), nil, 0, map[string]string{HeaderLimitTokens: "", HeaderLimitRequests: ""}},
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			st, sec := storeWith(t, keystore.Spec{Name: "k", Limits: row.limits})
			reg := New(mustBuild(t, nil, st, row.edges))
			p, err := reg.Authenticate(sec["k"], noon)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range row.steps {
				now := noon.Add(s.at)
				tk, ref := admit(reg, p, s.estimate, now)
				h := http.Header{}
				if s.wantErr != nil {
					if ref == nil || !errors.Is(ref, s.wantErr) || ref.RetryAfter != s.wantRA {
						t.Fatalf("step %d: got %v (%+v), want %v with Retry-After %v", i, ref, ref, s.wantErr, s.wantRA)
					}
					ref.RateLimit.WriteOpenAI(h)
				} else {
					if ref != nil {
						t.Fatalf("step %d: refused: %v", i, ref)
					}
					tk.RateLimit.WriteOpenAI(h)
					if s.finish != nil {
						tk.Finish(*s.finish, now)
					}
				}
				for k, v := range s.wantHdr {
					if got := h.Get(k); got != v {
						t.Errorf("step %d: %s = %q, want %q (all: %v)", i, k, got, v, h)
					}
				}
			}
		})
	}
}

// K6: Anthropic's names on /v1/messages, resets as RFC 3339 times.
func TestAnthropicHeaders(t *testing.T) {
	st, sec := storeWith(t, keystore.Spec{Name: "k", Limits: keystore.Limits{RequestsPerMinute: 60, TokensPerMinute: 600}})
	reg := New(mustBuild(t, nil, st, 1))
	p, _ := reg.Authenticate(sec["k"], noon)
	tk, _ := admit(reg, p, 100, noon)
	tk.Finish(*used(100, 200), noon)
	tk, _ = admit(reg, p, 10, noon.Add(500*time.Millisecond))
	h := http.Header{}
	tk.RateLimit.WriteAnthropic(h, noon.Add(500*time.Millisecond))
	want := map[string]string{
		HeaderAnthropicRequestsLimit: "60", HeaderAnthropicRequestsRemaining: "58", HeaderAnthropicRequestsReset: "2026-01-31T12:00:02Z",
		HeaderAnthropicTokensLimit: "600", HeaderAnthropicTokensRemaining: "295", HeaderAnthropicTokensReset: "2026-01-31T12:00:31Z", // 300 settled and 10 in flight at 10 a second
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if h.Get(HeaderLimitRequests) != "" {
		t.Error("OpenAI names on an Anthropic answer")
	}
}

// K7: usage and budgets survive a restart: the usage file's contents
// restored into a new Registry keep the day spent and the counters.
func TestRestart(t *testing.T) {
	st, sec := storeWith(t, keystore.Spec{Name: "k", Limits: keystore.Limits{TokensPerDay: 1000}}, keystore.Spec{Name: "idle"})
	reg := New(mustBuild(t, nil, st, 1))
	p, _ := reg.Authenticate(sec["k"], noon)
	tk, _ := admit(reg, p, 10, noon)
	tk.Finish(*used(300, 700), noon)
	inflight, _ := admit(reg, p, 10, noon) // would be refused now: the day is spent
	if inflight != nil {
		t.Fatal("admitted after the day was spent")
	}
	if !reg.Dirty() {
		t.Fatal("not dirty after a request")
	}
	u := reg.Usage(noon.Add(time.Second))
	if reg.Dirty() {
		t.Fatal("dirty after Usage")
	}
	// A new Edge process: the store again, the usage file's contents.
	reg2 := New(mustBuild(t, nil, st, 1))
	reg2.Restore(u, noon.Add(time.Minute))
	p2, _ := reg2.Authenticate(sec["k"], noon.Add(time.Minute))
	if _, ref := admit(reg2, p2, 1, noon.Add(time.Minute)); !errors.Is(ref, limit.ErrTokensDay) {
		t.Fatalf("after the restart: got %v, want the day still spent", ref)
	}
	ks, _ := reg2.StatusOf("k", noon.Add(time.Minute))
	if ks.Requests != 1 || ks.PromptTokens != 300 || ks.CompletionTokens != 700 || ks.TokensToday != 1000 || ks.Refused != 2 {
		t.Fatalf("status after the restart: %+v", ks)
	}
	// The next UTC day the budget is back.
	if tk, ref := admit(reg2, p2, 1, noon.Add(12*time.Hour)); ref != nil || tk == nil {
		t.Fatalf("the next day: %v", ref)
	}
}

// K2: revoking under load: requests in flight finish and give their slots
// back; every request after the swap is refused.
func TestRevokeUnderLoad(t *testing.T) {
	st, sec := storeWith(t, keystore.Spec{Name: "k", Limits: keystore.Limits{MaxConcurrent: 64, TokensPerDay: 1 << 30}})
	reg := New(mustBuild(t, nil, st, 1))
	var wg sync.WaitGroup
	start := make(chan struct{})
	release := make(chan struct{})
	admitted := make(chan struct{}, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p, err := reg.Authenticate(sec["k"], noon)
			if err != nil {
				return
			}
			tk, ref := admit(reg, p, 10, noon)
			if ref != nil {
				return
			}
			admitted <- struct{}{}
			<-release // in flight across the revocation
			tk.Finish(*used(1, 1), noon)
		}()
	}
	close(start)
	deadline := time.After(10 * time.Second)
	for range 64 {
		select {
		case <-admitted:
		case <-deadline:
			close(release)
			wg.Wait()
			t.Fatal("64 requests under max_concurrent 64 were not all admitted within 10 s")
		}
	}
	if n := reg.rate.InFlight("k"); n != 64 {
		t.Fatalf("%d in flight, want 64", n)
	}
	if err := st.Revoke("k", noon); err != nil {
		t.Fatal(err)
	}
	reg.Swap(mustBuild(t, nil, st, 1))
	if _, err := reg.Authenticate(sec["k"], noon); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after the revocation: %v", err)
	}
	close(release)
	wg.Wait()
	if n := reg.rate.InFlight("k"); n != 0 {
		t.Fatalf("%d still in flight after every request finished", n)
	}
	ks, _ := reg.StatusOf("k", noon)
	if ks.Status != "revoked" || ks.Requests != 64 || ks.PromptTokens != 64 {
		t.Fatalf("status %+v", ks)
	}
}

// K7: /metrics has one series per configured key and direction, named
// by the key's name; no key or hash appears.
func TestMetrics(t *testing.T) {
	st, sec := storeWith(t, keystore.Spec{Name: "team-a"}, keystore.Spec{Name: "team-b"})
	reg := New(mustBuild(t, []config.APIKey{{Principal: `o"ps`, KeySHA256: keystore.Hash("x")}}, st, 1))
	p, _ := reg.Authenticate(sec["team-a"], noon)
	tk, _ := admit(reg, p, 5, noon)
	tk.Finish(*used(3, 4), noon)
	var b strings.Builder
	if err := reg.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		`iop_edge_key_requests_total{key="team-a"} 1`, `iop_edge_key_requests_total{key="team-b"} 0`,
		`iop_edge_key_tokens_total{key="team-a",direction="prompt"} 3`, `iop_edge_key_tokens_total{key="team-a",direction="completion"} 4`,
		`iop_edge_key_requests_total{key="o\"ps"} 0`, "# TYPE iop_edge_key_refused_total counter",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, sec["team-a"]) || strings.Contains(out, keystore.Hash(sec["team-a"])) {
		t.Error("P4: a key or its hash in /metrics")
	}
}

// K5: a request ended before its body was read (a bad request, a client
// gone) gives its in-flight slot back and costs no tokens.
func TestFinishWithoutReserve(t *testing.T) {
	st, sec := storeWith(t, keystore.Spec{Name: "k", Limits: keystore.Limits{MaxConcurrent: 1, TokensPerDay: 100}})
	reg := New(mustBuild(t, nil, st, 1))
	p, _ := reg.Authenticate(sec["k"], noon)
	tk, ref := reg.Admit(p, noon)
	if ref != nil {
		t.Fatal(ref)
	}
	if _, ref := reg.Admit(p, noon); !errors.Is(ref, limit.ErrConcurrency) {
		t.Fatalf("a second request in flight: %v", ref)
	}
	tk.Finish(Outcome{Answered: true}, noon)
	tk.Finish(Outcome{Answered: true}, noon)
	if _, ref := admit(reg, p, 1, noon); ref != nil {
		t.Fatalf("after Finish: %v", ref)
	}
	if ks, _ := reg.StatusOf("k", noon); ks.TokensToday != 0 || ks.Requests != 2 || ks.InFlight != 1 {
		t.Fatalf("status %+v", ks)
	}
	if got := Estimate(400, 0); got != 100+DefaultCompletionEstimate {
		t.Fatalf("Estimate(400, 0) = %d", got)
	}
	if got := Estimate(400, 50); got != 150 {
		t.Fatalf("Estimate(400, 50) = %d", got)
	}
}

// SPEC V3: a store key's local_only and api_keys[].local_only reach the
// principal the API schedules with; keys without it are not local-only.
func TestPrincipalLocalOnly(t *testing.T) {
	st := keystore.New()
	for _, sp := range []keystore.Spec{{Name: "site", LocalOnly: true}, {Name: "anywhere"}} {
		if _, err := st.Create(sp, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil {
			t.Fatal(err)
		}
	}
	s := mustBuild(t, []config.APIKey{{Principal: "cfg-site", KeySHA256: keystore.Hash("a"), LocalOnly: true},
		{Principal: "cfg-anywhere", KeySHA256: keystore.Hash("b")}}, st, 1)
	for name, want := range map[string]bool{"site": true, "anywhere": false, "cfg-site": true, "cfg-anywhere": false} {
		if got := s.Principal(name).LocalOnly; got != want {
			t.Errorf("principal %q: LocalOnly %v, want %v", name, got, want)
		}
	}
}
