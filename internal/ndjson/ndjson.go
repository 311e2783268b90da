// Package ndjson reads newline-delimited JSON streams (NDJSON / JSON Lines),
// such as Ollama's native /api/chat stream (SPEC E8).
//
// The package owns line framing only: it never decodes the JSON of a line,
// starts no goroutines, touches no network and logs nothing. A Reader is for
// one goroutine at a time and reuses its buffers, so a returned line stays
// valid only until the next call.
package ndjson

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxLine is the default cap on one line, in bytes (4 MiB).
const DefaultMaxLine = 4 << 20

// ErrLineTooLong: a line exceeded the reader's cap. It is sticky.
var ErrLineTooLong = errors.New("ndjson: line too long")

// Reader returns the lines of an NDJSON stream. A line ends at "\n"; a "\r"
// before it is dropped (CRLF input), blank lines (only spaces, tabs or "\r")
// are skipped, and a last line without "\n" is returned before io.EOF.
type Reader struct {
	br   *bufio.Reader
	max  int
	long []byte // a line that spans more than one buffer
	err  error
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
	return &Reader{br: bufio.NewReaderSize(r, size), max: maxLine}
}

// Next returns the next non-blank line without its line ending. The slice is
// valid until the next call. It returns io.EOF at the end of the stream, the
// underlying reader's error after the lines read before it, or
// ErrLineTooLong.
func (r *Reader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	for {
		line, err := r.readLine()
		if err != nil {
			r.err = err
			if err == io.EOF && !blank(line) {
				return line, nil // last line without "\n"
			}
			return nil, err
		}
		if !blank(line) {
			return line, nil
		}
	}
}

// LineBuffered reports whether a whole line is already buffered, so that
// the next Next returns without reading: a consumer can pass on what it
// got so far in one piece instead of one piece per line, without waiting
// for anything that has not arrived.
func (r *Reader) LineBuffered() bool {
	n := r.br.Buffered()
	if n == 0 {
		return false
	}
	b, _ := r.br.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

// readLine returns one line without "\n" and a trailing "\r". On an error it
// returns the unterminated rest it had read.
func (r *Reader) readLine() ([]byte, error) {
	r.long = r.long[:0]
	for {
		frag, err := r.br.ReadSlice('\n')
		if err == nil {
			var line []byte
			if len(r.long) == 0 {
				line = frag[:len(frag)-1]
			} else {
				if len(r.long)+len(frag)-1 > r.max {
					return nil, fmt.Errorf("%w: over %d bytes", ErrLineTooLong, r.max)
				}
				r.long = append(r.long, frag[:len(frag)-1]...)
				line = r.long
			}
			if len(line) > r.max {
				return nil, fmt.Errorf("%w: over %d bytes", ErrLineTooLong, r.max)
			}
			return trimCR(line), nil
		}
		if len(r.long)+len(frag) > r.max {
			return nil, fmt.Errorf("%w: over %d bytes", ErrLineTooLong, r.max)
		}
		r.long = append(r.long, frag...)
		if err != bufio.ErrBufferFull {
			return trimCR(r.long), err
		}
	}
}

func trimCR(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\r' {
		return b[:n-1]
	}
	return b
}

func blank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}
