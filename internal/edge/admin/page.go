package admin

import (
	"bytes"
	"crypto/rand"
	_ "embed"
	"html/template"
	"net/http"
)

// pageHTML is the operator page (GET /): one self-contained document, no
// external asset and no framework. Its script polls /status every 2 s,
// follows /events (refreshing at once on each event) and builds the tables
// with DOM calls (textContent only, so no value from a node or a client
// is ever parsed as HTML).
//
//go:embed page.html
var pageHTML string

// chartsHTML defines the page's charts of the last 15 minutes (GET
// /series): the section, its style and its script, included by page.html.
//
//go:embed charts.html
var chartsHTML string

// pageTemplate is parsed once per handler (New); html/template escapes the
// version and the nonce for their contexts.
func pageTemplate() *template.Template {
	t := template.Must(template.New("page").Parse(pageHTML))
	template.Must(t.New("charts").Parse(chartsHTML))
	return t
}

// pageData is what the template fills in.
type pageData struct {
	Version string
	// Nonce allows exactly this response's inline style and script under
	// the Content-Security-Policy (no other script can run on the page).
	Nonce string
}

// servePage writes the operator page with a fresh CSP nonce.
func servePage(w http.ResponseWriter, t *template.Template, version string) {
	var buf bytes.Buffer
	nonce := rand.Text()
	if err := t.Execute(&buf, pageData{Version: version, Nonce: nonce}); err != nil {
		http.Error(w, "page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; connect-src 'self'; img-src 'self' data:; "+
		"style-src 'nonce-"+nonce+"'; script-src 'nonce-"+nonce+"'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.Write(buf.Bytes())
}
