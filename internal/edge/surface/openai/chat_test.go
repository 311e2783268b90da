package openai

import (
	"flag"
	"net/http"
	"testing"

	"iop/internal/edge/surface"
	st "iop/internal/edge/surface/surfacetest"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

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
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hello"), st.Delta(3, " from tiny"), st.Complete(4, "Hello from tiny", "stop", st.Usage(9, 3), nil)}},
	{name: "T5 stream text", golden: "stream_text.sse", stream: true, status: 200, wantFinish: "stop",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hello"), st.Delta(3, " \"quoted\"\n<tag> & é"), st.Complete(4, "", "stop", st.Usage(9, 3), nil)}},
	{name: "T5 stream include_usage", golden: "stream_include_usage.sse", stream: true, includeUsage: true, status: 200, wantFinish: "stop",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hello"), st.Delta(3, " from tiny"), st.Complete(4, "Hello from tiny", "stop", st.Usage(9, 3), nil)}},
	{name: "T5 stream one tool call", golden: "stream_tool_call.sse", stream: true, tools: []string{"get_weather"}, status: 200,
		wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "", "stop", st.Usage(40, 4), map[string]string{protocol.MetaToolCalls: st.OneCall})}},
	{name: "T5 stream two parallel tool calls with usage", golden: "stream_two_tool_calls.sse", stream: true, includeUsage: true,
		tools: []string{"get_weather", "get_time"}, status: 200, wantCalls: 2, wantFinish: "tool_calls",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "", "tool_calls", st.Usage(40, 8), map[string]string{protocol.MetaToolCalls: st.TwoCalls})}},
	{name: "T5 non-stream one tool call", golden: "nonstream_tool_call.json", tools: []string{"get_weather"}, status: 200,
		wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "", "stop", st.Usage(40, 4), map[string]string{protocol.MetaToolCalls: st.OneCall})}},
	{name: "T5 non-stream two parallel tool calls", golden: "nonstream_two_tool_calls.json", tools: []string{"get_weather", "get_time"},
		status: 200, wantCalls: 2, wantFinish: "tool_calls",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "", "tool_calls", st.Usage(40, 8), map[string]string{protocol.MetaToolCalls: st.TwoCalls})}},
	{name: "T5 stream length stop", golden: "stream_length.sse", stream: true, includeUsage: true, status: 200, wantFinish: "length",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "word"), st.Delta(3, " word"), st.Complete(4, "word word", "length", st.Usage(5, 2), nil)}},
	{name: "T5 non-stream length stop", golden: "nonstream_length.json", status: 200, wantFinish: "length",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "word"), st.Delta(3, " word"), st.Complete(4, "", "length", st.Usage(5, 2), nil)}},
	{name: "E9 stream text tool fallback", golden: "stream_text_tool_fallback.sse", stream: true, tools: []string{"get_weather"},
		status: 200, wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Checking. "), st.Delta(3, "```json\n{\"tool_calls\":[{\"name\":"),
			st.Delta(4, "\"get_weather\",\"arguments\":{\"city\": \"Paris\"}}]}\n```"),
			st.Complete(5, "", "stop", st.Usage(50, 20), map[string]string{protocol.MetaTextToolFallback: "true"})}},
	{name: "E9 non-stream text tool fallback", golden: "nonstream_text_tool_fallback.json", tools: []string{"get_weather"},
		status: 200, wantCalls: 1, wantFinish: "tool_calls",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]}", "stop",
			st.Usage(50, 20), map[string]string{protocol.MetaTextToolFallback: "true"})}},
	{name: "E9 JSON text without the fallback flag stays content", golden: "stream_json_text_no_fallback.sse", stream: true,
		tools: []string{"get_weather"}, status: 200, wantFinish: "stop",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Here: "), st.Delta(3, "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{}}]}"),
			st.Complete(4, "", "stop", st.Usage(50, 20), nil)}},
	{name: "T5 stream error after bytes ends with an error event", golden: "stream_error_midstream.sse", stream: true, includeUsage: true,
		status: 200, wantError: true,
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hel"), st.Error(3, "upstream_error", "backend reset the connection")}},
	{name: "H1 stall before any byte is a 504", golden: "error_stalled.json", stream: true, status: 504,
		events: []*iop.RunEvent{st.Start(), st.Error(2, "response_stalled", "response stalled")}},
}

// TestConversionGolden checks run-event → OpenAI conversions byte for byte
// against testdata/ (regenerate with -update) and structurally against what
// the official SDKs parse.
func TestConversionGolden(t *testing.T) {
	for _, tc := range convCases {
		t.Run(tc.name, func(t *testing.T) {
			var c Chat
			c.Init(ChatOptions{Model: "tiny", ID: "chatcmpl-id0", Created: 1700000000, Stream: tc.stream,
				IncludeUsage: tc.includeUsage, Tools: tc.tools, Hold: true, NewID: st.SeqIDs()})
			status, body := st.Drive(t, &c, tc.events, testFailure, surface.AppendOpenAIError)
			if status != tc.status {
				t.Fatalf("status: got %d, want %d; body %s", status, tc.status, body)
			}
			st.Golden(t, tc.golden, body, *update)
			switch {
			case tc.status != 200:
				st.CheckOpenAIError(t, body, tc.status)
			case tc.stream:
				st.CheckChatStream(t, body, tc.includeUsage, tc.wantCalls, tc.wantFinish, tc.wantError)
			default:
				st.CheckCompletion(t, body, tc.wantCalls, tc.wantFinish)
			}
		})
	}
}

// testFailure stands for the Edge's mapping of a node's ERROR terminal
// (internal/edge/api): a stall is 504, anything else a 502.
func testFailure(ev *iop.RunEvent) *surface.Error {
	if ev.FailureCode == "response_stalled" {
		return &surface.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "response_stalled",
			Message: "the provider stopped responding (response stalled)"}
	}
	return surface.BadGateway("provider_error", "the provider failed to answer")
}
