package sse

import (
	"errors"
	"io"
	"strings"
)

// ErrInvalidEventName: an event name contained '\r' or '\n', which would
// break the stream's framing.
var ErrInvalidEventName = errors.New("sse: event name contains a line break")

// Writer writes events in the text/event-stream format. Each event goes to
// the underlying writer in a single Write call; the Writer never flushes (an
// http.ResponseWriter caller flushes after WriteEvent). Not safe for
// concurrent use.
type Writer struct {
	w   io.Writer
	buf []byte // reused encoding buffer
}

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteEvent writes one event: an "event:" line when event is non-empty, one
// "data:" line per line of data (data may contain "\n", "\r\n" or "\r"; each
// becomes a separate data line, so a reader gets back data with "\n"), then
// the blank line that dispatches it. It returns ErrInvalidEventName for a
// name with a line break, or the underlying writer's error.
func (w *Writer) WriteEvent(event string, data []byte) error {
	b, err := AppendEvent(w.buf[:0], event, data)
	if err != nil {
		return err
	}
	w.buf = b
	_, err = w.w.Write(b)
	return err
}

// WriteComment writes a comment (":" line) and a blank line, e.g. as a
// keep-alive that readers ignore. Line breaks in text start new comment
// lines.
func (w *Writer) WriteComment(text string) error {
	b := w.buf[:0]
	for {
		i := strings.IndexAny(text, "\r\n")
		if i < 0 {
			break
		}
		b = append(b, ':')
		b = append(b, text[:i]...)
		b = append(b, '\n')
		if text[i] == '\r' && i+1 < len(text) && text[i+1] == '\n' {
			i++
		}
		text = text[i+1:]
	}
	b = append(b, ':')
	b = append(b, text...)
	b = append(b, '\n', '\n')
	w.buf = b
	_, err := w.w.Write(b)
	return err
}

// WriteEvent writes one event to w; see Writer.WriteEvent. It allocates one
// buffer per call; use a Writer to reuse it.
func WriteEvent(w io.Writer, event string, data []byte) error {
	b, err := AppendEvent(nil, event, data)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// AppendEvent appends the encoding of one event to dst and returns the
// extended slice; see Writer.WriteEvent.
func AppendEvent(dst []byte, event string, data []byte) ([]byte, error) {
	if strings.ContainsAny(event, "\r\n") {
		return dst, ErrInvalidEventName
	}
	if event != "" {
		dst = append(dst, "event: "...)
		dst = append(dst, event...)
		dst = append(dst, '\n')
	}
	for {
		i := indexEOL(data)
		if i < 0 {
			break
		}
		dst = append(dst, "data: "...)
		dst = append(dst, data[:i]...)
		dst = append(dst, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	dst = append(dst, '\n', '\n')
	return dst, nil
}
