package surface

import iop "iop/proto/gen/iop"

// Encoder turns the RunEvents of one normalized run (SPEC E3) into one
// client surface's response body. Not safe for concurrent use; one per
// request.
//
// Event appends to dst what ev adds to the response and returns the
// extended buffer: for a stream, the SSE events to write and flush now
// (possibly none, while text is held); for a non-stream request, nothing
// until COMPLETE and then the whole JSON body. done is true after the
// terminal. A non-nil err (a malformed COMPLETE) ends the response: the
// caller answers it as an error response before any byte, else with
// AppendError. Event handles START, DELTA and COMPLETE and ignores unknown
// kinds (SPEC W5); ERROR and CANCELLED are the caller's, which maps the
// node's failure to an Error.
//
// AppendError appends the event that ends a stream which already sent
// bytes with e, in the surface's own shape.
//
// The bytes appended never alias dst's earlier contents or ev's fields, so
// dst may be a pooled buffer reused once written.
type Encoder interface {
	Event(dst []byte, ev *iop.RunEvent) (out []byte, done bool, err *Error)
	AppendError(dst []byte, e *Error) []byte
}
