package api

import (
	"net/http"
	"testing"

	"iop/internal/edge/reply"
	"iop/internal/protocol"
)

// T5: the one endpoint table: each path's method, access-record surface,
// error shape, trace route and endpoint; /v1/models/{id} names one model;
// a path the edge does not serve has no method and is answered in
// Anthropic's shape only under /v1/messages/.
func TestRouteOf(t *testing.T) {
	rows := []struct {
		path       string
		method     string
		record     string
		shape      reply.Surface
		traceRoute string
		ep         *endpoint
		modelID    string
	}{
		{"/v1/chat/completions", http.MethodPost, protocol.OpChatCompletions, reply.OpenAI, "/v1/chat/completions", &epChat, ""},
		{"/v1/responses", http.MethodPost, protocol.OpResponses, reply.OpenAI, "/v1/responses", &epResponses, ""},
		{"/v1/messages", http.MethodPost, protocol.OpMessages, reply.Anthropic, "/v1/messages", &epMessages, ""},
		{"/v1/messages/count_tokens", http.MethodPost, protocol.OpCountTokens, reply.Anthropic, "/v1/messages/count_tokens", &epCountTokens, ""},
		{"/v1/completions", http.MethodPost, protocol.OpCompletions, reply.OpenAI, "/v1/completions", &epCompletions, ""},
		{"/v1/embeddings", http.MethodPost, protocol.OpEmbeddings, reply.OpenAI, "/v1/embeddings", &epEmbeddings, ""},
		{"/v1/models", http.MethodGet, protocol.OpModels, reply.OpenAI, "/v1/models", nil, ""},
		{"/v1/models/tiny", http.MethodGet, protocol.OpModels, reply.OpenAI, "", nil, "tiny"},
		{"/v1/models/", "", protocol.OpModels, reply.OpenAI, "", nil, ""},
		{"/v1/messages/batches", "", reply.SurfaceOther, reply.Anthropic, "", nil, ""},
		{"/v1/files", "", reply.SurfaceOther, reply.OpenAI, "", nil, ""},
		{"/v1/chat/completions/", "", reply.SurfaceOther, reply.OpenAI, "", nil, ""},
		{"/", "", reply.SurfaceOther, reply.OpenAI, "", nil, ""},
	}
	for _, r := range rows {
		got := routeOf(r.path)
		if got.method != r.method || got.record != r.record || got.shape != r.shape || got.traceRoute != r.traceRoute ||
			got.ep != r.ep || got.oneModel != (r.modelID != "") {
			t.Errorf("routeOf(%q) = %+v, want %+v", r.path, got, r)
		}
	}
}
