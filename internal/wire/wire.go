// Package wire frames Envelopes on the Edge–Node connection (SPEC W1, W2, W5).
//
// A frame is a 4-byte big-endian length N followed by N bytes of one
// serialized iop.Envelope:
//
//	+----------------+---------------------------+
//	| length (4, BE) | Envelope (length bytes)    |
//	+----------------+---------------------------+
//
// A length of 0, or one above the reader's cap, is a protocol error reported
// before any body byte is read and before anything of that size is allocated.
// The cap is 64 KiB until the session is ready and 16 MiB after (docs/wire.md,
// "Timeouts and bounds"); SetMaxFrame moves it. Within the cap, a body longer than 64 KiB
// is buffered as its bytes arrive, so a peer that declares 16 MiB and sends
// ten bytes costs about 64 KiB, not 16 MiB.
//
// The package owns framing only: it starts no goroutines, touches no network
// and logs nothing. A Reader and a Writer are each for one goroutine: neither
// is safe for concurrent use.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// Frame size caps in bytes.
const (
	HeaderSize         = 4
	DefaultPreReadyCap = 64 << 10 // 64 KiB until the session is ready
	DefaultMaxFrame    = 16 << 20 // 16 MiB after (SPEC W1)
)

// Buffer policy in bytes: a body up to growStep is read into a buffer of its
// full length; a longer one grows by doubling from growStep as data arrives.
// Buffers above retainMax are not kept for the next frame (Reader and Writer),
// so one rare huge frame does not pin its memory for the connection's life.
const (
	growStep  = 64 << 10
	retainMax = 1 << 20
)

// Errors returned by Reader and Writer; test with errors.Is. Every one of
// them means the connection must be closed (SPEC W1, W5), except that an
// io.EOF from ReadFrame before any header byte is a clean close.
var (
	// ErrEmptyFrame: the length prefix was 0.
	ErrEmptyFrame = errors.New("wire: frame length 0")
	// ErrFrameTooLarge: the length prefix exceeded the cap.
	ErrFrameTooLarge = errors.New("wire: frame length over cap")
	// ErrTruncated: the stream ended inside a header or a body.
	ErrTruncated = errors.New("wire: truncated frame")
	// ErrMalformed: the body is not a valid protobuf Envelope.
	ErrMalformed = errors.New("wire: malformed envelope")
	// ErrNoPayload: the Envelope carries no payload this build knows. Unlike
	// the others this is not fatal for a reader: log and ignore the frame
	// (SPEC W5). A Writer returns it, writing nothing, for an Envelope whose
	// oneof is unset (SPEC W2).
	ErrNoPayload = errors.New("wire: envelope has no known payload")
)

// FrameError describes a rejected frame: its declared length and the cap in
// force, in bytes (0 = not known: a header cut short has no length, Decode has
// no cap). It wraps one of the sentinels above.
type FrameError struct {
	Length uint32
	Cap    uint32
	Err    error
}

func (e *FrameError) Error() string {
	switch {
	case e.Length == 0 && errors.Is(e.Err, ErrTruncated):
		return fmt.Sprintf("%v (inside the %d-byte header)", e.Err, HeaderSize)
	case e.Cap == 0:
		return fmt.Sprintf("%v (length %d bytes)", e.Err, e.Length)
	default:
		return fmt.Sprintf("%v (length %d bytes, cap %d bytes)", e.Err, e.Length, e.Cap)
	}
}

func (e *FrameError) Unwrap() error { return e.Err }

// Reader reads frames from an underlying io.Reader. Wrap a net.Conn in a
// bufio.Reader first when many small frames are expected.
type Reader struct {
	r   io.Reader
	cap uint32
	hdr [HeaderSize]byte
	buf []byte
}

// NewReader returns a Reader with the given cap in bytes (values ≤ 0 mean
// DefaultPreReadyCap).
func NewReader(r io.Reader, maxFrame int) *Reader {
	rd := &Reader{r: r}
	rd.SetMaxFrame(maxFrame)
	return rd
}

