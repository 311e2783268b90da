package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// chatRequest is an OpenAI chat completions request as the run path parses
// it (OpenAI API reference, "Create chat completion"): every documented
// field, so that none is dropped unseen; ChatFields says what happens to
// each. A member not listed here is a 400 naming it, as OpenAI answers.
type chatRequest struct {
	Model               surface.Skip    `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Stream              surface.Skip    `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Audio               surface.Seen    `json:"audio"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	FunctionCall        surface.Seen    `json:"function_call"`
	Functions           surface.Seen    `json:"functions"`
	LogitBias           surface.Seen    `json:"logit_bias"`
	Logprobs            *bool           `json:"logprobs"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	MaxTokens           *int64          `json:"max_tokens"`
	Metadata            json.RawMessage `json:"metadata"`
	Modalities          []string        `json:"modalities"`
	N                   *int64          `json:"n"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	Prediction          surface.Seen    `json:"prediction"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	PromptCacheKey      *string         `json:"prompt_cache_key"`
	PromptCacheRetain   *string         `json:"prompt_cache_retention"`
	ReasoningEffort     *string         `json:"reasoning_effort"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	SafetyIdentifier    *string         `json:"safety_identifier"`
	Seed                *int64          `json:"seed"`
	ServiceTier         *string         `json:"service_tier"`
	Stop                json.RawMessage `json:"stop"`
	Store               *bool           `json:"store"`
	Temperature         *float64        `json:"temperature"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	Tools               json.RawMessage `json:"tools"`
	TopLogprobs         *int64          `json:"top_logprobs"`
	TopP                *float64        `json:"top_p"`
	User                *string         `json:"user"`
	Verbosity           surface.Seen    `json:"verbosity"`
	WebSearchOptions    surface.Seen    `json:"web_search_options"`
}

type streamOptions struct {
	IncludeUsage       *bool `json:"include_usage"`
	IncludeObfuscation *bool `json:"include_obfuscation"`
}

