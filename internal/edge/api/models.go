package api

import (
	"strconv"
	"time"
)

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
