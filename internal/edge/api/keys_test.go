package api

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// newKeysRig is newRig with Options.Keys: a Registry over a key store of
// specs (created an hour before fixedNow), and the keys by name.
func newKeysRig(t *testing.T, specs ...keystore.Spec) (*rig, *keys.Registry, map[string]string) {
	t.Helper()
	st := keystore.New()
	sec := map[string]string{}
	for _, s := range specs {
		k, err := st.Create(s, fixedNow().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		sec[s.Name] = k
	}
	if err := st.Revoke("gone", fixedNow()); err != nil && len(sec["gone"]) > 0 {
		t.Fatal(err)
	}
	set, err := keys.Build(nil, st, true, 1)
	if err != nil {
		t.Fatal(err)
	}
	reg := keys.New(set)
	r := &rig{fp: newFakePool(protocol.TypeOpenAICompat), st: newFakeStream("run-1"), cfg: testConfig(nil)}
	r.p, r.d = r.fp, newFakeDispatcher(r.st)
	cfg := r.cfg
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(), Keys: reg})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	t.Cleanup(r.st.kill)
	return r, reg, sec
}

// K3, K4, K5, K6: the key store's keys at the HTTP surface: who (401 for
// revoked and expired keys, saying so), which models (the scope's 404 is
// the unknown model's, and never reaches the pool; /v1/models filtered),
// the headers in each surface's names, and a spent budget's 429.
func TestKeysHTTP(t *testing.T) {
	leakcheck.Check(t)
	r, reg, sec := newKeysRig(t,
		keystore.Spec{Name: "scoped", Models: []string{"ti*"}, Limits: keystore.Limits{RequestsPerMinute: 60, TokensPerDay: 1000}},
		keystore.Spec{Name: "spent", Limits: keystore.Limits{TokensPerDay: 10}},
		keystore.Spec{Name: "old", ExpiresAt: fixedNow()},
		keystore.Spec{Name: "gone"},
	)
	r.fp.err = pool.ErrUnknownModel // an admitted request ends at the pool with its 404
	p, _ := reg.Authenticate(sec["spent"], fixedNow())
	tk, _ := reg.Admit(p, fixedNow())
	tk.Reserve(1, fixedNow())
	tk.Finish(keys.Outcome{PromptTokens: 5, CompletionTokens: 20, Reported: true, Answered: true}, fixedNow())

	bearer := func(name string) []string { return []string{"Authorization", "Bearer " + sec[name]} }
	chat := func(model string) string { return strings.Replace(chatBody, `"tiny"`, `"`+model+`"`, 1) }
	left := strconv.FormatInt(1000-keys.Estimate(len(chatBody), 0), 10) // this request's reservation counts as spent
	unknown := `{"error":{"message":"the model \"nope\" does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}`
	rows := []struct {
		name, method, path, body string
		hdr                      []string
		wantStatus               int
		wantPool                 bool              // the request reached the pool
		wantBody                 string            // exact, when set
		wantHdr                  map[string]string // "" = absent
	}{
		{"K4 in scope by pattern: reaches the pool", "POST", "/v1/chat/completions", chatBody, bearer("scoped"), 404, true,
			strings.ReplaceAll(unknown, "nope", "tiny"), map[string]string{"X-Ratelimit-Limit-Requests": "60", "X-Ratelimit-Remaining-Requests": "59",
				"X-Ratelimit-Limit-Tokens": "1000", "X-Ratelimit-Remaining-Tokens": left}},
		{"K4 out of scope: the unknown model's 404, not the pool's", "POST", "/v1/chat/completions", chat("other"), bearer("scoped"), 404, false,
			strings.ReplaceAll(unknown, "nope", "other"), nil},
		{"K4 a model that does not exist", "POST", "/v1/chat/completions", chat("nope"), bearer("scoped"), 404, false, unknown, nil},
		{"K4 /v1/models lists the scope", "GET", "/v1/models", "", bearer("scoped"), 200, false,
			`{"object":"list","data":[{"id":"tiny","object":"model","created":1700000000,"owned_by":"iop"}]}`,
			map[string]string{"X-Ratelimit-Limit-Requests": "60"}},
		{"K6 Anthropic's names on /v1/messages, x-api-key", "POST", "/v1/messages", chatBody, []string{"X-Api-Key", sec["scoped"]}, 404, true, "",
			map[string]string{"Anthropic-Ratelimit-Requests-Limit": "60", "Anthropic-Ratelimit-Tokens-Remaining": left,
				"Anthropic-Ratelimit-Tokens-Reset": "2023-11-15T00:00:00Z", "X-Ratelimit-Limit-Requests": ""}},
		{"K5 a spent day: 429 with Retry-After until 00:00 UTC", "POST", "/v1/messages", chatBody, bearer("spent"), 429, false, "",
			map[string]string{"Retry-After": "6400", "Anthropic-Ratelimit-Tokens-Remaining": "0"}},
		{"K3 expired", "POST", "/v1/chat/completions", chatBody, bearer("old"), 401, false, "", nil},
		{"K3 revoked", "POST", "/v1/chat/completions", chatBody, bearer("gone"), 401, false, "", nil},
		{"K1 no key", "GET", "/v1/models", "", nil, 401, false, "", nil},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			before := len(r.fp.requests())
			resp, body := r.do(t, row.method, row.path, row.body, row.hdr...)
			if resp.StatusCode != row.wantStatus || (row.wantBody != "" && body != row.wantBody) {
				t.Fatalf("got %d %s\nwant %d %s", resp.StatusCode, body, row.wantStatus, row.wantBody)
			}
			if reached := len(r.fp.requests()) > before; reached != row.wantPool {
				t.Errorf("reached the pool: %v, want %v", reached, row.wantPool)
			}
			for k, v := range row.wantHdr {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if row.wantStatus == 401 && strings.HasPrefix(row.name, "K3") {
				if e := checkShape(t, body, false); !strings.Contains(e.Error.Message, strings.TrimPrefix(row.name, "K3 ")) {
					t.Errorf("401 says %q", e.Error.Message)
				}
			}
			if strings.Contains(body, sec["scoped"]) {
				t.Fatal("P4: the key in an answer")
			}
		})
	}
	if r.h.OpenMode() {
		t.Error("K1: open mode with a key store")
	}
}
