// Package direct is the write side of one framed connection shared by many
// goroutines: the Edge's HTTP handlers and its session writer, or the Node's
// run goroutines and its session writer.
//
// A sender that finds the connection free and nothing queued writes its
// frame itself, under a lock, instead of handing it to a writer goroutine
// (a "direct write": one goroutine wake-up less per frame, which on a busy
// 2-core host is most of a frame's cost). When the connection is busy, or
// frames are queued, the sender queues its frame and the connection's writer
// goroutine writes it with whatever else is queued, in one flush; the order
// on the wire is therefore the order of the Send and Enqueue calls that did
// not overlap. Flushes are combined: a frame written with Hold may wait in
// the buffer for the next frame's flush, at most HoldMax.
//
// The package owns the buffered writer, the queue and their lock. It
// starts no goroutine of its own (a Hold arms one timer, whose callback
// flushes) and logs nothing; the caller owns the connection's lifetime and
// ends it when a method returns a socket error.
package direct

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// Conn is what a Writer writes to: a net.Conn or *tls.Conn.
type Conn interface {
	io.Writer
	SetWriteDeadline(time.Time) error
}

// Defaults for Options' zero fields.
const (
	DefaultBufferSize = 32 << 10              // bytes: a burst shares one TLS record of up to 16 KiB
	DefaultQueue      = 256                   // frames
	DefaultMaxBurst   = 64                    // frames written between two flushes by Drain
	DefaultHoldMax    = 20 * time.Millisecond // a held frame is flushed after this at the latest
)

// Options configure a Writer; zero fields take the defaults above.
type Options struct {
	// BufferSize of the buffered writer in bytes.
	BufferSize int
	// Queue is the queue's length in frames.
	Queue int
	// MaxBurst bounds the frames Drain writes before it flushes, so a queue
	// that never empties still reaches the peer steadily.
	MaxBurst int
	// WriteTimeout is the deadline of every write that reaches the socket
	// (every network write has a deadline); required.
	WriteTimeout time.Duration
	// MaxFrame refuses frames over this many bytes (≤ 0: wire.DefaultMaxFrame).
	MaxFrame int
	// HoldMax bounds how long a frame written with Hold waits for a flush.
	HoldMax time.Duration
	// OnUnencodable, when set, is told of a queued envelope that cannot be
	// encoded (over MaxFrame, invalid UTF-8, no payload) and Drain goes on
	// with the next; when nil, Drain returns the error.
	OnUnencodable func(env *iop.Envelope, err error)
}

// Mode says when a frame must reach the socket.
type Mode uint8

const (
	// Flush: before Send returns, or by the writer goroutine's next flush
	// when frames are queued behind it (they are written right after it).
	Flush Mode = iota
	// Hold: the frame may wait for a later frame's flush, at most HoldMax
	// (for a frame that is known to be followed at once by another, e.g. a
	// tunnel's RESPONSE_START by its first BODY).
	Hold
)

// ErrUnencodable wraps why an envelope could not be encoded (a
// *wire.FrameError or a marshal error); nothing of it was written and the
// connection stays usable.
var ErrUnencodable = errors.New("direct: envelope not encodable")

// Writer is safe for concurrent use.
type Writer struct {
	o      Options
	conn   Conn
	queue  chan *iop.Envelope
	queued atomic.Int64 // frames queued and not yet written; counted before the channel send

	// sem is the lock (a one-slot channel rather than a sync.Mutex: a
	// writer goroutine waiting for it is durably blocked, which
	// testing/synctest needs to advance its clock past a stuck write). It
	// guards the fields below and every write to bw.
	sem       chan struct{}
	bw        *bufio.Writer
	buf       []byte // reused frame buffer
	want      bool   // a buffered frame asked for a flush
	holdTimer *time.Timer
	holdArmed bool
	err       error // sticky socket error
	closed    bool
}

// New returns a Writer over c. Nothing is written until a frame is sent.
func New(c Conn, o Options) *Writer {
	if o.BufferSize <= 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.MaxBurst <= 0 {
		o.MaxBurst = DefaultMaxBurst
	}
	if o.HoldMax <= 0 {
		o.HoldMax = DefaultHoldMax
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = wire.DefaultMaxFrame
	}
	return &Writer{o: o, conn: c, queue: make(chan *iop.Envelope, o.Queue), sem: make(chan struct{}, 1),
		bw: bufio.NewWriterSize(c, o.BufferSize)}
}

// Send writes env itself when no other goroutine holds the connection and
// nothing is queued; sent is false when it did not, and the caller must
// Enqueue env (nothing was written). err is an encoding error (a
// *wire.FrameError or a marshal error: nothing was written, sent is true so
// the caller does not retry) or the connection's socket error, sticky: the
// caller ends the connection. Send never waits for the lock, but a direct
// write may block up to WriteTimeout on a full socket.
func (w *Writer) Send(env *iop.Envelope, m Mode) (sent bool, err error) {
	if w.queued.Load() != 0 || !w.tryLock() {
		return false, nil
	}
	if w.queued.Load() != 0 { // queued while we took the lock: keep the order
		w.unlock()
		return false, nil
	}
	err = w.writeLocked(env, m)
	if err == nil {
		err = w.releaseFlush()
	}
	w.unlock()
	return true, err
}

