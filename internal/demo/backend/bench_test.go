package backend

import (
	"net/http"
	"strings"
	"testing"
)

// discardWriter is a ResponseWriter that drops the body, for benchmarks.
type discardWriter struct {
	h http.Header
	n int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
func (w *discardWriter) Flush()                      {}

func benchServe(b *testing.B, opts Options, path, body string) {
	be, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, path, strings.NewReader(body))
		be.ServeHTTP(w, req)
	}
	b.SetBytes(int64(w.n / b.N))
}

// BenchmarkStream100: the benchmark's upstream case, a 100-chunk stream.
func BenchmarkStream100(b *testing.B) {
	benchServe(b, Options{}, "/v1/chat/completions",
		`{"model":"tiny-loop","max_tokens":100,"stream":true,"stream_options":{"include_usage":true},`+hiMessages+`}`)
}

// BenchmarkNonStream1KB: a non-stream answer padded to 1 KB.
func BenchmarkNonStream1KB(b *testing.B) {
	benchServe(b, Options{PadBytes: 1024}, "/v1/chat/completions", `{"model":"tiny",`+hiMessages+`}`)
}

// BenchmarkOllamaStream100: a 100-line /api/chat stream.
func BenchmarkOllamaStream100(b *testing.B) {
	benchServe(b, Options{}, "/api/chat", `{"model":"tiny-loop","options":{"num_predict":100},`+hiMessages+`}`)
}
