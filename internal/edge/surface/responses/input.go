package responses

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"iop/internal/edge/surface"
	"iop/internal/edge/surface/openai"
	iop "iop/proto/gen/iop"
)

// Input turns a Responses body into the normalized RunInput: the field
// table (Fields) and the shapes its errors name, the fields refused, the
// tools, tool_choice and text.format converted, and the request's
// settings the response object repeats (Params.Echo).

// The shapes of the Responses request's objects (surface.CheckMembers):
// every member the parser's structs know, per item and part type, so that
// no other is accepted and ignored. Tests hold them equal to the structs.
var (
	partShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil)},
		Types: []surface.Variant{
			{Type: "input_text", Members: []surface.Member{surface.M("text", nil)}},
			{Type: "output_text", Members: []surface.Member{surface.M("text", nil), surface.M("annotations", nil), surface.M("logprobs", nil)}},
			{Type: "input_image", Members: []surface.Member{surface.M("image_url", nil), surface.M("file_id", nil), surface.M("detail", nil)}},
		},
	}
	messageMembers = []surface.Member{surface.M("role", nil), surface.M("content", partShape)}
	itemShape      = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil), surface.M("id", nil), surface.M("status", nil)},
		Types: []surface.Variant{
			{Type: "", Members: messageMembers},
			{Type: "message", Members: messageMembers},
			{Type: "function_call", Members: []surface.Member{surface.M("call_id", nil), surface.M("name", nil),
				surface.M("namespace", nil), surface.M("arguments", nil)}},
			{Type: "function_call_output", Members: []surface.Member{surface.M("call_id", nil), surface.M("output", partShape)}},
			{Type: "reasoning", Members: []surface.Member{surface.M("summary", reasoningPartShape),
				surface.M("content", reasoningPartShape), surface.M("encrypted_content", nil)}},
		},
	}
	reasoningPartShape = &surface.Shape{Members: []surface.Member{surface.M("type", nil), surface.M("text", nil)}}
	functionMembers    = []surface.Member{surface.M("name", nil), surface.M("description", nil), surface.M("parameters", nil), surface.M("strict", nil)}
	namespacedShape    = &surface.Shape{Members: []surface.Member{surface.M("type", nil)},
		Types: []surface.Variant{{Type: "function", Members: functionMembers}}}
	toolShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil)},
		Types: []surface.Variant{{Type: "function", Members: functionMembers},
			{Type: "namespace", Members: []surface.Member{surface.M("name", nil), surface.M("description", nil), surface.M("tools", namespacedShape)}}},
	}
	toolChoiceShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil)},
		Types:   []surface.Variant{{Type: "function", Members: []surface.Member{surface.M("name", nil)}}},
	}
	formatShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil)},
		Types: []surface.Variant{
			{Type: "text"},
			{Type: "json_object"},
			{Type: "json_schema", Members: []surface.Member{surface.M("name", nil), surface.M("schema", nil),
				surface.M("strict", nil), surface.M("description", nil)}},
		},
	}
	textShape          = &surface.Shape{Members: []surface.Member{surface.M("format", formatShape), surface.M("verbosity", nil)}}
	reasoningShape     = &surface.Shape{Members: []surface.Member{surface.M("effort", nil), surface.M("summary", nil), surface.M("generate_summary", nil)}}
	streamOptionsShape = &surface.Shape{Members: []surface.Member{surface.M("include_obfuscation", nil)}}
)

