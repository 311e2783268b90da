package admin

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"testing"
)

// P4 (admin surface): every request but /healthz is checked for its Host
// (a DNS-rebinding page names its own host) and, with a token configured,
// for the token as a bearer or the Basic password; pprof sits behind the
// same guard.
func TestAdminGuard(t *testing.T) {
	sum := sha256.Sum256([]byte("s3cret-admin"))
	token := hex.EncodeToString(sum[:])
	open := Access{AllowedHosts: []string{"edge.lan"}}
	locked := Access{TokenSHA256: token}
	rows := []struct {
		name   string
		access Access
		path   string
		host   string
		auth   func(*http.Request)
		want   int
	}{
		{"P4 loopback IP host", open, "/status", "127.0.0.1:9090", nil, 200},
		{"P4 IPv6 loopback host", open, "/status", "[::1]:9090", nil, 200},
		{"P4 localhost", open, "/status", "localhost:9090", nil, 200},
		{"P4 another IP literal (a non-loopback listener reached by address)", open, "/status", "10.0.0.5:9090", nil, 200},
		{"P4 allowed host name", open, "/metrics", "EDGE.lan:9090", nil, 200},
		{"P4 DNS rebinding: foreign host on /status", open, "/status", "evil.example:9090", nil, 403},
		{"P4 DNS rebinding: foreign host on /events", open, "/events", "evil.example", nil, 403},
		{"P4 DNS rebinding: localhost look-alike", open, "/status", "localhost.evil.example:9090", nil, 403},
		{"P4 healthz answers any host", open, "/healthz", "evil.example", nil, 200},
		{"P4 token missing", locked, "/status", "127.0.0.1", nil, 401},
		{"P4 token missing on pprof", locked, "/debug/pprof/", "127.0.0.1", nil, 401},
		{"P4 wrong bearer", locked, "/status", "127.0.0.1", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, 401},
		{"P4 bearer", locked, "/status", "127.0.0.1", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-admin") }, 200},
		{"P4 basic password (the page after the browser's prompt)", locked, "/metrics", "127.0.0.1", func(r *http.Request) { r.SetBasicAuth("ops", "s3cret-admin") }, 200},
		{"P4 basic with a wrong password", locked, "/status", "127.0.0.1", func(r *http.Request) { r.SetBasicAuth("ops", "s3cret") }, 401},
		{"P4 token does not bypass the host check", locked, "/status", "evil.example", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-admin") }, 403},
		{"P4 healthz needs no token", locked, "/healthz", "127.0.0.1", nil, 200},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			a := r.access
			h := New(Options{Status: status(), Events: nil, Pprof: true, Access: func() Access { return a }})
			req := httptest.NewRequest("GET", "http://x"+r.path, nil)
			req.Host = r.host
			if r.auth != nil {
				r.auth(req)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != r.want {
				t.Fatalf("GET %s Host %q: %d, want %d (%s)", r.path, r.host, rec.Code, r.want, rec.Body.String())
			}
			if r.want == 401 && rec.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate: a browser would not prompt")
			}
		})
	}
}
