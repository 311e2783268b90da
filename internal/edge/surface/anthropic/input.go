package anthropic

import (
	"encoding/json"
	"strconv"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// Input turns a Messages body into the normalized RunInput: the request,
// the shapes its errors name and the field table (Fields), the fields
// refused, thinking, output_config.format, context_management and tools
// converted.

// request is an Anthropic Messages request as the run path parses it
// (Anthropic API reference, "Create a Message"): every documented field,
// so that none is dropped unseen; Fields says what happens to each. A
// member not listed here is a 400 naming it, as Anthropic answers.
type request struct {
	Model             surface.Skip               `json:"model"`
	Messages          []message                  `json:"messages"`
	MaxTokens         *int64                     `json:"max_tokens"`
	System            json.RawMessage            `json:"system"`
	StopSequences     []string                   `json:"stop_sequences"`
	Stream            surface.Seen               `json:"stream"`
	Temperature       *float64                   `json:"temperature"`
	TopP              *float64                   `json:"top_p"`
	TopK              *int64                     `json:"top_k"`
	Tools             []tool                     `json:"tools"`
	ToolChoice        *toolChoice                `json:"tool_choice"`
	Metadata          *surface.AnthropicMetadata `json:"metadata"`
	Thinking          *thinking                  `json:"thinking"`
	OutputConfig      *outputConfig              `json:"output_config"`
	ServiceTier       *string                    `json:"service_tier"`
	Container         surface.Seen               `json:"container"`
	MCPServers        surface.Seen               `json:"mcp_servers"`
	ContextManagement *contextManagement         `json:"context_management"`
}

// The shapes of the Messages request's objects (surface.CheckMembers):
// every member the parser's structs know, per block type, so that no
// other is accepted and ignored. Tests hold them equal to the structs.
var (
	cacheControlShape = &surface.Shape{Members: []surface.Member{surface.M("type", nil), surface.M("ttl", nil)}}
	sourceShape       = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil)},
		Types: []surface.Variant{
			{Type: "base64", Members: []surface.Member{surface.M("media_type", nil), surface.M("data", nil)}},
			{Type: "text", Members: []surface.Member{surface.M("media_type", nil), surface.M("data", nil)}},
			{Type: "url", Members: []surface.Member{surface.M("url", nil)}},
			{Type: "file", Members: []surface.Member{surface.M("file_id", nil)}},
		},
	}
	textVariant     = surface.Variant{Type: "text", Members: []surface.Member{surface.M("text", nil), surface.M("citations", nil)}}
	imageVariant    = surface.Variant{Type: "image", Members: []surface.Member{surface.M("source", sourceShape)}}
	documentVariant = surface.Variant{Type: "document", Members: []surface.Member{surface.M("source", sourceShape),
		surface.M("title", nil), surface.M("context", nil), surface.M("citations", nil)}}
	// toolResultContentShape: the blocks a tool_result's content holds.
	toolResultContentShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil), surface.M("cache_control", cacheControlShape)},
		Types:   []surface.Variant{textVariant, imageVariant, documentVariant},
	}
	blockShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil), surface.M("cache_control", cacheControlShape)},
		Types: []surface.Variant{textVariant, imageVariant, documentVariant,
			{Type: "tool_use", Members: []surface.Member{surface.M("id", nil), surface.M("name", nil), surface.M("input", nil)}},
			{Type: "tool_result", Members: []surface.Member{surface.M("tool_use_id", nil),
				surface.M("content", toolResultContentShape), surface.M("is_error", nil)}},
			{Type: "thinking", Members: []surface.Member{surface.M("thinking", nil), surface.M("signature", nil)}},
			{Type: "redacted_thinking", Members: []surface.Member{surface.M("data", nil)}},
		},
	}
	messageShape = &surface.Shape{Members: []surface.Member{surface.M("role", nil), surface.M("content", blockShape)}}
	toolShape    = &surface.Shape{Members: []surface.Member{surface.M("type", nil), surface.M("name", nil), surface.M("description", nil),
		surface.M("input_schema", nil), surface.M("cache_control", cacheControlShape), surface.M("defer_loading", nil)}}
	toolChoiceShape   = &surface.Shape{Members: []surface.Member{surface.M("type", nil), surface.M("name", nil), surface.M("disable_parallel_tool_use", nil)}}
	thinkingShape     = &surface.Shape{Members: []surface.Member{surface.M("type", nil), surface.M("budget_tokens", nil), surface.M("display", nil)}}
	metadataShape     = &surface.Shape{Members: []surface.Member{surface.M("user_id", nil)}}
	outputFormatShape = &surface.Shape{Members: []surface.Member{surface.M("type", nil), surface.M("schema", nil)}}
	outputConfigShape = &surface.Shape{Members: []surface.Member{surface.M("effort", nil), surface.M("format", outputFormatShape)}}
	contextEditShape  = &surface.Shape{Members: []surface.Member{surface.M("type", nil), surface.M("keep", nil)}}
	contextMgmtShape  = &surface.Shape{Members: []surface.Member{surface.M("edits", contextEditShape)}}
)

