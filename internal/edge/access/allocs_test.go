//go:build !race

package access

// Allocation counts only mean something without the race detector: under
// -race, sync.Pool drops a share of what is put back (slog's buffers among
// it), so every run allocates more at random. `go test
// ./internal/edge/access/` (without -race) runs it; BenchmarkLog reports
// the same count.

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// A1 (the access line's cost): one access line through slog's JSON
// handler allocates once (slog's record overflow past its 5 inline
// attributes); the attributes themselves stay on Log's stack. Before, they
// were a heap slice too: 2 allocations, 1,184 bytes a line.
func TestRecordLogAllocs(t *testing.T) {
	l := slog.New(slog.NewJSONHandler(io.Discard, nil))
	r := &Record{RequestID: "Q2XJ7V4M3KZ5N6P8R9S0T1U2VW", Principal: "team-a", Surface: "chat_completions", Model: "tiny",
		Known: true, Node: "gpu-1", Provider: "ollama", Path: PathRun, Status: 200, Outcome: OK,
		QueueWait: time.Millisecond, TTFB: 30 * time.Millisecond, Duration: 200 * time.Millisecond}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { r.Log(ctx, l) }); n > 1 {
		t.Errorf("an access line allocates %v times, want at most 1", n)
	}
	off := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if n := testing.AllocsPerRun(100, func() { r.Log(ctx, off) }); n != 0 {
		t.Errorf("an access line below the handler's level allocates %v times, want 0", n)
	}
}
