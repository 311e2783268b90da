package api

import (
	"bytes"
	"io"
	"iop/internal/edge/reply"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/iotest"
)

// B1: readBody returns exactly the bytes sent, grows its buffer with
// them (never past the declared length) and refuses what the cap or the
// declaration rules out.
func TestReadBody(t *testing.T) {
	const limit = 100_000
	body := func(n int) []byte { return bytes.Repeat([]byte{'a'}, n) }
	rows := []struct {
		name       string
		sent       []byte
		declared   int64 // -1: chunked (no Content-Length)
		oneByte    bool  // the body arrives a byte per read
		wantStatus int   // 0: read fine
		encoding   string
	}{
		{"empty", nil, 0, false, 0, ""},
		{"one byte", body(1), 1, false, 0, ""},
		{"first buffer exactly", body(bodyFirstBuffer), bodyFirstBuffer, false, 0, ""},
		{"one over the first buffer", body(bodyFirstBuffer + 1), bodyFirstBuffer + 1, true, 0, ""},
		{"at the cap", body(limit), limit, false, 0, ""},
		{"chunked small", body(10), -1, false, 0, ""},
		{"chunked at the cap", body(limit), -1, true, 0, ""},
		{"chunked one over the cap", body(limit + 1), -1, false, 413, ""},
		{"declared over the cap", body(10), limit + 1, false, 413, ""},
		{"declared more than sent", body(10), 20, false, 400, ""},
		{"gzip body is 415", body(10), 10, false, 415, "gzip"},
		{"identity coding is the body itself", body(10), 10, false, 0, "identity"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var rd io.Reader = bytes.NewReader(row.sent)
			if row.oneByte {
				rd = iotest.OneByteReader(rd)
			}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", io.NopCloser(rd))
			r.ContentLength = row.declared
			if row.encoding != "" {
				r.Header.Set("Content-Encoding", row.encoding)
			}
			got, err := readBody(httptest.NewRecorder(), r, limit, nil)
			e, _ := err.(*reply.Error)
			if row.wantStatus != 0 {
				if e == nil || e.Status != row.wantStatus {
					t.Fatalf("got %v, want status %d", e, row.wantStatus)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v", err)
			}
			if !bytes.Equal(got, row.sent) {
				t.Fatalf("got %d bytes, want the %d sent", len(got), len(row.sent))
			}
			if row.declared > 0 && int64(cap(got)) > row.declared {
				t.Errorf("buffer capacity %d over the declared %d", cap(got), row.declared)
			}
			if cap(got) > 2*max(len(got), bodyFirstBuffer) {
				t.Errorf("buffer capacity %d for %d bytes", cap(got), len(got))
			}
		})
	}
}
