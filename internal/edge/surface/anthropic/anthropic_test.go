package anthropic

import (
	"flag"
	"net/http"
	"strings"
	"testing"

	"iop/internal/edge/surface"
	st "iop/internal/edge/surface/surfacetest"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

const weatherTool = `{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`

// F1, Q3: Messages requests → RunInput, golden (testdata/in_*.json).
func TestInputGolden(t *testing.T) {
	rows := []struct {
		name, golden, body string
		count              bool
		tools              []string
		maxCalls           int
	}{
		{name: "Q3 system string, text, sampling", golden: "in_text.json",
			body: `{"model":"tiny","max_tokens":64,"system":"be brief","stop_sequences":["END"],"temperature":0.5,"top_p":0.9,"top_k":40,` +
				`"metadata":{"user_id":"u1"},"messages":[{"role":"user","content":"hi"}]}`},
		{name: "Q3 system blocks with cache_control, multi-block user text and an image", golden: "in_blocks.json",
			body: `{"model":"tiny","max_tokens":8,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],` +
				`"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"at this"}]}]}`},
		{name: "Q3 tool round trip: tool_use in, tool_result back (is_error), tools and tool_choice", golden: "in_tool_round_trip.json",
			tools: []string{"get_weather"}, maxCalls: 1,
			body: `{"model":"tiny","max_tokens":64,"tools":[` + weatherTool + `],"tool_choice":{"type":"auto","disable_parallel_tool_use":true},"messages":[` +
				`{"role":"user","content":"weather in Paris?"},` +
				`{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},` +
				`{"type":"tool_use","id":"call_2","name":"get_weather","input":{"city":"Lyon"}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":[{"type":"text","text":"sunny"}]},` +
				`{"type":"tool_result","tool_use_id":"call_2","content":"timeout","is_error":true},{"type":"text","text":"and?"}]}]}`},
		{name: "Q3 count_tokens caps the run at one token", golden: "in_count.json", count: true, tools: []string{"get_weather"},
			body: `{"model":"tiny","system":"s","tools":[` + weatherTool + `],"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			in, p, e := Input([]byte(row.body), row.count)
			if e != nil {
				t.Fatal(e)
			}
			if strings.Join(p.Tools, ",") != strings.Join(row.tools, ",") || p.MaxToolCalls != row.maxCalls {
				t.Errorf("params %+v, want tools %v max %d", p, row.tools, row.maxCalls)
			}
			st.Golden(t, row.golden, st.RunInputJSON(t, in), *update)
		})
	}
}

// F2: bad or unsupported Messages input is a 400 naming the field.
func TestInputRefused(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	rows := []struct {
		name, body, param, contains string
		count                       bool
	}{
		{"missing max_tokens", `{"model":"tiny",` + msgs + `}`, "max_tokens", "max_tokens", false},
		{"thinking enabled without a budget", `{"model":"tiny","max_tokens":5,"thinking":{"type":"enabled"},` + msgs + `}`, "thinking", "budget_tokens", false},
		{"thinking of an unknown type", `{"model":"tiny","max_tokens":5,"thinking":{"type":"deep"},` + msgs + `}`, "thinking", "deep", false},
		{"an unknown effort", `{"model":"tiny","max_tokens":5,"output_config":{"effort":"extreme"},` + msgs + `}`, "output_config", "extreme", false},
		{"a context edit the Edge cannot apply", `{"model":"tiny","max_tokens":5,"context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]},` + msgs + `}`,
			"context_management", "clear_tool_uses_20250919", false},
		{"an unknown block type", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"hologram","x":1}]}]}`, "messages", "hologram", false},
		{"mcp_servers", `{"model":"tiny","max_tokens":5,"mcp_servers":[{}],` + msgs + `}`, "mcp_servers", "mcp_servers", false},
		{"remote image URL (SSRF)", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://169.254.169.254/"}}]}]}`,
			"messages", "remote image URLs", false},
		{"server tool", `{"model":"tiny","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],` + msgs + `}`, "tools", "server tools", false},
		{"an unknown role in messages", `{"model":"tiny","max_tokens":5,"messages":[{"role":"narrator","content":"x"}]}`, "messages", "role", false},
		// T5: content the model reads is never dropped: an unknown block type is named.
		{"an unknown system block type", `{"model":"tiny","max_tokens":5,"system":[{"type":"image","source":{}}],` + msgs + `}`, "system", `"image"`, false},
		{"document block", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"AA=="}}]}]}`,
			"messages", "document", false},
		{"count_tokens with max_tokens", `{"model":"tiny","max_tokens":5,` + msgs + `}`, "max_tokens", "count_tokens", true},
		{"bad tool_choice", `{"model":"tiny","max_tokens":5,"tool_choice":{"type":"maybe"},` + msgs + `}`, "tool_choice", "tool_choice", false},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := Input([]byte(row.body), row.count)
			if e == nil || e.Status != http.StatusBadRequest || e.Param != row.param || !strings.Contains(e.Message, row.contains) {
				t.Fatalf("got %+v, want a 400 with param %q naming %q", e, row.param, row.contains)
			}
		})
	}
}

type outCase struct {
	name, golden string
	stream       bool
	tools        []string
	maxCalls     int
	events       []*iop.RunEvent
	status       int
	wantStop     string
	wantError    bool
}

var outCases = []outCase{
	{name: "T5 non-stream text", golden: "nonstream_text.json", status: 200, wantStop: "end_turn",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hello"), st.Complete(3, "Hello from tiny", "stop", st.Usage(9, 3), nil)}},
	{name: "T5 stream text", golden: "stream_text.sse", stream: true, status: 200, wantStop: "end_turn",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hello"), st.Delta(3, " \"quoted\"\n<tag> & é"), st.Complete(4, "", "stop", st.Usage(9, 3), nil)}},
	{name: "T5 stream cut by max_tokens", golden: "stream_max_tokens.sse", stream: true, status: 200, wantStop: "max_tokens",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "word"), st.Delta(3, " word"), st.Complete(4, "word word", "length", st.Usage(5, 2), nil)}},
	{name: "T5 non-stream cut by max_tokens", golden: "nonstream_max_tokens.json", status: 200, wantStop: "max_tokens",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "word word", "length", st.Usage(5, 2), nil)}},
	{name: "T5 stream text then a tool call", golden: "stream_tool_use.sse", stream: true, tools: []string{"get_weather"}, status: 200,
		wantStop: "tool_use",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Checking."), st.Complete(3, "Checking.", "tool_calls", st.Usage(40, 9),
			map[string]string{protocol.MetaToolCalls: st.OneCall})}},
	{name: "T5 non-stream two tool calls", golden: "nonstream_two_tool_uses.json", tools: []string{"get_weather", "get_time"}, status: 200,
		wantStop: "tool_use",
		events:   []*iop.RunEvent{st.Start(), st.Complete(2, "", "tool_calls", st.Usage(40, 8), map[string]string{protocol.MetaToolCalls: st.TwoCalls})}},
	{name: "T5 disable_parallel_tool_use keeps the first call", golden: "stream_one_of_two_tool_uses.sse", stream: true,
		tools: []string{"get_weather", "get_time"}, maxCalls: 1, status: 200, wantStop: "tool_use",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "", "tool_calls", st.Usage(40, 8), map[string]string{protocol.MetaToolCalls: st.TwoCalls})}},
	{name: "T5 tool round trip, final answer after the tool result", golden: "stream_after_tool_result.sse", stream: true,
		tools: []string{"get_weather"}, status: 200, wantStop: "end_turn",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "It is sunny in Paris."), st.Complete(3, "", "stop", st.Usage(60, 7), nil)}},
	{name: "T5 stream error after bytes is an error event", golden: "stream_error_midstream.sse", stream: true, status: 200, wantError: true,
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hel"), st.Error(3, "upstream_error", "backend reset")}},
	{name: "H1 stall before any byte is a 504 in Anthropic shape", golden: "error_stalled.json", stream: true, status: 504,
		events: []*iop.RunEvent{st.Start(), st.Error(2, "response_stalled", "stalled")}},
	{name: "T5 malformed tool arguments are a 502", golden: "error_bad_tool_input.json", tools: []string{"f"}, status: 502,
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "", "tool_calls", nil,
			map[string]string{protocol.MetaToolCalls: `[{"id":"c","type":"function","function":{"name":"f","arguments":"[1,2]"}}]`})}},
}

// TestOutputGolden checks run-event → Messages conversions byte for byte
// against testdata/ (regenerate with -update) and structurally as the SDKs
// parse them.
func TestOutputGolden(t *testing.T) {
	for _, tc := range outCases {
		t.Run(tc.name, func(t *testing.T) {
			var m Messages
			m.Init(Options{Model: "tiny", ID: "msg_id0", Stream: tc.stream, Tools: tc.tools, MaxToolCalls: tc.maxCalls, NewID: st.SeqIDs()})
			status, body := st.Drive(t, &m, tc.events, testFailure, surface.AppendAnthropicError)
			if status != tc.status {
				t.Fatalf("status: got %d, want %d; body %s", status, tc.status, body)
			}
			st.Golden(t, tc.golden, body, *update)
			var msg st.AnthropicMessage
			switch {
			case tc.status != 200:
				if !strings.HasPrefix(string(body), `{"type":"error","error":{"type":`) {
					t.Errorf("not an Anthropic error: %s", body)
				}
				return
			case tc.stream:
				msg = st.CheckAnthropicStream(t, body, tc.wantError)
			default:
				msg = st.CheckAnthropicMessage(t, body)
			}
			if !tc.wantError && msg.StopReason != tc.wantStop {
				t.Errorf("stop_reason %q, want %q", msg.StopReason, tc.wantStop)
			}
		})
	}
}

// F1: count_tokens answers the backend's own prompt count, and a 400
// when the backend reported none.
func TestCount(t *testing.T) {
	status, body := st.Drive(t, Count{}, []*iop.RunEvent{st.Start(), st.Complete(2, "x", "length", st.Usage(17, 1), nil)}, testFailure, surface.AppendAnthropicError)
	if status != 200 || string(body) != `{"input_tokens":17}` {
		t.Errorf("got %d %s", status, body)
	}
	status, body = st.Drive(t, Count{}, []*iop.RunEvent{st.Start(), st.Complete(2, "x", "length", nil, nil)}, testFailure, surface.AppendAnthropicError)
	if status != 400 || !strings.Contains(string(body), "reported no token count") {
		t.Errorf("without a count: got %d %s", status, body)
	}
}

func testFailure(ev *iop.RunEvent) *surface.Error {
	if ev.FailureCode == "response_stalled" {
		return &surface.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "response_stalled",
			Message: "the provider stopped responding (response stalled)"}
	}
	return surface.BadGateway("provider_error", "the provider failed to answer")
}

// T5: an assistant's thinking block goes back to the backend as that
// message's thinking (its text, else the text of an iop signature); one
// whose only reasoning is another provider's signature is reported like
// redacted_thinking, and a thinking or signature that is not a string is a
// 400 naming it, never dropped in silence.
func TestThinkingHistory(t *testing.T) {
	rows := []struct {
		name, block      string
		thinking, report string // the assistant message's thinking; the reported path
		bad              string // a 400 naming this
	}{
		{name: "text and signature", block: `{"type":"thinking","thinking":"T","signature":"sig"}`, thinking: "T"},
		{name: "an iop signature only", block: `{"type":"thinking","thinking":"","signature":"` + surface.EncodeReasoning("C") + `"}`, thinking: "C"},
		{name: "text without a signature", block: `{"type":"thinking","thinking":"T"}`, thinking: "T"},
		{name: "another provider's signature only", block: `{"type":"thinking","thinking":"","signature":"EqQBCkYIBxgC"}`, report: "messages[1].content[0]"},
		{name: "redacted_thinking", block: `{"type":"redacted_thinking","data":"EqQB"}`, report: "messages[1].content[0]"},
		{name: "thinking a number", block: `{"type":"thinking","thinking":5,"signature":"x"}`, bad: "messages[1].content[0].thinking"},
		{name: "signature a number", block: `{"type":"thinking","thinking":"T","signature":7}`, bad: "messages[1].content[0].signature"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			body := `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[` + row.block +
				`,{"type":"text","text":"a"}]},{"role":"user","content":"again"}]}`
			in, p, e := Input([]byte(body), false)
			if row.bad != "" {
				if e == nil || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, row.bad) {
					t.Fatalf("got %+v, want a 400 naming %s", e, row.bad)
				}
				return
			}
			if e != nil {
				t.Fatal(e)
			}
			if got := in.Messages[1].GetThinking(); in.Messages[1].Role != "assistant" || got != row.thinking {
				t.Errorf("assistant thinking %q, want %q", got, row.thinking)
			}
			if got := p.Ignored.Header(); got != row.report {
				t.Errorf("reported %q, want %q", got, row.report)
			}
		})
	}
}
