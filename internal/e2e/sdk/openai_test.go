package sdk

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
)

// requestTimeout bounds one SDK call (a real server may be slow to load).
const requestTimeout = 90 * time.Second

// demoAnswer is the demo backend's fixed "tiny" answer; asserted only when
// the demo backend serves (a real model's text is checked for shape only).
const demoAnswer = "Hello from tiny-gguf! This reply is deterministic."

// pathRows are the two dispatch paths of each demo model: the native Ollama
// run path and the OpenAI-compatible tunnel (the demo surface).
var pathRows = []struct{ name, suffix string }{
	{"native", ""},
	{"tunnel", "-oa"},
}

func reqCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	t.Cleanup(cancel)
	return ctx
}

func helloParams(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    shared.ChatModel(model),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello in one short sentence.")},
	}
}

func weatherTool() openai.ChatCompletionToolUnionParam {
	return openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "get_weather",
		Description: openai.String("Get the current weather in a city"),
		Parameters: shared.FunctionParameters{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string", "description": "city name"}},
			"required":   []string{"city"},
		},
	})
}

func toolParams(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model: shared.ChatModel(model),
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.UserMessage("What is the weather in Paris right now? Use the get_weather tool."),
		},
		Tools: []openai.ChatCompletionToolUnionParam{weatherTool()},
	}
}

// testModelsList: Q1 — /v1/models lists exactly the configured model groups.
func testModelsList(t *testing.T, s *stack) {
	page, err := s.openai().Models.List(reqCtx(t))
	if err != nil {
		t.Fatalf("Models.List: %v", err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	want := slices.Clone(demoGroups)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("Models.List ids = %q, want %q", ids, want)
	}
}

// testChat: T5 — a non-stream chat completion on both paths.
func testChat(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			model := "tiny" + p.suffix
			resp, err := s.openai().Chat.Completions.New(reqCtx(t), helloParams(model))
			if err != nil {
				t.Fatalf("Chat.Completions.New(%s): %v", model, err)
			}
			if resp.ID == "" || len(resp.Choices) != 1 {
				t.Fatalf("completion: id %q, %d choices; want an id and 1 choice", resp.ID, len(resp.Choices))
			}
			c := resp.Choices[0]
			if c.Message.Content == "" || c.FinishReason != "stop" {
				t.Errorf("choice: content %q finish_reason %q; want text and stop", short(c.Message.Content), c.FinishReason)
			}
			if !s.env.realServer() && c.Message.Content != demoAnswer {
				t.Errorf("content = %q, want %q", c.Message.Content, demoAnswer)
			}
			u := resp.Usage
			if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Errorf("usage = %+v, want positive prompt/completion and total = sum", u)
			}
		})
	}
}

// testChatStreamUsage: T2/T5 — a streamed chat with include_usage: the SDK's
// accumulator takes every chunk, sees the text and the usage, and the usage
// chunk is the last one with an empty choices array.
func testChatStreamUsage(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			model := "tiny" + p.suffix
			params := helloParams(model)
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			stream := s.openai().Chat.Completions.NewStreaming(reqCtx(t), params)
			defer stream.Close()
			var acc openai.ChatCompletionAccumulator
			var chunks, contentChunks, usageAt int
			var finish string
			var usage openai.CompletionUsage
			usageAt = -1
			for stream.Next() {
				ch := stream.Current()
				if !acc.AddChunk(ch) {
					t.Fatalf("accumulator rejected chunk %d: %s", chunks, short(ch.RawJSON()))
				}
				if len(ch.Choices) == 0 {
					if !ch.JSON.Usage.Valid() {
						t.Errorf("chunk %d has no choices and no usage: %s", chunks, short(ch.RawJSON()))
					}
					usageAt, usage = chunks, ch.Usage
				}
				for _, c := range ch.Choices {
					if c.Delta.Content != "" {
						contentChunks++
					}
					if c.FinishReason != "" {
						finish = c.FinishReason
					}
				}
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if usageAt != chunks-1 {
				t.Errorf("usage chunk at %d of %d chunks; want the last one, with choices []", usageAt, chunks)
			}
			if usage.PromptTokens <= 0 || usage.CompletionTokens <= 0 || usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens {
				t.Errorf("usage chunk = %+v, want positive counts and total = sum", usage)
			}
			if acc.Usage.TotalTokens != usage.TotalTokens {
				t.Errorf("accumulator usage total %d, want %d", acc.Usage.TotalTokens, usage.TotalTokens)
			}
			if contentChunks < 2 {
				t.Errorf("%d content chunks; want the text streamed in ≥ 2", contentChunks)
			}
			if finish != "stop" {
				t.Errorf("finish_reason = %q, want stop", finish)
			}
			if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
				t.Fatalf("accumulated choices %+v; want one with text", acc.Choices)
			}
			if got := acc.Choices[0].Message.Content; !s.env.realServer() && got != demoAnswer {
				t.Errorf("accumulated text = %q, want %q", got, demoAnswer)
			}
		})
	}
}

// checkWeatherArgs checks a get_weather call's arguments: a JSON object
// with a non-empty "city" string.
func checkWeatherArgs(t *testing.T, args string) {
	t.Helper()
	var a map[string]any
	if err := json.Unmarshal([]byte(args), &a); err != nil {
		t.Errorf("arguments %q are not a JSON object: %v", args, err)
		return
	}
	if city, _ := a["city"].(string); city == "" {
		t.Errorf("arguments %q have no city", args)
	}
}

