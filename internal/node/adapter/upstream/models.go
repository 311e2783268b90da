package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
)

// Bounds of a model list (SPEC D1): a backend can lie, so what it lists
// costs a bounded amount.
const (
	MaxModelsBody = 4 << 20 // bytes read of a models list
	MaxModels     = 4096    // names kept
	MaxModelName  = 256     // bytes per name
)

// ListModels GETs rel (Ollama's /api/tags, an OpenAI-compatible models
// path) and returns the model names it lists: OpenAI's data[].id (OpenAI
// API reference, "List models") and Ollama's models[].name (Ollama
// docs/api.md, "List Local Models"), sorted and without duplicates, names
// over MaxModelName dropped, at most MaxModels. Errors: *StatusError for a
// non-2xx answer, the transport's (*RequestError) or a decoding error.
func ListModels(ctx context.Context, ep *Endpoint, rel string) ([]string, error) {
	req, err := ep.NewRequest(ctx, http.MethodGet, rel, nil)
	if err != nil {
		return nil, err
	}
	resp, err := ep.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, &StatusError{Status: resp.StatusCode}
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, MaxModelsBody)).Decode(&list); err != nil {
		return nil, fmt.Errorf("models list %s: %w", rel, err)
	}
	names := make([]string, 0, len(list.Data)+len(list.Models))
	for _, d := range list.Data {
		names = append(names, d.ID)
	}
	for _, m := range list.Models {
		names = append(names, m.Name)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == "" || len(n) > MaxModelName })
	sort.Strings(names)
	names = slices.Compact(names)
	return slices.Clip(names[:min(len(names), MaxModels)]), nil
}
