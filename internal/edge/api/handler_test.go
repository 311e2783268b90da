package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// errorShape decodes an error body of either surface.
type errorShape struct {
	Type  string `json:"type"`
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// checkShape checks body is an error object in the OpenAI shape
// ({"error":{"message","type","param","code"}}) or, when anthropic, in the
// Anthropic shape ({"type":"error","error":{"type","message"}}).
func checkShape(t *testing.T, body string, anthropic bool) errorShape {
	t.Helper()
	var e errorShape
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an error object: %s", body)
	}
	if anthropic {
		if e.Type != "error" || strings.Contains(body, `"code"`) {
			t.Errorf("want the Anthropic error shape, got %s", body)
		}
	} else if e.Type != "" || !strings.Contains(body, `"param":`) || !strings.Contains(body, `"code":`) {
		t.Errorf("want the OpenAI error shape, got %s", body)
	}
	return e
}

const chatBody = `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`

// T4 and the 401 answer: keys are checked by SHA-256 in constant time; the
// principal rides with the request; Anthropic routes also take x-api-key.
func TestAuth(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, map[string]string{"team-a": "sk-a", "team-b": "sk-b"})
	r.fp.err = pool.ErrUnknownModel // an admitted request ends at the pool with 404
	rows := []struct {
		name       string
		method     string
		path       string
		body       string
		hdr        []string
		want       int
		anthropic  bool
		wantAuthed string // principal the pool saw
	}{
		{"T4 missing key is 401", "GET", "/v1/models", "", nil, 401, false, ""},
		{"T4 wrong key is 401", "GET", "/v1/models", "", []string{"Authorization", "Bearer sk-wrong"}, 401, false, ""},
		{"T4 key without Bearer scheme is 401", "GET", "/v1/models", "", []string{"Authorization", "sk-a"}, 401, false, ""},
		{"T4 right key lists models", "GET", "/v1/models", "", []string{"Authorization", "Bearer sk-a"}, 200, false, ""},
		{"T4 scheme is case-insensitive", "GET", "/v1/models", "", []string{"Authorization", "bearer sk-b"}, 200, false, ""},
		{"T4 principal rides with the request", "POST", "/v1/chat/completions", chatBody, []string{"Authorization", "Bearer sk-b"}, 404, false, "team-b"},
		{"T4 x-api-key is not accepted on chat", "POST", "/v1/chat/completions", chatBody, []string{"X-Api-Key", "sk-a"}, 401, false, ""},
		{"T4 x-api-key on /v1/messages", "POST", "/v1/messages", chatBody, []string{"x-api-key", "sk-a"}, 404, true, "team-a"},
		{"T4 bearer on /v1/messages", "POST", "/v1/messages", chatBody, []string{"Authorization", "Bearer sk-a"}, 404, true, "team-a"},
		{"T4 wrong x-api-key on /v1/messages/count_tokens", "POST", "/v1/messages/count_tokens", chatBody, []string{"x-api-key", "nope"}, 401, true, ""},
		// T4: credentials that disagree are a 401, however valid one of them is.
		{"T4 a valid x-api-key beside a wrong bearer is 401", "POST", "/v1/messages", chatBody,
			[]string{"x-api-key", "sk-a", "Authorization", "Bearer sk-wrong"}, 401, true, ""},
		{"T4 a wrong x-api-key beside a valid bearer is 401", "POST", "/v1/messages", chatBody,
			[]string{"x-api-key", "sk-wrong", "Authorization", "Bearer sk-a"}, 401, true, ""},
		{"T4 two valid keys of two principals are 401", "POST", "/v1/messages", chatBody,
			[]string{"x-api-key", "sk-a", "Authorization", "Bearer sk-b"}, 401, true, ""},
		{"T4 x-api-key beside an Authorization that is no bearer key is 401", "POST", "/v1/messages", chatBody,
			[]string{"x-api-key", "sk-a", "Authorization", "Basic c2stYTo="}, 401, true, ""},
		{"T4 two x-api-key values that disagree are 401", "POST", "/v1/messages", chatBody,
			[]string{"x-api-key", "sk-a", "x-api-key", "sk-b"}, 401, true, ""},
		{"T4 two Authorization values that disagree are 401", "POST", "/v1/chat/completions", chatBody,
			[]string{"Authorization", "Bearer sk-a", "Authorization", "Bearer sk-b"}, 401, false, ""},
		{"T4 the same key in both headers is that key", "POST", "/v1/messages", chatBody,
			[]string{"x-api-key", "sk-a", "Authorization", "Bearer sk-a"}, 404, true, "team-a"},
		{"T4 on an OpenAI route x-api-key is no credential: the bearer decides", "POST", "/v1/chat/completions", chatBody,
			[]string{"X-Api-Key", "sk-b", "Authorization", "Bearer sk-a"}, 404, false, "team-a"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			before := len(r.fp.requests())
			resp, body := r.do(t, row.method, row.path, row.body, row.hdr...)
			if resp.StatusCode != row.want {
				t.Fatalf("status: got %d, want %d; body %s", resp.StatusCode, row.want, body)
			}
			if row.want != 200 {
				checkShape(t, body, row.anthropic)
			}
			reqs := len(r.fp.requests())
			if row.wantAuthed != "" {
				if reqs != before+1 {
					t.Fatalf("pool saw %d requests, want 1", reqs-before)
				}
				r.fp.mu.Lock()
				got := r.fp.principal[len(r.fp.principal)-1]
				r.fp.mu.Unlock()
				if got != row.wantAuthed {
					t.Errorf("principal: got %q, want %q", got, row.wantAuthed)
				}
			} else if reqs != before {
				t.Errorf("an unauthenticated request reached the pool")
			}
		})
	}
	if r.h.OpenMode() {
		t.Error("OpenMode: got true with keys configured")
	}
}

