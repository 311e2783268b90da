package surfacetest

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"iop/internal/sse"
)

type wireChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role      *string `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    *int   `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// CheckChatStream parses body as the OpenAI SDKs do (SSE events, one JSON
// object per `data:` line, `[DONE]` last) and checks the chunk rules of
// SPEC T5: role first; tool calls with index 0,1,… each introduced with id,
// type and name; one finish_reason; with include_usage every chunk but the
// last has "usage": null and the last has "choices": [] and the usage.
func CheckChatStream(t testing.TB, body []byte, includeUsage bool, wantCalls int, wantFinish string, wantError bool) {
	t.Helper()
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		t.Fatalf("stream does not end with a blank line: %q", body)
	}
	r := sse.NewReader(bytes.NewReader(body), sse.DefaultMaxLine)
	var chunks []wireChunk
	var raws [][]byte
	done, errored := false, false
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		if len(ev.Type) != 0 {
			t.Errorf("event name %q on an OpenAI stream", ev.Type)
		}
		if done || errored {
			t.Fatalf("event after [DONE] or error: %s", ev.Data)
		}
		if string(ev.Data) == "[DONE]" {
			done = true
			continue
		}
		var c wireChunk
		if err := json.Unmarshal(ev.Data, &c); err != nil {
			t.Fatalf("data is not one JSON object: %v: %s", err, ev.Data)
		}
		if c.Error != nil {
			errored = true
			continue
		}
		chunks = append(chunks, c)
		raws = append(raws, append([]byte(nil), ev.Data...))
	}
	if wantError != errored || done == wantError {
		t.Fatalf("stream end: got [DONE]=%v error=%v, want error=%v", done, errored, wantError)
	}
	if len(chunks) == 0 {
		t.Fatal("no chunks")
	}
	if r := chunks[0].Choices; len(r) != 1 || r[0].Delta.Role == nil || *r[0].Delta.Role != "assistant" {
		t.Errorf("first chunk has no assistant role: %s", raws[0])
	}
	finishes, calls := 0, 0
	for i, c := range chunks {
		if c.Object != "chat.completion.chunk" || c.ID != chunks[0].ID || c.Model != "tiny" {
			t.Errorf("chunk %d: object/id/model = %q/%q/%q", i, c.Object, c.ID, c.Model)
		}
		last := i == len(chunks)-1 && includeUsage && !wantError
		switch {
		case last:
			if c.Choices == nil || len(c.Choices) != 0 || !bytes.Contains(raws[i], []byte(`"choices":[]`)) {
				t.Errorf("usage chunk must have \"choices\": []: %s", raws[i])
			}
			if len(c.Usage) == 0 || string(c.Usage) == "null" {
				t.Errorf("usage chunk without usage: %s", raws[i])
			}
			continue
		case includeUsage:
			if string(c.Usage) != "null" {
				t.Errorf("chunk %d: want \"usage\": null before the usage chunk: %s", i, raws[i])
			}
		default:
			if c.Usage != nil {
				t.Errorf("chunk %d: usage present without include_usage: %s", i, raws[i])
			}
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk %d: %d choices", i, len(c.Choices))
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			finishes++
			if *ch.FinishReason != wantFinish {
				t.Errorf("finish_reason: got %q, want %q", *ch.FinishReason, wantFinish)
			}
		}
		for _, tc := range ch.Delta.ToolCalls {
			if tc.Index == nil {
				t.Fatalf("chunk %d: tool call without index: %s", i, raws[i])
			}
			switch {
			case *tc.Index == calls:
				if tc.ID == "" || tc.Type != "function" || tc.Function.Name == "" {
					t.Errorf("tool call %d introduced without id/type/name: %s", calls, raws[i])
				}
				calls++
			case *tc.Index == calls-1:
				if tc.ID != "" || tc.Function.Name != "" {
					t.Errorf("tool call %d fragment repeats id/name: %s", calls-1, raws[i])
				}
			default:
				t.Errorf("tool call index %d out of order (calls so far %d)", *tc.Index, calls)
			}
		}
	}
	if !wantError && finishes != 1 {
		t.Errorf("finish_reason chunks: got %d, want 1", finishes)
	}
	if calls != wantCalls {
		t.Errorf("tool calls: got %d, want %d", calls, wantCalls)
	}
}

// CheckCompletion checks a chat.completion object (SPEC T5).
func CheckCompletion(t testing.TB, body []byte, wantCalls int, wantFinish string) {
	t.Helper()
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role      string  `json:"role"`
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			Prompt, Completion, Total int64
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	if !strings.HasPrefix(c.ID, "chatcmpl-") || c.Object != "chat.completion" || c.Model != "tiny" || len(c.Choices) != 1 || c.Usage == nil {
		t.Fatalf("bad chat.completion: %s", body)
	}
	m := c.Choices[0].Message
	if m.Role != "assistant" || len(m.ToolCalls) != wantCalls || c.Choices[0].FinishReason != wantFinish {
		t.Errorf("message: role %q, %d tool calls, finish %q; want %d, %q: %s", m.Role, len(m.ToolCalls),
			c.Choices[0].FinishReason, wantCalls, wantFinish, body)
	}
	for _, tc := range m.ToolCalls {
		if tc.ID == "" || tc.Type != "function" || !json.Valid([]byte(tc.Function.Arguments)) {
			t.Errorf("bad tool call: %+v", tc)
		}
	}
	if wantCalls > 0 && m.Content != nil {
		t.Errorf("content: got %q, want null with tool calls", *m.Content)
	}
}

// CheckOpenAIError checks the OpenAI error shape.
func CheckOpenAIError(t testing.TB, body []byte, status int) {
	t.Helper()
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("status %d: not an OpenAI error object: %s", status, body)
	}
}
