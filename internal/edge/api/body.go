package api

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
)

// Request-body buffer policy in bytes (issue 12). A body is read into a
// buffer of at most bodyFirstBuffer bytes that doubles as bytes arrive, up
// to the declared Content-Length (or http.max_body_bytes without one): the
// Edge's memory follows what a client sent, never what it declared. A client
// that declares 8 MiB and sends one byte costs bodyFirstBuffer, not 8 MiB;
// one that sends its whole body costs under twice its size while it
// arrives and exactly its size after.
const bodyFirstBuffer = 4 << 10

// readBody reads the request body, at most max bytes: a declared or actual
// larger body is a 413 (http.MaxBytesReader also makes the server close the
// connection). The buffer grows with the bytes received (bodyFirstBuffer).
// A body that stops arriving ends with the connection's read deadline (408).
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, *apiError) {
	if r.ContentLength > max {
		return nil, tooLarge(max)
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return []byte{}, nil
	}
	// limit is the largest buffer the body can need: its declared length,
	// or one byte over the cap so that a longer body shows as one.
	limit := max + 1
	if r.ContentLength > 0 {
		limit = r.ContentLength
	}
	body := http.MaxBytesReader(w, r.Body, max)
	buf := make([]byte, 0, min(limit, bodyFirstBuffer))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) == limit {
				if r.ContentLength > 0 {
					return buf, nil // all of it
				}
				return nil, tooLarge(max) // MaxBytesReader reports this first
			}
			grown := make([]byte, len(buf), min(limit, 2*int64(cap(buf))))
			copy(grown, buf)
			buf = grown
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF:
			if r.ContentLength > 0 && int64(len(buf)) < r.ContentLength {
				return nil, readError(io.ErrUnexpectedEOF, max)
			}
			return buf, nil
		case err != nil:
			return nil, readError(err, max)
		}
	}
}

func tooLarge(max int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
		msg: "request body exceeds " + strconv.FormatInt(max, 10) + " bytes"}
}

func readError(err error, max int64) *apiError {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge(max)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &apiError{status: http.StatusRequestTimeout, typ: "invalid_request_error", code: "request_timeout",
			msg: "the request body did not arrive in time"}
	}
	return badRequest("", "could not read the request body: %v", err)
}
