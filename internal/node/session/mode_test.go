package session

import (
	"testing"

	"iop/internal/wire/direct"
	iop "iop/proto/gen/iop"
)

// T2: a stream's BODY frames and every terminal are flushed at once; only
// frames the Edge does not write on their own (RESPONSE_START, USAGE, a plain
// body it holds until END, a run's START) may wait for the next frame.
func TestFlushPolicy(t *testing.T) {
	sse := []*iop.Header{{Name: "content-type", Value: "Text/Event-Stream; charset=utf-8"}}
	ndjson := []*iop.Header{{Name: "Content-Type", Value: "application/x-ndjson"}}
	plain := []*iop.Header{{Name: "Content-Type", Value: "application/json"}}
	tf := func(k iop.TunnelFrameKind) *iop.ProviderTunnelFrame { return &iop.ProviderTunnelFrame{Kind: k} }
	tunnel := []struct {
		name      string
		fr        *iop.ProviderTunnelFrame
		streaming bool
		want      direct.Mode
	}{
		{"T2 RESPONSE_START waits for the first BODY", tf(iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START), true, direct.Hold},
		{"T2 USAGE is observation only", tf(iop.TunnelFrameKind_TUNNEL_FRAME_USAGE), true, direct.Hold},
		{"T2 a stream's BODY is never buffered", tf(iop.TunnelFrameKind_TUNNEL_FRAME_BODY), true, direct.Flush},
		{"T2 a plain body's BODY waits for END", tf(iop.TunnelFrameKind_TUNNEL_FRAME_BODY), false, direct.Hold},
		{"T2 END flushes", tf(iop.TunnelFrameKind_TUNNEL_FRAME_END), false, direct.Flush},
		{"T2 ERROR flushes", tf(iop.TunnelFrameKind_TUNNEL_FRAME_ERROR), true, direct.Flush},
	}
	for _, tc := range tunnel {
		if got := tunnelFrameMode(tc.fr, tc.streaming); got != tc.want {
			t.Errorf("%s: mode %d, want %d", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		hs   []*iop.Header
		want bool
	}{
		{"T2 SSE, any case, with parameters", sse, true},
		{"T2 NDJSON", ndjson, true},
		{"T2 JSON is a plain body", plain, false},
		{"T2 no Content-Type", nil, false},
	} {
		if got := streamingResponse(tc.hs); got != tc.want {
			t.Errorf("%s: streamingResponse = %v", tc.name, got)
		}
	}
	for _, tc := range []struct {
		typ  iop.RunEventType
		want direct.Mode
	}{
		{iop.RunEventType_RUN_EVENT_START, direct.Hold},
		{iop.RunEventType_RUN_EVENT_DELTA, direct.Flush},
		{iop.RunEventType_RUN_EVENT_COMPLETE, direct.Flush},
		{iop.RunEventType_RUN_EVENT_ERROR, direct.Flush},
		{iop.RunEventType_RUN_EVENT_CANCELLED, direct.Flush},
	} {
		if got := runEventMode(&iop.RunEvent{Type: tc.typ}); got != tc.want {
			t.Errorf("E3 %v: mode %d, want %d", tc.typ, got, tc.want)
		}
	}
}