// Fields is the run path's table of Messages request fields (no field is
// accepted and silently dropped): every field request parses has a row.
// Its notes are written for the client's operator: docs/surfaces.md shows
// them (TestSurfacesDocFieldTables).
var Fields = []surface.Field{
	surface.Row("model", surface.Routing, "selects the model group; the provider's target replaces it"),
	surface.Row("messages", surface.Translated, "text blocks → content; image blocks with base64 data → images (a URL or file source is refused: the node never fetches what a client names); tool_use → tool_calls; tool_result → tool messages (text content only; is_error → content prefixed \"Error: \"); an assistant's thinking blocks → that message's thinking (the text, else the text its iop signature carries; a signature is never trusted or checked; thinking and signature must be strings); redacted_thinking and a thinking block whose only reasoning is another provider's signature (no backend can read them) dropped and reported; document blocks refused (Ollama takes no documents); role \"system\" (mid-conversation system turns, Claude Code 2.1) → a system message; cache_control (a prompt-cache hint: the backends cache prompt prefixes by themselves) and a text block's citations (what an earlier answer cited) accepted without effect").Of(messageShape),
	surface.Row("max_tokens", surface.Translated, "options.num_predict; required, as Anthropic requires it"),
	surface.Row("system", surface.Translated, "a system message (text blocks joined with \"\\n\")").Of(blockShape),
	surface.Row("stop_sequences", surface.Translated, "options.stop"),
	surface.Row("stream", surface.Routing, "true: the answer streams as server-sent events; false: one JSON body"),
	surface.Row("temperature", surface.Translated, "options.temperature (0 to 1)"),
	surface.Row("top_p", surface.Translated, "options.top_p (0 to 1)"),
	surface.Row("top_k", surface.Translated, "options.top_k (≥ 0)"),
	surface.Row("tools", surface.Translated, "custom tools → Ollama's tools; server tools (web search, code execution, …) are refused: nothing here runs them; defer_loading true: the tool is not offered to the model (Anthropic loads a deferred tool only when its server-side tool search finds it, and there is none) and reported").Of(toolShape),
	surface.Row("tool_choice", surface.Translated, "auto → \"auto\", none → \"none\"; any and tool are refused: Ollama cannot force a tool call; disable_parallel_tool_use: the edge returns at most one tool_use").Of(toolChoiceShape),
	surface.Row("metadata", surface.Advisory, "metadata.user_id (a string up to 256 characters, no other member): an end-user id for Anthropic's abuse detection; no backend takes one").Of(metadataShape),
	surface.Row("thinking", surface.Translated, "enabled or adaptive → think true (or output_config.effort's level), disabled → think false; a target that cannot think is answered without thinking (the node drops think); budget_tokens is checked (≥ 1024, < max_tokens) but Ollama has no budget; display summarized returns the thinking text, omitted returns thinking blocks with \"\" and the text in their signature").Of(thinkingShape),
	surface.Row("output_config", surface.Translated, "effort (low, medium, high, max) → think \"low\"/\"medium\"/\"high\" when thinking is on; format json_schema → format <schema> (structured output)").Of(outputConfigShape),
	surface.Row("service_tier", surface.Advisory, "a capacity tier (auto, standard_only): every request is served alike"),
	surface.Row("container", surface.Refused, "Anthropic's code-execution containers: nothing here runs code"),
	surface.Row("mcp_servers", surface.Refused, "Anthropic's MCP connector (the API calls MCP servers itself): the edge calls none; a client runs its own MCP tools as tools"),
	surface.Row("context_management", surface.Translated, "edits: clear_thinking_20251015 applied by the edge (keep \"all\", or {\"type\":\"thinking_turns\",\"value\":N}: the thinking of all but the last N assistant turns is not sent); any other edit is refused (clear_tool_uses_20250919 triggers on a count of input tokens the edge does not have)").Of(contextMgmtShape),
}