// T4: with no api_keys the surface is open and says so.
func TestOpenMode(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, nil)
	if !r.h.OpenMode() {
		t.Fatal("OpenMode: got false with no keys")
	}
	resp, body := r.do(t, "GET", "/v1/models", "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

// Q1: GET /v1/models lists the configured model groups (OpenAI list shape);
// /healthz needs no key; unknown paths are 404 and wrong methods 405.
func TestModelsHealthAndRouting(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOpenAICompat, map[string]string{"a": "k"})
	auth := []string{"Authorization", "Bearer k"}
	resp, body := r.do(t, "GET", "/v1/models", "", auth...)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "tiny" || list.Data[1].ID != "other" {
		t.Fatalf("models: got %s", body)
	}
	for _, m := range list.Data {
		if m.Object != "model" || m.OwnedBy != "iop" || m.Created != fixedNow().Unix() {
			t.Errorf("model entry: %+v", m)
		}
	}

	rows := []struct {
		name, method, path string
		want               int
		anthropic          bool
	}{
		{"healthz without a key", "GET", "/healthz", 200, false},
		{"unknown path is 404 in OpenAI shape", "GET", "/v1/nope", 404, false},
		{"unknown path under /v1/messages is 404 in Anthropic shape", "POST", "/v1/messages/batches", 404, true},
		{"POST /v1/models is 405", "POST", "/v1/models", 405, false},
		{"GET /v1/chat/completions is 405", "GET", "/v1/chat/completions", 405, false},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			resp, body := r.do(t, row.method, row.path, "")
			if resp.StatusCode != row.want {
				t.Fatalf("status: got %d, want %d; %s", resp.StatusCode, row.want, body)
			}
			if row.want != 200 {
				checkShape(t, body, row.anthropic)
			}
		})
	}
}

