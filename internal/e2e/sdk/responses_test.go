package sdk

import (
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// responsesTool is get_weather as a Responses function tool.
func responsesTool() responses.ToolUnionParam {
	return responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
		Name:        "get_weather",
		Description: openai.String("Get the current weather in a city"),
		Strict:      openai.Bool(false),
		Parameters: map[string]any{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string", "description": "city name"}},
			"required":   []string{"city"},
		},
	}}
}

func responsesParams(model string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: shared.ResponsesModel(model),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello in one short sentence.")},
		Store: openai.Bool(false),
	}
}

// checkResponseText checks a completed response with assistant text (the
// demo answer when the demo backend serves).
func checkResponseText(t *testing.T, s *stack, r *responses.Response) {
	t.Helper()
	text := r.OutputText()
	if r.ID == "" || r.Status != responses.ResponseStatusCompleted || text == "" {
		t.Errorf("response id %q status %q text %q; want an id, completed, text", r.ID, r.Status, text)
	}
	if !s.env.realServer() && text != demoAnswer {
		t.Errorf("text = %q, want %q", text, demoAnswer)
	}
}

// testResponses: F1 — responses.create on both paths (the run path
// converts to and from Ollama's /api/chat; the tunnel relays the server's
// own /v1/responses).
func testResponses(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			r, err := s.openai().Responses.New(reqCtx(t), responsesParams("tiny"+p.suffix))
			if err != nil {
				t.Fatalf("Responses.New: %v", err)
			}
			checkResponseText(t, s, r)
			if r.Usage.OutputTokens <= 0 {
				t.Errorf("usage.output_tokens = %d, want > 0", r.Usage.OutputTokens)
			}
		})
	}
}

// testResponsesStream: the same, streamed: response.created first, text
// deltas that add up to the final text, response.completed last.
func testResponsesStream(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			stream := s.openai().Responses.NewStreaming(reqCtx(t), responsesParams("tiny"+p.suffix))
			defer stream.Close()
			var types []string
			var deltas strings.Builder
			var final responses.Response
			for stream.Next() {
				ev := stream.Current()
				types = append(types, ev.Type)
				switch ev.Type {
				case "response.output_text.delta":
					deltas.WriteString(ev.Delta)
				case "response.completed":
					final = ev.Response
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if len(types) < 3 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
				t.Fatalf("event types %q; want response.created … response.completed", types)
			}
			if deltas.Len() == 0 || final.OutputText() != deltas.String() {
				t.Errorf("deltas %q, final text %q", deltas.String(), final.OutputText())
			}
			checkResponseText(t, s, &final)
		})
	}
}

// testResponsesTools: F1 — one function tool round trip on both
// paths: the model calls get_weather, the client sends the call and its
// output back (without tools, so the answer is text) and gets a final text
// answer.
func testResponsesTools(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			model := "tiny-tool" + p.suffix
			params := responses.ResponseNewParams{
				Model: shared.ResponsesModel(model),
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is the weather in Paris right now? Use the get_weather tool.")},
				Tools: []responses.ToolUnionParam{responsesTool()},
				Store: openai.Bool(false),
			}
			r, err := s.openai().Responses.New(reqCtx(t), params)
			if err != nil {
				t.Fatalf("Responses.New: %v", err)
			}
			var call *responses.ResponseFunctionToolCall
			for _, it := range r.Output {
				if it.Type == "function_call" {
					c := it.AsFunctionCall()
					call = &c
				}
			}
			if call == nil || call.Name != "get_weather" || call.CallID == "" {
				t.Fatalf("output %+v: want a get_weather function_call", r.Output)
			}
			checkWeatherArgs(t, call.Arguments)
			fc := call.ToParam()
			input := responses.ResponseInputParam{
				responses.ResponseInputItemParamOfMessage("What is the weather in Paris right now? Use the get_weather tool.", responses.EasyInputMessageRoleUser),
				{OfFunctionCall: &fc},
				responses.ResponseInputItemParamOfFunctionCallOutput(`{"temperature_c": 21, "sky": "clear"}`),
			}
			input[2].OfFunctionCallOutput.CallID = openai.String(call.CallID)
			r2, err := s.openai().Responses.New(reqCtx(t), responses.ResponseNewParams{
				Model: shared.ResponsesModel(model),
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input},
				Store: openai.Bool(false),
			})
			if err != nil {
				t.Fatalf("Responses.New with the function output: %v", err)
			}
			checkResponseText(t, s, r2)
		})
	}
}
