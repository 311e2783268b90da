// Package sse reads and writes Server-Sent Events streams (text/event-stream,
// WHATWG HTML Living Standard §9.2 "Server-sent events").
//
// The node's OpenAI-compatible adapter reads provider streams with Reader; the
// edge's HTTP surface writes client streams with Writer. Both are
// allocation-lean: a Reader reuses its buffers, and the slices of an Event
// stay valid only until the next call to Next.
//
// The package owns the event-stream syntax only. It never interprets the data
// of an event (no JSON, no "[DONE]" handling), starts no goroutines, touches no
// network and logs nothing. A Reader or a Writer is for one goroutine at a
// time.
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxLine is the default cap on one line of a stream, in bytes (1 MiB).
// The data of one event may be larger (it spans several lines) but is capped
// at the same value times four.
const DefaultMaxLine = 1 << 20

// Errors returned by Reader.Next; test with errors.Is.
var (
	// ErrLineTooLong: one line exceeded the reader's line cap.
	ErrLineTooLong = errors.New("sse: line too long")
	// ErrEventTooLarge: the data of one event exceeded 4× the line cap.
	ErrEventTooLarge = errors.New("sse: event data too large")
)

// Event is one dispatched event. Type is the "event:" field (empty means the
// default type "message"); Data is the concatenation of its "data:" lines
// joined by "\n" without the final newline; ID is the last "id:" field seen on
// the stream so far (the spec's last event ID). The slices are owned by the
// Reader and valid only until the next call to Next.
type Event struct {
	Type []byte
	Data []byte
	ID   []byte
}

// Reader parses an event stream from an io.Reader. It accepts the three line
// endings of the spec ("\r\n", "\n", "\r"), also when a "\r\n" pair is split
// across two reads, comment lines (":" first), the fields event, data, id and
// retry (retry is ignored: reconnection is the caller's business), a single
// space after the colon, and fields without a colon.
//
// One deliberate difference from the spec: an event still pending when the
// stream ends (the last blank line is missing) is dispatched rather than
// discarded, so a server that omits the final blank line loses nothing.
type Reader struct {
	r       io.Reader
	maxLine int

	buf        []byte // read buffer; buf[start:end] is unread
	start, end int
	skipLF     bool  // the previous line ended with '\r': drop one leading '\n'
	err        error // sticky read error, reported after buffered lines

	typ     []byte
	data    []byte
	hasData bool
	id      []byte
}

// NewReader returns a Reader over r. maxLine caps one line in bytes; values
// ≤ 0 mean DefaultMaxLine.
func NewReader(r io.Reader, maxLine int) *Reader {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	size := 4096
	if size > maxLine {
		size = maxLine
	}
	return &Reader{r: r, maxLine: maxLine, buf: make([]byte, size)}
}

// Next returns the next event. At the end of the stream it returns io.EOF
// (after dispatching a pending event, see Reader); a read error of the
// underlying reader is returned as is, after the events completed before it.
// ErrLineTooLong and ErrEventTooLarge are sticky: the stream cannot be
// resynchronized after them.
func (r *Reader) Next() (Event, error) {
	r.typ = r.typ[:0]
	r.data = r.data[:0]
	r.hasData = false
	for {
		line, err := r.readLine()
		if err != nil {
			if err == io.EOF && r.hasData {
				return r.dispatch(), nil
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if r.hasData {
				return r.dispatch(), nil
			}
			r.typ = r.typ[:0] // spec: an empty event resets the type
			continue
		}
		if line[0] == ':' {
			continue // comment
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) { // no allocation: compiler-optimized comparison
		case "event":
			r.typ = append(r.typ[:0], value...)
		case "data":
			if len(r.data)+len(value)+1 > 4*r.maxLine {
				r.err = fmt.Errorf("%w: over %d bytes", ErrEventTooLarge, 4*r.maxLine)
				return Event{}, r.err
			}
			r.data = append(r.data, value...)
			r.data = append(r.data, '\n')
			r.hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.id = append(r.id[:0], value...)
			}
		}
	}
}

func (r *Reader) dispatch() Event {
	data := r.data
	if n := len(data); n > 0 && data[n-1] == '\n' {
		data = data[:n-1]
	}
	r.hasData = false
	return Event{Type: r.typ, Data: data, ID: r.id}
}

// readLine returns the next line without its terminator. The slice aliases
// the read buffer and is valid until the next call. At the end of the stream
// an unterminated last line is returned first, then the sticky error.
func (r *Reader) readLine() ([]byte, error) {
	scanned := 0 // bytes of buf[start:end] known to hold no line ending
	for {
		if r.skipLF && r.start < r.end {
			if r.buf[r.start] == '\n' {
				r.start++
			}
			r.skipLF = false
		}
		unread := r.buf[r.start:r.end]
		if i := indexEOL(unread[scanned:]); i >= 0 {
			i += scanned
			line := unread[:i]
			if unread[i] == '\r' {
				r.skipLF = true
			}
			r.start += i + 1
			return line, nil
		}
		scanned = len(unread)
		if r.err != nil {
			if len(unread) > 0 {
				r.start = r.end
				return unread, nil
			}
			return nil, r.err
		}
		if len(unread) >= r.maxLine {
			r.err = fmt.Errorf("%w: over %d bytes", ErrLineTooLong, r.maxLine)
			return nil, r.err
		}
		r.fill()
	}
}

// fill makes room in the buffer (compacting, then growing up to maxLine+1
// bytes) and reads once from the underlying reader.
func (r *Reader) fill() {
	if r.start > 0 {
		n := copy(r.buf, r.buf[r.start:r.end])
		r.start, r.end = 0, n
	}
	if r.end == len(r.buf) {
		size := 2 * len(r.buf)
		if size > r.maxLine+1 {
			size = r.maxLine + 1
		}
		nb := make([]byte, size)
		copy(nb, r.buf[:r.end])
		r.buf = nb
	}
	for tries := 0; tries < 100; tries++ {
		n, err := r.r.Read(r.buf[r.end:])
		r.end += n
		if err != nil {
			r.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	r.err = io.ErrNoProgress
}

// indexEOL returns the index of the first '\r' or '\n' in b, or -1.
func indexEOL(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.IndexByte(b, '\r')
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	return i
}
