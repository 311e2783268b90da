package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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

// scopeFleet: one node n1 with a tunnel adapter (compat, openai_compat)
// and a run-path adapter (ollama): "tiny" is served by n1/compat as
// tiny-target and by n1/ollama as tiny-run, "secret" by the same two
// providers as secret-target and secret-run. A key scoped to "tiny"
// shares the node, the adapters and the upstream with "secret": only the
// edge's scope check stands between them.
func scopeFleet(typ string) (*config.Config, pool.Config) {
	prov, tgt := "compat", "-target"
	if typ == protocol.TypeOllama {
		prov, tgt = "ollama", "-run"
	}
	cfg := testConfig(nil)
	cfg.HTTP.MaxBodyBytes = 1 << 16
	cfg.Nodes = []config.Node{{ID: "n1", Adapters: []config.Adapter{{Name: prov}}}}
	cfg.Models = []config.Model{
		{Name: "tiny", Providers: []config.ModelProvider{{Node: "n1", Provider: prov, Target: "tiny" + tgt}}},
		{Name: "secret", Providers: []config.ModelProvider{{Node: "n1", Provider: prov, Target: "secret" + tgt}}},
	}
	ops := []string{protocol.OpChatCompletions, protocol.OpResponses, protocol.OpMessages, protocol.OpCountTokens,
		protocol.OpCompletions, protocol.OpEmbeddings}
	cand := func(target string) []pool.Candidate {
		return []pool.Candidate{{Key: pool.Key{Node: "n1", Provider: prov}, Target: target, StallTimeoutMs: 60000}}
	}
	pc := pool.Config{Nodes: []string{"n1"},
		Resources:  []pool.Resource{{Key: pool.Key{Node: "n1", Provider: prov}, Type: typ, Capacity: 64, LongCapacity: 64, Operations: ops}},
		Groups:     []pool.Group{{Name: "tiny", Candidates: cand("tiny" + tgt)}, {Name: "secret", Candidates: cand("secret" + tgt)}},
		MaxWaiters: 64, WaitTimeout: 20 * time.Millisecond}
	return cfg, pc
}