// Fields is the run path's table of Responses request fields (no field is
// accepted and silently dropped): every field request parses has a row.
// Its notes are written for the client's operator: docs/surfaces.md shows
// them (TestSurfacesDocFieldTables).
var Fields = []surface.Field{
	surface.Row("model", surface.Routing, "selects the model group; the provider's target replaces it"),
	surface.Row("input", surface.Translated, "a string (one user message) or items: messages (input_text/output_text joined with \"\\n\", input_image with a data: URL → images; a remote URL or file_id is refused: the node never fetches what a client names), function_call → assistant tool_calls (its namespace is the client's: the call goes by name), function_call_output → tool messages, reasoning → the next assistant message's thinking (its reasoning_text content, else summary_text, else the text an iop encrypted_content carries; another provider's encrypted_content cannot be read and is dropped and reported; content other than reasoning_text parts, or a summary part other than summary_text, refused); id and status are the client's bookkeeping and change nothing").Of(itemShape),
	surface.Row("instructions", surface.Translated, "a system message before the input"),
	surface.Row("max_output_tokens", surface.Translated, "options.num_predict; reaching it ends the response as incomplete (reason max_output_tokens)"),
	surface.Row("max_tool_calls", surface.Advisory, "a count (≥ 0) of calls to built-in tools, and there are none"),
	surface.Row("background", surface.Refused, "true: the run path is stateless and runs nothing in the background; false is what it does"),
	surface.Row("client_metadata", surface.Advisory, "the client's own tags for its vendor's logs (Codex CLI sends its session and turn ids; an object): no effect on the answer, no backend takes them"),
	surface.Row("conversation", surface.Refused, "the run path is stateless: it stores no conversations; send the history as input"),
	surface.Row("include", surface.Refused, "any value but reasoning.encrypted_content (reasoning items always carry it: the reasoning text, base64, for clients that send back only that)"),
	surface.Row("metadata", surface.Advisory, "tags (16 string pairs, checked) echoed on the response object; no effect on the answer"),
	surface.Row("parallel_tool_calls", surface.Translated, "false: the edge returns at most one function call"),
	surface.Row("previous_response_id", surface.Refused, "the run path is stateless: it stores no responses; send the history as input"),
	surface.Row("prompt", surface.Refused, "no stored prompt templates: the run path stores nothing"),
	surface.Row("prompt_cache_key", surface.Advisory, "a prompt-cache routing hint (a string): the backends cache prompt prefixes by themselves, and prefix_affinity groups route by the conversation"),
	surface.Row("prompt_cache_retention", surface.Advisory, "a prompt-cache retention hint (in-memory or 24h): the backends keep their caches as they do"),
	surface.Row("reasoning", surface.Translated, "effort → think (none → false; minimal, low → \"low\"; medium; high, xhigh → \"high\"); a target that cannot think is answered without thinking; summary and generate_summary (auto, concise, detailed) advisory: no summarizer, the reasoning itself is returned as the reasoning item's reasoning_text content").Of(reasoningShape),
	surface.Row("safety_identifier", surface.Advisory, "an end-user id (a string) for the API provider's abuse monitoring; no backend takes one"),
	surface.Row("service_tier", surface.Advisory, "a processing tier (auto, default, flex, scale, priority): every request is served alike"),
	surface.Row("store", surface.Refused, "true: the run path is stateless and stores nothing; false is what it does"),
	surface.Row("stream", surface.Routing, "true: the answer streams as server-sent events; false: one JSON body"),
	surface.Row("stream_options", surface.Advisory, "include_obfuscation (a boolean): no obfuscation is added").Of(streamOptionsShape),
	surface.Row("temperature", surface.Translated, "options.temperature (0 to 2)"),
	surface.Row("text", surface.Translated, "format: json_object → format \"json\", json_schema → format <schema>; verbosity refused: Ollama has no verbosity control").Of(textShape),
	surface.Row("tool_choice", surface.Translated, "\"none\" drops the tools, \"auto\" is Ollama's behaviour; \"required\", a named function and the other kinds are refused: Ollama cannot force or restrict a tool call").Of(toolChoiceShape),
	surface.Row("tools", surface.Translated, "function tools → Ollama's tools; a namespace's function tools → tools under their own names; built-in and hosted tools (web_search, file_search, code_interpreter, mcp, local_shell, custom, …) are not offered to the model, since nothing here runs them, and are reported; strict (default true, echoed) is passed on but not enforced: Ollama has no constrained decoding of tool arguments").Of(toolShape),
	surface.Row("top_logprobs", surface.Refused, "any value but 0: output_text logprobs are not offered on this surface"),
	surface.Row("top_p", surface.Translated, "options.top_p (0 to 1)"),
	surface.Row("truncation", surface.Translated, "\"auto\" → truncate true, \"disabled\" → truncate false; absent → Ollama's default, which truncates as auto does (what Ollama's own /v1/responses does; echoed \"auto\")"),
	surface.Row("user", surface.Advisory, "an end-user id (a string) for the API provider's abuse monitoring; no backend takes one"),
}

// RequestFields lists the JSON names of every field the parser knows (for
// the field-table test).
func RequestFields() []string { return surface.JSONNames(request{}) }

// Params is what Input read besides the RunInput: the declared tool names,
// at most how many calls to return (0 = any; 1 with parallel_tool_calls
// false), Echo, the JSON members the response object repeats from the
// request (`"instructions":…,…,"user":null`, without braces), Namespaces
// (a namespaced function's name → its namespace, for the function_call
// items) and Ignored, what the request carried that is not sent to the
// backend.
type Params struct {
	Tools        []string
	MaxToolCalls int
	Echo         []byte
	Namespaces   map[string]string
	Ignored      surface.Ignored
}

