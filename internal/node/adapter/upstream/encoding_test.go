package upstream

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
)

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zlibbed(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	_, _ = w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func deflated(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.DefaultCompression)
	_, _ = w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// B3: a body in gzip or deflate (zlib-wrapped or raw) reads decoded and
// loses its Content-Encoding and Content-Length; another coding, more than
// one, a body that is not in its coding or is cut short fails its read with
// an *EncodingError that names the coding and wraps ErrProtocol; the raw
// body's own failure (a reset) stays what it was.
func TestDecodeBody(t *testing.T) {
	plain := []byte(`{"object":"chat.completion","choices":[{"message":{"content":"hi"}}]}` + "\n")
	gz := gzipped(t, plain)
	reset := &net0Error{}
	cases := []struct {
		name     string
		encoding []string
		body     io.Reader
		want     string // the decoded body, when it reads
		wantErr  string // an *EncodingError naming this, when it must not read
		raw      error  // the raw body's own error that must come back as is
		keepsHdr bool   // Content-Encoding stays (refused coding)
	}{
		{name: "B3 gzip", encoding: []string{"gzip"}, body: bytes.NewReader(gz), want: string(plain)},
		{name: "B3 x-gzip, any case, spaces", encoding: []string{" X-GZip "}, body: bytes.NewReader(gz), want: string(plain)},
		{name: "B3 identity listed with gzip", encoding: []string{"identity, gzip"}, body: bytes.NewReader(gz), want: string(plain)},
		{name: "B3 deflate zlib-wrapped (RFC 9110)", encoding: []string{"deflate"}, body: bytes.NewReader(zlibbed(t, plain)), want: string(plain)},
		{name: "B3 deflate raw (RFC 1951)", encoding: []string{"deflate"}, body: bytes.NewReader(deflated(t, plain)), want: string(plain)},
		{name: "B3 gzip one byte at a time", encoding: []string{"gzip"}, body: iotest.OneByteReader(bytes.NewReader(gz)), want: string(plain)},
		{name: "B3 gzip, empty body", encoding: []string{"gzip"}, body: bytes.NewReader(nil), want: ""},
		{name: "B3 identity only", encoding: []string{"identity"}, body: bytes.NewReader(plain), want: string(plain)},
		{name: "B3 no header", body: bytes.NewReader(plain), want: string(plain)},
		{name: "B3 br is refused", encoding: []string{"br"}, body: bytes.NewReader(plain), wantErr: `"br"`, keepsHdr: true},
		{name: "B3 zstd is refused", encoding: []string{"zstd"}, body: bytes.NewReader(plain), wantErr: `"zstd"`, keepsHdr: true},
		{name: "B3 two codings are refused", encoding: []string{"gzip", "gzip"}, body: bytes.NewReader(gz), wantErr: `"gzip, gzip"`, keepsHdr: true},
		{name: "B3 claims gzip, is JSON", encoding: []string{"gzip"}, body: bytes.NewReader(plain), wantErr: `not valid Content-Encoding "gzip"`},
		{name: "B3 claims deflate, is JSON", encoding: []string{"deflate"}, body: bytes.NewReader(plain), wantErr: `not valid Content-Encoding "deflate"`},
		{name: "B3 gzip cut short", encoding: []string{"gzip"}, body: bytes.NewReader(gz[:len(gz)-6]), wantErr: "ended before the coding's end"},
		{name: "B3 gzip with a bad checksum", encoding: []string{"gzip"}, body: bytes.NewReader(append(bytes.Clone(gz[:len(gz)-8]), 0, 0, 0, 0, 0, 0, 0, 0)), wantErr: `"gzip"`},
		{name: "B3 gzip reset mid-body stays a reset", encoding: []string{"gzip"}, body: io.MultiReader(bytes.NewReader(gz[:12]), iotest.ErrReader(reset)), raw: reset},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := &http.Response{Header: http.Header{}, Body: io.NopCloser(tc.body), ContentLength: 99}
			resp.Header.Set("Content-Length", "99")
			for _, e := range tc.encoding {
				resp.Header.Add("Content-Encoding", e)
			}
			decodeBody(resp)
			got, err := io.ReadAll(resp.Body)
			var ee *EncodingError
			switch {
			case tc.raw != nil:
				if err != tc.raw || errors.As(err, &ee) {
					t.Fatalf("B3: read error %v, want the raw body's own %v", err, tc.raw)
				}
			case tc.wantErr != "":
				if !errors.As(err, &ee) || !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("B3: read = %q, %v; want an *EncodingError (ErrProtocol) naming %s", got, err, tc.wantErr)
				}
				if _, again := resp.Body.Read(make([]byte, 8)); again == nil {
					t.Fatalf("B3: the failure is not sticky")
				}
			default:
				if err != nil || string(got) != tc.want {
					t.Fatalf("B3: read = %q, %v; want %q", got, err, tc.want)
				}
			}
			coded := len(tc.encoding) > 0 && !strings.EqualFold(strings.TrimSpace(tc.encoding[0]), "identity")
			switch {
			case tc.keepsHdr && resp.Header.Get("Content-Encoding") == "":
				t.Errorf("B3: a refused coding's header was dropped")
			case coded && !tc.keepsHdr && (resp.Header.Get("Content-Encoding") != "" || resp.Header.Get("Content-Length") != "" || resp.ContentLength != -1 || !resp.Uncompressed):
				t.Errorf("B3: decoded, yet Content-Encoding %q, Content-Length %q/%d, Uncompressed %v", resp.Header.Get("Content-Encoding"),
					resp.Header.Get("Content-Length"), resp.ContentLength, resp.Uncompressed)
			case !coded && resp.ContentLength != 99:
				t.Errorf("B3: an identity body's Content-Length changed to %d", resp.ContentLength)
			}
			if err := resp.Body.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// net0Error stands for a connection reset under the coded body.
type net0Error struct{}

func (*net0Error) Error() string { return "read tcp: " + syscall.ECONNRESET.Error() }

// B3: a decompression bomb costs what its decoded bytes would: the reader's
// own bound applies to the decoded bytes (here 1 MiB of a 64 MiB body that
// is 64 KiB coded), and nothing reads ahead of what the reader asks.
func TestDecodeBodyBomb(t *testing.T) {
	member := gzipped(t, make([]byte, 1<<20)) // gzip members in a row decode as one body (RFC 1952 §2.2)
	var buf bytes.Buffer
	for range 64 {
		buf.Write(member)
	}
	coded := buf.Len()
	counted := &countingReader{r: bytes.NewReader(buf.Bytes())}
	resp := &http.Response{Header: http.Header{"Content-Encoding": {"gzip"}}, Body: io.NopCloser(counted)}
	decodeBody(resp)
	got, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || len(got) != 1<<20 {
		t.Fatalf("B3: read %d bytes, %v", len(got), err)
	}
	if counted.n > coded/32+64<<10 {
		t.Errorf("B3: %d coded bytes read for 1 MiB decoded (the whole body is %d): the decoder reads ahead", counted.n, coded)
	}
	t.Logf("64 MiB of zeros are %d bytes of gzip; 1 MiB of them read %d", coded, counted.n)
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
