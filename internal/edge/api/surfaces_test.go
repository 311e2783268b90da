package api

import (
	"net/http"
	"strings"
	"testing"

	st "iop/internal/edge/surface/surfacetest"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Q3, T5, F1: an ollama lease serves every run-path surface: the
// RunRequest carries the surface's converted input (stream, operation,
// max_tokens), and the answer has the surface's shape and content type.
func TestRunPathSurfaces(t *testing.T) {
	embedding := &iop.RunEvent{Seq: 2, Type: iop.RunEventType_RUN_EVENT_COMPLETE, Usage: st.Usage(3, 0),
		Embeddings: []*iop.Embedding{{Values: []float32{1, 0.5}}}}
	rows := []struct {
		name, path, body string
		events           []*iop.RunEvent
		ctype            string
		check            func(t *testing.T, body string, req *iop.RunRequest)
	}{
		{name: "T5 messages non-stream", path: "/v1/messages",
			body:   `{"model":"tiny","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
			events: []*iop.RunEvent{evStart(), evComplete(2, "Hello", "stop", usage(3, 1), nil)}, ctype: "application/json",
			check: func(t *testing.T, body string, req *iop.RunRequest) {
				m := st.CheckAnthropicMessage(t, []byte(body))
				if m.StopReason != "end_turn" || !strings.HasPrefix(m.ID, "msg_") || req.Stream || req.Input.MaxTokens != 16 {
					t.Errorf("message %+v, request stream %v max %d", m, req.Stream, req.Input.MaxTokens)
				}
			}},
		{name: "T5 messages stream", path: "/v1/messages",
			body:   `{"model":"tiny","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			events: []*iop.RunEvent{evStart(), evDelta(2, "Hel"), evDelta(3, "lo"), evComplete(4, "", "length", usage(3, 2), nil)},
			ctype:  "text/event-stream",
			check: func(t *testing.T, body string, req *iop.RunRequest) {
				m := st.CheckAnthropicStream(t, []byte(body), false)
				if m.StopReason != "max_tokens" || !req.Stream {
					t.Errorf("stop_reason %q, request stream %v", m.StopReason, req.Stream)
				}
			}},
		{name: "count_tokens from the backend's prompt count", path: "/v1/messages/count_tokens",
			body:   `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`,
			events: []*iop.RunEvent{evStart(), evComplete(2, "H", "length", usage(21, 1), nil)}, ctype: "application/json",
			check: func(t *testing.T, body string, req *iop.RunRequest) {
				if body != `{"input_tokens":21}` || req.Stream || req.Input.MaxTokens != 1 {
					t.Errorf("body %s, request stream %v max %d", body, req.Stream, req.Input.MaxTokens)
				}
			}},
		{name: "T5 responses stream", path: "/v1/responses",
			body:   `{"model":"tiny","stream":true,"input":"hi"}`,
			events: []*iop.RunEvent{evStart(), evDelta(2, "Hello"), evComplete(3, "", "stop", usage(3, 1), nil)}, ctype: "text/event-stream",
			check: func(t *testing.T, body string, req *iop.RunRequest) {
				r := st.CheckResponseStream(t, []byte(body), false)
				if r.Status != "completed" || r.Text() != "Hello" || !strings.HasPrefix(r.ID, "resp_") || !req.Stream {
					t.Errorf("response %+v, request stream %v", r, req.Stream)
				}
			}},
		{name: "embeddings on the run path", path: "/v1/embeddings",
			body:   `{"model":"tiny","input":["a"],"dimensions":2}`,
			events: []*iop.RunEvent{evStart(), embedding}, ctype: "application/json",
			check: func(t *testing.T, body string, req *iop.RunRequest) {
				want := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1,0.5]}],"model":"tiny","usage":{"prompt_tokens":3,"total_tokens":3}}`
				if body != want || req.Operation != "embeddings" || req.Input.Dimensions != 2 || len(req.Input.EmbedInput) != 1 {
					t.Errorf("body %s\nwant %s\nrequest %v", body, want, req)
				}
			}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newRig(t, protocol.TypeOllama, nil)
			r.st.run(row.events...)
			resp, got := r.do(t, "POST", row.path, row.body)
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), row.ctype) {
				t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), got)
			}
			req := r.d.lastRun()
			if req == nil || req.Target != "tiny:latest" {
				t.Fatalf("RunRequest %v", req)
			}
			row.check(t, got, req)
			checkOneOutcome(t, r, 0)
		})
	}
}

// F2: bad input on a run-path surface is a 400 in that surface's
// shape, naming the field, before any dispatch.
func TestRunPathSurfaceRefusals(t *testing.T) {
	rows := []struct {
		name, path, body, contains string
		anthropic                  bool
	}{
		{"responses previous_response_id", "/v1/responses", `{"model":"tiny","input":"hi","previous_response_id":"resp_1"}`, "previous_response_id", false},
		{"messages without max_tokens", "/v1/messages", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, "max_tokens", true},
		{"chat logit_bias", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"logit_bias":{"1":1}}`, "logit_bias", false},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newRig(t, protocol.TypeOllama, nil)
			resp, got := r.do(t, "POST", row.path, row.body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, row.contains) {
				t.Fatalf("status %d: %s", resp.StatusCode, got)
			}
			checkShape(t, got, row.anthropic)
			r.srv.Close()
			if r.d.lastRun() != nil || r.fp.releases.Load() != 1 {
				t.Errorf("dispatched %v, releases %d; want none and 1", r.d.lastRun(), r.fp.releases.Load())
			}
		})
	}
}
