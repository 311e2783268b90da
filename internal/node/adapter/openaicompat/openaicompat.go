// Package openaicompat drives an OpenAI-compatible chat-completions server
// (vLLM, llama.cpp's llama-server, Ollama's /v1, a hosted API) for the node's
// normalized runs (SPEC E9), following the OpenAI API reference for
// "Create chat completion" with stream=true.
//
// It asks for stream_options.include_usage, parses the SSE stream with
// internal/sse, assembles streamed tool-call fragments by index into
// metadata["openai_tool_calls"], and — only when the backend rejects the
// native tools API, or its profile says it has none — retries once in the
// text tool-call mode of SPEC E9 (see TextToolCallFormat). It never parses
// assistant text into tool calls, owns no capacity and emits no run events
// (the adapter Set does, from Hooks and the Result).
package openaicompat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Driver runs chats against one OpenAI-compatible server.
type Driver struct {
	EP *upstream.Endpoint
	// Profile is the resolved protocol profile; ChatCompletionsPath must be
	// set for runs, NativeTools says whether tools are sent natively.
	Profile *iop.ConcreteProtocolProfile
}

// Run streams one chat for target and returns the finished result. Text
// deltas go to h as they are read. When the input carries tools and the
// backend rejects them (see RejectsTools) or Profile.NativeTools is false,
// the run is sent once in text tool-call mode and the result carries
// metadata["openai_text_tool_fallback"]="true" (SPEC E9).
//
// Errors: upstream.ErrInvalidInput for input that cannot be converted,
// upstream.ErrUnsupported when the profile has no chat_completions path,
// *upstream.StatusError for a non-2xx answer, upstream.ErrProtocol for a
// malformed or unfinished stream or an error object mid-stream, or the
// transport's error (including ctx's) as is.
func (d *Driver) Run(ctx context.Context, target string, in *iop.RunInput, h upstream.Hooks) (upstream.Result, error) {
	if in == nil {
		return upstream.Result{}, fmt.Errorf("%w: no input", upstream.ErrInvalidInput)
	}
	if d.Profile.GetChatCompletionsPath() == "" {
		return upstream.Result{}, fmt.Errorf("%w: profile %q has no chat_completions path", upstream.ErrUnsupported, d.Profile.GetName())
	}
	tools, err := upstream.Tools(in.GetToolsJson())
	if err != nil {
		return upstream.Result{}, err
	}
	if tools == nil || d.Profile.GetNativeTools() {
		res, err := d.attempt(ctx, target, in, false, h)
		if err == nil || tools == nil || !RejectsTools(err) {
			return res, err
		}
	}
	res, err := d.attempt(ctx, target, in, true, h)
	if err != nil {
		return res, err
	}
	if res.Metadata == nil {
		res.Metadata = map[string]string{}
	}
	res.Metadata[protocol.MetaTextToolFallback] = "true"
	return res, nil
}

// RejectsTools reports whether err is a backend's rejection of the native
// tools API (SPEC E9): a 400 or 422 answer to a request carrying tools, or a
// 5xx whose message names tools (llama-server without --jinja, for one).
func RejectsTools(err error) bool {
	var se *upstream.StatusError
	if !errors.As(err, &se) {
		return false
	}
	switch {
	case se.Status == http.StatusBadRequest || se.Status == http.StatusUnprocessableEntity:
		return true
	case se.Status >= 500:
		return strings.Contains(strings.ToLower(se.Message), "tool")
	}
	return false
}

func (d *Driver) attempt(ctx context.Context, target string, in *iop.RunInput, textTools bool, h upstream.Hooks) (upstream.Result, error) {
	body, err := BuildChatRequest(d.Profile.GetName(), target, in, textTools)
	if err != nil {
		return upstream.Result{}, err
	}
	if n, ok := upstream.PriorityOf(ctx); ok { // SPEC G7: the backend schedules by it
		if body, err = upstream.SetPriority(body, n); err != nil {
			return upstream.Result{}, err
		}
	}
	resp, err := d.EP.PostJSON(ctx, d.Profile.GetChatCompletionsPath(), body, "text/event-stream")
	if err != nil {
		return upstream.Result{}, err
	}
	h.Activity() // the response headers arrived (SPEC H1)
	defer resp.Body.Close()
	return ReadChatStream(h.Body(resp.Body), h)
}

// Probe reports whether target is served (SPEC H10): "unavailable" when the
// profile's health_path answers non-2xx or cannot be reached; then, when the
// profile has a models path, "available" only if the models list names
// target (data[].id or aliases, or models[].name/model; tag-aware), else
// "unavailable"; "available" on a healthy health_path without a models path;
// "unknown" when ctx ends first, the list is unreadable, or the profile has
// neither path. The caller bounds ctx.
func (d *Driver) Probe(ctx context.Context, target string) string {
	health, models := d.Profile.GetHealthPath(), d.Profile.GetModelsPath()
	if health == "" && models == "" {
		return protocol.HealthUnknown
	}
	if health != "" && health != models {
		status, _, verdict := d.get(ctx, health, 0)
		if verdict != "" {
			return verdict
		}
		if status < 200 || status > 299 {
			return protocol.HealthUnavailable
		}
		if models == "" {
			return protocol.HealthAvailable
		}
	}
	status, body, verdict := d.get(ctx, models, 4<<20)
	if verdict != "" {
		return verdict
	}
	if status < 200 || status > 299 {
		return protocol.HealthUnavailable
	}
	var list struct {
		Data []struct {
			ID      string   `json:"id"`
			Aliases []string `json:"aliases"`
		} `json:"data"`
		Models []struct {
			Name  string `json:"name"`
			Model string `json:"model"`
		} `json:"models"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return protocol.HealthUnknown
	}
	for _, m := range list.Data {
		if upstream.SameModel(m.ID, target) {
			return protocol.HealthAvailable
		}
		for _, a := range m.Aliases {
			if upstream.SameModel(a, target) {
				return protocol.HealthAvailable
			}
		}
	}
	for _, m := range list.Models {
		if upstream.SameModel(m.Name, target) || upstream.SameModel(m.Model, target) {
			return protocol.HealthAvailable
		}
	}
	return protocol.HealthUnavailable
}

// get fetches rel and returns its status and up to limit body bytes; verdict
// is non-empty when the request failed ("unknown" if ctx ended, else
// "unavailable").
func (d *Driver) get(ctx context.Context, rel string, limit int64) (int, []byte, string) {
	req, err := d.EP.NewRequest(ctx, http.MethodGet, rel, nil)
	if err != nil {
		return 0, nil, protocol.HealthUnknown
	}
	resp, err := d.EP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, protocol.HealthUnknown
		}
		return 0, nil, protocol.HealthUnavailable
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, protocol.HealthUnknown
		}
		return 0, nil, protocol.HealthUnavailable
	}
	return resp.StatusCode, body, ""
}

// Models lists the models the server serves (the profile's models path,
// data[].id), for discovery (SPEC D1); see upstream.ListModels. A profile
// without a models path lists nothing (an error).
func (d *Driver) Models(ctx context.Context) ([]string, error) {
	p := d.Profile.GetModelsPath()
	if p == "" {
		return nil, errors.New("the profile has no models_path to list models from")
	}
	return upstream.ListModels(ctx, d.EP, p)
}
