package backend

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// timedWriter is a ResponseWriter that records when (bubble time) the
// header and each write happened. It is used by one handler goroutine;
// tests read it after synctest.Wait.
type timedWriter struct {
	start   time.Time
	header  http.Header
	status  int
	headAt  time.Duration // since start; -1 = no header yet
	writes  []string
	writeAt []time.Duration
}

func newTimedWriter() *timedWriter {
	return &timedWriter{start: time.Now(), header: http.Header{}, headAt: -1}
}

func (w *timedWriter) Header() http.Header { return w.header }

func (w *timedWriter) WriteHeader(code int) {
	if w.headAt < 0 {
		w.status, w.headAt = code, time.Since(w.start)
	}
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.writes = append(w.writes, string(p))
	w.writeAt = append(w.writeAt, time.Since(w.start))
	return len(p), nil
}

func (w *timedWriter) Flush() {}

// serveInBubble starts one request on b in the current bubble and returns
// its writer, a cancel for the request context and a channel closed when
// ServeHTTP returns.
func serveInBubble(b *Backend, path, body string) (*timedWriter, context.CancelFunc, chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, path, strings.NewReader(body))
	w := newTimedWriter()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.ServeHTTP(w, req)
	}()
	return w, cancel, done
}

// TestTokenDelay: each content token waits TokenDelay; the prologue and the
// terminal chunks do not (a stand-in for generation speed).
func TestTokenDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var end RequestEnd
		b, err := New(Options{TokenDelay: 20 * time.Millisecond, OnRequestEnd: func(e RequestEnd) { end = e }})
		if err != nil {
			t.Fatal(err)
		}
		w, cancel, done := serveInBubble(b, "/v1/chat/completions", `{"model":"tiny","stream":true,`+hiMessages+`}`)
		defer cancel()
		<-done
		want := []time.Duration{0, 20, 40, 60, 80, 100, 120, 140, 140} // role chunk, 7 tokens, finish+[DONE]
		if len(w.writeAt) != len(want) {
			t.Fatalf("writes: got %d, want %d: %q", len(w.writeAt), len(want), w.writes)
		}
		for i, at := range w.writeAt {
			if at != want[i]*time.Millisecond {
				t.Errorf("write %d at %s, want %s", i, at, want[i]*time.Millisecond)
			}
		}
		if got := end.End.Sub(end.Start); got != 140*time.Millisecond || end.Outcome != OutcomeOK {
			t.Errorf("RequestEnd: got %s %s, want 140ms ok", got, end.Outcome)
		}
		if !strings.Contains(w.writes[8], `"predicted_ms":120.0`) {
			t.Errorf("timings: got %s, want predicted_ms 120.0 (first to last token)", w.writes[8])
		}
	})
}

// TestSlowHeaders: slowheaders=2s holds the status line for 2 s; a client
// leaving earlier ends the request without one.
func TestSlowHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		w, cancel, done := serveInBubble(b, "/api/chat", `{"model":"tiny+slowheaders=2s","stream":false,`+hiMessages+`}`)
		defer cancel()
		<-done
		if w.headAt != 2*time.Second || w.status != http.StatusOK {
			t.Errorf("header: got %d at %s, want 200 at 2s", w.status, w.headAt)
		}

		w, cancel, done = serveInBubble(b, "/api/chat", `{"model":"tiny+slowheaders=2s",`+hiMessages+`}`)
		time.Sleep(time.Second) // bubble time: the handler is still waiting
		synctest.Wait()
		cancel()
		<-done
		if w.headAt >= 0 {
			t.Errorf("header written at %s, want none after the client left", w.headAt)
		}
	})
}

// TestStallNonStream: H1 — a non-stream stall "generates" N tokens (with the
// token delay), then holds without a status line until the client leaves.
func TestStallNonStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var end RequestEnd
		b, err := New(Options{TokenDelay: 10 * time.Millisecond, OnRequestEnd: func(e RequestEnd) { end = e }})
		if err != nil {
			t.Fatal(err)
		}
		w, cancel, done := serveInBubble(b, "/v1/messages", `{"model":"tiny+stall=3","max_tokens":9,`+hiMessages+`}`)
		time.Sleep(time.Hour) // bubble time: 3 token delays pass, then the stalled handler stays put
		synctest.Wait()
		if w.headAt >= 0 || b.Active() != 1 {
			t.Fatalf("during the stall: header at %s, active %d; want no header, 1 active", w.headAt, b.Active())
		}
		cancel()
		<-done
		if end.Outcome != OutcomeStalled || end.Tokens != 3 || end.Status != 0 || b.Active() != 0 {
			t.Errorf("RequestEnd: got %+v (active %d), want stalled after 3 tokens, no status, 0 active", end, b.Active())
		}
	})
}
