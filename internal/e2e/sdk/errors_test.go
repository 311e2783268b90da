package sdk

import (
	"errors"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// testErrors: T5 — errors reach the SDKs as their typed
// errors with the right status: 401 missing/wrong key, 404 unknown model,
// 400 bad JSON, on the OpenAI and the Anthropic surface.
func testErrors(t *testing.T, s *stack) {
	openaiRows := []struct {
		name   string
		model  string
		opts   []option.RequestOption
		status int
	}{
		{"401 no key", "tiny", []option.RequestOption{option.WithAPIKey("")}, http.StatusUnauthorized},
		{"401 wrong key", "tiny", []option.RequestOption{option.WithAPIKey("not-the-demo-key")}, http.StatusUnauthorized},
		{"404 unknown model", "no-such-model", nil, http.StatusNotFound},
		{"400 bad JSON", "tiny", []option.RequestOption{
			option.WithRequestBody("application/json", []byte(`{"model":"tiny","messages":[{"role":"user","content":"hi"}`)),
		}, http.StatusBadRequest},
	}
	for _, r := range openaiRows {
		t.Run("openai "+r.name, func(t *testing.T) {
			_, err := s.openai(r.opts...).Chat.Completions.New(reqCtx(t), helloParams(r.model))
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v (%T), want *openai.Error", err, err)
			}
			if apiErr.StatusCode != r.status {
				t.Errorf("status = %d, want %d", apiErr.StatusCode, r.status)
			}
			if apiErr.Message == "" || apiErr.Type == "" {
				t.Errorf("error body message %q type %q; want the OpenAI error object", apiErr.Message, apiErr.Type)
			}
		})
	}

	anthropicRows := []struct {
		name   string
		model  string
		opts   []aoption.RequestOption
		status int
	}{
		{"401 no key", "tiny", []aoption.RequestOption{aoption.WithHeaderDel("x-api-key")}, http.StatusUnauthorized},
		{"404 unknown model", "no-such-model", nil, http.StatusNotFound},
	}
	for _, r := range anthropicRows {
		t.Run("anthropic "+r.name, func(t *testing.T) {
			p := messageParams(r.model)
			_, err := s.anthropic(r.opts...).Messages.New(reqCtx(t), p)
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v (%T), want *anthropic.Error", err, err)
			}
			if apiErr.StatusCode != r.status {
				t.Errorf("status = %d, want %d", apiErr.StatusCode, r.status)
			}
		})
	}
}
