package backend

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// U7: /api/ps follows each request's keep_alive as Ollama 0.17.4 does
// (checked against it: a 300-second keep_alive gave an expires_at 5 min
// after the request): absent = 5 min, a number = seconds, a string = a
// duration, negative = kept, 0 = gone after the request; a model whose
// expires_at passed is no longer listed.
func TestKeepAlivePS(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	for _, tc := range []struct {
		keepAlive string
		until     time.Duration // 0 = not listed
	}{
		{"", 5 * time.Minute}, {`,"keep_alive":300`, 5 * time.Minute}, {`,"keep_alive":"10m"`, 10 * time.Minute},
		{`,"keep_alive":0`, 0}, {`,"keep_alive":"0"`, 0}, {`,"keep_alive":-1`, 100 * 365 * 24 * time.Hour},
	} {
		b, err := New(Options{Now: clock, Models: []string{"tiny"}})
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		b.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/api/chat",
			strings.NewReader(`{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}]`+tc.keepAlive+`}`)))
		if w.Code != 200 {
			t.Fatalf("%s: chat %d %s", tc.keepAlive, w.Code, w.Body)
		}
		w = httptest.NewRecorder()
		b.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/ps", nil))
		var ps struct {
			Models []struct {
				Name      string    `json:"name"`
				ExpiresAt time.Time `json:"expires_at"`
			} `json:"models"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &ps); err != nil {
			t.Fatal(err)
		}
		switch {
		case tc.until == 0 && len(ps.Models) != 0:
			t.Errorf("U7 keep_alive%s: still listed %v", tc.keepAlive, ps.Models)
		case tc.until > 0 && (len(ps.Models) != 1 || !ps.Models[0].ExpiresAt.Equal(now.Add(tc.until))):
			t.Errorf("U7 keep_alive%s: %v, want tiny:latest until %v", tc.keepAlive, ps.Models, now.Add(tc.until))
		}
	}
	b, _ := New(Options{Now: clock, Models: []string{"tiny"}})
	b.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/api/chat",
		strings.NewReader(`{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}],"keep_alive":"1s"}`)))
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	w := httptest.NewRecorder()
	b.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/ps", nil))
	if got := w.Body.String(); got != `{"models":[]}` {
		t.Errorf("U7 after its expires_at: %s", got)
	}
}
