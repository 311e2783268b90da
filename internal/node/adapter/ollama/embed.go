package ollama

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"iop/internal/node/adapter/upstream"
	iop "iop/proto/gen/iop"
)

// EmbedPath is Ollama's embeddings endpoint (Ollama docs/api.md, "Generate
// Embeddings").
const EmbedPath = "/api/embed"

// maxEmbedBody bounds an /api/embed answer read into memory, in bytes.
const maxEmbedBody = 256 << 20

// embedRequest is the body of POST /api/embed.
type embedRequest struct {
	Model      string   `json:"model"`
	Input      []string `json:"input"`
	Dimensions int64    `json:"dimensions,omitempty"`
	Truncate   *bool    `json:"truncate,omitempty"`
	// KeepAlive is Driver.KeepAlive.
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
}

// embedResponse is the answer of /api/embed.
type embedResponse struct {
	Embeddings      [][]float32 `json:"embeddings"`
	PromptEvalCount int64       `json:"prompt_eval_count"`
	LoadDuration    int64       `json:"load_duration"` // ns
}

// BuildEmbedRequest returns the JSON body of an /api/embed request for
// target: input.embed_input, input.dimensions and input.truncate. Errors
// wrap upstream.ErrInvalidInput.
func BuildEmbedRequest(target string, in *iop.RunInput) ([]byte, error) {
	return buildEmbedRequest(target, in, nil)
}

func buildEmbedRequest(target string, in *iop.RunInput, keepAlive json.RawMessage) ([]byte, error) {
	if len(in.GetEmbedInput()) == 0 {
		return nil, fmt.Errorf("%w: no input to embed", upstream.ErrInvalidInput)
	}
	return json.Marshal(embedRequest{Model: target, Input: in.GetEmbedInput(), Dimensions: in.GetDimensions(), Truncate: in.Truncate,
		KeepAlive: keepAlive})
}

// Embed runs one /api/embed call for target and returns one vector per
// input in Result.Embeddings and prompt_eval_count as the usage. Errors as
// Run's; upstream.ErrProtocol also when the vector count differs from the
// input count.
func (d *Driver) Embed(ctx context.Context, target string, in *iop.RunInput, h upstream.Hooks) (res upstream.Result, err error) {
	end := d.begin(target)
	defer func() { end(res.LoadNs) }()
	body, err := buildEmbedRequest(target, in, d.KeepAlive)
	if err != nil {
		return upstream.Result{}, err
	}
	resp, err := d.EP.PostJSON(ctx, EmbedPath, body, "application/json")
	if err != nil {
		return upstream.Result{}, err
	}
	h.Activity()
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(h.Body(resp.Body), maxEmbedBody+1))
	if err != nil {
		return upstream.Result{}, err
	}
	if len(raw) > maxEmbedBody {
		return upstream.Result{}, fmt.Errorf("%w: ollama embed answer over %d bytes", upstream.ErrProtocol, maxEmbedBody)
	}
	var er embedResponse
	if err := json.Unmarshal(raw, &er); err != nil {
		return upstream.Result{}, fmt.Errorf("%w: ollama embed answer is not JSON: %v", upstream.ErrProtocol, err)
	}
	if len(er.Embeddings) != len(in.GetEmbedInput()) {
		return upstream.Result{}, fmt.Errorf("%w: ollama returned %d embeddings for %d inputs", upstream.ErrProtocol, len(er.Embeddings), len(in.GetEmbedInput()))
	}
	res = upstream.Result{FinishReason: "stop", Usage: &iop.Usage{PromptTokens: er.PromptEvalCount, TotalTokens: er.PromptEvalCount},
		LoadNs: max(er.LoadDuration, 0)}
	for _, v := range er.Embeddings {
		res.Embeddings = append(res.Embeddings, &iop.Embedding{Values: v})
	}
	return res, nil
}