// Input is InputPolicy under surface.RejectUnknown.
func Input(body []byte) (*iop.RunInput, Params, *surface.Error) {
	return InputPolicy(body, surface.RejectUnknown)
}

// InputPolicy turns a Responses body into the normalized RunInput (SPEC
// Q3; Fields says what happens to each field, policy what happens to a
// member Fields does not know). Errors are 400s naming the field.
func InputPolicy(body []byte, policy surface.UnknownFields) (*iop.RunInput, Params, *surface.Error) {
	var req request
	var p Params
	if e := surface.DecodeRequestPolicy(body, &req, Fields, policy, &p.Ignored); e != nil {
		return nil, p, e
	}
	if e := refuse(&req); e != nil {
		return nil, p, e
	}
	in := &iop.RunInput{}
	if req.Instructions != nil && *req.Instructions != "" {
		in.Messages = append(in.Messages, &iop.ChatMessage{Role: "system", Content: *req.Instructions})
	}
	msgs, e := convertInput(req.Input, &p.Ignored)
	if e != nil {
		return nil, p, e
	}
	in.Messages = append(in.Messages, msgs...)
	if e := surface.CheckToolPairing("input", surface.Terms{Call: "function_call", Result: "function_call_output"}, msgs); e != nil {
		return nil, p, e
	}
	toolsJSON, names, e := convertTools(req.Tools, &p)
	if e != nil {
		return nil, p, e
	}
	in.ToolsJson, p.Tools = toolsJSON, names
	if req.Reasoning != nil {
		var effort *string
		if surface.Present(req.Reasoning.Effort) {
			var s string
			if json.Unmarshal(req.Reasoning.Effort, &s) != nil {
				return nil, p, surface.BadRequest("reasoning", "field \"reasoning.effort\" must be a string")
			}
			effort = &s
		}
		if in.Think, e = openai.Think("reasoning", effort); e != nil {
			e.Message = strings.Replace(e.Message, `"reasoning"`, `"reasoning.effort"`, 1)
			return nil, p, e
		}
	}
	if in.ToolChoiceJson, e = toolChoice(req.ToolChoice); e != nil {
		return nil, p, e
	}
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls {
		p.MaxToolCalls = 1
	}
	if req.MaxOutputTokens != nil {
		if *req.MaxOutputTokens < 1 {
			return nil, p, surface.BadRequest("max_output_tokens", "field \"max_output_tokens\" must be at least 1")
		}
		in.MaxTokens = *req.MaxOutputTokens
	}
	if e := surface.InRange("temperature", req.Temperature, 0, 2); e != nil {
		return nil, p, e
	}
	if e := surface.InRange("top_p", req.TopP, 0, 1); e != nil {
		return nil, p, e
	}
	in.Temperature, in.TopP = req.Temperature, req.TopP
	if req.Text != nil && surface.Present(req.Text.Format) {
		if in.ResponseFormatJson, e = responseFormat(req.Text.Format); e != nil {
			return nil, p, e
		}
	}
	// No truncation is Ollama's own default, which drops the oldest
	// messages like "auto" does: a client that names none (Codex CLI)
	// gets what Ollama's /v1/responses, the tunnel, gives it, not a 400
	// for a conversation longer than a local model's context.
	truncation := "auto"
	if req.Truncation != nil {
		truncation = *req.Truncation
	}
	switch truncation {
	case "disabled":
		in.Truncate = new(bool)
	case "auto":
		if req.Truncation != nil {
			t := true
			in.Truncate = &t
		}
	default:
		return nil, p, surface.BadRequest("truncation", "field \"truncation\": want \"auto\" or \"disabled\", got %q", truncation)
	}
	p.Echo = echo(&req, truncation)
	return in, p, nil
}

