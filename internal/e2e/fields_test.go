package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/edge/surface"
	"iop/internal/edge/surface/anthropic"
	"iop/internal/edge/surface/openai"
	"iop/internal/edge/surface/responses"
	"iop/internal/leakcheck"
)

// absent is a native-field expectation: the path must not exist.
const absent = "<absent>"

// fieldCase is one request that exercises one field of a surface's table:
// a translated field must reach the upstream Ollama request as native (path
// → JSON value, or absent); a refused one must be a 400 naming it; a
// routing or advisory one must succeed.
type fieldCase struct {
	field  string
	body   string
	native map[string]string
	refuse string // substring of the 400's message
}

// captor records the body of every /api/chat and /api/embed request before
// the demo backend answers it.
type captor struct {
	next http.Handler
	mu   sync.Mutex
	last []byte
}

func (c *captor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/api/chat" || r.URL.Path == "/api/embed" {
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.last = b
		c.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	c.next.ServeHTTP(w, r)
}

func (c *captor) take() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.last
	c.last = nil
	return b
}

// jsonAt returns the value at a dotted path ("options.top_k",
// "messages.1.images.0") of a decoded JSON document.
func jsonAt(doc any, path string) (any, bool) {
	for _, k := range strings.Split(path, ".") {
		switch v := doc.(type) {
		case map[string]any:
			e, ok := v[k]
			if !ok {
				return nil, false
			}
			doc = e
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			doc = v[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

const (
	weatherFn     = `{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`
	weatherTool   = `{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}`
	weatherRespFn = `{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}`
	pngDataURL    = "data:image/png;base64,iVBORw0KGgo="
	chatMsgs      = `"messages":[{"role":"user","content":"hi"}]`
)

func chatCase(field, extra string, native map[string]string, refuse string) fieldCase {
	return fieldCase{field: field, body: `{"model":"tiny",` + chatMsgs + `,` + extra + `}`, native: native, refuse: refuse}
}

var chatCases = []fieldCase{
	chatCase("model", `"stream":false`, map[string]string{"model": `"tiny"`}, ""),
	{field: "messages", body: `{"model":"tiny","messages":[{"role":"developer","content":"rules"},{"role":"user","content":[{"type":"text","text":"a"},` +
		`{"type":"text","text":"b"},{"type":"image_url","image_url":{"url":"` + pngDataURL + `"}}]}]}`,
		native: map[string]string{"messages.0.role": `"system"`, "messages.1.content": `"a\nb"`, "messages.1.images.0": `"iVBORw0KGgo="`}},
	{field: "messages", body: `{"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/latest"}}]}]}`,
		refuse: "remote image URLs"},
	chatCase("stream", `"stream":true`, nil, ""),
	chatCase("stream_options", `"stream":true,"stream_options":{"include_usage":true}`, nil, ""),
	chatCase("audio", `"audio":{"voice":"alloy","format":"mp3"}`, nil, `"audio"`),
	chatCase("frequency_penalty", `"frequency_penalty":0.5`, map[string]string{"options.frequency_penalty": "0.5"}, ""),
	chatCase("function_call", `"function_call":"auto"`, nil, `"function_call"`),
	chatCase("functions", `"functions":[{"name":"f"}]`, nil, `"functions"`),
	chatCase("logit_bias", `"logit_bias":{"50256":-100}`, nil, `"logit_bias"`),
	chatCase("logprobs", `"logprobs":true`, map[string]string{"logprobs": "true"}, ""),
	chatCase("max_completion_tokens", `"max_completion_tokens":7`, map[string]string{"options.num_predict": "7"}, ""),
	chatCase("max_tokens", `"max_tokens":9`, map[string]string{"options.num_predict": "9"}, ""),
	chatCase("metadata", `"metadata":{"k":"v"}`, map[string]string{"metadata": absent}, ""),
	chatCase("metadata", `"metadata":"k"`, nil, "metadata"),
	chatCase("modalities", `"modalities":["text","audio"]`, nil, `"modalities"`),
	chatCase("n", `"n":2`, nil, `"n"`),
	chatCase("parallel_tool_calls", `"parallel_tool_calls":false,"tools":[`+weatherFn+`]`, map[string]string{"parallel_tool_calls": absent}, ""),
	chatCase("prediction", `"prediction":{"type":"content","content":"x"}`, nil, `"prediction"`),
	chatCase("presence_penalty", `"presence_penalty":-0.5`, map[string]string{"options.presence_penalty": "-0.5"}, ""),
	chatCase("prompt_cache_key", `"prompt_cache_key":"k1"`, nil, ""),
	chatCase("prompt_cache_retention", `"prompt_cache_retention":"24h"`, nil, ""),
	// tiny cannot think (/api/show): thinking asked for is answered without
	// it (think left out), never a 400; reasoning_test.go covers a model
	// that thinks.
	chatCase("reasoning_effort", `"reasoning_effort":"low"`, map[string]string{"think": absent}, ""),
	chatCase("reasoning_effort", `"reasoning_effort":"extreme"`, nil, "reasoning_effort"),
	{field: "messages", body: `{"model":"tiny","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello","reasoning_content":"greet back"},` +
		`{"role":"user","content":"again"}]}`, native: map[string]string{"messages.1.thinking": `"greet back"`}},
	chatCase("response_format", `"response_format":{"type":"json_object"}`, map[string]string{"format": `"json"`}, ""),
	chatCase("response_format", `"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"a":{"type":"string"}}}}}`,
		map[string]string{"format": `{"type":"object","properties":{"a":{"type":"string"}}}`}, ""),
	chatCase("safety_identifier", `"safety_identifier":"u-1"`, nil, ""),
	chatCase("seed", `"seed":42`, map[string]string{"options.seed": "42"}, ""),
	chatCase("service_tier", `"service_tier":"auto"`, nil, ""),
	chatCase("service_tier", `"service_tier":"gold"`, nil, "service_tier"),
	chatCase("stop", `"stop":["END"]`, map[string]string{"options.stop": `["END"]`}, ""),
	chatCase("store", `"store":true`, nil, `"store"`),
	chatCase("temperature", `"temperature":0.25`, map[string]string{"options.temperature": "0.25"}, ""),
	chatCase("temperature", `"temperature":99`, nil, "temperature"),
	chatCase("tool_choice", `"tool_choice":"none","tools":[`+weatherFn+`]`, map[string]string{"tools": absent}, ""),
	chatCase("tool_choice", `"tool_choice":"required","tools":[`+weatherFn+`]`, nil, "tool_choice"),
	chatCase("tools", `"tools":[`+weatherFn+`]`, map[string]string{"tools.0.function.name": `"get_weather"`}, ""),
	chatCase("top_logprobs", `"logprobs":true,"top_logprobs":3`, map[string]string{"top_logprobs": "3"}, ""),
	chatCase("top_p", `"top_p":0.75`, map[string]string{"options.top_p": "0.75"}, ""),
	chatCase("user", `"user":"u-1"`, map[string]string{"user": absent}, ""),
	chatCase("user", `"user":5`, nil, "user"),
	chatCase("verbosity", `"verbosity":"low"`, nil, `"verbosity"`),
	chatCase("web_search_options", `"web_search_options":{}`, nil, `"web_search_options"`),
}

func msgCase(field, extra string, native map[string]string, refuse string) fieldCase {
	return fieldCase{field: field, body: `{"model":"tiny","max_tokens":32,` + chatMsgs + `,` + extra + `}`, native: native, refuse: refuse}
}

var messagesCases = []fieldCase{
	msgCase("model", `"stream":false`, map[string]string{"model": `"tiny"`}, ""),
	{field: "messages", body: `{"model":"tiny","max_tokens":32,"messages":[{"role":"user","content":[{"type":"text","text":"look","cache_control":{"type":"ephemeral"}},` +
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"sunny"}]}],"tools":[` + weatherTool + `]}`,
		native: map[string]string{"messages.0.images.0": `"iVBORw0KGgo="`, "messages.1.tool_calls.0.function.arguments": `{"city":"Paris"}`,
			"messages.2.role": `"tool"`, "messages.2.tool_name": `"get_weather"`}},
	{field: "messages", body: `{"model":"tiny","max_tokens":32,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://10.0.0.1/x.png"}}]}]}`,
		refuse: "remote image URLs"},
	msgCase("max_tokens", `"stream":true`, map[string]string{"options.num_predict": "32"}, ""),
	msgCase("system", `"system":[{"type":"text","text":"be brief"}]`, map[string]string{"messages.0.role": `"system"`, "messages.0.content": `"be brief"`}, ""),
	msgCase("stop_sequences", `"stop_sequences":["END"]`, map[string]string{"options.stop": `["END"]`}, ""),
	msgCase("stream", `"stream":true`, nil, ""),
	msgCase("temperature", `"temperature":0.25`, map[string]string{"options.temperature": "0.25"}, ""),
	msgCase("top_p", `"top_p":0.75`, map[string]string{"options.top_p": "0.75"}, ""),
	msgCase("top_k", `"top_k":20`, map[string]string{"options.top_k": "20"}, ""),
	msgCase("tools", `"tools":[`+weatherTool+`]`, map[string]string{"tools.0.function.name": `"get_weather"`, "tools.0.function.parameters.type": `"object"`}, ""),
	msgCase("tools", `"tools":[`+weatherTool+`,{"name":"later","input_schema":{"type":"object"},"defer_loading":true}]`,
		map[string]string{"tools.0.function.name": `"get_weather"`, "tools.1": absent}, ""),
	msgCase("tool_choice", `"tool_choice":{"type":"none"},"tools":[`+weatherTool+`]`, map[string]string{"tools": absent}, ""),
	msgCase("tool_choice", `"tool_choice":{"type":"any"},"tools":[`+weatherTool+`]`, nil, "tool_choice"),
	msgCase("metadata", `"metadata":{"user_id":"u-1"}`, map[string]string{"metadata": absent}, ""),
	msgCase("metadata", `"metadata":{"tag":"x"}`, map[string]string{"metadata": absent, "tag": absent}, ""), // an unknown member: reported (unknown_test.go)
	msgCase("metadata", `"metadata":{"user_id":5}`, nil, "user_id"),
	msgCase("thinking", `"thinking":{"type":"enabled","budget_tokens":1024}`, map[string]string{"think": absent}, ""),
	msgCase("thinking", `"thinking":{"type":"adaptive","display":"omitted"}`, map[string]string{"think": absent}, ""),
	msgCase("thinking", `"thinking":{"type":"enabled","budget_tokens":10}`, nil, "budget_tokens"),
	msgCase("output_config", `"output_config":{"effort":"high","format":{"type":"json_schema","schema":{"type":"object"}}}`,
		map[string]string{"format": `{"type":"object"}`, "output_config": absent}, ""),
	msgCase("output_config", `"output_config":{"effort":"extreme"}`, nil, "output_config.effort"),
	{field: "messages", body: `{"model":"tiny","max_tokens":32,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[` +
		`{"type":"thinking","thinking":"greet back","signature":"sig-from-elsewhere"},{"type":"text","text":"hello"}]},{"role":"system","content":[{"type":"text","text":"be brief"}]},` +
		`{"role":"user","content":"again"}]}`,
		native: map[string]string{"messages.1.thinking": `"greet back"`, "messages.1.content": `"hello"`, "messages.2.role": `"system"`, "messages.2.content": `"be brief"`}},
	msgCase("service_tier", `"service_tier":"auto"`, nil, ""),
	msgCase("container", `"container":"c-1"`, nil, `"container"`),
	msgCase("mcp_servers", `"mcp_servers":[{"type":"url","url":"http://x","name":"x"}]`, nil, `"mcp_servers"`),
	msgCase("context_management", `"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]}`, map[string]string{"context_management": absent}, ""),
	msgCase("context_management", `"context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]}`, nil, "clear_tool_uses_20250919"),
}

