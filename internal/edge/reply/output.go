package reply

import "net/http"

// Output is a response being written: every Send is written and flushed at
// once, so each SSE event reaches the client as it is produced, except
// within a burst (Batch).
type Output struct {
	W http.ResponseWriter
	// Batch: more frames of the stream are already queued; flush is left
	// to the last of them (one client write per burst, SPEC T2). dirty: a
	// flush was skipped for it; EndBurst does it.
	Batch bool
	dirty bool
}

// Send writes p and flushes; an error means the client is gone.
func (o *Output) Send(p []byte) error {
	if _, err := o.W.Write(p); err != nil {
		return err
	}
	return o.Flush()
}

// EndBurst flushes what a burst left unflushed: its last frame may write
// nothing of its own (USAGE, RESPONSE_START) and so never flush.
func (o *Output) EndBurst() error {
	if o.Batch || !o.dirty {
		return nil
	}
	return o.Flush()
}

// Flush flushes the response, reporting the error when the writer can (as
// net/http's does); wrapped writers go through http.ResponseController.
func (o *Output) Flush() error {
	if o.Batch {
		o.dirty = true
		return nil
	}
	o.dirty = false
	switch f := o.W.(type) {
	case interface{ FlushError() error }:
		return f.FlushError()
	case http.Flusher:
		f.Flush()
		return nil
	default:
		return http.NewResponseController(o.W).Flush()
	}
}