// SetMaxFrame changes the cap in bytes; ≤ 0 means DefaultPreReadyCap and
// values above 2^32−1 are clamped.
func (r *Reader) SetMaxFrame(n int) {
	switch {
	case n <= 0:
		r.cap = DefaultPreReadyCap
	case uint64(n) > uint64(^uint32(0)):
		r.cap = ^uint32(0)
	default:
		r.cap = uint32(n)
	}
}

// MaxFrame reports the cap in bytes.
func (r *Reader) MaxFrame() int { return int(r.cap) }

// ReadFrame reads one frame and returns its body (1 to MaxFrame bytes). The
// returned slice is owned by the Reader and valid only until the next call. It
// returns io.EOF when the stream ends cleanly between frames, a *FrameError
// wrapping ErrEmptyFrame, ErrFrameTooLarge or ErrTruncated for a bad frame
// (SPEC W1), and the underlying reader's error otherwise. The length is checked
// before any body byte is read or any buffer is grown; at steady state (bodies
// no larger than an earlier one, up to 1 MiB) it allocates nothing.
func (r *Reader) ReadFrame() ([]byte, error) {
	if n, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if err == io.EOF && n == 0 {
			return nil, io.EOF
		}
		if err == io.ErrUnexpectedEOF {
			return nil, &FrameError{Cap: r.cap, Err: ErrTruncated}
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(r.hdr[:])
	if n == 0 {
		return nil, &FrameError{Length: n, Cap: r.cap, Err: ErrEmptyFrame}
	}
	if n > r.cap {
		return nil, &FrameError{Length: n, Cap: r.cap, Err: ErrFrameTooLarge}
	}
	body, err := r.readBody(int(n))
	if err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, &FrameError{Length: n, Cap: r.cap, Err: ErrTruncated}
		}
		return nil, err
	}
	return body, nil
}

// readBody reads exactly n bytes (0 < n ≤ cap). The reused buffer serves when
// it is large enough; otherwise it starts at min(n, growStep) bytes and doubles
// as bytes arrive, so memory follows what the peer actually sent.
func (r *Reader) readBody(n int) ([]byte, error) {
	buf := r.buf[:0]
	if cap(buf) < n && cap(buf) < growStep {
		buf = make([]byte, 0, min(n, growStep))
	}
	for len(buf) < n {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(n, 2*cap(buf)))
			copy(grown, buf)
			buf = grown
		}
		m, err := io.ReadFull(r.r, buf[len(buf):min(n, cap(buf))])
		buf = buf[:len(buf)+m]
		if err != nil {
			return nil, err
		}
	}
	if cap(buf) <= retainMax {
		r.buf = buf
	}
	return buf, nil
}

// ReadEnvelope reads one frame and decodes it into env, which is reset first.
// Decoded byte fields are copies: env stays valid after the next call. An
// envelope with no known payload is decoded and returned together with
// ErrNoPayload (log and ignore it, SPEC W5); invalid protobuf returns a
// *FrameError wrapping ErrMalformed.
func (r *Reader) ReadEnvelope(env *iop.Envelope) error {
	body, err := r.ReadFrame()
	if err != nil {
		return err
	}
	err = Decode(body, env)
	if fe, ok := err.(*FrameError); ok {
		fe.Cap = r.cap
	}
	return err
}

