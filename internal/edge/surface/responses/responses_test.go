package responses

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

const weatherTool = `{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":false}`

// F1, Q3: Responses requests → RunInput, golden (testdata/in_*.json).
func TestInputGolden(t *testing.T) {
	rows := []struct {
		name, golden, body string
		tools              []string
		maxCalls           int
	}{
		{name: "Q3 string input, instructions, sampling, json_schema", golden: "in_text.json",
			body: `{"model":"tiny","input":"hi","instructions":"be brief","max_output_tokens":64,"temperature":0.5,"top_p":0.9,"store":false,` +
				`"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}},"metadata":{"k":"v"},"user":"u1"}`},
		{name: "Q3 message items with parts and an image", golden: "in_items.json",
			body: `{"model":"tiny","truncation":"auto","input":[{"role":"developer","content":"rules"},{"type":"message","role":"user","content":[` +
				`{"type":"input_text","text":"look"},{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo=","detail":"auto"}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}]}]}`},
		{name: "Q3 function tool round trip", golden: "in_tool_round_trip.json", tools: []string{"get_weather"}, maxCalls: 1,
			body: `{"model":"tiny","tools":[` + weatherTool + `],"tool_choice":"auto","parallel_tool_calls":false,"input":[` +
				`{"role":"user","content":"weather in Paris?"},` +
				`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},` +
				`{"type":"function_call_output","call_id":"call_1","output":"sunny"}]}`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			in, p, e := Input([]byte(row.body))
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

// F2: stateful or unsupported Responses input is a 400 naming the
// field.
func TestInputRefused(t *testing.T) {
	rows := []struct{ name, body, param, contains string }{
		{"previous_response_id (stateless)", `{"model":"tiny","input":"hi","previous_response_id":"resp_1"}`, "previous_response_id", "previous_response_id"},
		{"store true (stateless)", `{"model":"tiny","input":"hi","store":true}`, "store", "store"},
		{"conversation", `{"model":"tiny","input":"hi","conversation":"conv_1"}`, "conversation", "conversation"},
		{"background", `{"model":"tiny","input":"hi","background":true}`, "background", "background"},
		{"an unknown reasoning effort", `{"model":"tiny","input":"hi","reasoning":{"effort":"ultra"}}`, "reasoning", "reasoning.effort"},
		{"a tool of an unknown type", `{"model":"tiny","input":"hi","tools":[{"type":"teleport"}]}`, "tools", "teleport"},
		{"an item of an unknown type", `{"model":"tiny","input":[{"type":"hologram"}]}`, "input", "hologram"},
		{"remote image URL (SSRF)", `{"model":"tiny","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://example.com/x.png"}]}]}`,
			"input", "remote image URLs"},
		{"missing input", `{"model":"tiny"}`, "input", "input"},
		{"include logprobs", `{"model":"tiny","input":"hi","include":["message.output_text.logprobs"]}`, "include", "include"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, _, e := Input([]byte(row.body))
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
	events       []*iop.RunEvent
	status       int
	wantStatus   string
	wantCalls    int
	wantError    bool
}

var outCases = []outCase{
	{name: "T5 non-stream text", golden: "nonstream_text.json", status: 200, wantStatus: "completed",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hello"), st.Complete(3, "Hello from tiny", "stop", st.Usage(9, 3), nil)}},
	{name: "T5 stream text", golden: "stream_text.sse", stream: true, status: 200, wantStatus: "completed",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hello"), st.Delta(3, " \"quoted\"\n<tag> & é"), st.Complete(4, "", "stop", st.Usage(9, 3), nil)}},
	{name: "T5 stream cut by max_output_tokens is incomplete", golden: "stream_incomplete.sse", stream: true, status: 200, wantStatus: "incomplete",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "word"), st.Delta(3, " word"), st.Complete(4, "word word", "length", st.Usage(5, 2), nil)}},
	{name: "T5 non-stream cut by max_output_tokens is incomplete", golden: "nonstream_incomplete.json", status: 200, wantStatus: "incomplete",
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "word word", "length", st.Usage(5, 2), nil)}},
	{name: "T5 stream function call", golden: "stream_function_call.sse", stream: true, tools: []string{"get_weather"}, status: 200,
		wantStatus: "completed", wantCalls: 1,
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "", "tool_calls", st.Usage(40, 9), map[string]string{protocol.MetaToolCalls: st.OneCall})}},
	{name: "T5 non-stream text and two function calls", golden: "nonstream_function_calls.json", tools: []string{"get_weather", "get_time"},
		status: 200, wantStatus: "completed", wantCalls: 2,
		events: []*iop.RunEvent{st.Start(), st.Complete(2, "Checking.", "tool_calls", st.Usage(40, 8), map[string]string{protocol.MetaToolCalls: st.TwoCalls})}},
	{name: "T5 tool round trip, final answer after the function output", golden: "stream_after_function_output.sse", stream: true,
		tools: []string{"get_weather"}, status: 200, wantStatus: "completed",
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "It is sunny in Paris."), st.Complete(3, "", "stop", st.Usage(60, 7), nil)}},
	{name: "T5 stream error after bytes is response.failed", golden: "stream_failed.sse", stream: true, status: 200, wantError: true,
		events: []*iop.RunEvent{st.Start(), st.Delta(2, "Hel"), st.Error(3, "upstream_error", "backend reset")}},
	{name: "H1 stall before any byte is a 504", golden: "error_stalled.json", stream: true, status: 504,
		events: []*iop.RunEvent{st.Start(), st.Error(2, "response_stalled", "stalled")}},
}

