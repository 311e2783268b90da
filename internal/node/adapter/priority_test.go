package adapter_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// vllmProfile is vLLM's profile at base, with the priority field of scheme
// ("" = none).
func vllmProfile(base, scheme string) *iop.ConcreteProtocolProfile {
	p, _ := protocol.NamedProfile(protocol.ProfileVLLM)
	c := p.Concrete(base)
	c.PriorityField, _ = protocol.PriorityFieldOf(scheme)
	return c
}

// fakeVLLM answers every request with a one-chunk chat stream and records
// the bodies it got.
func fakeVLLM(t *testing.T) *fake {
	t.Helper()
	return newFake(t, replay(200, "text/event-stream", sseStream("\n",
		`{"choices":[{"index":0,"delta":{"content":"ok"}}]}`, finishChunk("stop"), usageChunk, "[DONE]")))
}

// priorityOf is the top-level "priority" a backend that keeps the last
// duplicate (vLLM's pydantic over Python's json) reads from body; ok is
// false when there is none.
func priorityOf(t *testing.T, body []byte) (n int, ok bool) {
	t.Helper()
	var v map[string]json.RawMessage
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("backend got %s: %v", body, err)
	}
	raw, ok := v["priority"]
	if !ok {
		return 0, false
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatalf("backend got priority %s: %v", raw, err)
	}
	return n, true
}

