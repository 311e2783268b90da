package backend

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// harness is a Backend behind a real loopback HTTP server.
type harness struct {
	b    *Backend
	srv  *httptest.Server
	ends chan RequestEnd // every RequestEnd, buffered
}

// newHarness starts a Backend with opts (OnRequestEnd is replaced) and
// checks for goroutine leaks when the test ends.
func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	leakcheck.Check(t)
	h := &harness{ends: make(chan RequestEnd, 256)}
	opts.OnRequestEnd = func(e RequestEnd) { h.ends <- e }
	b, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.b = b
	h.srv = httptest.NewServer(b)
	t.Cleanup(h.srv.Close)
	return h
}

// do sends one request and returns the status, headers and the whole body.
func (h *harness) do(t *testing.T, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, got
}

// open starts a request whose body the caller reads; cancel aborts it.
func (h *harness) open(t *testing.T, path, body string) (*http.Response, context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		cancel()
		t.Fatalf("new request: %v", err)
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		return nil, cancel, err
	}
	return resp, cancel, nil
}

// nextEnd waits up to d for the next RequestEnd.
func (h *harness) nextEnd(t *testing.T, d time.Duration) RequestEnd {
	t.Helper()
	select {
	case e := <-h.ends:
		return e
	case <-time.After(d):
		t.Fatalf("no request ended within %s (active %d)", d, h.b.Active())
		return RequestEnd{}
	}
}

// readCapture returns a capture from testdata/.
func readCapture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("read capture: %v", err)
	}
	return b
}

// splitHTTP splits an .http capture into its status code and body.
func splitHTTP(t *testing.T, raw []byte) (int, []byte) {
	t.Helper()
	head, body, ok := bytes.Cut(raw, []byte("\n\n"))
	if !ok {
		t.Fatalf("capture has no blank line after the status line")
	}
	f := strings.Fields(string(head))
	if len(f) < 2 {
		t.Fatalf("capture status line %q has no code", head)
	}
	code, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("capture status line %q: %v", head, err)
	}
	return code, body
}

// normalizers replace the fields that legitimately vary between runs and
// servers (ids, timestamps, durations, timings, prompt-size-derived counts)
// with fixed values; the id patterns pin the id shape, so an id of another
// shape is left alone and fails the comparison.
type normalizer struct {
	re   *regexp.Regexp
	repl string
}

func normalizers() []normalizer {
	return []normalizer{
		{regexp.MustCompile(`"created":\d+`), `"created":0`},
		{regexp.MustCompile(`"(created_at|expires_at)":"[0-9T:.Z-]+"`), `"$1":"T"`},
		{regexp.MustCompile(`"id":"chatcmpl-[A-Za-z0-9]{32}"`), `"id":"chatcmpl-ID"`},
		{regexp.MustCompile(`"id":"[A-Za-z0-9]{32}"`), `"id":"ID32"`},
		{regexp.MustCompile(`"id":"call_[a-z0-9]{8}"`), `"id":"call_ID"`},
		{regexp.MustCompile(`"(resp|msg|fc)_[A-Za-z0-9]{32}"`), `"${1}_ID"`},
		{regexp.MustCompile(`"(created_at|completed_at)":\d+`), `"$1":0`},
		{regexp.MustCompile(`"logprob":-8\.[0-9]+e-13`), `"logprob":-8.8e-13`},
		{regexp.MustCompile(`"(total|load|prompt_eval|eval)_duration":\d+`), `"${1}_duration":0`},
		{regexp.MustCompile(`"(prompt_ms|prompt_per_token_ms|prompt_per_second|predicted_ms|predicted_per_token_ms|predicted_per_second)":[0-9.e+-]+`), `"$1":0`},
		{regexp.MustCompile(`"(prompt_tokens|total_tokens|cached_tokens|prompt_eval_count|input_tokens|cache_read_input_tokens|cache_n|prompt_n)":\d+`), `"$1":0`},
	}
}

func normalize(b []byte) []byte {
	for _, n := range normalizers() {
		b = n.re.ReplaceAll(b, []byte(n.repl))
	}
	return b
}

// diffLines reports the first differing line of two byte strings.
func diffLines(got, want []byte) string {
	g := strings.SplitAfter(string(got), "\n")
	w := strings.SplitAfter(string(want), "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n got: " + strconv.Quote(gl) + "\nwant: " + strconv.Quote(wl)
		}
	}
	return "equal"
}
