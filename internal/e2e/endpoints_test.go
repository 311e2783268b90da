package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// get sends a GET with headers (name, value pairs) and returns the status
// and the body.
func (c *apiClient) get(t testing.TB, path string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// rateLimitedBackend is an OpenAI-compatible server answering chat
// completions with the response headers real APIs send about limits and
// the request, and ones no client should get from it.
func rateLimitedBackend(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"tiny","object":"model"}]}`)
			return
		}
		for k, v := range map[string]string{
			"X-Ratelimit-Limit-Requests": "500", "X-Ratelimit-Remaining-Tokens": "149984", "X-Ratelimit-Reset-Requests": "120ms",
			"Anthropic-Ratelimit-Requests-Remaining": "49", "Anthropic-Ratelimit-Tokens-Reset": "2026-12-01T12:00:00Z",
			"Request-Id": "req_upstream_1", "Openai-Processing-Ms": "42", "Retry-After-Ms": "10", "X-Should-Retry": "false",
			"Openai-Version": "2020-10-01", "Openai-Organization": "org-upstream", "Openai-Project": "proj_upstream",
			// Never relayed: cookies, CORS, redirects, caching and the Edge's own.
			"Set-Cookie": "s=1", "Access-Control-Allow-Origin": "*", "Location": "http://elsewhere/", "Cache-Control": "public, max-age=9999",
			"X-Request-Id": "upstream-id", "Iop-Ignored-Fields": "forged", "Strict-Transport-Security": "max-age=1",
		} {
			h.Set(k, v)
		}
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// T2, T5: on the tunnel, the upstream's headers about limits and the
// request (x-ratelimit-*, anthropic-ratelimit-*, request-id,
// openai-processing-ms, openai-version, openai-organization,
// openai-project, retry-after-ms, x-should-retry) reach the client;
// cookies, CORS, redirects, caching policy and the Edge's own headers
// (X-Request-Id, Iop-Ignored-Fields) from upstream never do.
func TestTunnelResponseHeaders(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{compatAdapter("oa", rateLimitedBackend(t), 4)}}},
		[]config.Model{modelGroup("tiny-oa", provider("gpu-1", "oa", "tiny"))}, nil)
	_, _, api := startReady(t, p, cfg, logs)
	resp, err := api.hc.Post(api.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"tiny-oa","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for k, want := range map[string]string{
		"X-Ratelimit-Limit-Requests": "500", "X-Ratelimit-Remaining-Tokens": "149984", "X-Ratelimit-Reset-Requests": "120ms",
		"Anthropic-Ratelimit-Requests-Remaining": "49", "Anthropic-Ratelimit-Tokens-Reset": "2026-12-01T12:00:00Z",
		"Request-Id": "req_upstream_1", "Openai-Processing-Ms": "42", "Retry-After-Ms": "10", "X-Should-Retry": "false",
		"Openai-Version": "2020-10-01", "Openai-Organization": "org-upstream", "Openai-Project": "proj_upstream",
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: got %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"Set-Cookie", "Access-Control-Allow-Origin", "Location", "Cache-Control", "Iop-Ignored-Fields", "Strict-Transport-Security"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("%s: %q reached the client", k, v)
		}
	}
	if id := resp.Header.Get("X-Request-Id"); id == "upstream-id" || id == "" {
		t.Errorf("X-Request-Id %q: want the Edge's own", id)
	}
}

// Q1: GET /v1/models/{id} answers in OpenAI's shape (retrieve), 404
// model_not_found in the same shape for an id that is no group; asked as
// the Anthropic API is asked (x-api-key, anthropic-version), GET
// /v1/models and /v1/models/{id} answer in Anthropic's shapes.
func TestModelEndpoints(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", "http://127.0.0.1:1", 4)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny")), modelGroup("tiny-oa", provider("gpu-1", "ollama", "tiny"))},
		func(c *config.Config) {
			c.APIKeys = []config.APIKey{{Principal: "demo", KeySHA256: "a53c35ff06595c53b5811e292b28c03dc28ae31504113b192957969974063a5c"}}
		})
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	api := newAPIClient(t, e)
	bearer := []string{"Authorization", "Bearer iop-demo-key"}
	anth := []string{"X-Api-Key", "iop-demo-key", "Anthropic-Version", "2023-06-01"}
	decode := func(body string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		return m
	}

	status, _, body := api.get(t, "/v1/models/tiny", bearer...)
	if m := decode(body); status != 200 || m["id"] != "tiny" || m["object"] != "model" || m["owned_by"] != "iop" {
		t.Errorf("retrieve: %d %s", status, body)
	}
	status, _, body = api.get(t, "/v1/models/nope", bearer...)
	if m := decode(body); status != 404 || str(m, "error.code") != "model_not_found" || str(m, "error.type") != "invalid_request_error" {
		t.Errorf("retrieve unknown: %d %s", status, body)
	}
	status, _, body = api.get(t, "/v1/models", anth...)
	m := decode(body)
	data, _ := m["data"].([]any)
	if status != 200 || len(data) != 2 || str(data[0], "type") != "model" || str(data[1], "id") != "tiny-oa" ||
		str(data[0], "created_at") == "" || m["has_more"] != false || m["first_id"] != "tiny" || m["last_id"] != "tiny-oa" {
		t.Errorf("Anthropic list: %d %s", status, body)
	}
	status, _, body = api.get(t, "/v1/models/tiny", anth...)
	if m := decode(body); status != 200 || m["type"] != "model" || m["display_name"] != "tiny" {
		t.Errorf("Anthropic get: %d %s", status, body)
	}
	status, _, body = api.get(t, "/v1/models/nope", anth...)
	if m := decode(body); status != 404 || m["type"] != "error" || str(m, "error.type") != "not_found_error" {
		t.Errorf("Anthropic get unknown: %d %s", status, body)
	}
	if status, _, body = api.get(t, "/v1/models", "X-Api-Key", "wrong", "Anthropic-Version", "2023-06-01"); status != 401 {
		t.Errorf("Anthropic list with a wrong key: %d %s", status, body)
	}
}
