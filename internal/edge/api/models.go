package api

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"iop/internal/edge/reply"
)

// serveModels answers GET /v1/models (the model groups names holds: every
// configured one, or a scoped key's, K4) and GET /v1/models/{id} (one of
// them; 404 model_not_found for any other id), in OpenAI's shapes (API
// reference, "Models": list and retrieve) or, with surface s Anthropic's,
// in Anthropic's ("Models": list {data, has_more, first_id, last_id}, get
// {type, id, display_name, created_at}).
func serveModels(w http.ResponseWriter, v *view, s reply.Surface, names []string, one bool, id string) {
	var body []byte
	switch {
	case one:
		if !slices.Contains(names, id) {
			e := &reply.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
				Message: "The model '" + reply.Truncate(id, 256) + "' does not exist"}
			reply.WriteError(w, s, e)
			return
		}
		if s == reply.Anthropic {
			body = appendAnthropicModel(nil, id, v.created)
		} else {
			body = appendOpenAIModel(nil, id, v.created)
		}
	case s == reply.Anthropic && len(names) == len(v.names):
		body = v.anthropicModels
	case s == reply.Anthropic:
		body = anthropicModelList(names, v.created)
	case len(names) == len(v.names):
		body = v.models
	default:
		body = modelList(names, v.created)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// appendOpenAIModel appends one OpenAI model object {"id","object":
// "model","created","owned_by"}.
func appendOpenAIModel(b []byte, name string, created int64) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, created, 10)
	return append(b, `,"owned_by":"iop"}`...)
}

// appendAnthropicModel appends one Anthropic model object {"type":"model",
// "id","display_name","created_at"} (created_at RFC 3339, UTC).
func appendAnthropicModel(b []byte, name string, created int64) []byte {
	b = append(b, `{"type":"model","id":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"display_name":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"created_at":"`...)
	b = time.Unix(created, 0).UTC().AppendFormat(b, time.RFC3339)
	return append(b, `"}`...)
}

// anthropicModelList is GET /v1/models in Anthropic's list shape: the
// groups names holds, on one page.
func anthropicModelList(names []string, created int64) []byte {
	b := []byte(`{"data":[`)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendAnthropicModel(b, name, created)
	}
	b = append(b, `],"has_more":false,"first_id":`...)
	if n := len(names); n > 0 {
		b = appendJSONString(b, names[0])
		b = append(b, `,"last_id":`...)
		b = appendJSONString(b, names[n-1])
	} else {
		b = append(b, `null,"last_id":null`...)
	}
	return append(b, '}')
}

// modelList is the GET /v1/models body: the configured model groups in the
// OpenAI list shape (OpenAI API reference, "List models").
func modelList(names []string, created int64) []byte {
	b := []byte(`{"object":"list","data":[`)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendOpenAIModel(b, name, created)
	}
	return append(b, "]}"...)
}
