package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRunStreamSurface: one streamed request at a time on the run path
// (an ollama provider in front of the demo backend, no token delay) through
// each client surface: chat completions, Anthropic Messages and Responses (F1).
// Metrics besides ns/op:
//
//   - first-event-µs: median time from sending the request to the first
//     body bytes (the first SSE event) at the client;
//   - cpu-µs/op: user+system CPU time of the whole process (client, Edge,
//     node, demo backend) per request.
//
// Everything but the surface's conversion is the same in the three rows,
// so the differences to the chat row are what /v1/messages and
// /v1/responses add.
//
// Run: go test -run '^$' -bench RunStreamSurface -benchtime 2000x -count 3 ./internal/e2e
func BenchmarkRunStreamSurface(b *testing.B) {
	c, _ := roundTrip(b, ollamaAdapter("ollama", "", 4), "tiny")
	for _, s := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"messages", "/v1/messages", `{"model":"tiny","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`},
		{"responses", "/v1/responses", `{"model":"tiny","stream":true,"input":"hi"}`},
	} {
		b.Run(s.name, func(b *testing.B) {
			body := []byte(s.body)
			first := make([]time.Duration, 0, b.N)
			var ru0, ru1 syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				resp, err := c.hc.Post(c.url+s.path, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				br := bufio.NewReader(resp.Body)
				if _, err := br.Peek(1); err != nil {
					b.Fatalf("first byte: %v", err)
				}
				first = append(first, time.Since(start))
				_, err = io.Copy(io.Discard, br)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d, read error %v", resp.StatusCode, err)
				}
			}
			b.StopTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano()-ru0.Utime.Nano()) + time.Duration(ru1.Stime.Nano()-ru0.Stime.Nano())
			slices.Sort(first)
			b.ReportMetric(float64(first[len(first)/2].Nanoseconds())/1e3, "first-event-µs")
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
		})
	}
}