// SPEC K4, attacked: a key scoped to "tiny" (by name, and another by the
// pattern "ti*") tries to reach "secret" — served by the same node,
// adapter and upstream — through every spelling of the model a client
// controls, on every model surface (chat, responses, messages,
// count_tokens, completions, embeddings), on the tunnel (openai_compat)
// and on the run path (ollama), through the batch path's entry (a line is
// served as its key, AsPrincipal) and on GET /v1/models/{id}. Every
// dispatch is recorded (the dispatcher refuses it, so nothing streams):
// a spelling that is not the name "tiny" is the unknown model's 404 and
// dispatches nothing; one that is in scope dispatches only tiny's target,
// with every top-level "model" of the forwarded body rewritten to it, as
// a backend decoding it with Go's encoding/json (case-insensitive keys,
// the last one wins) would read it.
func TestK4ScopeSpellingsOnEverySurface(t *testing.T) {
	leakcheck.Check(t)
	// model spellings: the JSON text of the "model" value
	out := []string{`"secret"`, `"Secret"`, `"SECRET"`, `"secret:latest"`, `"secret-target"`, `"secret-run"`,
		`" secret"`, `"secret "`, `"secret\n"`, `"secret\u0000"`, `"se\u0063ret"`, `"\u0073ecret"`, `"secret%20"`,
		`"%73ecret"`, `"tiny/../secret"`, `"./secret"`, `"tiny\u0000secret"`, `"tiny,secret"`, `"tiny|secret"`,
		`"tiny-target"`, `"tiny-run"`, `"tiny:latest"`, `"Tiny"`, `"TINY"`, `"tıny"`, `"ti*"`, `"*"`, `"t?ny"`,
		`"tiny\u200b"`, `"ｔｉｎｙ"`, `"secret\ud800"`}
	// bodies other than the value: another key or several "model" keys
	bodyOut := []string{
		`{"model":"tiny","model":"secret",%s}`,
		`{"model":"tiny","mod\u0065l":"secret",%s}`,
		`{"model":"tiny","\u006dodel":"secret",%s}`,
	}
	bodyIn := []string{ // routed as tiny; the forwarded body must name only tiny's target
		`{"model":"secret","model":"tiny",%s}`,
		`{"mod\u0065l":"secret","model":"tiny",%s}`,
		`{"model":"secret","mod\u0065l":"tiny",%s}`,
	}
	bodyBad := []string{ // refused 400 before any dispatch
		`{"Model":"secret","model":"tiny",%s}`,
		`{"model":"tiny","MODEL":"secret",%s}`,
		`{"model":"tiny","\u004dodel":"secret",%s}`,
		`{"model":["tiny","secret"],%s}`,
		`{"model":{"name":"tiny"},%s}`,
	}
	surfaces := []struct{ path, rest string }{
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`},
		{"/v1/responses", `"input":"hi"`},
		{"/v1/messages", `"max_tokens":8,"messages":[{"role":"user","content":"hi"}]`},
		{"/v1/messages/count_tokens", `"messages":[{"role":"user","content":"hi"}]`},
		{"/v1/completions", `"prompt":"hi"`},
		{"/v1/embeddings", `"input":"hi"`},
	}
	cases := 0
	for _, typ := range []string{protocol.TypeOpenAICompat, protocol.TypeOllama} {
		t.Run(typ, func(t *testing.T) {
			cfg, pc := scopeFleet(typ)
			p := pool.New(pc, nil)
			p.NodeReady("n1", 1)
			st := keystore.New()
			sec := map[string]string{}
			for _, s := range []keystore.Spec{{Name: "named", Models: []string{"tiny"}}, {Name: "glob", Models: []string{"ti*"}}} {
				k, err := st.Create(s, fixedNow().Add(-time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				sec[s.Name] = k
			}
			set, err := keys.Build(nil, st, true, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := &rig{p: p, fp: newFakePool(""), st: newFakeStream("run-1"), cfg: cfg}
			r.d = newFakeDispatcher(r.st)
			r.d.err = errors.New("refused by the test") // record the dispatch, stream nothing
			r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(), Keys: keys.New(set)})
			r.srv = httptest.NewServer(r.h)
			t.Cleanup(r.srv.Close)
			t.Cleanup(r.srv.Client().CloseIdleConnections)
			t.Cleanup(r.st.kill)
			wantTarget := "tiny-target"
			if typ == protocol.TypeOllama {
				wantTarget = "tiny-run"
			}

			// send one request as key (by its secret, or as the batch path
			// does: AsPrincipal) and return its status, body and the
			// dispatches it caused.
			send := func(key, path, body string, batch bool) (int, string, []string, []string) {
				t.Helper()
				r.d.mu.Lock()
				nt, nr := len(r.d.tunnels), len(r.d.runs)
				r.d.mu.Unlock()
				var code int
				var text string
				if batch {
					req := httptest.NewRequestWithContext(AsPrincipal(t.Context(), key), http.MethodPost, path, strings.NewReader(body))
					rec := httptest.NewRecorder()
					r.h.ServeHTTP(rec, req)
					code, text = rec.Code, rec.Body.String()
				} else {
					resp, b := r.do(t, "POST", path, body, "Authorization", "Bearer "+sec[key])
					code, text = resp.StatusCode, b
				}
				r.d.mu.Lock()
				defer r.d.mu.Unlock()
				var targets, bodies []string
				for _, tr := range r.d.tunnels[nt:] {
					targets = append(targets, tr.GetTarget())
					bodies = append(bodies, string(tr.GetBody()))
				}
				for _, rr := range r.d.runs[nr:] {
					targets = append(targets, rr.GetTarget())
				}
				return code, text, targets, bodies
			}
			for _, key := range []string{"named", "glob"} {
				for _, batch := range []bool{false, true} {
					for _, sf := range surfaces {
						try := func(body string, want string) {
							t.Helper()
							cases++
							code, text, targets, bodies := send(key, sf.path, body, batch)
							where := key + " " + sf.path + " " + body
							if batch {
								where = "batch " + where
							}
							if strings.Contains(text, "secret-") && !strings.Contains(body, "secret-") {
								t.Errorf("%s: the answer names secret's target: %s", where, text)
							}
							switch want {
							case "out":
								if code != http.StatusNotFound || !strings.Contains(text, "not_found") || len(targets) != 0 {
									t.Errorf("%s: %d %s, dispatched %v; want the unknown model's 404, nothing dispatched", where, code, text, targets)
								}
							case "bad":
								if code != http.StatusBadRequest || len(targets) != 0 {
									t.Errorf("%s: %d %s, dispatched %v; want 400, nothing dispatched", where, code, text, targets)
								}
							case "in", "in-or-bad":
								if want == "in-or-bad" && code == http.StatusBadRequest && len(targets) == 0 {
									break // the run path's field table refuses the unknown member
								}
								if len(targets) == 0 {
									t.Errorf("%s: %d %s: not dispatched", where, code, text)
								}
								for _, tg := range targets {
									if tg != wantTarget {
										t.Errorf("%s: dispatched to %q, want only %q", where, tg, wantTarget)
									}
								}
								for _, b := range bodies {
									var last struct{ Model string } // Go's decoding: case-insensitive, the last wins
									var all map[string]any
									if err := json.Unmarshal([]byte(b), &last); err != nil || last.Model != wantTarget {
										t.Errorf("%s: the forwarded body reads as model %q (%v): %s", where, last.Model, err, b)
									}
									if err := json.Unmarshal([]byte(b), &all); err != nil || all["model"] != wantTarget {
										t.Errorf("%s: forwarded %s", where, b)
									}
								}
							}
						}
						for _, m := range out {
							try(`{"model":`+m+`,`+sf.rest+`}`, "out")
						}
						for _, f := range bodyOut {
							try(strings.Replace(f, "%s", sf.rest, 1), "out")
						}
						for _, f := range bodyIn {
							try(strings.Replace(f, "%s", sf.rest, 1), "in")
						}
						for _, f := range bodyBad {
							try(strings.Replace(f, "%s", sf.rest, 1), "bad")
						}
						try(`{"model":"tiny",`+sf.rest+`}`, "in")
						try(`{"model":"tiny","meta":{"model":"secret"},`+sf.rest+`}`, "in-or-bad") // nested: not the request's model
					}
				}
			}

			// GET /v1/models and /v1/models/{id}: secret is never listed or
			// found, however the id is spelled or encoded.
			for _, key := range []string{"named", "glob"} {
				cases++
				resp, body := r.do(t, "GET", "/v1/models", "", "Authorization", "Bearer "+sec[key])
				if resp.StatusCode != 200 || strings.Contains(body, "secret") || !strings.Contains(body, `"tiny"`) {
					t.Errorf("%s GET /v1/models: %d %s", key, resp.StatusCode, body)
				}
				for _, path := range []string{"secret", "Secret", "SECRET", "secret:latest", "secret%3Alatest", "%73ecret", "%2573ecret",
					"secret-target", "secret/", "/secret", "secret%2F", "tiny/../secret", "tiny%2F..%2Fsecret", "./secret",
					"secret%00", "secret%20", "%20secret", "secret?x=1", "secret#x", "tiny:latest", "Tiny", "ti*", "*", "ti%2A",
					"tiny%00", "tiny/", "tiny%20"} {
					for _, anthropic := range []bool{false, true} {
						cases++
						hdr := []string{"Authorization", "Bearer " + sec[key]}
						if anthropic {
							hdr = append(hdr, "Anthropic-Version", "2023-06-01")
						}
						req, err := http.NewRequest("GET", r.srv.URL+"/v1/models/x", nil)
						if err != nil {
							t.Fatal(err)
						}
						req.URL.Opaque = "/v1/models/" + path // sent as written, not cleaned or re-encoded
						for i := 0; i+1 < len(hdr); i += 2 {
							req.Header.Set(hdr[i], hdr[i+1])
						}
						resp, err := r.srv.Client().Do(req)
						if err != nil {
							t.Fatal(err)
						}
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusNotFound || strings.Contains(string(b), `"id":"secret"`) {
							t.Errorf("%s GET /v1/models/%s (anthropic %v): %d %s, want 404", key, path, anthropic, resp.StatusCode, b)
						}
					}
				}
			}
		})
	}
	t.Logf("K4: %d requests tried", cases)
}