// Decode decodes one frame body into env (reset first); errors as ReadEnvelope
// (SPEC W5). Byte and string fields are copied out of body.
func Decode(body []byte, env *iop.Envelope) error {
	proto.Reset(env)
	if err := proto.Unmarshal(body, env); err != nil {
		return &FrameError{Length: uint32(len(body)), Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	if env.Kind == nil {
		return ErrNoPayload
	}
	return nil
}

// Writer writes frames to an underlying io.Writer, one Write call per frame.
// It reuses one buffer across calls.
type Writer struct {
	w   io.Writer
	max uint32
	buf []byte
}

// NewWriter returns a Writer that refuses frames over maxFrame bytes (≤ 0 means
// DefaultMaxFrame): a peer would reject them anyway.
func NewWriter(w io.Writer, maxFrame int) *Writer {
	wr := &Writer{w: w}
	wr.SetMaxFrame(maxFrame)
	return wr
}

// SetMaxFrame changes the Writer's cap in bytes, e.g. to the peer's pre-ready
// cap; ≤ 0 means DefaultMaxFrame, values above 2^32−1 are clamped.
func (w *Writer) SetMaxFrame(n int) {
	switch {
	case n <= 0:
		w.max = DefaultMaxFrame
	case uint64(n) > uint64(^uint32(0)):
		w.max = ^uint32(0)
	default:
		w.max = uint32(n)
	}
}

// MaxFrame reports the Writer's cap in bytes.
func (w *Writer) MaxFrame() int { return int(w.max) }

// WriteEnvelope serializes env and writes it as one frame with one Write call.
// Nothing is written when it returns a *FrameError: ErrFrameTooLarge when the
// serialized size exceeds the Writer's cap, ErrEmptyFrame for an empty (or
// nil) Envelope, ErrNoPayload for one whose oneof is unset (SPEC W1, W2).
// Otherwise it returns the underlying write error, if any.
func (w *Writer) WriteEnvelope(env *iop.Envelope) error {
	buf, err := AppendFrame(w.buf[:0], env, int(w.max))
	if err != nil {
		return err
	}
	w.buf = buf
	_, err = w.w.Write(buf)
	if cap(w.buf) > retainMax { // do not pin a rare huge frame's buffer
		w.buf = nil
	}
	return err
}

// WriteFrame writes an already serialized Envelope body as one frame.
func (w *Writer) WriteFrame(body []byte) error {
	if len(body) == 0 {
		return &FrameError{Cap: w.max, Err: ErrEmptyFrame}
	}
	if uint64(len(body)) > uint64(w.max) {
		return &FrameError{Length: clampLen(len(body)), Cap: w.max, Err: ErrFrameTooLarge}
	}
	buf := binary.BigEndian.AppendUint32(w.buf[:0], uint32(len(body)))
	buf = append(buf, body...)
	w.buf = buf
	_, err := w.w.Write(buf)
	if cap(w.buf) > retainMax {
		w.buf = nil
	}
	return err
}

// AppendFrame appends env as one frame (header and body) to dst and returns
// the extended slice. maxFrame ≤ 0 means DefaultMaxFrame. On error it returns
// dst unextended and a *FrameError as WriteEnvelope, or a marshal error.
func AppendFrame(dst []byte, env *iop.Envelope, maxFrame int) ([]byte, error) {
	limit := uint64(DefaultMaxFrame)
	if maxFrame > 0 {
		limit = uint64(maxFrame)
	}
	if env.GetKind() == nil {
		if proto.Size(env) == 0 {
			return dst, &FrameError{Err: ErrEmptyFrame}
		}
		return dst, &FrameError{Err: fmt.Errorf("%w: oneof kind is unset", ErrNoPayload)}
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	out, err := proto.MarshalOptions{}.MarshalAppend(dst, env)
	if err != nil {
		return dst[:start], fmt.Errorf("wire: marshal envelope: %w", err)
	}
	n := len(out) - start - HeaderSize
	if n == 0 {
		return out[:start], &FrameError{Err: ErrEmptyFrame}
	}
	if uint64(n) > limit {
		return out[:start], &FrameError{Length: clampLen(n), Cap: uint32(min(limit, uint64(^uint32(0)))), Err: ErrFrameTooLarge}
	}
	binary.BigEndian.PutUint32(out[start:], uint32(n))
	return out, nil
}

func clampLen(n int) uint32 {
	if uint64(n) > uint64(^uint32(0)) {
		return ^uint32(0)
	}
	return uint32(n)
}