// testTools: E8 (native) and E9/T2 (tunnel) — a request with a get_weather
// tool, non-stream: tool_calls with id, type function, name and JSON
// arguments, finish_reason tool_calls.
func testTools(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			model := "tiny-tool" + p.suffix
			resp, err := s.openai().Chat.Completions.New(reqCtx(t), toolParams(model))
			if err != nil {
				t.Fatalf("Chat.Completions.New(%s): %v", model, err)
			}
			if len(resp.Choices) != 1 {
				t.Fatalf("%d choices, want 1", len(resp.Choices))
			}
			c := resp.Choices[0]
			if c.FinishReason != "tool_calls" {
				t.Errorf("finish_reason = %q, want tool_calls", c.FinishReason)
			}
			if len(c.Message.ToolCalls) < 1 {
				t.Fatalf("no tool_calls in %s", short(resp.RawJSON()))
			}
			tc := c.Message.ToolCalls[0]
			if tc.ID == "" || tc.Type != "function" || tc.Function.Name != "get_weather" {
				t.Errorf("tool call id %q type %q name %q; want an id, function, get_weather", tc.ID, tc.Type, tc.Function.Name)
			}
			checkWeatherArgs(t, tc.Function.Arguments)
		})
	}
}

// testToolsStream: the same tool request streamed: the first fragment of the
// call carries index, id and name; the accumulator rebuilds one complete
// call; the finish chunk says tool_calls.
func testToolsStream(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			model := "tiny-tool" + p.suffix
			stream := s.openai().Chat.Completions.NewStreaming(reqCtx(t), toolParams(model))
			defer stream.Close()
			var acc openai.ChatCompletionAccumulator
			var finish string
			var fragments int
			firstOf := map[int64]bool{}
			for stream.Next() {
				ch := stream.Current()
				if !acc.AddChunk(ch) {
					t.Fatalf("accumulator rejected chunk: %s", short(ch.RawJSON()))
				}
				for _, c := range ch.Choices {
					if c.FinishReason != "" {
						finish = c.FinishReason
					}
					for _, tc := range c.Delta.ToolCalls {
						fragments++
						if !tc.JSON.Index.Valid() {
							t.Errorf("tool call fragment without index: %s", short(ch.RawJSON()))
						}
						if !firstOf[tc.Index] {
							firstOf[tc.Index] = true
							if tc.ID == "" || tc.Function.Name != "get_weather" {
								t.Errorf("first fragment of call %d: id %q name %q; want an id and get_weather", tc.Index, tc.ID, tc.Function.Name)
							}
						}
					}
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if fragments == 0 || !firstOf[0] {
				t.Fatalf("no tool call fragment with index 0 in the stream")
			}
			if finish != "tool_calls" {
				t.Errorf("finish_reason = %q, want tool_calls", finish)
			}
			if len(acc.Choices) != 1 || len(acc.Choices[0].Message.ToolCalls) < 1 {
				t.Fatalf("accumulated %+v; want one choice with a tool call", acc.Choices)
			}
			tc := acc.Choices[0].Message.ToolCalls[0]
			if tc.ID == "" || tc.Function.Name != "get_weather" {
				t.Errorf("accumulated call id %q name %q", tc.ID, tc.Function.Name)
			}
			checkWeatherArgs(t, tc.Function.Arguments)
		})
	}
}

// testLoopLength: a generation cut by max_tokens 16 ends with
// finish_reason length (stream and not) and counts at most 16 tokens.
func testLoopLength(t *testing.T, s *stack) {
	const maxTokens = 16
	for _, p := range pathRows {
		for _, streamed := range []bool{false, true} {
			name := p.name
			if streamed {
				name += " stream"
			}
			t.Run(name, func(t *testing.T) {
				model := "tiny-loop" + p.suffix
				params := openai.ChatCompletionNewParams{
					Model:     shared.ChatModel(model),
					Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count from 1 to 1000, separated by spaces.")},
					MaxTokens: openai.Int(maxTokens),
				}
				var text, finish string
				var completion int64
				if streamed {
					params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
					stream := s.openai().Chat.Completions.NewStreaming(reqCtx(t), params)
					defer stream.Close()
					var acc openai.ChatCompletionAccumulator
					for stream.Next() {
						if !acc.AddChunk(stream.Current()) {
							t.Fatalf("accumulator rejected chunk: %s", short(stream.Current().RawJSON()))
						}
					}
					if err := stream.Err(); err != nil {
						t.Fatalf("stream: %v", err)
					}
					if len(acc.Choices) != 1 {
						t.Fatalf("accumulated %d choices, want 1", len(acc.Choices))
					}
					text, finish, completion = acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, acc.Usage.CompletionTokens
				} else {
					resp, err := s.openai().Chat.Completions.New(reqCtx(t), params)
					if err != nil {
						t.Fatalf("Chat.Completions.New(%s): %v", model, err)
					}
					if len(resp.Choices) != 1 {
						t.Fatalf("%d choices, want 1", len(resp.Choices))
					}
					text, finish, completion = resp.Choices[0].Message.Content, resp.Choices[0].FinishReason, resp.Usage.CompletionTokens
				}
				if finish != "length" {
					t.Errorf("finish_reason = %q, want length", finish)
				}
				if text == "" {
					t.Errorf("no text before the limit")
				}
				if completion <= 0 || completion > maxTokens {
					t.Errorf("completion_tokens = %d, want 1..%d", completion, maxTokens)
				}
			})
		}
	}
}
