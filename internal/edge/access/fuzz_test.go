package access

import "testing"

// FuzzRequestID: any X-Request-Id a client sends gives an id that is safe
// in a header and a log line: non-empty, at most MaxRequestIDLen bytes of
// [A-Za-z0-9._:-], the client's own when it already was such an id.
func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "abc-123", "a b\r\nInjected: 1", "ünïcödé", string(make([]byte, 300))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		id := RequestID(header, func() string { return "minted" })
		if id == "" || len(id) > MaxRequestIDLen || !validID(id) {
			t.Fatalf("RequestID(%q) = %q", header, id)
		}
		if validID(header) && header != "" && id != header {
			t.Fatalf("a valid id %q became %q", header, id)
		}
	})
}