// RequestFields lists the JSON names of every field the parser knows (for
// the field-table test).
func RequestFields() []string { return surface.JSONNames(request{}) }

// Params is what Input read besides the RunInput: the declared tool names,
// at most how many tool calls to return (0 = any; 1 with
// tool_choice.disable_parallel_tool_use), OmitThinking (thinking.display
// "omitted": the encoder sends thinking blocks with "" and the text in
// their signature) and Ignored, what the request carried that is not sent
// to the backend.
type Params struct {
	Tools        []string
	MaxToolCalls int
	OmitThinking bool
	Ignored      surface.Ignored
}

// Input is InputPolicy under surface.RejectUnknown.
func Input(body []byte, count bool) (*iop.RunInput, Params, *surface.Error) {
	return InputPolicy(body, count, surface.RejectUnknown)
}

// InputPolicy turns a Messages body into the normalized RunInput (SPEC Q3;
// Fields says what happens to each field; policy what happens to a member
// Fields does not know). With count set the body is a count_tokens
// request: no max_tokens or sampling fields are allowed and the run
// generates at most one token (the count is the prompt's). Errors are 400s
// naming the field.
func InputPolicy(body []byte, count bool, policy surface.UnknownFields) (*iop.RunInput, Params, *surface.Error) {
	var req request
	var p Params
	if e := surface.DecodeRequestPolicy(body, &req, Fields, policy, &p.Ignored); e != nil {
		return nil, p, e
	}
	if e := refuse(&req, count); e != nil {
		return nil, p, e
	}
	in := &iop.RunInput{}
	sys, e := systemText(req.System)
	if e != nil {
		return nil, p, e
	}
	if sys != "" {
		in.Messages = append(in.Messages, &iop.ChatMessage{Role: "system", Content: sys})
	}
	if len(req.Messages) == 0 {
		return nil, p, surface.BadRequest("messages", "field \"messages\" must hold at least one message")
	}
	for i := range req.Messages {
		if e := checkNonEmpty(i, &req.Messages[i], i == len(req.Messages)-1); e != nil {
			return nil, p, e
		}
		ms, e := convertMessage(i, &req.Messages[i], &p.Ignored)
		if e != nil {
			return nil, p, e
		}
		in.Messages = append(in.Messages, ms...)
	}
	if e := surface.CheckToolPairing("messages", surface.Terms{Call: "tool_use", Result: "tool_result"}, in.Messages); e != nil {
		return nil, p, e
	}
	if e := applyContextEdits(req.ContextManagement, in.Messages); e != nil {
		return nil, p, e
	}
	if in.ToolsJson, p.Tools, e = convertTools(req.Tools, &p.Ignored); e != nil {
		return nil, p, e
	}
	if tc := req.ToolChoice; tc != nil {
		var choice string
		switch tc.Type {
		case "auto":
			choice = `"auto"`
		case "none":
			choice = `"none"`
		case "any":
			choice = `"required"`
		case "tool":
			if tc.Name == "" {
				return nil, p, surface.BadRequest("tool_choice", "tool_choice.name is required for type \"tool\"")
			}
			choice = string(surface.AppendString([]byte(`{"type":"function","function":{"name":`), tc.Name)) + "}}"
		default:
			return nil, p, surface.BadRequest("tool_choice", "tool_choice.type %q is not one of auto, any, tool, none", tc.Type)
		}
		in.ToolChoiceJson = []byte(choice)
		if tc.DisableParallelToolUse != nil && *tc.DisableParallelToolUse {
			p.MaxToolCalls = 1
		}
	}
	think, e := thinkValue(&req)
	if e != nil {
		return nil, p, e
	}
	p.OmitThinking = req.Thinking != nil && req.Thinking.Display == "omitted"
	if count {
		in.MaxTokens = 1
		return in, p, nil
	}
	in.Think = think
	if in.ResponseFormatJson, e = outputFormatJSON(req.OutputConfig); e != nil {
		return nil, p, e
	}
	if req.MaxTokens == nil {
		return nil, p, surface.BadRequest("max_tokens", "missing required field \"max_tokens\"")
	}
	if *req.MaxTokens < 1 {
		return nil, p, surface.BadRequest("max_tokens", "field \"max_tokens\" must be at least 1")
	}
	in.MaxTokens = *req.MaxTokens
	in.Stop = req.StopSequences
	if e := surface.InRange("temperature", req.Temperature, 0, 1); e != nil {
		return nil, p, e
	}
	if e := surface.InRange("top_p", req.TopP, 0, 1); e != nil {
		return nil, p, e
	}
	if req.TopK != nil && *req.TopK < 0 {
		return nil, p, surface.BadRequest("top_k", "field \"top_k\" must not be negative")
	}
	in.Temperature, in.TopP, in.TopK = req.Temperature, req.TopP, req.TopK
	return in, p, nil
}

