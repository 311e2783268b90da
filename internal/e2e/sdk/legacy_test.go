package sdk

import (
	"testing"

	"github.com/openai/openai-go/v3"
)

// testEmbeddings: F1 — embeddings.create on both paths (the run path
// through Ollama's /api/embed; the tunnel to the server's /v1/embeddings).
func testEmbeddings(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			if p.suffix != "" && s.env.realServer() && s.env.openaiProfile == "llamacpp" {
				t.Skip("llama-server serves /v1/embeddings only with --embeddings (real-backends start it without)")
			}
			if p.suffix == "" && s.env.ollamaURL == "" && s.env.realServer() {
				t.Skip("no native Ollama: the native group uses the OpenAI-compatible provider")
			}
			r, err := s.openai().Embeddings.New(reqCtx(t), openai.EmbeddingNewParams{
				Model: "tiny" + p.suffix,
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"hello", "world"}},
			})
			if err != nil {
				t.Fatalf("Embeddings.New: %v", err)
			}
			if len(r.Data) != 2 || len(r.Data[0].Embedding) == 0 || r.Data[1].Index != 1 {
				t.Fatalf("data %+v: want two vectors", r.Data)
			}
		})
	}
}

// testCompletions: F1 — the legacy completions.create on both paths
// (tunnelled: Ollama's own /v1/completions behind the run path's node, the
// server's behind an openai_compat provider).
func testCompletions(t *testing.T, s *stack) {
	for _, p := range pathRows {
		t.Run(p.name, func(t *testing.T) {
			r, err := s.openai().Completions.New(reqCtx(t), openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel("tiny" + p.suffix),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Say hello.")},
				MaxTokens: openai.Int(16),
			})
			if err != nil {
				t.Fatalf("Completions.New: %v", err)
			}
			if len(r.Choices) != 1 || r.Choices[0].Text == "" {
				t.Fatalf("choices %+v: want one text", r.Choices)
			}
		})
	}
}
