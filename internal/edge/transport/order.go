package transport

import (
	"fmt"

	iop "iop/proto/gen/iop"
)

// order checks the envelopes of one stream against the order the node must
// keep (B1):
//
//	run     (SPEC E3): START DELTA* (COMPLETE | ERROR | CANCELLED)
//	tunnel  (SPEC T2): RESPONSE_START? (BODY | USAGE)* (END | ERROR)
//
// with seq strictly increasing from 1 in both. Two allowances: an ERROR or
// CANCELLED terminal may come without START (a node refuses a run at its
// boundary, e.g. a duplicate run id, with a lone ERROR), and an event type
// this Edge does not know is ordered by seq only (SPEC W5: a newer node's
// kinds are ignored). It is a pure value: step decides, the session acts.
type order struct {
	tunnel  bool   // the stream is a tunnel; a run otherwise
	seq     uint64 // of the last envelope accepted; 0 before the first
	started bool   // run: START seen; tunnel: RESPONSE_START seen
	body    bool   // tunnel: BODY or USAGE seen (RESPONSE_START may not follow)
}

// OrderError is a stream's envelope out of order; the stream fails with
// dispatch.ErrProtocol and the envelope is never delivered.
type OrderError struct {
	Seq, LastSeq uint64
	What         string // "DELTA before START", "seq not increasing", …
}

func (e *OrderError) Error() string {
	return fmt.Sprintf("stream out of order: %s (seq %d after %d)", e.What, e.Seq, e.LastSeq)
}

// step checks env, the stream's next envelope, and on success advances the
// order. terminal reports whether env ends the stream. A violation changes
// nothing and returns an *OrderError.
func (o *order) step(env *iop.Envelope) (terminal bool, err error) {
	var seq uint64
	var what string
	switch k := env.GetKind().(type) {
	case *iop.Envelope_RunEvent:
		if o.tunnel {
			return false, &OrderError{Seq: k.RunEvent.GetSeq(), LastSeq: o.seq, What: "run event on a tunnel"}
		}
		seq = k.RunEvent.GetSeq()
		switch k.RunEvent.GetType() {
		case iop.RunEventType_RUN_EVENT_START:
			if o.started || o.seq != 0 {
				what = "START not first"
			}
		case iop.RunEventType_RUN_EVENT_DELTA:
			if !o.started {
				what = "DELTA before START"
			}
		case iop.RunEventType_RUN_EVENT_COMPLETE:
			if !o.started {
				what = "COMPLETE before START"
			}
			terminal = true
		case iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
			terminal = true
		}
	case *iop.Envelope_TunnelFrame:
		if !o.tunnel {
			return false, &OrderError{Seq: k.TunnelFrame.GetSeq(), LastSeq: o.seq, What: "tunnel frame on a run"}
		}
		seq = k.TunnelFrame.GetSeq()
		switch k.TunnelFrame.GetKind() {
		case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
			if o.started || o.body {
				what = "RESPONSE_START not first"
			}
		case iop.TunnelFrameKind_TUNNEL_FRAME_BODY, iop.TunnelFrameKind_TUNNEL_FRAME_USAGE:
		case iop.TunnelFrameKind_TUNNEL_FRAME_END, iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
			terminal = true
		}
	default:
		return false, &OrderError{LastSeq: o.seq, What: fmt.Sprintf("%T on a stream", k)}
	}
	if what == "" && seq <= o.seq {
		what = "seq not increasing"
	}
	if what != "" {
		return false, &OrderError{Seq: seq, LastSeq: o.seq, What: what}
	}
	o.seq = seq
	switch k := env.GetKind().(type) {
	case *iop.Envelope_RunEvent:
		if k.RunEvent.GetType() == iop.RunEventType_RUN_EVENT_START {
			o.started = true
		}
	case *iop.Envelope_TunnelFrame:
		switch k.TunnelFrame.GetKind() {
		case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
			o.started = true
		case iop.TunnelFrameKind_TUNNEL_FRAME_BODY, iop.TunnelFrameKind_TUNNEL_FRAME_USAGE:
			o.body = true
		}
	}
	return terminal, nil
}