func respCase(field, extra string, native map[string]string, refuse string) fieldCase {
	return fieldCase{field: field, body: `{"model":"tiny","input":"hi",` + extra + `}`, native: native, refuse: refuse}
}

var responsesCases = []fieldCase{
	respCase("model", `"stream":false`, map[string]string{"model": `"tiny"`}, ""),
	{field: "input", body: `{"model":"tiny","tools":[` + weatherRespFn + `],"input":[{"role":"user","content":[{"type":"input_text","text":"look"},` +
		`{"type":"input_image","image_url":"` + pngDataURL + `"}]},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},` +
		`{"type":"function_call_output","call_id":"call_1","output":"sunny"}]}`,
		native: map[string]string{"messages.0.images.0": `"iVBORw0KGgo="`, "messages.1.tool_calls.0.function.name": `"get_weather"`,
			"messages.2.role": `"tool"`, "messages.2.content": `"sunny"`}},
	respCase("instructions", `"instructions":"be brief"`, map[string]string{"messages.0.role": `"system"`, "messages.0.content": `"be brief"`}, ""),
	respCase("max_output_tokens", `"max_output_tokens":11`, map[string]string{"options.num_predict": "11"}, ""),
	respCase("max_tool_calls", `"max_tool_calls":3`, nil, ""),
	respCase("max_tool_calls", `"max_tool_calls":"3"`, nil, "max_tool_calls"),
	respCase("background", `"background":true`, nil, `"background"`),
	respCase("client_metadata", `"client_metadata":{"session_id":"s-1"}`, map[string]string{"client_metadata": absent}, ""),
	respCase("client_metadata", `"client_metadata":"s-1"`, nil, "client_metadata"),
	respCase("conversation", `"conversation":"conv_1"`, nil, `"conversation"`),
	respCase("include", `"include":["file_search_call.results"]`, nil, `"include"`),
	respCase("metadata", `"metadata":{"k":"v"}`, map[string]string{"metadata": absent}, ""),
	respCase("metadata", `"metadata":5`, nil, "metadata"),
	respCase("parallel_tool_calls", `"parallel_tool_calls":false`, nil, ""),
	respCase("previous_response_id", `"previous_response_id":"resp_1"`, nil, `"previous_response_id"`),
	respCase("prompt", `"prompt":{"id":"pmpt_1"}`, nil, `"prompt"`),
	respCase("prompt_cache_key", `"prompt_cache_key":"k"`, nil, ""),
	respCase("prompt_cache_retention", `"prompt_cache_retention":"24h"`, nil, ""),
	respCase("reasoning", `"reasoning":{"effort":"high","summary":"auto"}`, map[string]string{"think": absent, "reasoning": absent}, ""),
	respCase("reasoning", `"reasoning":{"summary":"verbose"}`, nil, "reasoning.summary"),
	{field: "input", body: `{"model":"tiny","input":[{"role":"user","content":"hi"},{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"` +
		`iop1.Z3JlZXQgYmFjaw=="},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]},{"role":"user","content":"again"}]}`,
		native: map[string]string{"messages.1.thinking": `"greet back"`, "messages.1.content": `"hello"`}},
	respCase("safety_identifier", `"safety_identifier":"u"`, nil, ""),
	respCase("service_tier", `"service_tier":"default"`, nil, ""),
	respCase("store", `"store":true`, nil, `"store"`),
	respCase("stream", `"stream":true`, nil, ""),
	respCase("stream_options", `"stream":true,"stream_options":{"include_obfuscation":false}`, nil, ""),
	respCase("temperature", `"temperature":0.25`, map[string]string{"options.temperature": "0.25"}, ""),
	respCase("text", `"text":{"format":{"type":"json_object"}}`, map[string]string{"format": `"json"`}, ""),
	respCase("tool_choice", `"tool_choice":"none","tools":[`+weatherRespFn+`]`, map[string]string{"tools": absent}, ""),
	respCase("tools", `"tools":[`+weatherRespFn+`]`, map[string]string{"tools.0.function.name": `"get_weather"`}, ""),
	respCase("tools", `"tools":[{"type":"web_search","external_web_access":false},{"type":"namespace","name":"ns","description":"d","tools":[`+weatherRespFn+`]}]`,
		map[string]string{"tools.0.function.name": `"get_weather"`, "tools.1": absent}, ""),
	respCase("tools", `"tools":[{"type":"teleport"}]`, nil, "teleport"),
	respCase("top_logprobs", `"top_logprobs":2`, nil, `"top_logprobs"`),
	respCase("top_p", `"top_p":0.75`, map[string]string{"options.top_p": "0.75"}, ""),
	respCase("truncation", `"truncation":"auto"`, map[string]string{"truncate": "true"}, ""),
	respCase("truncation", `"truncation":"disabled"`, map[string]string{"truncate": "false"}, ""),
	respCase("truncation", `"stream":false`, map[string]string{"truncate": absent}, ""),
	respCase("user", `"user":"u"`, nil, ""),
}

