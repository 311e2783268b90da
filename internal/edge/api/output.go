package api

import "net/http"

// output is a response being written: every send is written and flushed at
// once, so each SSE event reaches the client as it is produced.
type output struct {
	w http.ResponseWriter
	// batch: more frames of the stream are already queued; flush is left
	// to the last of them (one client write per burst, SPEC T2). dirty: a
	// flush was skipped for it; endBurst does it.
	batch, dirty bool
}

func newOutput(w http.ResponseWriter) *output { return &output{w: w} }

// send writes p and flushes; an error means the client is gone.
func (o *output) send(p []byte) error {
	if _, err := o.w.Write(p); err != nil {
		return err
	}
	return o.flush()
}

// endBurst flushes what a burst left unflushed: its last frame may write
// nothing of its own (USAGE, RESPONSE_START) and so never flush.
func (o *output) endBurst() error {
	if o.batch || !o.dirty {
		return nil
	}
	return o.flush()
}

// flush flushes the response, reporting the error when the writer can (as
// net/http's does); wrapped writers go through http.ResponseController.
func (o *output) flush() error {
	if o.batch {
		o.dirty = true
		return nil
	}
	o.dirty = false
	switch f := o.w.(type) {
	case interface{ FlushError() error }:
		return f.FlushError()
	case http.Flusher:
		f.Flush()
		return nil
	default:
		return http.NewResponseController(o.w).Flush()
	}
}