// refuse answers the fields Fields marks refused with a 400 naming the
// field.
func refuse(r *request) *surface.Error {
	switch {
	case bool(r.PreviousResponseID):
		return surface.BadRequest("previous_response_id", "field \"previous_response_id\": this model's provider is stateless; send the whole conversation in \"input\"")
	case bool(r.Conversation):
		return surface.BadRequest("conversation", "field \"conversation\": this model's provider is stateless; send the whole conversation in \"input\"")
	case r.Store != nil && *r.Store:
		return surface.BadRequest("store", "field \"store\": this model's provider is stateless and stores nothing; send \"store\": false")
	case r.Background != nil && *r.Background:
		return surface.BadRequest("background", "field \"background\": background responses need stored state, which this model's provider does not keep")
	case bool(r.Prompt):
		return surface.BadRequest("prompt", "field \"prompt\": stored prompt templates are not supported by this model's provider")
	case r.TopLogprobs != nil && *r.TopLogprobs != 0:
		return surface.BadRequest("top_logprobs", "field \"top_logprobs\": log probabilities are not offered on /v1/responses by this model's provider; use /v1/chat/completions")
	case r.Text != nil && surface.Present(r.Text.Verbosity):
		return surface.BadRequest("text", "field \"text.verbosity\" is not supported by this model's provider")
	}
	if r.Reasoning != nil {
		for _, f := range [...]struct {
			name string
			raw  json.RawMessage
		}{{"reasoning.summary", r.Reasoning.Summary}, {"reasoning.generate_summary", r.Reasoning.GenerateSummary}} {
			if !surface.Present(f.raw) {
				continue
			}
			var s string
			if json.Unmarshal(f.raw, &s) != nil || (s != "auto" && s != "concise" && s != "detailed" && s != "none") {
				return surface.BadRequest("reasoning", "field %q must be one of auto, concise, detailed, none", f.name)
			}
		}
	}
	if surface.Present(r.ClientMetadata) && r.ClientMetadata[0] != '{' {
		return surface.BadRequest("client_metadata", "field \"client_metadata\" must be an object")
	}
	if r.MaxToolCalls != nil && *r.MaxToolCalls < 0 {
		return surface.BadRequest("max_tool_calls", "field \"max_tool_calls\" must not be negative")
	}
	if e := openai.CheckAdvisory(r.Metadata, r.ServiceTier, r.PromptCacheRetain); e != nil {
		return e
	}
	for _, inc := range r.Include {
		if inc != "reasoning.encrypted_content" {
			return surface.BadRequest("include", "field \"include\": %q is not supported by this model's provider", inc)
		}
	}
	return nil
}

// convertTools turns Responses function tools (and the function tools of
// a namespace, under their own names, recorded in p.Namespaces) into an
// OpenAI chat "tools" array and their names. A built-in or hosted tool
// (builtinTools) is not offered and is reported in p.Ignored; any other
// type is a 400 naming it, as is a name offered twice.
func convertTools(tools []tool, p *Params) ([]byte, []string, *surface.Error) {
	if len(tools) == 0 {
		return nil, nil, nil
	}
	out := []byte{'['}
	names := make([]string, 0, len(tools))
	add := func(at string, t *tool, ns string) *surface.Error {
		if t.Name == "" {
			return surface.BadRequest("tools", "%s.name is required", at)
		}
		if surface.Present(t.Parameters) && t.Parameters[0] != '{' {
			return surface.BadRequest("tools", "%s.parameters must be a JSON Schema object", at)
		}
		if slices.Contains(names, t.Name) {
			return surface.BadRequest("tools", "%s: a tool named %q is offered twice", at, t.Name)
		}
		if len(names) > 0 {
			out = append(out, ',')
		}
		out = openai.AppendFunctionTool(out, t.Name, t.Description, t.Parameters, t.Strict)
		names = append(names, t.Name)
		if ns != "" {
			if p.Namespaces == nil {
				p.Namespaces = map[string]string{}
			}
			p.Namespaces[t.Name] = ns
		}
		return nil
	}
	for i := range tools {
		t := &tools[i]
		at := "tools[" + strconv.Itoa(i) + "]"
		switch {
		case t.Type == "function":
			if e := add(at, t, ""); e != nil {
				return nil, nil, e
			}
		case t.Type == "namespace":
			if t.Name == "" {
				return nil, nil, surface.BadRequest("tools", "%s.name is required", at)
			}
			for j := range t.Tools {
				sub := &t.Tools[j]
				sat := at + ".tools[" + strconv.Itoa(j) + "]"
				if sub.Type != "function" {
					return nil, nil, surface.BadRequest("tools", "%s.type %q: a namespace holds function tools only", sat, sub.Type)
				}
				if e := add(sat, sub, t.Name); e != nil {
					return nil, nil, e
				}
			}
		case slices.Contains(builtinTools, t.Type):
			p.Ignored.Add(at, "tools")
		default:
			return nil, nil, surface.BadRequest("tools", "%s.type %q is not a tool type this model's provider knows (function, namespace; built-in tools are not offered)", at, t.Type)
		}
	}
	if len(names) == 0 {
		return nil, nil, nil
	}
	return append(out, ']'), names, nil
}

