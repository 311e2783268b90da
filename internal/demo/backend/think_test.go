package backend

import (
	"net/http"
	"strings"
	"testing"
)

// E8: tiny-think answers "think" as Ollama 0.17.4 answers it on a thinking
// model that is not gpt-oss (server/routes.go ChatHandler): true thinks,
// false does not, a level ("low", "medium", "high": only the harmony
// parser takes one) is a 400 naming it; think on a model that cannot think
// is a 400 too.
func TestThinkValues(t *testing.T) {
	h := newHarness(t, Options{Models: []string{"tiny", "tiny-think"}})
	rows := []struct {
		name, model, think string
		status             int
		want               string
	}{
		{"true thinks", "tiny-think", `true`, http.StatusOK, `"thinking":"The user wants a greeting.`},
		{"false does not", "tiny-think", `false`, http.StatusOK, `"content":"Hello from tiny-gguf!`},
		{"a level is refused", "tiny-think", `"high"`, http.StatusBadRequest, `{"error":"think value \"high\" is not supported for this model"}`},
		{"a model that cannot think", "tiny", `true`, http.StatusBadRequest, `{"error":"\"tiny\" does not support thinking"}`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			status, _, body := h.do(t, http.MethodPost, "/api/chat",
				`{"model":"`+row.model+`","stream":false,"think":`+row.think+`,"messages":[{"role":"user","content":"hi"}]}`)
			if status != row.status || !strings.Contains(string(body), row.want) {
				t.Fatalf("got %d %s, want %d with %s", status, body, row.status, row.want)
			}
			if row.think == `false` && strings.Contains(string(body), `"thinking"`) {
				t.Fatalf("think false: %s carries thinking", body)
			}
		})
	}
}
