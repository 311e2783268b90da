// Package logbuf buffers a process's log lines so that a request's line
// (the edge's access line, the node's "run done") does not cost a
// write(2) of its own (SPEC A1: still one line per request, none lost on a
// graceful stop).
//
// A Writer takes whole lines (slog's handlers write each record with one
// Write) and passes them on in order, several per write: when the buffer
// would pass its size, at most Delay after the first line it holds, at
// once for a record of level Warn or above (Handler), and on Close, after
// which every write goes straight through. A process killed with SIGKILL,
// or dying of a runtime fatal error or an unrecovered panic, loses the
// lines it still held: at most Delay's worth and at most Size bytes
// (docs/operating.md, "Logs").
//
// It starts no goroutine of its own: the delay is a time.AfterFunc timer,
// armed only while lines wait. A Writer is safe for concurrent use.
package logbuf

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// Defaults of New for a size or delay ≤ 0.
const (
	DefaultSize  = 16 << 10              // bytes held before a write
	DefaultDelay = 50 * time.Millisecond // longest a line waits
)

// Writer is a buffered io.Writer of whole log lines; see the package doc.
type Writer struct {
	out   io.Writer
	size  int
	delay time.Duration

	mu     sync.Mutex
	buf    []byte      // lines held, whole; cap size
	timer  *time.Timer // nil until the first line was held
	armed  bool        // the timer will flush
	closed bool        // Close ran: writes go straight to out
	err    error       // the first error out returned
}

// New returns a Writer in front of out that holds at most size bytes
// (DefaultSize for ≤ 0) for at most delay (DefaultDelay for ≤ 0).
func New(out io.Writer, size int, delay time.Duration) *Writer {
	if size <= 0 {
		size = DefaultSize
	}
	if delay <= 0 {
		delay = DefaultDelay
	}
	return &Writer{out: out, size: size, delay: delay}
}

// Write holds p (one or more whole lines) and returns len(p), nil: the
// line is taken. A p of Size bytes or more, or any p after Close, is
// written through at once (what was held first), and then its error is
// returned. An error of a later write is kept for Flush and Close.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || len(p) >= w.size {
		w.flushLocked()
		n, err := w.out.Write(p)
		w.keep(err)
		return n, err
	}
	if len(w.buf)+len(p) > w.size {
		w.flushLocked()
	}
	if w.buf == nil {
		w.buf = make([]byte, 0, w.size)
	}
	w.buf = append(w.buf, p...)
	if !w.armed {
		w.armed = true
		if w.timer == nil {
			w.timer = time.AfterFunc(w.delay, w.fire)
		} else {
			w.timer.Reset(w.delay)
		}
	}
	return len(p), nil
}

// fire is the timer's flush.
func (w *Writer) fire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	w.flushLocked()
}

// Flush writes what is held now; it returns the first error out returned
// so far.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
	return w.err
}

// Close writes what is held, stops the timer and makes every later write
// go straight through; it returns the first error out returned. Calling
// it again is harmless.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.armed = false
	w.flushLocked()
	w.buf = nil
	return w.err
}

func (w *Writer) flushLocked() {
	if len(w.buf) == 0 {
		return
	}
	_, err := w.out.Write(w.buf)
	w.keep(err)
	w.buf = w.buf[:0]
}

func (w *Writer) keep(err error) {
	if w.err == nil {
		w.err = err
	}
}

// Handler wraps h, whose output is w, so that a record of level Warn or
// above is written out at once with everything held before it.
func (w *Writer) Handler(h slog.Handler) slog.Handler { return flushing{h, w} }

type flushing struct {
	slog.Handler
	w *Writer
}

func (h flushing) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		h.w.Flush()
	}
	return err
}

func (h flushing) WithAttrs(as []slog.Attr) slog.Handler {
	return flushing{h.Handler.WithAttrs(as), h.w}
}

func (h flushing) WithGroup(name string) slog.Handler {
	return flushing{h.Handler.WithGroup(name), h.w}
}
