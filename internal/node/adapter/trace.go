package adapter

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"iop/internal/node/adapter/upstream"
	iop "iop/proto/gen/iop"
)

// spanRecorder records the node's spans of one traced run or tunnel (the
// proto's TraceContext and NodeSpan; docs/operating.md "Tracing"): its own
// span (RUN or TUNNEL, from Run's or Tunnel's start to the terminal) and
// the UPSTREAM span of the provider call (from its first request to the
// call's return), whose id is the parent-id of the traceparent the backend
// gets. Times are offsets from the start; the Edge anchors them. A nil
// *spanRecorder (no or an invalid TraceContext) records nothing and sends
// no trace header.
type spanRecorder struct {
	kind      iop.NodeSpanKind
	traceID   [16]byte
	parent    [8]byte // the Edge's attempt span
	self, up  [8]byte // this span's id, the upstream span's id
	sampled   bool
	start     time.Time
	call      *upstream.Trace
	returnedA atomic.Int64 // ns from start at the provider call's return; 0 = not yet
}

// newSpanRecorder returns the recorder of a request carrying tc, or nil
// when tc is absent or invalid: an id of the wrong length or all zeros, or
// a tracestate over 512 bytes or with a byte that is not printable ASCII
// (the Edge validated it; a header value must never break the upstream
// request).
func newSpanRecorder(tc *iop.TraceContext, kind iop.NodeSpanKind) *spanRecorder {
	if tc == nil || len(tc.GetTraceId()) != 16 || len(tc.GetParentSpanId()) != 8 || len(tc.GetTracestate()) > 512 {
		return nil
	}
	r := &spanRecorder{kind: kind, sampled: tc.GetSampled(), start: time.Now()}
	copy(r.traceID[:], tc.GetTraceId())
	copy(r.parent[:], tc.GetParentSpanId())
	if r.traceID == [16]byte{} || r.parent == [8]byte{} {
		return nil
	}
	for _, c := range []byte(tc.GetTracestate()) {
		if c < 0x20 || c > 0x7e {
			return nil
		}
	}
	r.self, r.up = newSpanID(), newSpanID()
	for r.up == r.self {
		r.up = newSpanID()
	}
	flags := "-00"
	if r.sampled {
		flags = "-01"
	}
	r.call = upstream.NewTrace("00-"+hex.EncodeToString(r.traceID[:])+"-"+hex.EncodeToString(r.up[:])+flags, tc.GetTracestate())
	return r
}

func newSpanID() [8]byte {
	var id [8]byte
	for id == [8]byte{} {
		v := rand.Uint64()
		for i := range 8 {
			id[i] = byte(v >> (56 - 8*i))
		}
	}
	return id
}

// context returns ctx carrying the upstream trace (its requests send
// traceparent and tracestate); ctx itself for a nil r.
func (r *spanRecorder) context(ctx context.Context) context.Context {
	if r == nil {
		return ctx
	}
	return upstream.WithTrace(ctx, r.call)
}

// returned notes the provider call's return (called on its goroutine).
func (r *spanRecorder) returned() {
	if r != nil {
		r.returnedA.Store(max(int64(time.Since(r.start)), 1))
	}
}

// spans returns the NodeSpans of a sampled request ending now with
// failure code failure ("" = success); nil for a nil r or an unsampled
// one. The UPSTREAM span is there when a request went out; it ends at the
// call's return, or now when the terminal goes out first (a fenced call,
// SPEC H7).
func (r *spanRecorder) spans(failure string) []*iop.NodeSpan {
	if r == nil || !r.sampled {
		return nil
	}
	now := int64(time.Since(r.start))
	out := []*iop.NodeSpan{{Kind: r.kind, SpanId: r.self[:], ParentSpanId: r.parent[:], DurationNs: now, FailureCode: failure}}
	method, path, status, sent, head := r.call.Observed()
	if sent.IsZero() {
		return out
	}
	start := max(int64(sent.Sub(r.start)), 0)
	end := r.returnedA.Load()
	if end == 0 || end > now {
		end = now
	}
	up := &iop.NodeSpan{Kind: iop.NodeSpanKind_NODE_SPAN_UPSTREAM, SpanId: r.up[:], ParentSpanId: r.self[:],
		StartOffsetNs: start, DurationNs: max(end-start, 0), Method: method, Path: path, StatusCode: int32(status), FailureCode: failure}
	if !head.IsZero() {
		up.FirstByteNs = max(int64(head.Sub(sent)), 1)
	}
	return append(out, up)
}