const echoForTest = `"instructions":null,"max_output_tokens":null,"metadata":{},"parallel_tool_calls":true,"previous_response_id":null,` +
	`"reasoning":{"effort":null,"summary":null},"store":false,"temperature":1,"text":{"format":{"type":"text"}},"tool_choice":"auto",` +
	`"tools":[],"top_p":1,"truncation":"disabled","user":null`

// TestOutputGolden checks run-event → Responses conversions byte for byte
// against testdata/ (regenerate with -update) and structurally as the SDKs
// parse them.
func TestOutputGolden(t *testing.T) {
	for _, tc := range outCases {
		t.Run(tc.name, func(t *testing.T) {
			var enc Encoder
			enc.Init(Options{Model: "tiny", ID: "resp_id0", Created: 1700000000, Stream: tc.stream, Tools: tc.tools,
				Echo: []byte(echoForTest), NewID: st.SeqIDs()})
			status, body := st.Drive(t, &enc, tc.events, testFailure, surface.AppendOpenAIError)
			if status != tc.status {
				t.Fatalf("status: got %d, want %d; body %s", status, tc.status, body)
			}
			st.Golden(t, tc.golden, body, *update)
			var r st.ResponseObject
			switch {
			case tc.status != 200:
				st.CheckOpenAIError(t, body, tc.status)
				return
			case tc.stream:
				r = st.CheckResponseStream(t, body, tc.wantError)
			default:
				r = st.CheckResponse(t, body)
			}
			if tc.wantError {
				return
			}
			calls := 0
			for _, it := range r.Output {
				if it.Type == "function_call" {
					calls++
				}
			}
			if r.Status != tc.wantStatus || calls != tc.wantCalls {
				t.Errorf("status %q with %d calls, want %q with %d", r.Status, calls, tc.wantStatus, tc.wantCalls)
			}
		})
	}
}

// F1: the echo is valid JSON members for every request shape.
func TestEcho(t *testing.T) {
	_, p, e := Input([]byte(`{"model":"tiny","input":"x","instructions":"i","max_output_tokens":5,"temperature":0.2,"tools":[` + weatherTool +
		`],"tool_choice":{"type":"function","name":"get_weather"},"text":{"format":{"type":"json_object"}},"metadata":{"a":"b"},"user":"u"}`))
	if e != nil {
		t.Fatal(e)
	}
	st.CheckResponse(t, append(append([]byte(`{"id":"r","object":"response","status":"completed","model":"tiny","output":[],`+
		`"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2},`), p.Echo...), '}'))
}

// F2: every field the Responses parser knows has exactly one row in
// Fields; a field added to request without a row fails here.
func TestFieldTableComplete(t *testing.T) {
	st.CheckFieldTable(t, RequestFields(), Fields)
}

func testFailure(ev *iop.RunEvent) *surface.Error {
	if ev.FailureCode == "response_stalled" {
		return &surface.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "response_stalled",
			Message: "the provider stopped responding (response stalled)"}
	}
	return surface.BadGateway("provider_error", "the provider failed to answer")
}

// T5: a reasoning input item goes back to the backend as the next
// assistant message's thinking; one the run path cannot read (another
// provider's encrypted_content) is reported, and a malformed one (content
// not an array of reasoning_text parts, a summary part of another type) is
// a 400 naming it, never dropped in silence.
func TestReasoningHistory(t *testing.T) {
	const u = `{"role":"user","content":"hi"},`
	const a = `,{"role":"assistant","content":"a"},{"role":"user","content":"again"}`
	rows := []struct {
		name, item       string
		thinking, report string // the assistant message's thinking; the reported path
		bad              string // a 400 naming this
	}{
		{name: "reasoning_text content", item: `{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"T"}]}`, thinking: "T"},
		{name: "summary only", item: `{"type":"reasoning","summary":[{"type":"summary_text","text":"S"}]}`, thinking: "S"},
		{name: "an iop carrier only", item: `{"type":"reasoning","summary":[],"encrypted_content":"` + surface.EncodeReasoning("C") + `"}`, thinking: "C"},
		{name: "another provider's encrypted_content", item: `{"type":"reasoning","summary":[],"encrypted_content":"gAAAAABfoo"}`, report: "input[1]"},
		{name: "content a string", item: `{"type":"reasoning","summary":[],"content":"T"}`, bad: "input[1].content"},
		{name: "content part of another type", item: `{"type":"reasoning","summary":[],"content":[{"type":"secret_text","text":"T"}]}`, bad: `"secret_text"`},
		{name: "content part text a number", item: `{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":5}]}`, bad: "text"},
		{name: "summary part of another type", item: `{"type":"reasoning","summary":[{"type":"weird","text":"S"}]}`, bad: `"weird"`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			in, p, e := Input([]byte(`{"model":"tiny","input":[` + u + row.item + a + `]}`))
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
