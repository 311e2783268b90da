//go:build !race

package api

import "testing"

// Allocation counts are taken without the race detector (its
// instrumentation may allocate); `go test ./internal/edge/api/` runs it.

// The head parse of a request (model, stream, the required array, the
// case-folded key check of SPEC Q1) allocates once (the model name) for a body whose
// keys have no escapes, however many other top-level fields it has.
func TestParseHeadAllocs(t *testing.T) {
	body := []byte(`{"model":"tiny","temperature":0.2,"max_tokens":9,"top_p":1,"user":"u","seed":4,` +
		`"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	var hd head
	if e := parseHead(body, &epChat, &hd); e != nil {
		t.Fatal(e.Message)
	}
	if n := testing.AllocsPerRun(100, func() { hd = head{}; _ = parseHead(body, &epChat, &hd) }); n > 1 {
		t.Errorf("parseHead allocates %v times per request, want at most 1 (the model name)", n)
	}
}
