package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"
)

// longLoopParams asks tiny-loop for far more tokens than a test waits for.
func longLoopParams(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     shared.ChatModel(model),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count from 1 to 100000, separated by spaces.")},
		MaxTokens: openai.Int(100000),
	}
}

// firstContent advances stream to its first chunk with text and fails t if
// the stream ends first.
func firstContent(t *testing.T, stream *ssestream.Stream[openai.ChatCompletionChunk]) {
	t.Helper()
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			if c.Delta.Content != "" {
				return
			}
		}
	}
	t.Fatalf("stream ended before any text: %v", stream.Err())
}

// backendEnd is the demo backend's per-request "request end" log line.
type backendEnd struct {
	Msg     string `json:"msg"`
	Path    string `json:"path"`
	Model   string `json:"model"`
	Outcome string `json:"outcome"`
	Tokens  int    `json:"tokens"`
}

// TestClientAbort: T3 — a client that goes away mid-stream makes the Edge
// cancel the run, the Node abort the upstream request, and the backend's
// request end within 1 s; the lease goes back (Q2: in_flight returns to 0).
func TestClientAbort(t *testing.T) {
	if loadEnv(t).realServer() {
		t.Skip("needs the demo backend's per-request end log; a real server does not expose when a request ends")
	}
	s := newStack(t)
	rows := []struct{ name, model, upstreamPath string }{
		{"native", "tiny-loop", "/api/chat"},
		{"tunnel", "tiny-loop-oa", "/v1/chat/completions"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			from := s.backend.log.mark()
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			defer cancel()
			stream := s.openai().Chat.Completions.NewStreaming(ctx, longLoopParams(r.model))
			defer stream.Close()
			firstContent(t, stream)
			cancel()
			abortedAt := time.Now()
			wctx, wcancel := context.WithDeadline(context.Background(), abortedAt.Add(time.Second))
			defer wcancel()
			var end backendEnd
			line, err := s.backend.log.waitLine(wctx, from, func(l string) bool {
				var e backendEnd
				return json.Unmarshal([]byte(l), &e) == nil && e.Msg == "request end" && e.Path == r.upstreamPath && e.Model == "tiny-loop"
			})
			if err != nil {
				t.Fatalf("backend %s request for tiny-loop did not end within 1 s of the client abort: %v", r.upstreamPath, err)
			}
			t.Logf("backend request ended %v after the abort: %s", time.Since(abortedAt).Round(time.Millisecond), line)
			if err := json.Unmarshal([]byte(line), &end); err != nil {
				t.Fatal(err)
			}
			if end.Outcome != "client_gone" || end.Tokens >= 100000 {
				t.Errorf("backend outcome %q after %d tokens; want client_gone before the limit", end.Outcome, end.Tokens)
			}
			s.waitStatus("in_flight back to 0 (Q2)", 5*time.Second, func(d statusDoc) bool { return d.inFlight() == 0 })
		})
	}
}

// TestNodeKilled: L7/L8/E6 — the node SIGKILLed mid-stream: the client gets
// a terminal error (not a silently truncated stream) within the heartbeat
// bound; the edge shows the node disconnected with its lease returned; a
// restarted node reconnects (S1) and a new request succeeds.
func TestNodeKilled(t *testing.T) {
	s := newStack(t)
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), heartbeatTimeout+30*time.Second)
			defer cancel()
			stream := s.openai().Chat.Completions.NewStreaming(ctx, longLoopParams("tiny-loop"+p.suffix))
			defer stream.Close()
			firstContent(t, stream)
			old := s.node
			if err := old.signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killedAt := time.Now()
			for stream.Next() {
			}
			took := time.Since(killedAt)
			err := stream.Err()
			switch {
			case err == nil:
				t.Errorf("stream ended cleanly %v after the node died; want a terminal error (a cut answer must not look complete)", took)
			case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
				t.Errorf("no terminal error within %v of the node's death: %v", took, err)
			case took > heartbeatTimeout+2*time.Second:
				t.Errorf("terminal error after %v, want within the heartbeat bound %v: %v", took, heartbeatTimeout, err)
			default:
				t.Logf("terminal error %v after the kill: %T: %v", took.Round(time.Millisecond), err, err)
			}
			if _, err := old.wait(5 * time.Second); err != nil {
				t.Fatal(err)
			}
			s.waitConnected(false, heartbeatTimeout+5*time.Second)
			// L8: the fence returned the dead generation's lease.
			s.waitStatus("in_flight back to 0 after the fence (L8)", 5*time.Second, func(d statusDoc) bool { return d.inFlight() == 0 })
			s.startNode()
			s.waitConnected(true, readyTimeout)
			resp, err := s.openai().Chat.Completions.New(reqCtx(t), helloParams("tiny"+p.suffix))
			if err != nil {
				t.Fatalf("request after the node restarted: %v", err)
			}
			if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
				t.Errorf("answer after restart: %s", short(resp.RawJSON()))
			}
		})
	}
}

// TestEdgeRestart: S3/S5 — the edge stopped with SIGTERM (exit 0) and
// started again on the same ports: the node, which keeps running, reconnects
// by itself and requests on both paths succeed again.
func TestEdgeRestart(t *testing.T) {
	s := newStack(t)
	if _, err := s.openai().Chat.Completions.New(reqCtx(t), helloParams("tiny")); err != nil {
		t.Fatalf("request before the restart: %v", err)
	}
	code, err := s.edge.stop()
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Errorf("edge exited %d on SIGTERM, want 0", code)
	}
	if s.node.exited() {
		t.Fatalf("node exited (code %d) when the edge went away; want it to keep retrying (max_attempts 0)", s.node.code)
	}
	s.startEdge()
	s.waitConnected(true, readyTimeout)
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			resp, err := s.openai().Chat.Completions.New(reqCtx(t), helloParams("tiny"+p.suffix))
			if err != nil {
				t.Fatalf("request after the edge restart: %v", err)
			}
			if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
				t.Errorf("answer after restart: %s", short(resp.RawJSON()))
			}
		})
	}
	if s.node.exited() {
		t.Errorf("node exited (code %d) during the edge restart", s.node.code)
	}
}
