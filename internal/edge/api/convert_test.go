package api

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iop/internal/sse"
	iop "iop/proto/gen/iop"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func evStart() *iop.RunEvent { return &iop.RunEvent{Seq: 1, Type: iop.RunEventType_RUN_EVENT_START} }

func evDelta(seq uint64, s string) *iop.RunEvent {
	return &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: s}
}

func evComplete(seq uint64, content, finish string, u *iop.Usage, meta map[string]string) *iop.RunEvent {
	return &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_COMPLETE, Content: content, FinishReason: finish, Usage: u, Metadata: meta}
}

func evError(seq uint64, code, msg string) *iop.RunEvent {
	return &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_ERROR, FailureCode: code, Error: msg}
}

func usage(p, c int64) *iop.Usage {
	return &iop.Usage{PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}
}

const (
	oneCall  = `[{"id":"call_a1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]`
	twoCalls = `[{"id":"call_a1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},` +
		`{"id":"call_b2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"Europe/Paris\"}"}}]`
)

type convCase struct {
	name         string
	golden       string // file under testdata/
	stream       bool
	includeUsage bool
	tools        []string
	events       []*iop.RunEvent
	status       int
	wantCalls    int // tool calls the response must carry
	wantFinish   string
	wantError    bool // the stream ends with an error event
}

var convCases = []convCase{
	{name: "T5 non-stream text", golden: "nonstream_text.json", status: 200, wantFinish: "stop",
		events: []*iop.RunEvent{evStart(), evDelta(2, "Hello"), evDelta(3, " from tiny"), evComplete(4, "Hello from tiny", "stop", usage(9, 3), nil)}},
	{name: "T5 stream text", golden: "stream_text.sse", stream: true, status: 200, wantFinish: "stop",
		events: []*iop.RunEvent{evStart(), evDelta(2, "Hello"), evDelta(3, " \"quoted\"\n<tag> & é"), evComplete(4, "", "stop", usage(9, 3), nil)}},
	{name: "T5 stream include_usage", golden: "stream_include_usage.sse", stream: true, includeUsage: true, status: 200, wantFinish: "stop",
		events: []*iop.RunEvent{evStart(), evDelta(2, "Hello"), evDelta(3, " from tiny"), evComplete(4, "Hello from tiny", "stop", usage(9, 3), nil)}},
	{name: "T5 stream one tool call", golden: "stream_tool_call.sse", stream: true, tools: []string{"get_weather"}, status: 200,
		wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{evStart(), evComplete(2, "", "stop", usage(40, 4), map[string]string{MetaToolCalls: oneCall})}},
	{name: "T5 stream two parallel tool calls with usage", golden: "stream_two_tool_calls.sse", stream: true, includeUsage: true,
		tools: []string{"get_weather", "get_time"}, status: 200, wantCalls: 2, wantFinish: "tool_calls",
		events: []*iop.RunEvent{evStart(), evComplete(2, "", "tool_calls", usage(40, 8), map[string]string{MetaToolCalls: twoCalls})}},
	{name: "T5 non-stream one tool call", golden: "nonstream_tool_call.json", tools: []string{"get_weather"}, status: 200,
		wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{evStart(), evComplete(2, "", "stop", usage(40, 4), map[string]string{MetaToolCalls: oneCall})}},
	{name: "T5 non-stream two parallel tool calls", golden: "nonstream_two_tool_calls.json", tools: []string{"get_weather", "get_time"},
		status: 200, wantCalls: 2, wantFinish: "tool_calls",
		events: []*iop.RunEvent{evStart(), evComplete(2, "", "tool_calls", usage(40, 8), map[string]string{MetaToolCalls: twoCalls})}},
	{name: "T5 stream length stop", golden: "stream_length.sse", stream: true, includeUsage: true, status: 200, wantFinish: "length",
		events: []*iop.RunEvent{evStart(), evDelta(2, "word"), evDelta(3, " word"), evComplete(4, "word word", "length", usage(5, 2), nil)}},
	{name: "T5 non-stream length stop", golden: "nonstream_length.json", status: 200, wantFinish: "length",
		events: []*iop.RunEvent{evStart(), evDelta(2, "word"), evDelta(3, " word"), evComplete(4, "", "length", usage(5, 2), nil)}},
	{name: "E9 stream text tool fallback", golden: "stream_text_tool_fallback.sse", stream: true, tools: []string{"get_weather"},
		status: 200, wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{evStart(), evDelta(2, "Checking. "), evDelta(3, "```json\n{\"tool_calls\":[{\"name\":"),
			evDelta(4, "\"get_weather\",\"arguments\":{\"city\": \"Paris\"}}]}\n```"),
			evComplete(5, "", "stop", usage(50, 20), map[string]string{MetaTextToolFallback: "true"})}},
	{name: "E9 non-stream text tool fallback", golden: "nonstream_text_tool_fallback.json", tools: []string{"get_weather"},
		status: 200, wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{evStart(), evComplete(2, "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]}", "stop",
			usage(50, 20), map[string]string{MetaTextToolFallback: "true"})}},
	{name: "E9 JSON text without the fallback flag stays content", golden: "stream_json_text_no_fallback.sse", stream: true,
		tools: []string{"get_weather"}, status: 200, wantFinish: "stop",
		events: []*iop.RunEvent{evStart(), evDelta(2, "Here: "), evDelta(3, "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{}}]}"),
			evComplete(4, "", "stop", usage(50, 20), nil)}},
	{name: "T5 stream error after bytes ends with an error event", golden: "stream_error_midstream.sse", stream: true, includeUsage: true,
		status: 200, wantError: true,
		events: []*iop.RunEvent{evStart(), evDelta(2, "Hel"), evError(3, "upstream_error", "backend reset the connection")}},
	{name: "H1 stall before any byte is a 504", golden: "error_stalled.json", stream: true, status: 504,
		events: []*iop.RunEvent{evStart(), evError(2, failureStalled, "response stalled")}},
}

