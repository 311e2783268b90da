// Command agentcapture is a recording reverse proxy for capturing what a
// real client (Claude Code, Codex CLI, the AI SDK) sends: every request's
// method, path, query, headers (credentials replaced by "<redacted>") and
// JSON body is written to -dir as NNN.json, then the request goes on to
// -upstream and the answer streams back unchanged. It is a development
// tool for refreshing the goldens in internal/e2e/testdata/agents, in the
// SDK suite's module; it never ships in the edge or node binaries.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
)

// Capture is one recorded request.
type Capture struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Query   string            `json:"query,omitempty"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body,omitempty"`
	RawBody string            `json:"raw_body,omitempty"`
}

var secretHeaders = map[string]bool{"authorization": true, "x-api-key": true, "cookie": true, "proxy-authorization": true}

func main() {
	listen := flag.String("listen", "127.0.0.1:8381", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:8380", "where requests go on to")
	dir := flag.String("dir", "capture", "directory the NNN.json files go to")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		log.Fatal(err)
	}
	var n atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.FlushInterval = -1
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		r.Body.Close()
		c := Capture{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Headers: map[string]string{}}
		keys := make([]string, 0, len(r.Header))
		for k := range r.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := strings.Join(r.Header.Values(k), ", ")
			if secretHeaders[strings.ToLower(k)] {
				v = "<redacted>"
			}
			c.Headers[strings.ToLower(k)] = v
		}
		if len(body) > 0 {
			if json.Valid(body) {
				c.Body = body
			} else {
				c.RawBody = string(body)
			}
		}
		out, _ := json.MarshalIndent(c, "", "  ")
		name := filepath.Join(*dir, fmt.Sprintf("%03d.json", n.Add(1)))
		if err := os.WriteFile(name, out, 0o644); err != nil {
			log.Print(err)
		}
		log.Printf("%s %s %s (%d bytes)", name, r.Method, r.URL.Path, len(body))
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		proxy.ServeHTTP(w, r)
	})
	log.Fatal(http.ListenAndServe(*listen, nil))
}
