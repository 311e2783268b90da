package surface

import "strings"

// Text tracks the assistant text of one run for an encoder: what to send
// with each DELTA and what is left to send at COMPLETE.
//
// A non-stream response sends nothing before COMPLETE. A stream sends each
// delta as it comes, except with Hold: then the text from its first '{' or
// '`' on is held until COMPLETE, because only then is it known whether the
// run used the text tool-call fallback (SPEC E9), whose JSON must become
// tool calls and never reach the client as text. Hold is for leases whose
// adapter may use that fallback; an Ollama run never does (its tool calls
// are native), so its text is never held.
type Text struct {
	stream, hold      bool
	holding, streamed bool
	buf               []byte // non-stream: every delta; stream: the held tail
}

// Init makes t ready for one response.
func (t *Text) Init(stream, hold bool) { *t = Text{stream: stream, hold: hold} }

// Delta takes the next piece of text and returns the part to send now (""
// for none).
func (t *Text) Delta(d string) string {
	switch {
	case d == "":
		return ""
	case !t.stream, t.holding:
		t.buf = append(t.buf, d...)
		return ""
	}
	if t.hold {
		if k := strings.IndexAny(d, "{`"); k >= 0 {
			t.holding = true
			t.buf = append(t.buf, d[k:]...)
			d = d[:k]
		}
	}
	if d != "" {
		t.streamed = true
	}
	return d
}

// Rest returns, at COMPLETE, the text not sent yet: for a non-stream
// response the run's content (else the deltas); for a stream the held
// text, or the content when no delta was sent.
func (t *Text) Rest(content string) string {
	switch {
	case !t.stream:
		if content == "" {
			return string(t.buf)
		}
		return content
	case t.holding:
		return string(t.buf)
	case !t.streamed:
		return content
	}
	return ""
}

// Streamed reports whether any text was sent.
func (t *Text) Streamed() bool { return t.streamed }
