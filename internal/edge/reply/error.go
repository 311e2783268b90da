package reply

import (
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"iop/internal/edge/surface"
	"iop/internal/protocol"
)

// Error is the Edge's one client-visible failure type (surface.Error): the
// converters return it and every error answer is written from it.
type Error = surface.Error

// Surface is the API shape a request's errors take.
type Surface uint8

const (
	OpenAI    Surface = iota // {"error":{"message","type","param","code"}}
	Anthropic                // {"type":"error","error":{"type","message"}}
)

// BadGateway is a 502 server_error with code.
func BadGateway(code, msg string) *Error { return surface.BadGateway(code, msg) }

// AppendErrorBody appends e as a JSON error object in s's shape.
func AppendErrorBody(dst []byte, s Surface, e *Error) []byte {
	if s == Anthropic {
		return surface.AppendAnthropicError(dst, e)
	}
	return surface.AppendOpenAIError(dst, e)
}

// WriteError writes e as a complete HTTP error response in the surface's
// shape, with Retry-After in whole seconds (RFC 9110 §10.2.3) when set.
func WriteError(w http.ResponseWriter, s Surface, e *Error) {
	NoteError(w, e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	w.WriteHeader(e.Status)
	var buf [256]byte
	_, _ = w.Write(AppendErrorBody(buf[:0], s, e))
}

// AppendErrorEvent appends the SSE event that ends a stream which already
// sent bytes: OpenAI `data: {"error":{...}}`, Anthropic `event: error` with
// the error object as data.
//
// On the Responses API (operation protocol.OpResponses) it is the stream's
// `error` event: `event: error`, data {"type":"error","code","message","param"}
// as the API reference documents it, with the same error object under
// "error" as well, as the API itself sends it and as the official SDKs
// detect a failed stream (a top-level "error" member). Its
// sequence_number is left out: a tunnelled stream's numbers are the
// upstream's, which the Edge does not parse.
func AppendErrorEvent(dst []byte, s Surface, operation string, e *Error) []byte {
	switch {
	case s == Anthropic:
		dst = append(dst, "event: error\n"...)
	case operation == protocol.OpResponses:
		dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"code\":"...)
		dst = surface.AppendNullable(dst, e.Code)
		dst = append(dst, `,"message":`...)
		dst = surface.AppendString(dst, e.Message)
		dst = append(dst, `,"param":`...)
		dst = surface.AppendNullable(dst, e.Param)
		dst = append(dst, ',')
		body := surface.AppendOpenAIError(dst[len(dst):], e) // {"error":{…}}
		dst = append(dst, body[1:]...)
		return append(dst, '\n', '\n')
	}
	dst = append(dst, "data: "...)
	dst = AppendErrorBody(dst, s, e)
	return append(dst, '\n', '\n')
}

// Truncate shortens s to at most n bytes, cut at a UTF-8 boundary, for
// echoing in an error message.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