// thinkValue maps thinking and output_config.effort to RunInput.think:
// disabled → "false"; enabled or adaptive → the effort's level ("low",
// "medium", "high"; max and xhigh → "high") or "true"; no thinking → ""
// (the backend's default). Bad values are 400s naming the field.
func thinkValue(r *request) (string, *surface.Error) {
	level := ""
	if oc := r.OutputConfig; oc != nil && oc.Effort != nil {
		switch *oc.Effort {
		case "low", "medium", "high":
			level = *oc.Effort
		case "max", "xhigh":
			level = "high"
		default:
			return "", surface.BadRequest("output_config", "field \"output_config.effort\": %q is not one of low, medium, high, max", *oc.Effort)
		}
	}
	t := r.Thinking
	if t == nil {
		return "", nil
	}
	switch t.Display {
	case "", "summarized", "omitted":
	default:
		return "", surface.BadRequest("thinking", "field \"thinking.display\": %q is not one of summarized, omitted", t.Display)
	}
	switch t.Type {
	case "disabled":
		return "false", nil
	case "enabled":
		if t.BudgetTokens == nil || *t.BudgetTokens < 1024 {
			return "", surface.BadRequest("thinking", "field \"thinking.budget_tokens\" is required with type \"enabled\" and must be at least 1024")
		}
	case "adaptive":
	default:
		return "", surface.BadRequest("thinking", "field \"thinking.type\": %q is not one of enabled, adaptive, disabled", t.Type)
	}
	if level != "" {
		return level, nil
	}
	return "true", nil
}

// outputFormatJSON turns output_config.format (json_schema with a schema
// object) into the chat response_format the node translates to Ollama's
// format; nil when absent.
func outputFormatJSON(oc *outputConfig) ([]byte, *surface.Error) {
	if oc == nil || oc.Format == nil {
		return nil, nil
	}
	f := oc.Format
	if f.Type != "json_schema" {
		return nil, surface.BadRequest("output_config", "field \"output_config.format.type\": %q is not json_schema", f.Type)
	}
	if !surface.Present(f.Schema) || f.Schema[0] != '{' {
		return nil, surface.BadRequest("output_config", "field \"output_config.format.schema\" must be a JSON Schema object")
	}
	b := append([]byte(`{"type":"json_schema","json_schema":{"name":"output","schema":`), f.Schema...)
	return append(b, "}}"...), nil
}

