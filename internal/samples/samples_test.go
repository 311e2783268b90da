package samples

import "testing"

func TestReadHTTP(t *testing.T) {
	status, body := ReadHTTP(t, "llama_error_context_exceeded.http")
	if status != 400 || len(body) == 0 || body[0] != '{' {
		t.Errorf("got %d %q, want 400 and a JSON body", status, body)
	}
	if b := Read(t, "ollama_api_tags.json"); len(b) == 0 {
		t.Error("empty capture")
	}
}
