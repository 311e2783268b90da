package protocol

import iop "iop/proto/gen/iop"

// Named protocol profiles of openai_compat adapters (SPEC T1):
// AdapterConfig's protocol_profile.name, resolved by the Edge into the
// ConcreteProtocolProfile the node receives.
const (
	ProfileOpenAI   = "openai"
	ProfileVLLM     = "vllm"
	ProfileLlamaCpp = "llamacpp"
	ProfileOllama   = "ollama"
)

// DefaultKeepAliveIdleMs is the default upstream_idle_timeout_ms of the
// profiles whose servers close a keep-alive connection idle for 5 s
// (llama-server's cpp-httplib, vLLM's uvicorn): 3 s leaves 2 s for the
// node to read the end of an answer after the server wrote it.
const DefaultKeepAliveIdleMs = 3000

// Profile is a built-in protocol profile: the paths below the base URL per
// operation ("" = not served), the upstream auth header and scheme, the
// health path, whether the server takes native tool calls, and its
// defaults.
type Profile struct {
	Name                                                                               string
	DefaultBaseURL                                                                     string // "" = the adapter must set base_url
	AuthHeader, AuthScheme                                                             string
	Models, ChatCompletions, Messages, CountTokens, Responses, Completions, Embeddings string
	Health                                                                             string
	NativeTools                                                                        bool
	// IdleMs is the default upstream_idle_timeout_ms (0 = the node's
	// default, 90000): below the server's own keep-alive timeout.
	IdleMs int64
}

// ollamaV1 is Ollama 0.17's OpenAI- and Anthropic-compatible /v1 layer
// (Ollama docs/openai.md, docs/api/anthropic-compatibility; no
// count_tokens), checked against the real server; /api/tags is its health
// path. It is both the openai_compat "ollama" profile and the built-in
// profile of an ollama adapter's tunnels and probes (OllamaProfile).
var ollamaV1 = Profile{
	Name: ProfileOllama, AuthHeader: "Authorization", AuthScheme: "Bearer",
	Models: "/v1/models", ChatCompletions: "/v1/chat/completions", Messages: "/v1/messages",
	Responses: "/v1/responses", Completions: "/v1/completions", Embeddings: "/v1/embeddings",
	Health: "/api/tags", NativeTools: true,
}

// NamedProfile returns the named profile (ProfileOpenAI, …) before an
// adapter's overrides. Paths follow what each server serves: OpenAI's API
// reference; vLLM's OpenAI-compatible server; llama.cpp's llama-server
// (commit e95dae18: also Anthropic /v1/messages and
// /v1/messages/count_tokens, and /v1/responses); Ollama's /v1 layer
// (ollamaV1). The llamacpp and ollama paths were checked against those real
// servers.
func NamedProfile(name string) (Profile, bool) {
	d := Profile{Name: name, AuthHeader: "Authorization", AuthScheme: "Bearer",
		Models: "/v1/models", ChatCompletions: "/v1/chat/completions",
		Completions: "/v1/completions", Embeddings: "/v1/embeddings", NativeTools: true}
	switch name {
	case ProfileOpenAI:
		d.DefaultBaseURL = "https://api.openai.com"
		d.Responses = "/v1/responses"
		d.Health = "/v1/models"
	case ProfileVLLM:
		d.Responses = "/v1/responses"
		d.Health = "/health"
		d.IdleMs = DefaultKeepAliveIdleMs
	case ProfileLlamaCpp:
		d.Messages = "/v1/messages"
		d.CountTokens = "/v1/messages/count_tokens"
		d.Responses = "/v1/responses"
		d.Health = "/health"
		d.IdleMs = DefaultKeepAliveIdleMs
	case ProfileOllama:
		return ollamaV1, true
	default:
		return Profile{}, false
	}
	return d, true
}

// Concrete is p as the wire's ConcreteProtocolProfile, with base as its
// base URL.
func (p Profile) Concrete(base string) *iop.ConcreteProtocolProfile {
	return &iop.ConcreteProtocolProfile{
		Name: p.Name, BaseUrl: base, AuthHeader: p.AuthHeader, AuthScheme: p.AuthScheme,
		ModelsPath: p.Models, ChatCompletionsPath: p.ChatCompletions, MessagesPath: p.Messages,
		CountTokensPath: p.CountTokens, ResponsesPath: p.Responses, CompletionsPath: p.Completions,
		EmbeddingsPath: p.Embeddings, HealthPath: p.Health, NativeTools: p.NativeTools,
	}
}

// OllamaProfile is the built-in profile of an ollama adapter at base, used
// by its tunnels and probes: Ollama's /v1 layer (ollamaV1) without an auth
// header of its own (an ollama adapter's api_key_env always goes in
// "Authorization: Bearer").
func OllamaProfile(base string) *iop.ConcreteProtocolProfile {
	p := ollamaV1
	p.AuthHeader, p.AuthScheme = "", ""
	return p.Concrete(base)
}
