package backend

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/samples"
)

// U2: with LoadDelay the instance answers llama-server's loading 503, byte
// for byte the captured one, on every route until the delay passed, then
// serves.
func TestLoadDelay(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b, err := New(Options{LoadDelay: time.Second, Now: func() time.Time { return now }, Models: []string{"tiny"}})
	if err != nil {
		t.Fatal(err)
	}
	raw := samples.Read(t, "llama_health_loading.http")
	_, want, _ := bytes.Cut(raw, []byte("\n\n"))
	for _, path := range []string{"/health", "/v1/models", "/v1/chat/completions"} {
		method := http.MethodGet
		if path == "/v1/chat/completions" {
			method = http.MethodPost
		}
		w := httptest.NewRecorder()
		b.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`)))
		if w.Code != http.StatusServiceUnavailable || !bytes.Equal(w.Body.Bytes(), want) {
			t.Fatalf("%s while loading: %d %q, want 503 %q", path, w.Code, w.Body.Bytes(), want)
		}
	}
	now = now.Add(time.Second)
	w := httptest.NewRecorder()
	b.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/health", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("/health after the load: %d", w.Code)
	}
	if _, err := New(Options{LoadDelay: -1}); err == nil {
		t.Fatal("negative LoadDelay accepted")
	}
}
