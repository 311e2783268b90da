package logbuf

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// sink records each Write it gets as one element, and signals each.
type sink struct {
	mu     sync.Mutex
	writes []string
	wrote  chan struct{}
	err    error
}

func newSink() *sink { return &sink{wrote: make(chan struct{}, 1024)} }

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.writes = append(s.writes, string(p))
	s.mu.Unlock()
	s.wrote <- struct{}{}
	return len(p), s.err
}

func (s *sink) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.writes...)
}

// A1: lines are held, then written in order, several per write.
func TestA1LinesHeldThenWrittenTogether(t *testing.T) {
	s := newSink()
	w := New(s, 1<<10, time.Hour)
	defer w.Close()
	for i := range 3 {
		if n, err := fmt.Fprintf(w, "line %d\n", i); err != nil || n != 7 {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	if got := s.got(); len(got) != 0 {
		t.Fatalf("written before a flush: %q", got)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := s.got(); len(got) != 1 || got[0] != "line 0\nline 1\nline 2\n" {
		t.Fatalf("got writes %q, want the three lines in one", got)
	}
	w.Flush()
	if got := s.got(); len(got) != 1 {
		t.Fatalf("an empty flush wrote: %q", got)
	}
}

// A1: a held line goes out by itself after the delay, with no further
// write or flush; the timer is armed again for the next line.
func TestA1DelayWritesHeldLines(t *testing.T) {
	leakcheck.Check(t)
	s := newSink()
	w := New(s, 1<<10, time.Millisecond)
	defer w.Close()
	for round := range 3 {
		start := time.Now()
		fmt.Fprintf(w, "round %d\n", round)
		select {
		case <-s.wrote:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the held line was not written within 10 s", round)
		}
		if d := time.Since(start); d < time.Millisecond {
			t.Fatalf("round %d: written after %v, before the delay", round, d)
		}
	}
	if got := s.got(); strings.Join(got, "") != "round 0\nround 1\nround 2\n" || len(got) != 3 {
		t.Fatalf("got writes %q", got)
	}
}

// A1: the buffer never passes its size: what is held goes out before a line
// that would not fit, whole lines only; a line of Size bytes or more is
// written through at once, after what was held.
func TestA1SizeBound(t *testing.T) {
	s := newSink()
	w := New(s, 32, time.Hour)
	defer w.Close()
	for _, l := range []string{"aaaaaaaaa\n", "bbbbbbbbb\n", "ccccccccc\n", "ddddddddd\n"} {
		w.Write([]byte(l))
	}
	if got := s.got(); len(got) != 1 || got[0] != "aaaaaaaaa\nbbbbbbbbb\nccccccccc\n" {
		t.Fatalf("got writes %q, want the first three lines once the fourth did not fit", got)
	}
	long := strings.Repeat("x", 40) + "\n"
	if n, err := w.Write([]byte(long)); n != len(long) || err != nil {
		t.Fatalf("long line: %d, %v", n, err)
	}
	if got := s.got(); len(got) != 3 || got[1] != "ddddddddd\n" || got[2] != long {
		t.Fatalf("got writes %q, want the held line, then the long one", got)
	}
	if w.buf != nil && cap(w.buf) > 32 {
		t.Fatalf("buffer grew to %d bytes", cap(w.buf))
	}
}

// A1: Close writes what is held; later lines go straight through.
func TestA1CloseWritesHeldAndPassesThrough(t *testing.T) {
	leakcheck.Check(t)
	s := newSink()
	w := New(s, 1<<10, time.Hour)
	w.Write([]byte("held\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := s.got(); len(got) != 1 || got[0] != "held\n" {
		t.Fatalf("after Close: %q", got)
	}
	w.Write([]byte("after\n"))
	if got := s.got(); len(got) != 2 || got[1] != "after\n" {
		t.Fatalf("a line after Close was not written at once: %q", got)
	}
	w.Close()
}

// A1: through slog, an Info line is held and a Warn line takes it out with
// itself at once, also from a logger made With attributes or a group.
func TestA1HandlerWritesWarnAtOnce(t *testing.T) {
	s := newSink()
	w := New(s, 1<<10, time.Hour)
	defer w.Close()
	log := slog.New(w.Handler(slog.NewJSONHandler(w, nil)))
	log.Info("access", "request_id", "r1")
	if got := s.got(); len(got) != 0 {
		t.Fatalf("an Info line was written at once: %q", got)
	}
	log.With("component", "x").WithGroup("g").Warn("stalled", "n", 1)
	got := s.got()
	if len(got) != 1 || strings.Count(got[0], "\n") != 2 || !strings.Contains(got[0], `"request_id":"r1"`) ||
		!strings.Contains(got[0], `"msg":"stalled"`) || strings.Index(got[0], "access") > strings.Index(got[0], "stalled") {
		t.Fatalf("got writes %q, want the Info line then the Warn line, in one write", got)
	}
	log.Error("stopped")
	if got := s.got(); len(got) != 2 || !strings.Contains(got[1], `"level":"ERROR"`) {
		t.Fatalf("an Error line was held: %q", got)
	}
	if !log.Enabled(t.Context(), slog.LevelInfo) || log.Enabled(t.Context(), slog.LevelDebug) {
		t.Fatal("Enabled is not the wrapped handler's")
	}
}

// A1: lines written from many goroutines each come out once, whole, with
// every write holding whole lines.
func TestA1ConcurrentLinesWhole(t *testing.T) {
	leakcheck.Check(t)
	s := newSink()
	w := New(s, 256, time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				fmt.Fprintf(w, "g%d-%03d\n", g, i)
			}
		})
	}
	wg.Wait()
	w.Close()
	seen := map[string]int{}
	for _, wr := range s.got() {
		if !strings.HasSuffix(wr, "\n") || len(wr) > 256 {
			t.Fatalf("a write of %d bytes not ending a line: %q", len(wr), wr)
		}
		for _, l := range strings.Split(strings.TrimSuffix(wr, "\n"), "\n") {
			seen[l]++
		}
	}
	if len(seen) != 8*200 {
		t.Fatalf("%d distinct lines, want %d", len(seen), 8*200)
	}
	for l, n := range seen {
		if n != 1 {
			t.Fatalf("line %q written %d times", l, n)
		}
	}
}

// An error of the destination is kept for Flush and Close.
func TestErrorKept(t *testing.T) {
	s := newSink()
	s.err = errors.New("disk full")
	w := New(s, 1<<10, time.Hour)
	if _, err := w.Write([]byte("x\n")); err != nil {
		t.Fatalf("a held line returned %v", err)
	}
	if err := w.Flush(); err == nil || err.Error() != "disk full" {
		t.Fatalf("Flush: %v", err)
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close lost the error")
	}
	if got := s.got(); len(got) != 1 || !bytes.Equal([]byte(got[0]), []byte("x\n")) {
		t.Fatalf("got writes %q", got)
	}
}