// applyContextEdits applies context_management.edits the run path can
// apply at the Edge: clear_thinking_20251015 (keep "all", or
// {"type":"thinking_turns","value":N}; absent keep is Anthropic's default,
// the last turn). Any other edit is a 400 naming it.
func applyContextEdits(cm *contextManagement, msgs []*iop.ChatMessage) *surface.Error {
	if cm == nil {
		return nil
	}
	for i, ed := range cm.Edits {
		if ed.Type != "clear_thinking_20251015" {
			return surface.BadRequest("context_management", "context_management.edits[%d].type %q is not supported by this model's provider (clear_thinking_20251015 only)", i, ed.Type)
		}
		keep := 1
		switch k := ed.Keep; {
		case !surface.Present(k):
		case string(k) == `"all"`:
			continue
		default:
			var turns struct {
				Type  string `json:"type"`
				Value *int   `json:"value"`
			}
			if json.Unmarshal(k, &turns) != nil || turns.Type != "thinking_turns" || turns.Value == nil || *turns.Value < 0 {
				return surface.BadRequest("context_management", "context_management.edits[%d].keep must be \"all\" or {\"type\":\"thinking_turns\",\"value\":N}", i)
			}
			keep = *turns.Value
		}
		for j := len(msgs) - 1; j >= 0; j-- {
			if m := msgs[j]; m.Role == "assistant" && m.Thinking != "" {
				if keep > 0 {
					keep--
				} else {
					m.Thinking = ""
				}
			}
		}
	}
	return nil
}

// refuse answers the fields Fields marks refused, and in count mode the
// fields count_tokens does not take, with a 400 naming the field.
func refuse(r *request, count bool) *surface.Error {
	for _, f := range []struct {
		name string
		set  surface.Seen
	}{{"container", r.Container}, {"mcp_servers", r.MCPServers}} {
		if f.set {
			return surface.BadRequest(f.name, "field %q is not supported by this model's provider", f.name)
		}
	}
	if e := r.Metadata.Check(); e != nil {
		return e
	}
	if e := surface.OneOf("service_tier", r.ServiceTier, "auto", "standard_only"); e != nil {
		return e
	}
	if !count {
		return nil
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"max_tokens", r.MaxTokens != nil}, {"stop_sequences", r.StopSequences != nil}, {"stream", bool(r.Stream)},
		{"temperature", r.Temperature != nil}, {"top_p", r.TopP != nil}, {"top_k", r.TopK != nil},
		{"metadata", r.Metadata != nil}, {"service_tier", r.ServiceTier != nil}} {
		if f.set {
			return surface.BadRequest(f.name, "field %q is not a field of count_tokens", f.name)
		}
	}
	return nil
}

// convertTools turns Anthropic tools into an OpenAI chat "tools" array and
// their names. A deferred tool (defer_loading) is not offered, and
// reported in ig.
func convertTools(tools []tool, ig *surface.Ignored) ([]byte, []string, *surface.Error) {
	if len(tools) == 0 {
		return nil, nil, nil
	}
	out := []byte{'['}
	names := make([]string, 0, len(tools))
	for i, t := range tools {
		if t.DeferLoading != nil && *t.DeferLoading {
			ig.Add("tools["+strconv.Itoa(i)+"]", "tools")
			continue
		}
		if t.Type != "" && t.Type != "custom" {
			return nil, nil, surface.BadRequest("tools", "tools[%d].type %q: server tools are not supported by this model's provider", i, t.Type)
		}
		if t.Name == "" {
			return nil, nil, surface.BadRequest("tools", "tools[%d].name is required", i)
		}
		schema := t.InputSchema
		if !surface.Present(schema) || schema[0] != '{' {
			return nil, nil, surface.BadRequest("tools", "tools[%d].input_schema is required and must be a JSON Schema object", i)
		}
		if len(names) > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"type":"function","function":{"name":`...)
		out = surface.AppendString(out, t.Name)
		if t.Description != nil {
			out = append(out, `,"description":`...)
			out = surface.AppendString(out, *t.Description)
		}
		out = append(out, `,"parameters":`...)
		out = append(out, schema...)
		out = append(out, "}}"...)
		names = append(names, t.Name)
	}
	if len(names) == 0 {
		return nil, nil, nil
	}
	return append(out, ']'), names, nil
}