type chatMessage struct {
	Role         string          `json:"role"`
	Content      json.RawMessage `json:"content"`
	Name         string          `json:"name"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	ToolCallID   string          `json:"tool_call_id"`
	Refusal      surface.Seen    `json:"refusal"`
	Audio        surface.Seen    `json:"audio"`
	FunctionCall surface.Seen    `json:"function_call"`
	// The reasoning of an assistant turn sent back as history:
	// reasoning_content (llama-server, vLLM, DeepSeek) or reasoning
	// (Ollama's /v1).
	ReasoningContent *string `json:"reasoning_content"`
	Reasoning        *string `json:"reasoning"`
}

type contentPart struct {
	Type       string          `json:"type"`
	Text       *string         `json:"text"`
	ImageURL   *imageURL       `json:"image_url"`
	InputAudio json.RawMessage `json:"input_audio"`
	File       json.RawMessage `json:"file"`
	Refusal    json.RawMessage `json:"refusal"`
}

type imageURL struct {
	URL    string          `json:"url"`
	Detail json.RawMessage `json:"detail"`
}

// The shapes of the chat request's objects (surface.CheckMembers): every
// member the parser's structs know, so that no other is accepted and
// ignored. Tests hold them equal to the structs' JSON names.
var (
	chatPartShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil)},
		Types: []surface.Variant{
			{Type: "text", Members: []surface.Member{surface.M("text", nil)}},
			{Type: "image_url", Members: []surface.Member{surface.M("image_url", &surface.Shape{Members: []surface.Member{surface.M("url", nil), surface.M("detail", nil)}})}},
			{Type: "input_audio", Members: []surface.Member{surface.M("input_audio", nil)}},
			{Type: "file", Members: []surface.Member{surface.M("file", nil)}},
			{Type: "refusal", Members: []surface.Member{surface.M("refusal", nil)}},
		},
	}
	chatToolCallShape = &surface.Shape{Members: []surface.Member{surface.M("id", nil), surface.M("type", nil),
		surface.M("function", &surface.Shape{Members: []surface.Member{surface.M("name", nil), surface.M("arguments", nil)}})}}
	chatMessageShape = &surface.Shape{Members: []surface.Member{surface.M("role", nil), surface.M("content", chatPartShape),
		surface.M("name", nil), surface.M("tool_calls", chatToolCallShape), surface.M("tool_call_id", nil),
		surface.M("refusal", nil), surface.M("audio", nil), surface.M("function_call", nil),
		surface.M("reasoning_content", nil), surface.M("reasoning", nil)}}
	chatToolShape = &surface.Shape{Members: []surface.Member{surface.M("type", nil),
		surface.M("function", &surface.Shape{Members: []surface.Member{surface.M("name", nil), surface.M("description", nil),
			surface.M("parameters", nil), surface.M("strict", nil)}})}}
	chatToolChoiceShape = &surface.Shape{Members: []surface.Member{surface.M("type", nil),
		surface.M("function", &surface.Shape{Members: []surface.Member{surface.M("name", nil)}})}}
	chatResponseFormatShape = &surface.Shape{Members: []surface.Member{surface.M("type", nil),
		surface.M("json_schema", &surface.Shape{Members: []surface.Member{surface.M("name", nil), surface.M("description", nil),
			surface.M("schema", nil), surface.M("strict", nil)}})}}
	chatStreamOptionsShape = &surface.Shape{Members: []surface.Member{surface.M("include_usage", nil), surface.M("include_obfuscation", nil)}}
)

// ChatFields is the run path's table of chat request fields (no field is
// accepted and silently dropped): every field chatRequest parses has a
// row, each translated to Ollama's native /api/chat form, refused with a
// 400 naming it, read by the Edge, or advisory (no effect on the answer by
// OpenAI's own definition). Its notes are written for the client's
// operator: docs/surfaces.md shows them (TestSurfacesDocFieldTables).
var ChatFields = []surface.Field{
	surface.Row("model", surface.Routing, "selects the model group; the provider's target replaces it"),
	surface.Row("messages", surface.Translated, "messages (role developer → system); text parts joined with \"\\n\"; image_url parts with a data: URL → images (a remote URL is refused: the node never fetches a URL a client names); an assistant's reasoning_content (or reasoning, Ollama's /v1 name) → that message's thinking; audio, refusal, function_call, input_audio and file parts, and name on a role other than tool, are refused: Ollama has no place for them").Of(chatMessageShape),
	surface.Row("stream", surface.Routing, "true: the answer streams as server-sent events; false: one JSON body"),
	surface.Row("stream_options", surface.Translated, "include_usage: the usage chunk; include_obfuscation: advisory (no obfuscation is added)").Of(chatStreamOptionsShape),
	surface.Row("audio", surface.Refused, "no audio output: Ollama answers in text"),
	surface.Row("frequency_penalty", surface.Translated, "options.frequency_penalty (−2 to 2)"),
	surface.Row("function_call", surface.Refused, "deprecated by OpenAI; use tool_choice"),
	surface.Row("functions", surface.Refused, "deprecated by OpenAI; use tools"),
	surface.Row("logit_bias", surface.Refused, "Ollama has no logit bias"),
	surface.Row("logprobs", surface.Translated, "Ollama's logprobs, returned as choices[].logprobs.content"),
	surface.Row("max_completion_tokens", surface.Translated, "options.num_predict"),
	surface.Row("max_tokens", surface.Translated, "options.num_predict (max_completion_tokens wins)"),
	surface.Row("metadata", surface.Advisory, "tags for stored completions: checked against the API's limits (16 string pairs), then unused: nothing is stored and no backend takes tags"),
	surface.Row("modalities", surface.Refused, "any value but [\"text\"]: Ollama answers in text"),
	surface.Row("n", surface.Refused, "any value but 1: Ollama generates one answer per request"),
	surface.Row("parallel_tool_calls", surface.Translated, "false: the edge returns at most one tool call"),
	surface.Row("prediction", surface.Refused, "Ollama has no predicted outputs"),
	surface.Row("presence_penalty", surface.Translated, "options.presence_penalty (−2 to 2)"),
	surface.Row("prompt_cache_key", surface.Advisory, "a prompt-cache routing hint (a string): the backends cache prompt prefixes by themselves, and prefix_affinity groups route by the conversation"),
	surface.Row("prompt_cache_retention", surface.Advisory, "a prompt-cache retention hint (in-memory or 24h): the backends keep their caches as they do"),
	surface.Row("reasoning_effort", surface.Translated, "think: none → false; minimal, low → \"low\"; medium → \"medium\"; high, xhigh → \"high\"; a target that cannot think is answered without thinking"),
	surface.Row("response_format", surface.Translated, "json_object → format \"json\"; json_schema → format <schema>; text → none").Of(chatResponseFormatShape),
	surface.Row("safety_identifier", surface.Advisory, "an end-user id (a string) for the API provider's abuse monitoring; no backend takes one"),
	surface.Row("seed", surface.Translated, "options.seed"),
	surface.Row("service_tier", surface.Advisory, "a processing tier (auto, default, flex, scale, priority): every request is served alike"),
	surface.Row("stop", surface.Translated, "options.stop"),
	surface.Row("store", surface.Refused, "true: the edge stores no completions; false is what it does"),
	surface.Row("temperature", surface.Translated, "options.temperature (0 to 2)"),
	surface.Row("tool_choice", surface.Translated, "\"none\" drops the tools, \"auto\" is Ollama's behaviour; \"required\" and a named function are refused: Ollama cannot force a tool call").Of(chatToolChoiceShape),
	surface.Row("tools", surface.Translated, "function tools → Ollama's tools, rebuilt from their known members; other tool types are refused; function.strict is passed on but not enforced: Ollama has no constrained decoding of tool arguments").Of(chatToolShape),
	surface.Row("top_logprobs", surface.Translated, "Ollama's top_logprobs (0–20, needs logprobs)"),
	surface.Row("top_p", surface.Translated, "options.top_p (0 to 1)"),
	surface.Row("user", surface.Advisory, "an end-user id (a string) for the API provider's abuse monitoring; no backend takes one"),
	surface.Row("verbosity", surface.Refused, "Ollama has no verbosity control"),
	surface.Row("web_search_options", surface.Refused, "no web search: neither the edge nor Ollama searches the web"),
}

// ChatRequestFields lists the JSON names of every field the chat parser
// knows (for the field-table test).
func ChatRequestFields() []string { return surface.JSONNames(chatRequest{}) }

// ChatParams is what ChatInput read besides the RunInput: the declared tool
// names (text tool-call fallback), whether the client wants logprobs, at
// most how many tool calls (0 = any; 1 with parallel_tool_calls false) and
// Ignored, what the request carried that is not sent to the backend.
type ChatParams struct {
	Tools        []string
	Logprobs     bool
	MaxToolCalls int
	Ignored      surface.Ignored
}

// ChatInput is ChatInputPolicy under surface.RejectUnknown.
func ChatInput(body []byte) (*iop.RunInput, ChatParams, *surface.Error) {
	return ChatInputPolicy(body, surface.RejectUnknown)
}

// ChatInputPolicy turns a chat completions body into the normalized
// RunInput the node's run path takes (SPEC Q3; ChatFields says what
// happens to each field, policy what happens to a member ChatFields does
// not know). Errors are 400s naming the field.
func ChatInputPolicy(body []byte, policy surface.UnknownFields) (*iop.RunInput, ChatParams, *surface.Error) {
	var req chatRequest
	var p ChatParams
	if e := surface.DecodeRequestPolicy(body, &req, ChatFields, policy, &p.Ignored); e != nil {
		return nil, p, e
	}
	if e := refuseChat(&req); e != nil {
		return nil, p, e
	}
	in := &iop.RunInput{Messages: make([]*iop.ChatMessage, 0, len(req.Messages))}
	for i := range req.Messages {
		m, e := runMessage(i, &req.Messages[i])
		if e != nil {
			return nil, p, e
		}
		in.Messages = append(in.Messages, m)
	}
	if len(in.Messages) == 0 {
		return nil, p, surface.BadRequest("messages", "field \"messages\" must hold at least one message")
	}
	if e := surface.CheckToolPairing("messages", surface.Terms{Call: "tool call", Result: "tool message"}, in.Messages); e != nil {
		return nil, p, e
	}
	var e *surface.Error
	if in.ToolsJson, p.Tools, e = FunctionTools("tools", req.Tools); e != nil {
		return nil, p, e
	}
	if in.Think, e = Think("reasoning_effort", req.ReasoningEffort); e != nil {
		return nil, p, e
	}
	if surface.Present(req.ToolChoice) {
		if in.ToolChoiceJson, e = ToolChoice("tool_choice", req.ToolChoice); e != nil {
			return nil, p, e
		}
	}
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls {
		p.MaxToolCalls = 1
	}
	switch {
	case req.MaxCompletionTokens != nil:
		if *req.MaxCompletionTokens < 1 {
			return nil, p, surface.BadRequest("max_completion_tokens", "field \"max_completion_tokens\" must be at least 1")
		}
		in.MaxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		if *req.MaxTokens < 1 {
			return nil, p, surface.BadRequest("max_tokens", "field \"max_tokens\" must be at least 1")
		}
		in.MaxTokens = *req.MaxTokens
	}
	for _, r := range [...]struct {
		name   string
		v      *float64
		lo, hi float64
	}{{"temperature", req.Temperature, 0, 2}, {"top_p", req.TopP, 0, 1},
		{"frequency_penalty", req.FrequencyPenalty, -2, 2}, {"presence_penalty", req.PresencePenalty, -2, 2}} {
		if e := surface.InRange(r.name, r.v, r.lo, r.hi); e != nil {
			return nil, p, e
		}
	}
	in.Temperature, in.TopP, in.Seed = req.Temperature, req.TopP, req.Seed
	in.FrequencyPenalty, in.PresencePenalty = req.FrequencyPenalty, req.PresencePenalty
	if in.Stop, e = stopList("stop", req.Stop); e != nil {
		return nil, p, e
	}
	if in.ResponseFormatJson, e = ResponseFormat("response_format", req.ResponseFormat); e != nil {
		return nil, p, e
	}
	if req.Logprobs != nil && *req.Logprobs {
		in.Logprobs, p.Logprobs = true, true
	}
	if req.TopLogprobs != nil {
		if *req.TopLogprobs < 0 || *req.TopLogprobs > 20 {
			return nil, p, surface.BadRequest("top_logprobs", "field \"top_logprobs\" must be between 0 and 20")
		}
		if *req.TopLogprobs > 0 && !in.Logprobs {
			return nil, p, surface.BadRequest("top_logprobs", "field \"top_logprobs\" needs \"logprobs\": true")
		}
		in.TopLogprobs = int32(*req.TopLogprobs)
	}
	return in, p, nil
}

// refuseChat answers the fields ChatFields marks refused (for the values
// its notes name) with a 400 naming the field.
func refuseChat(r *chatRequest) *surface.Error {
	for _, f := range []struct {
		name string
		set  surface.Seen
		why  string
	}{
		{"audio", r.Audio, "audio output is not supported by this model's provider"},
		{"function_call", r.FunctionCall, "deprecated and not supported; use \"tool_choice\""},
		{"functions", r.Functions, "deprecated and not supported; use \"tools\""},
		{"logit_bias", r.LogitBias, "not supported by this model's provider"},
		{"prediction", r.Prediction, "predicted outputs are not supported by this model's provider"},
		{"verbosity", r.Verbosity, "not supported by this model's provider"},
		{"web_search_options", r.WebSearchOptions, "web search is not supported by this model's provider"},
	} {
		if f.set {
			return surface.BadRequest(f.name, "field %q: %s", f.name, f.why)
		}
	}
	if r.N != nil && *r.N != 1 {
		return surface.BadRequest("n", "field \"n\": only 1 choice is supported by this model's provider")
	}
	for _, m := range r.Modalities {
		if m != "text" {
			return surface.BadRequest("modalities", "field \"modalities\": only \"text\" is supported by this model's provider")
		}
	}
	if r.Store != nil && *r.Store {
		return surface.BadRequest("store", "field \"store\": this gateway stores nothing; send false or leave it out")
	}
	return CheckAdvisory(r.Metadata, r.ServiceTier, r.PromptCacheRetain)
}

// CheckAdvisory checks the advisory fields OpenAI's chat and Responses
// requests share: they change nothing on the run path, but a value the API
// would refuse is a 400 naming the field (the string-typed ones, user,
// safety_identifier and prompt_cache_key, are checked by their decoding).
func CheckAdvisory(metadata json.RawMessage, serviceTier, cacheRetention *string) *surface.Error {
	if e := surface.CheckMetadata("metadata", metadata); e != nil {
		return e
	}
	if e := surface.OneOf("service_tier", serviceTier, "auto", "default", "flex", "scale", "priority"); e != nil {
		return e
	}
	return surface.OneOf("prompt_cache_retention", cacheRetention, "in-memory", "24h")
}

func runMessage(i int, m *chatMessage) (*iop.ChatMessage, *surface.Error) {
	out := &iop.ChatMessage{Role: m.Role, ToolCallId: m.ToolCallID}
	switch m.Role {
	case "system", "user", "assistant", "tool":
	case "developer":
		out.Role = "system"
	case "":
		return nil, surface.BadRequest("messages", "messages[%d].role is required", i)
	default:
		return nil, surface.BadRequest("messages", "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, m.Role)
	}
	switch {
	case bool(m.Audio):
		return nil, surface.BadRequest("messages", "messages[%d].audio is not supported by this model's provider", i)
	case bool(m.FunctionCall):
		return nil, surface.BadRequest("messages", "messages[%d].function_call is deprecated and not supported; use tool_calls", i)
	case bool(m.Refusal):
		return nil, surface.BadRequest("messages", "messages[%d].refusal is not supported by this model's provider", i)
	case m.Name != "" && m.Role != "tool":
		return nil, surface.BadRequest("messages", "messages[%d].name: participant names are not supported by this model's provider", i)
	}
	out.Name = m.Name
	switch {
	case !surface.Present(m.Content) && m.Role != "assistant":
		return nil, surface.BadRequest("messages", "messages[%d].content is required for role %q", i, m.Role)
	case !surface.Present(m.Content) && !surface.Present(m.ToolCalls):
		return nil, surface.BadRequest("messages", "messages[%d].content is required unless the assistant message has tool_calls", i)
	case len(m.Content) > 1 && m.Content[0] == '[' && isEmptyArray(m.Content):
		return nil, surface.BadRequest("messages", "messages[%d].content must not be an empty array", i)
	}
	text, images, e := content(i, m.Role, m.Content)
	if e != nil {
		return nil, e
	}
	out.Content, out.Images = text, images
	if surface.Present(m.ToolCalls) {
		if m.Role != "assistant" {
			return nil, surface.BadRequest("messages", "messages[%d].tool_calls is only allowed on assistant messages", i)
		}
		if m.ToolCalls[0] != '[' {
			return nil, surface.BadRequest("messages", "messages[%d].tool_calls must be an array", i)
		}
		if e := checkToolCalls(i, m.ToolCalls); e != nil {
			return nil, e
		}
		out.ToolCallsJson = m.ToolCalls
	}
	for _, r := range [...]*string{m.ReasoningContent, m.Reasoning} {
		if r != nil && *r != "" {
			if m.Role != "assistant" {
				return nil, surface.BadRequest("messages", "messages[%d]: reasoning is only allowed on assistant messages", i)
			}
			if out.Thinking == "" {
				out.Thinking = *r
			}
		}
	}
	if m.Role == "tool" && m.ToolCallID == "" {
		return nil, surface.BadRequest("messages", "messages[%d].tool_call_id is required for role \"tool\"", i)
	}
	return out, nil
}

// isEmptyArray reports whether raw, a JSON array, has no element.
func isEmptyArray(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0
}

// content accepts a string, null, or an array of parts: text (joined with
// "\n") and, on user messages, image_url with a data: URL.
func content(i int, role string, raw json.RawMessage) (string, []*iop.ChatImage, *surface.Error) {
	if !surface.Present(raw) {
		return "", nil, nil
	}
	switch raw[0] {
	case '"':
		s, _ := surface.StringValue(raw)
		return s, nil, nil
	case '[':
	default:
		return "", nil, surface.BadRequest("messages", "messages[%d].content must be a string or an array of content parts", i)
	}
	var parts []contentPart
	if e := surface.Decode(raw, &parts); e != nil {
		if e.Param == "" || strings.HasPrefix(e.Message, "unknown field") {
			e.Message = fmt.Sprintf("messages[%d].content: %s", i, e.Message)
		}
		return "", nil, e
	}
	var b strings.Builder
	var images []*iop.ChatImage
	texts := 0
	for j, p := range parts {
		at := fmt.Sprintf("messages[%d].content[%d]", i, j)
		switch {
		case p.Type == "text":
			if p.Text == nil {
				return "", nil, surface.BadRequest("messages", "%s.text is required", at)
			}
			if texts > 0 {
				b.WriteByte('\n')
			}
			texts++
			b.WriteString(*p.Text)
		case p.Type == "image_url" && role == "user":
			if p.ImageURL == nil {
				return "", nil, surface.BadRequest("messages", "%s.image_url is required", at)
			}
			img, e := surface.DataURLImage(at+".image_url.url", p.ImageURL.URL)
			if e != nil {
				e.Param = "messages"
				return "", nil, e
			}
			images = append(images, img)
		default:
			return "", nil, surface.BadRequest("messages", "%s: part type %q is not supported by this model's provider on a %s message (text, and image_url on user messages)", at, p.Type, role)
		}
	}
	return b.String(), images, nil
}

// checkToolCalls checks an assistant message's tool_calls as the backend
// needs them: each a function call with an id, a name and arguments that
// are a string holding a JSON object (OpenAI's own shape; Ollama takes
// arguments as an object).
func checkToolCalls(i int, raw json.RawMessage) *surface.Error {
	var calls []struct {
		ID       *string `json:"id"`
		Type     *string `json:"type"`
		Function *struct {
			Name      *string `json:"name"`
			Arguments *string `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &calls); err != nil {
		return surface.BadRequest("messages", "messages[%d].tool_calls must be an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}} with string values", i)
	}
	for j, c := range calls {
		at := fmt.Sprintf("messages[%d].tool_calls[%d]", i, j)
		switch {
		case c.ID == nil || *c.ID == "":
			return surface.BadRequest("messages", "%s.id is required", at)
		case c.Type == nil || *c.Type != "function":
			return surface.BadRequest("messages", "%s.type must be \"function\"", at)
		case c.Function == nil || c.Function.Name == nil || *c.Function.Name == "":
			return surface.BadRequest("messages", "%s.function.name is required", at)
		case c.Function.Arguments == nil || !surface.IsJSONObject(*c.Function.Arguments):
			return surface.BadRequest("messages", "%s.function.arguments must be a string holding a JSON object", at)
		}
	}
	return nil
}

// stopList reads "stop": a string or an array of strings.
func stopList(field string, raw json.RawMessage) ([]string, *surface.Error) {
	if !surface.Present(raw) {
		return nil, nil
	}
	var out []string
	switch raw[0] {
	case '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		return []string{s}, nil
	case '[':
		if json.Unmarshal(raw, &out) == nil {
			return out, nil
		}
	}
	return nil, surface.BadRequest(field, "field %q must be a string or an array of strings", field)
}
