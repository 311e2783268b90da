package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"strings"
)

// Access is who may use the admin surface (the config's admin.* keys,
// read again for every request so a reload applies at once).
type Access struct {
	// TokenSHA256 is the hex SHA-256 of the admin token; "" = no token.
	TokenSHA256 string
	// AllowedHosts are the host names, besides IP literals and
	// "localhost", a request's Host header may name.
	AllowedHosts []string
}

// guard checks every request but GET /healthz before next sees it:
//
//   - Host (DNS rebinding): a page on evil.example whose name resolves to
//     the edge's address makes a browser send "Host: evil.example:9090";
//     only an IP literal, "localhost" or one of AllowedHosts is answered,
//     anything else gets 403. A request without Host (HTTP/1.0) is not a
//     browser's and passes.
//   - the token, when configured: "Authorization: Bearer <token>", or HTTP
//     Basic authentication with the token as password (RFC 7617; a
//     browser sends it on the page's fetch and EventSource requests once
//     the user answered its prompt). Otherwise 401 with
//     WWW-Authenticate: Basic. The comparison is of SHA-256 digests, in
//     constant time; the token itself is never stored or logged.
//
// /healthz stays open: it says "ok" and nothing else, for load balancers.
func guard(next http.Handler, access func() Access) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		var a Access
		if access != nil {
			a = access()
		}
		if !hostAllowed(r.Host, a.AllowedHosts) {
			http.Error(w, "admin: host not allowed (admin.allowed_hosts)", http.StatusForbidden)
			return
		}
		if a.TokenSHA256 != "" && !tokenOK(r, a.TokenSHA256) {
			w.Header().Set("WWW-Authenticate", `Basic realm="iop admin", charset="UTF-8"`)
			http.Error(w, "admin: token required (admin.token_sha256)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a Host header value (host[:port]) names an
// IP literal, localhost or one of allowed (case-insensitive).
func hostAllowed(hostport string, allowed []string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if net.ParseIP(host) != nil || strings.EqualFold(host, "localhost") {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(host, a) {
			return true
		}
	}
	return false
}

// tokenOK reports whether r carries the token whose SHA-256 is wantHex.
func tokenOK(r *http.Request, wantHex string) bool {
	want, err := hex.DecodeString(wantHex)
	if err != nil || len(want) != sha256.Size {
		return false
	}
	var token string
	if _, pass, ok := r.BasicAuth(); ok {
		token = pass
	} else if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		token = strings.TrimSpace(v)
	}
	if token == "" {
		return false
	}
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], want) == 1
}