// TestG7PriorityField: with the adapter's profile saying the backend
// schedules by priority (vLLM's order: critical -1, interactive 0, batch
// 1), every chat, completion, response and embedding body the node sends
// carries the request's class as "priority" — on the tunnel and on the run
// path — in place of any the client sent; without it the tunnel's body
// reaches the backend byte for byte and the run's has no priority (SPEC
// G7).
func TestG7PriorityField(t *testing.T) {
	const client = `{"model":"tiny","priority":-100,"messages":[{"role":"user","content":"hi"}]}`
	tunnel := func(s *adapter.Set, op, path, class, body string) []*iop.ProviderTunnelFrame {
		return tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "vllm", Target: "tiny", Operation: op, Path: path,
			Method: http.MethodPost, Body: []byte(body), PriorityClass: class})
	}
	t.Run("G7 tunnel: the class replaces the client's priority", func(t *testing.T) {
		leakcheck.Check(t)
		for _, row := range []struct {
			op, path, class string
			want            int
		}{
			{protocol.OpChatCompletions, "", protocol.ClassCritical, -1},
			{protocol.OpChatCompletions, "", protocol.ClassInteractive, 0},
			{protocol.OpChatCompletions, "", protocol.ClassBatch, 1},
			{protocol.OpChatCompletions, "", "", 0},       // an older edge: interactive
			{protocol.OpChatCompletions, "", "urgent", 0}, // a class this node does not know: interactive
			{protocol.OpCompletions, "", protocol.ClassBatch, 1},
			{protocol.OpResponses, "", protocol.ClassBatch, 1},
			{protocol.OpEmbeddings, "", protocol.ClassCritical, -1},
			{"", "/v1/chat/completions", protocol.ClassBatch, 1}, // a path that is the chat operation's
		} {
			up := fakeVLLM(t)
			s := newSet(t, adapter.Options{}, compatAdapter("vllm", vllmProfile(up.URL, protocol.PriorityLowerFirst), 1))
			last, status, _, _ := checkTunnel(t, tunnel(s, row.op, row.path, row.class, client))
			if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || status != 200 {
				t.Fatalf("%s %q: got %v %q status %d, want END after 200", row.op, row.class, last.GetKind(), last.GetError(), status)
			}
			reqs := up.requests()
			if len(reqs) != 1 {
				t.Fatalf("%s %q: %d upstream requests, want 1", row.op, row.class, len(reqs))
			}
			if n, ok := priorityOf(t, reqs[0].Body); !ok || n != row.want {
				t.Fatalf("%s class %q: the backend read priority %d (present %v) from %s, want %d", row.op, row.class, n, ok, reqs[0].Body, row.want)
			}
		}
	})
	t.Run("G7 tunnel: SGLang's order", func(t *testing.T) {
		leakcheck.Check(t)
		up := fakeVLLM(t)
		s := newSet(t, adapter.Options{}, compatAdapter("vllm", vllmProfile(up.URL, protocol.PriorityHigherFirst), 1))
		checkTunnel(t, tunnel(s, protocol.OpChatCompletions, "", protocol.ClassCritical, client))
		if n, ok := priorityOf(t, up.requests()[0].Body); !ok || n != 1 {
			t.Fatalf("critical under higher_first: priority %d (present %v), want 1", n, ok)
		}
	})
	t.Run("G7 tunnel: off, and on for the operations without a priority, the body is the client's", func(t *testing.T) {
		leakcheck.Check(t)
		for _, row := range []struct {
			scheme, op string
		}{
			{"", protocol.OpChatCompletions}, {"", protocol.OpCompletions}, {"", protocol.OpResponses}, {"", protocol.OpEmbeddings},
			{protocol.PriorityLowerFirst, protocol.OpMessages}, {protocol.PriorityLowerFirst, protocol.OpCountTokens},
		} {
			up := fakeVLLM(t)
			p := vllmProfile(up.URL, row.scheme)
			p.MessagesPath, p.CountTokensPath = "/v1/messages", "/v1/messages/count_tokens"
			s := newSet(t, adapter.Options{}, compatAdapter("vllm", p, 1))
			checkTunnel(t, tunnel(s, row.op, "", protocol.ClassBatch, client))
			if reqs := up.requests(); len(reqs) != 1 || string(reqs[0].Body) != client {
				t.Fatalf("scheme %q %s: the backend got %v, want the client's body byte for byte", row.scheme, row.op, reqs)
			}
		}
	})
	t.Run("G7 tunnel: a body that is no JSON object is refused, not sent", func(t *testing.T) {
		leakcheck.Check(t)
		up := fakeVLLM(t)
		s := newSet(t, adapter.Options{}, compatAdapter("vllm", vllmProfile(up.URL, protocol.PriorityLowerFirst), 1))
		for _, body := range []string{`[{"priority":-100}]`, `{"priority":-100`} {
			last, status, _, _ := checkTunnel(t, tunnel(s, protocol.OpChatCompletions, "", protocol.ClassBatch, body))
			if last.GetFailureCode() != protocol.CodeInvalidRequest.String() || status != 0 || last.GetMessage() == "" {
				t.Fatalf("body %s: got %v %s %q status %d, want ERROR invalid_request with a message", body, last.GetKind(), last.GetFailureCode(), last.GetMessage(), status)
			}
		}
		if n := len(up.requests()); n != 0 {
			t.Fatalf("%d upstream requests, want none", n)
		}
	})
	t.Run("G7 run: the class is the body's priority, none when off", func(t *testing.T) {
		leakcheck.Check(t)
		for _, row := range []struct {
			scheme, class string
			want          int
			present       bool
		}{
			{protocol.PriorityLowerFirst, protocol.ClassBatch, 1, true},
			{protocol.PriorityLowerFirst, protocol.ClassCritical, -1, true},
			{protocol.PriorityLowerFirst, "", 0, true},
			{"", protocol.ClassBatch, 0, false},
		} {
			up := fakeVLLM(t)
			s := newSet(t, adapter.Options{}, compatAdapter("vllm", vllmProfile(up.URL, row.scheme), 1))
			last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "vllm", Target: "tiny", Input: userInput("hi"),
				PriorityClass: row.class}))
			if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
				t.Fatalf("got %v %q, want COMPLETE", last.GetType(), last.GetError())
			}
			reqs := up.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d upstream requests, want 1", len(reqs))
			}
			if n, ok := priorityOf(t, reqs[0].Body); ok != row.present || n != row.want {
				t.Fatalf("scheme %q class %q: priority %d (present %v) in %s, want %d (present %v)", row.scheme, row.class, n, ok, reqs[0].Body, row.want, row.present)
			}
		}
	})
}