// TestConversionGolden checks run-event → OpenAI conversions byte for byte
// against testdata/ (regenerate with -update) and structurally against what
// the official SDKs parse.
func TestConversionGolden(t *testing.T) {
	for _, tc := range convCases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			conv := newChatConv(newOutput(rec), "tiny", "chatcmpl-id0", 1700000000, tc.stream, tc.includeUsage,
				tc.tools, len(tc.tools) > 0, seqIDs())
			for i, ev := range tc.events {
				done, err := conv.event(ev)
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if done != (i == len(tc.events)-1) {
					t.Fatalf("event %d: done = %v, want %v", i, done, i == len(tc.events)-1)
				}
			}
			if rec.Code != tc.status {
				t.Fatalf("status: got %d, want %d; body %s", rec.Code, tc.status, rec.Body)
			}
			compareGolden(t, tc.golden, rec.Body.Bytes())
			switch {
			case tc.status != 200:
				checkErrorBody(t, rec.Body.Bytes(), tc.status)
			case tc.stream:
				if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
					t.Errorf("Content-Type: got %q, want text/event-stream", ct)
				}
				checkChatStream(t, rec.Body.Bytes(), tc.includeUsage, tc.wantCalls, tc.wantFinish, tc.wantError)
			default:
				checkCompletion(t, rec.Body.Bytes(), tc.wantCalls, tc.wantFinish)
			}
		})
	}
}

func compareGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run with -update to create)", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("golden %s mismatch:\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

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

// checkChatStream parses body as the OpenAI SDKs do (SSE events, one JSON
// object per `data:` line, `[DONE]` last) and checks the chunk rules of
// SPEC T5: role first; tool calls with index 0,1,… each introduced with id,
// type and name; one finish_reason; with include_usage every chunk but the
// last has "usage": null and the last has "choices": [] and the usage.
func checkChatStream(t *testing.T, body []byte, includeUsage bool, wantCalls int, wantFinish string, wantError bool) {
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

// checkCompletion checks a chat.completion object (SPEC T5).
func checkCompletion(t *testing.T, body []byte, wantCalls int, wantFinish string) {
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

// checkErrorBody checks the OpenAI error shape.
func checkErrorBody(t *testing.T, body []byte, status int) {
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