// Q4, Q3 and the error answers (docs/surfaces.md): each failure has its status and the surface's
// shape; malformed requests are refused before they queue.
func TestRequestErrors(t *testing.T) {
	leakcheck.Check(t)
	big := `{"model":"tiny","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`
	rows := []struct {
		name       string
		path       string
		body       string
		chunked    bool
		poolErr    error
		want       int
		anthropic  bool
		contains   []string
		retryAfter string
	}{
		{name: "413 body over http.max_body_bytes", path: "/v1/chat/completions", body: big, want: 413, contains: []string{"4096"}},
		{name: "413 chunked body over the cap", path: "/v1/chat/completions", body: big, chunked: true, want: 413},
		{name: "413 on /v1/messages in Anthropic shape", path: "/v1/messages", body: big, want: 413, anthropic: true},
		{name: "400 bad JSON", path: "/v1/chat/completions", body: `{"model":"tiny","messages":[}`, want: 400, contains: []string{"not valid JSON", "byte"}},
		{name: "400 body not an object", path: "/v1/chat/completions", body: `[1,2]`, want: 400, contains: []string{"JSON object"}},
		{name: "400 missing model", path: "/v1/chat/completions", body: `{"messages":[]}`, want: 400, contains: []string{`"model"`}},
		{name: "400 model not a string", path: "/v1/chat/completions", body: `{"model":5,"messages":[]}`, want: 400, contains: []string{`"model"`}},
		{name: "400 messages not an array", path: "/v1/chat/completions", body: `{"model":"tiny","messages":"hi"}`, want: 400, contains: []string{`"messages"`}},
		{name: "400 messages missing", path: "/v1/chat/completions", body: `{"model":"tiny"}`, want: 400, contains: []string{`"messages"`}},
		{name: "400 stream not a boolean", path: "/v1/chat/completions", body: `{"model":"tiny","messages":[],"stream":"yes"}`, want: 400, contains: []string{`"stream"`}},
		{name: "400 include_usage not a boolean", path: "/v1/chat/completions", body: `{"model":"tiny","messages":[],"stream_options":{"include_usage":1}}`,
			want: 400, contains: []string{"stream_options.include_usage"}},
		{name: "400 Anthropic bad JSON", path: "/v1/messages", body: `{"model":`, want: 400, anthropic: true, contains: []string{"not valid JSON"}},
		{name: "Q4 404 unknown model", path: "/v1/chat/completions", body: chatBody, poolErr: pool.ErrUnknownModel, want: 404, contains: []string{`"tiny"`}},
		{name: "Q4 404 unknown model on /v1/messages", path: "/v1/messages", body: chatBody, poolErr: pool.ErrUnknownModel, want: 404, anthropic: true},
		{name: "Q4 429 queue full with Retry-After", path: "/v1/chat/completions", body: chatBody,
			poolErr: &pool.QueueFullError{Model: "tiny", MaxWaiters: 3, RetryAfter: 1500 * time.Millisecond}, want: 429, retryAfter: "2"},
		{name: "Q4 429 on /v1/messages in Anthropic shape", path: "/v1/messages", body: chatBody,
			poolErr: &pool.QueueFullError{Model: "tiny", RetryAfter: time.Second}, want: 429, anthropic: true, retryAfter: "1"},
		{name: "Q4 503 wait timeout names the model and the reason", path: "/v1/chat/completions", body: chatBody,
			poolErr: &pool.WaitTimeoutError{Model: "tiny", Waited: 30 * time.Second, Reason: "no live provider: node n1 not ready"},
			want:    503, contains: []string{`"tiny"`, "node n1 not ready"}},
		{name: "Q3 no provider with the operation on /v1/messages", path: "/v1/messages", body: chatBody,
			poolErr: &pool.NoCandidateError{Model: "tiny", Operation: "messages"}, want: 400, anthropic: true, contains: []string{"messages"}},
		{name: "Q3 no provider with the operation on /v1/responses", path: "/v1/responses", body: `{"model":"tiny","input":"hi"}`,
			poolErr: &pool.NoCandidateError{Model: "tiny", Operation: "responses"}, want: 400, contains: []string{"responses"}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			r := newRig(t, protocol.TypeOpenAICompat, nil)
			r.fp.err = row.poolErr
			var rd io.Reader = strings.NewReader(row.body)
			if row.chunked {
				rd = io.MultiReader(rd) // no Content-Length: sent chunked
			}
			req, _ := http.NewRequest("POST", r.srv.URL+row.path, rd)
			resp, err := r.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body := string(b)
			if resp.StatusCode != row.want {
				t.Fatalf("status: got %d, want %d; %s", resp.StatusCode, row.want, body)
			}
			e := checkShape(t, body, row.anthropic)
			for _, c := range row.contains {
				if !strings.Contains(e.Error.Message, c) {
					t.Errorf("message %q does not name %s", e.Error.Message, c)
				}
			}
			if got := resp.Header.Get("Retry-After"); got != row.retryAfter {
				t.Errorf("Retry-After: got %q, want %q", got, row.retryAfter)
			}
			wantReqs := 0
			if row.poolErr != nil {
				wantReqs = 1
			}
			if got := len(r.fp.requests()); got != wantReqs {
				t.Errorf("pool requests: got %d, want %d (bad input must not queue)", got, wantReqs)
			}
			if n := r.fp.releases.Load(); n != 0 {
				t.Errorf("releases: got %d without a lease", n)
			}
		})
	}
}

// Q3, Q7: Acquire gets the model, the endpoint's operation and the prompt
// estimate.
func TestAcquireRequest(t *testing.T) {
	leakcheck.Check(t)
	rows := []struct {
		path, body, op string
	}{
		{"/v1/chat/completions", chatBody, protocol.OpChatCompletions},
		{"/v1/responses", `{"model":"tiny","input":"hi"}`, protocol.OpResponses},
		{"/v1/messages", chatBody, protocol.OpMessages},
		{"/v1/messages/count_tokens", chatBody, protocol.OpCountTokens},
	}
	for _, routing := range []string{"least_loaded", "prefix_affinity"} {
		for _, row := range rows {
			// only a prefix_affinity group's requests carry a
			// conversation prefix, and count_tokens never does.
			wantPrefix := routing == "prefix_affinity" && row.op != protocol.OpCountTokens
			t.Run(fmt.Sprintf("Q3 issue16 %s %s", row.op, routing), func(t *testing.T) {
				r := newRig(t, protocol.TypeOpenAICompat, nil)
				r.cfg.Models[0].Routing = routing
				r.fp.err = pool.ErrUnknownModel
				r.do(t, "POST", row.path, row.body)
				reqs := r.fp.requests()
				want := pool.Request{Model: "tiny", Operation: row.op, PromptTokens: pool.EstimatePromptTokens(len(row.body))}
				if len(reqs) != 1 || reqs[0].Model != want.Model || reqs[0].Operation != want.Operation || reqs[0].PromptTokens != want.PromptTokens {
					t.Fatalf("Acquire: got %+v, want %+v", reqs, want)
				}
				if got := len(reqs[0].Prefix) > 0; got != wantPrefix {
					t.Fatalf("Acquire prefix %x: present %t, want %t", reqs[0].Prefix, got, wantPrefix)
				}
			})
		}
	}
}
