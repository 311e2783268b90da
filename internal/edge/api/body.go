package api

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"iop/internal/edge/limit"
	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
)

// Request-body buffer policy in bytes (B1). A body is read into a
// buffer of at most bodyFirstBuffer bytes that doubles as bytes arrive, up
// to the declared Content-Length (or http.max_body_bytes without one): the
// Edge's memory follows what a client sent, never what it declared. A client
// that declares 8 MiB and sends one byte costs bodyFirstBuffer, not 8 MiB;
// one that sends its whole body costs under twice its size while it
// arrives and exactly its size after.
const bodyFirstBuffer = 4 << 10

// errBodyBudget: the body's next bytes would pass the in-flight budget.
var errBodyBudget = errors.New("api: request bodies in flight over http.max_inflight_body_bytes")

// readBody reads the request body, at most max bytes: a declared or actual
// larger body is a 413 (http.MaxBytesReader also makes the server close the
// connection). The buffer grows with the bytes received (bodyFirstBuffer),
// and each growth is reserved in budget first (nil: not counted): on
// success cap(body) bytes stay reserved, on failure none. A body that stops
// arriving ends with the connection's read deadline (408). The error is an
// *reply.Error or errBodyBudget. A body with a Content-Encoding other than
// identity is a 415 before any byte is read.
func readBody(w http.ResponseWriter, r *http.Request, max int64, budget *limit.Budget) (body []byte, err error) {
	if ce := strings.TrimSpace(r.Header.Get("Content-Encoding")); ce != "" && !strings.EqualFold(ce, "identity") {
		// The Edge reads the JSON body to route it (model, stream) and
		// does not decompress: 415 as RFC 9110 §15.5.16 says for an
		// unsupported content coding, naming it.
		return nil, &reply.Error{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Param: "Content-Encoding",
			Message: fmt.Sprintf("Content-Encoding %.32q is not supported: send the request body uncompressed", ce)}
	}
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
	var reserved int64
	defer func() {
		if err != nil && budget != nil {
			budget.Release(reserved)
		}
	}()
	grow := func(buf []byte, size int64) ([]byte, bool) {
		if budget != nil && !budget.Reserve(size-int64(cap(buf))) {
			return buf, false
		}
		reserved += size - int64(cap(buf))
		grown := make([]byte, len(buf), size)
		copy(grown, buf)
		return grown, true
	}
	in := http.MaxBytesReader(w, r.Body, max)
	buf, ok := grow(nil, min(limit, bodyFirstBuffer))
	if !ok {
		return nil, errBodyBudget
	}
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) == limit {
				if r.ContentLength > 0 {
					return buf, nil // all of it
				}
				return nil, tooLarge(max) // MaxBytesReader reports this first
			}
			if buf, ok = grow(buf, min(limit, 2*int64(cap(buf)))); !ok {
				return nil, errBodyBudget
			}
		}
		n, err := in.Read(buf[len(buf):cap(buf)])
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

func tooLarge(max int64) *reply.Error {
	return &reply.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: "request body exceeds " + strconv.FormatInt(max, 10) + " bytes"}
}

func readError(err error, max int64) *reply.Error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge(max)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &reply.Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
			Message: "the request body did not arrive in time"}
	}
	e := apisurface.BadRequest("", "could not read the request body: %v", err)
	// The connection ended before the body did: net/http reports a body
	// cut short of its Content-Length (or a chunked body cut) as
	// io.ErrUnexpectedEOF; a reset is ECONNRESET. Either way the client
	// left (A1: client_cancelled, not a rejected request).
	e.ClientGone = errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
	return e
}
