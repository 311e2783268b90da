package openai

import (
	"encoding/json"
	"strconv"

	"iop/internal/edge/surface"
)

// The request members a surface checks and rebuilds for the RunInput: a
// chat tools array and one function tool, a reasoning effort, tool_choice
// and response_format; the Responses surface uses them too (SPEC Q3).

// FunctionTools checks an OpenAI chat "tools" array (only function tools,
// each with a name) and returns it rebuilt from the members the run path
// knows (type, function.name, description, parameters, strict: an unknown
// member never reaches the backend) with the names; nil, nil when absent
// or empty.
func FunctionTools(field string, raw json.RawMessage) ([]byte, []string, *surface.Error) {
	if !surface.Present(raw) {
		return nil, nil, nil
	}
	var tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, nil, surface.BadRequest(field, "field %q must be an array of tool objects", field)
	}
	if len(tools) == 0 {
		return nil, nil, nil
	}
	names := make([]string, 0, len(tools))
	out := make([]byte, 0, len(raw))
	out = append(out, '[')
	for i, t := range tools {
		if t.Type != "function" {
			return nil, nil, surface.BadRequest(field, "%s[%d].type %q is not supported by this model's provider (function tools only)", field, i, t.Type)
		}
		f := &t.Function
		if f.Name == "" {
			return nil, nil, surface.BadRequest(field, "%s[%d].function.name is required", field, i)
		}
		if surface.Present(f.Parameters) && f.Parameters[0] != '{' {
			return nil, nil, surface.BadRequest(field, "%s[%d].function.parameters must be a JSON Schema object", field, i)
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = AppendFunctionTool(out, f.Name, f.Description, f.Parameters, f.Strict)
		names = append(names, f.Name)
	}
	return append(out, ']'), names, nil
}

// AppendFunctionTool appends one chat function tool {"type":"function",
// "function":{"name","description"?,"parameters"?,"strict"?}}.
func AppendFunctionTool(out []byte, name string, description *string, parameters json.RawMessage, strict *bool) []byte {
	out = append(out, `{"type":"function","function":{"name":`...)
	out = surface.AppendString(out, name)
	if description != nil {
		out = append(out, `,"description":`...)
		out = surface.AppendString(out, *description)
	}
	if surface.Present(parameters) {
		out = append(out, `,"parameters":`...)
		out = append(out, parameters...)
	}
	if strict != nil {
		out = append(out, `,"strict":`...)
		out = strconv.AppendBool(out, *strict)
	}
	return append(out, "}}"...)
}

// Think maps an OpenAI reasoning effort (chat reasoning_effort, Responses
// reasoning.effort) to RunInput.think: none → "false"; minimal and low →
// "low"; medium → "medium"; high and xhigh → "high"; absent → "" (the
// backend's default). Another value is a 400 naming field.
func Think(field string, effort *string) (string, *surface.Error) {
	if effort == nil {
		return "", nil
	}
	switch *effort {
	case "none":
		return "false", nil
	case "minimal", "low":
		return "low", nil
	case "medium":
		return "medium", nil
	case "high", "xhigh":
		return "high", nil
	}
	return "", surface.BadRequest(field, "field %q: %q is not one of none, minimal, low, medium, high, xhigh", field, *effort)
}

// ToolChoice checks an OpenAI chat "tool_choice" ("none", "auto",
// "required" or {"type":"function","function":{"name"}}) and returns it
// rebuilt from those members only.
func ToolChoice(field string, raw json.RawMessage) ([]byte, *surface.Error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			return surface.AppendString(nil, s), nil
		}
		return nil, surface.BadRequest(field, "field %q: want \"none\", \"auto\", \"required\" or a function, got %q", field, s)
	}
	var f struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &f) != nil || f.Type != "function" || f.Function.Name == "" {
		return nil, surface.BadRequest(field, "field %q: want \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":…}}", field)
	}
	return append(surface.AppendString([]byte(`{"type":"function","function":{"name":`), f.Function.Name), "}}"...), nil
}

// ResponseFormat checks an OpenAI "response_format" and returns it for
// RunInput.response_format_json, rebuilt from its known members: nil for
// absent or {"type":"text"}, {"type":"json_object"}, or
// {"type":"json_schema","json_schema":{"name","schema","strict"?}} (which
// needs json_schema.schema as an object).
func ResponseFormat(field string, raw json.RawMessage) ([]byte, *surface.Error) {
	if !surface.Present(raw) {
		return nil, nil
	}
	var f struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, surface.BadRequest(field, "field %q must be an object with a \"type\"", field)
	}
	switch f.Type {
	case "text":
		return nil, nil
	case "json_object":
		return []byte(`{"type":"json_object"}`), nil
	case "json_schema":
		js := f.JSONSchema
		if js == nil || len(js.Schema) == 0 || js.Schema[0] != '{' {
			return nil, surface.BadRequest(field, "field %q: json_schema.schema must be a JSON Schema object", field)
		}
		b := surface.AppendString([]byte(`{"type":"json_schema","json_schema":{"name":`), js.Name)
		b = append(b, `,"schema":`...)
		b = append(b, js.Schema...)
		if js.Strict != nil {
			b = append(b, `,"strict":`...)
			b = strconv.AppendBool(b, *js.Strict)
		}
		return append(b, "}}"...), nil
	}
	return nil, surface.BadRequest(field, "field %q: type %q is not one of text, json_object, json_schema", field, f.Type)
}
