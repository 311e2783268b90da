package backend

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

// C3 (demo backend side): with APIKey set, the /v1 routes but the public
// ones require the key as llama-server --api-key does, with its 401 body;
// Ollama's /api/* routes stay open.
func TestAPIKey(t *testing.T) {
	const key = "sk-demo-backend-key"
	h := newHarness(t, Options{APIKey: key})
	chat := `{"model":"tiny","stream":false,` + hiMessages + `}`
	rows := []struct {
		name, method, path, auth, xAPIKey, body string
		want                                    int
	}{
		{"no key on chat completions", "POST", "/v1/chat/completions", "", "", chat, 401},
		{"wrong key", "POST", "/v1/chat/completions", "Bearer nope", "", chat, 401},
		{"Bearer key", "POST", "/v1/chat/completions", "Bearer " + key, "", chat, 200},
		{"bare key", "POST", "/v1/chat/completions", key, "", chat, 200},
		{"x-api-key on messages", "POST", "/v1/messages", "", key, chat, 200},
		{"no key on messages", "POST", "/v1/messages", "", "", chat, 401},
		{"models is public", "GET", "/v1/models", "", "", "", 200},
		{"health is public", "GET", "/health", "", "", "", 200},
		{"ollama native is open", "POST", "/api/chat", "", "", chat, 200},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			req, _ := http.NewRequest(row.method, h.srv.URL+row.path, strings.NewReader(row.body))
			if row.auth != "" {
				req.Header.Set("Authorization", row.auth)
			}
			if row.xAPIKey != "" {
				req.Header.Set("X-Api-Key", row.xAPIKey)
			}
			resp, err := h.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				b.Write(buf[:n])
				if err != nil {
					break
				}
			}
			resp.Body.Close()
			if resp.StatusCode != row.want {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, b.String(), row.want)
			}
			e := h.nextEnd(t, 5e9)
			if row.want == 401 {
				if b.String() != `{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}` ||
					resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
					t.Fatalf("401 body %q, content type %q: want llama-server's", b.String(), resp.Header.Get("Content-Type"))
				}
				if !errors.Is(e.Err, errUnauthorized) {
					t.Fatalf("RequestEnd.Err %v", e.Err)
				}
			}
		})
	}
}