// toolChoice turns a Responses tool_choice into the chat shape.
func toolChoice(raw json.RawMessage) ([]byte, *surface.Error) {
	if !surface.Present(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			return raw, nil
		}
		return nil, surface.BadRequest("tool_choice", "field \"tool_choice\": want \"none\", \"auto\", \"required\" or a function, got %q", s)
	}
	var f struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &f) != nil || f.Type != "function" || f.Name == "" {
		return nil, surface.BadRequest("tool_choice", "field \"tool_choice\": only \"none\", \"auto\", \"required\" and {\"type\":\"function\",\"name\":…} are supported by this model's provider")
	}
	return append(surface.AppendString([]byte(`{"type":"function","function":{"name":`), f.Name), "}}"...), nil
}

// responseFormat turns text.format into the chat response_format:
// {"type":"json_schema","name","schema","strict"} → {"type":"json_schema",
// "json_schema":{…}}.
func responseFormat(raw json.RawMessage) ([]byte, *surface.Error) {
	var f struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Schema      json.RawMessage `json:"schema"`
		Strict      *bool           `json:"strict"`
		Description *string         `json:"description"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, surface.BadRequest("text", "field \"text.format\" must be an object with a \"type\"")
	}
	switch f.Type {
	case "text":
		return nil, nil
	case "json_object":
		return []byte(`{"type":"json_object"}`), nil
	case "json_schema":
		if len(f.Schema) == 0 || f.Schema[0] != '{' {
			return nil, surface.BadRequest("text", "field \"text.format.schema\" must be a JSON Schema object")
		}
		b := append([]byte(`{"type":"json_schema","json_schema":{"name":`), surface.AppendString(nil, f.Name)...)
		b = append(b, `,"schema":`...)
		b = append(b, f.Schema...)
		if f.Strict != nil {
			b = append(b, `,"strict":`...)
			b = strconv.AppendBool(b, *f.Strict)
		}
		b = append(b, "}}"...)
		if _, e := openai.ResponseFormat("text", b); e != nil {
			return nil, e
		}
		return b, nil
	}
	return nil, surface.BadRequest("text", "field \"text.format\": type %q is not one of text, json_object, json_schema", f.Type)
}

// echo builds the members a response object repeats from the request.
func echo(r *request, truncation string) []byte {
	raw := func(b []byte, v json.RawMessage, def string) []byte {
		if surface.Present(v) {
			return append(b, v...)
		}
		return append(b, def...)
	}
	b := []byte(`"instructions":`)
	if r.Instructions != nil {
		b = surface.AppendString(b, *r.Instructions)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"max_output_tokens":`...)
	if r.MaxOutputTokens != nil {
		b = strconv.AppendInt(b, *r.MaxOutputTokens, 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"metadata":`...)
	b = raw(b, r.Metadata, "{}")
	b = append(b, `,"parallel_tool_calls":`...)
	b = strconv.AppendBool(b, r.ParallelToolCalls == nil || *r.ParallelToolCalls)
	b = append(b, `,"previous_response_id":null,"reasoning":{"effort":`...)
	var effort, summary json.RawMessage
	if r.Reasoning != nil {
		effort, summary = r.Reasoning.Effort, r.Reasoning.Summary
	}
	b = raw(b, effort, "null")
	b = append(b, `,"summary":`...)
	b = raw(b, summary, "null")
	b = append(b, `},"store":false,"temperature":`...)
	b = appendFloat(b, r.Temperature, 1)
	b = append(b, `,"text":{"format":`...)
	if r.Text != nil {
		b = raw(b, r.Text.Format, `{"type":"text"}`)
	} else {
		b = append(b, `{"type":"text"}`...)
	}
	b = append(b, `},"tool_choice":`...)
	b = raw(b, r.ToolChoice, `"auto"`)
	b = append(b, `,"tools":[`...)
	n := 0
	for _, t := range r.Tools {
		if t.Type != "function" {
			continue // offered as functions or not at all (convertTools)
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, `{"type":"function","name":`...)
		b = surface.AppendString(b, t.Name)
		b = append(b, `,"description":`...)
		if t.Description != nil {
			b = surface.AppendString(b, *t.Description)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"parameters":`...)
		b = raw(b, t.Parameters, "null")
		b = append(b, `,"strict":`...)
		b = strconv.AppendBool(b, t.Strict == nil || *t.Strict)
		b = append(b, '}')
	}
	b = append(b, `],"top_p":`...)
	b = appendFloat(b, r.TopP, 1)
	b = append(b, `,"truncation":`...)
	b = surface.AppendString(b, truncation)
	b = append(b, `,"user":`...)
	if r.User != nil {
		return surface.AppendString(b, *r.User)
	}
	return append(b, "null"...)
}

func appendFloat(b []byte, v *float64, def float64) []byte {
	f := def
	if v != nil {
		f = *v
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}