// Enqueue queues env for the writer goroutine without blocking; false when
// the queue is full.
func (w *Writer) Enqueue(env *iop.Envelope) bool {
	w.queued.Add(1)
	select {
	case w.queue <- env:
		return true
	default:
		w.queued.Add(-1)
		return false
	}
}

// EnqueueWait queues env, waiting up to d for room; false when d passed or
// stop was closed first.
func (w *Writer) EnqueueWait(env *iop.Envelope, stop <-chan struct{}, d time.Duration) bool {
	if w.Enqueue(env) {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	w.queued.Add(1)
	select {
	case w.queue <- env:
		return true
	case <-stop:
	case <-t.C:
	}
	w.queued.Add(-1)
	return false
}

// Queue is the queue the writer goroutine receives from; what it receives
// it hands to Drain with fromQueue true.
func (w *Writer) Queue() <-chan *iop.Envelope { return w.queue }

// Queued reports the frames queued and not yet written.
func (w *Writer) Queued() int { return int(w.queued.Load()) }

// QueueCap reports the queue's length in frames.
func (w *Writer) QueueCap() int { return cap(w.queue) }

// Drain is the writer goroutine's write: env (taken from Queue when
// fromQueue, else its own frame such as a heartbeat ping; nil for none),
// then whatever else is queued, up to MaxBurst frames, then one flush. It
// returns the number of frames written and a socket error, or an encoding
// error when OnUnencodable is nil.
func (w *Writer) Drain(env *iop.Envelope, fromQueue bool) (int, error) {
	w.lock()
	defer w.unlock()
	n := 0
	for n < w.o.MaxBurst {
		if env == nil {
			select {
			case env = <-w.queue:
				fromQueue = true
			default:
			}
			if env == nil {
				break
			}
		}
		err := w.writeLocked(env, Hold)
		if fromQueue {
			w.queued.Add(-1)
		}
		switch {
		case err == nil:
			n++
		case errors.Is(err, ErrUnencodable) && w.o.OnUnencodable != nil:
			w.o.OnUnencodable(env, err)
		default:
			return n, err
		}
		env, fromQueue = nil, false
	}
	return n, w.flushLocked()
}

// Close stops the hold timer; later writes fail with io.ErrClosedPipe. It
// does not close the connection.
func (w *Writer) Close() {
	w.lock()
	defer w.unlock()
	w.closed = true
	if w.holdTimer != nil {
		w.holdTimer.Stop()
	}
}

// writeLocked encodes env into the buffer. A frame that does not fit the
// buffer's room makes the buffer reach the socket: the deadline is set
// first. Encoding errors leave the buffer as it was.
func (w *Writer) writeLocked(env *iop.Envelope, m Mode) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return io.ErrClosedPipe
	}
	frame, err := wire.AppendFrame(w.buf[:0], env, w.o.MaxFrame)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnencodable, err)
	}
	if len(frame) > w.bw.Available() {
		w.deadline()
	}
	_, err = w.bw.Write(frame)
	if cap(frame) <= maxRetainedFrame {
		w.buf = frame[:0]
	} else {
		w.buf = nil
	}
	if err != nil {
		w.err = err
		return err
	}
	if m == Flush {
		w.want = true
	}
	return nil
}

// maxRetainedFrame bounds the frame buffer kept between writes, in bytes.
const maxRetainedFrame = 64 << 10

// releaseFlush decides, before a direct sender lets go of the lock, who
// flushes: the sender when a buffered frame wants it and nothing is queued;
// the writer goroutine when frames are queued (its Drain ends with a flush);
// the hold timer when only held frames are buffered.
func (w *Writer) releaseFlush() error {
	if w.bw.Buffered() == 0 || w.queued.Load() != 0 {
		return nil
	}
	if w.want {
		return w.flushLocked()
	}
	if !w.holdArmed {
		w.holdArmed = true
		if w.holdTimer == nil {
			w.holdTimer = time.AfterFunc(w.o.HoldMax, w.flushHeld)
		} else {
			w.holdTimer.Reset(w.o.HoldMax)
		}
	}
	return nil
}

// flushHeld is the hold timer's callback. A socket error stays sticky for
// the next sender, who ends the connection.
func (w *Writer) flushHeld() {
	w.lock()
	defer w.unlock()
	w.holdArmed = false
	if !w.closed {
		_ = w.flushLocked()
	}
}

func (w *Writer) flushLocked() error {
	if w.err != nil {
		return w.err
	}
	w.want = false
	if w.bw.Buffered() == 0 {
		return nil
	}
	w.deadline()
	if err := w.bw.Flush(); err != nil {
		w.err = err
		return err
	}
	return nil
}

func (w *Writer) lock()   { w.sem <- struct{}{} }
func (w *Writer) unlock() { <-w.sem }

func (w *Writer) tryLock() bool {
	select {
	case w.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (w *Writer) deadline() { _ = w.conn.SetWriteDeadline(time.Now().Add(w.o.WriteTimeout)) }