var embeddingsCases = []fieldCase{
	{field: "model", body: `{"model":"tiny","input":"hi"}`, native: map[string]string{"model": `"tiny"`}},
	{field: "input", body: `{"model":"tiny","input":["a","b"]}`, native: map[string]string{"input": `["a","b"]`}},
	{field: "input", body: `{"model":"tiny","input":[[1,2,3]]}`, refuse: `"input"`},
	{field: "encoding_format", body: `{"model":"tiny","input":"hi","encoding_format":"base64"}`},
	{field: "dimensions", body: `{"model":"tiny","input":"hi","dimensions":4}`, native: map[string]string{"dimensions": "4"}},
	{field: "user", body: `{"model":"tiny","input":"hi","user":"u"}`},
}

// F2: every field of every run-path surface is either translated to
// Ollama's native request (asserted on the bytes the upstream receives) or
// refused with a 400 naming it, never accepted and dropped; routing and
// advisory fields succeed. Every table row has a case here and every case a
// row, so a field added to a parser without a row, or a row without a case,
// fails. With IOP_TEST_OLLAMA_URL set the upstream is that real Ollama.
func TestRunPathFieldTables(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	capt := &captor{next: bp.b}
	if real := os.Getenv("IOP_TEST_OLLAMA_URL"); real != "" {
		// The same table against a real Ollama (IOP_TEST_OLLAMA_URL): the captor
		// sits in front of it.
		u, err := neturl.Parse(real)
		if err != nil {
			t.Fatalf("IOP_TEST_OLLAMA_URL: %v", err)
		}
		capt.next = httputil.NewSingleHostReverseProxy(u)
	}
	url := bp.serve(t, capt)
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, nil)
	_, _, api := startReady(t, p, cfg, logs)

	for _, s := range []struct {
		name, path string
		table      []surface.Field
		cases      []fieldCase
	}{
		{"chat", "/v1/chat/completions", openai.ChatFields, chatCases},
		{"messages", "/v1/messages", anthropic.Fields, messagesCases},
		{"responses", "/v1/responses", responses.Fields, responsesCases},
		{"embeddings", "/v1/embeddings", openai.EmbeddingsFields, embeddingsCases},
	} {
		t.Run(s.name, func(t *testing.T) {
			for _, row := range s.table {
				if !slices.ContainsFunc(s.cases, func(c fieldCase) bool { return c.field == row.Name }) {
					t.Errorf("table row %q (%s) has no case", row.Name, row.Disposition)
				}
			}
			for n, c := range s.cases {
				i := slices.IndexFunc(s.table, func(f surface.Field) bool { return f.Name == c.field })
				if i < 0 {
					t.Errorf("case %d: field %q has no table row", n, c.field)
					continue
				}
				row := s.table[i]
				t.Run(fmt.Sprintf("%s %s", row.Name, row.Disposition), func(t *testing.T) {
					capt.take()
					status, body := api.postRaw(t, s.path, c.body)
					if c.refuse != "" {
						var e struct {
							Error struct {
								Message string  `json:"message"`
								Param   *string `json:"param"`
							} `json:"error"`
						}
						_ = json.Unmarshal([]byte(body), &e)
						if status != http.StatusBadRequest || !strings.Contains(e.Error.Message, c.refuse) {
							t.Fatalf("got %d %s, want a 400 whose message names %s", status, body, c.refuse)
						}
						// OpenAI's error shape names the field in "param" too,
						// also when the node's driver refused it (tool_choice).
						if s.path != "/v1/messages" && c.refuse == c.field && (e.Error.Param == nil || *e.Error.Param != c.field) {
							t.Errorf("got %s, want param %q", body, c.field)
						}
						return
					}
					if status != http.StatusOK {
						t.Fatalf("got %d %s, want 200", status, body)
					}
					if row.Disposition == surface.Refused && len(c.native) == 0 {
						return // a refused row's accepted values
					}
					native := capt.take()
					var doc any
					if err := json.Unmarshal(native, &doc); err != nil {
						t.Fatalf("upstream body %q: %v", native, err)
					}
					for path, want := range c.native {
						got, ok := jsonAt(doc, path)
						if want == absent {
							if ok {
								t.Errorf("%s: got %v in the upstream request, want it absent: %s", path, got, native)
							}
							continue
						}
						var w any
						if err := json.Unmarshal([]byte(want), &w); err != nil {
							t.Fatalf("bad want %s: %v", want, err)
						}
						gb, _ := json.Marshal(got)
						wb, _ := json.Marshal(w)
						if !ok || !bytes.Equal(gb, wb) {
							t.Errorf("%s: got %s (present %v), want %s in %s", path, gb, ok, wb, native)
						}
					}
				})
			}
		})
	}
}

// postRaw posts body to path and returns the status and the whole body.
func (c *apiClient) postRaw(t testing.TB, path, body string) (int, string) {
	t.Helper()
	resp, err := c.hc.Post(c.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", path, err)
	}
	return resp.StatusCode, string(b)
}
