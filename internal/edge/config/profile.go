package config

import iop "iop/proto/gen/iop"

// Named protocol profiles of openai_compat adapters (issue 4, SPEC T1).
const (
	ProfileOpenAI   = "openai"
	ProfileVLLM     = "vllm"
	ProfileLlamaCpp = "llamacpp"
	ProfileOllama   = "ollama"
)

// Operations a profile may support (SPEC T1).
const (
	OpModels          = "models"
	OpChatCompletions = "chat_completions"
	OpMessages        = "messages"
	OpCountTokens     = "count_tokens"
	OpResponses       = "responses"
	OpCompletions     = "completions"
	OpEmbeddings      = "embeddings"
)

// profileDefaults is one named profile before overrides.
type profileDefaults struct {
	defaultBaseURL                                                                        string
	authHeader, authScheme                                                                string
	modelsPath, chatCompletionsPath, messagesPath, countTokensPath, responsesPath, health string
	completionsPath, embeddingsPath                                                       string
	nativeTools                                                                           bool
	// idleMs is the default upstream_idle_timeout_ms (0 = the node's
	// default, 90000): below the server's own keep-alive timeout.
	idleMs int64
}

// DefaultKeepAliveIdleMs is the default upstream_idle_timeout_ms of the
// profiles whose servers close a keep-alive connection idle for 5 s
// (llama-server's cpp-httplib, vLLM's uvicorn): 3 s leaves 2 s for the
// node to read the end of an answer after the server wrote it (issue 11).
const DefaultKeepAliveIdleMs = 3000

// namedProfile returns the defaults of a named profile. Paths follow what
// each server serves: OpenAI's API reference; vLLM's OpenAI-compatible
// server; llama.cpp's llama-server (commit e95dae18: also Anthropic
// /v1/messages and /v1/messages/count_tokens, and /v1/responses); Ollama
// 0.17.4's /v1 compatibility layer (also /v1/messages and /v1/responses, no
// count_tokens). The llamacpp and ollama paths were checked against those
// real servers (README, "Backends checked").
func namedProfile(name string) (profileDefaults, bool) {
	d := profileDefaults{authHeader: "Authorization", authScheme: "Bearer",
		modelsPath: "/v1/models", chatCompletionsPath: "/v1/chat/completions",
		completionsPath: "/v1/completions", embeddingsPath: "/v1/embeddings", nativeTools: true}
	switch name {
	case ProfileOpenAI:
		d.defaultBaseURL = "https://api.openai.com"
		d.responsesPath = "/v1/responses"
		d.health = "/v1/models"
	case ProfileVLLM:
		d.responsesPath = "/v1/responses"
		d.health = "/health"
		d.idleMs = DefaultKeepAliveIdleMs
	case ProfileLlamaCpp:
		d.messagesPath = "/v1/messages"
		d.countTokensPath = "/v1/messages/count_tokens"
		d.responsesPath = "/v1/responses"
		d.health = "/health"
		d.idleMs = DefaultKeepAliveIdleMs
	case ProfileOllama:
		d.messagesPath = "/v1/messages"
		d.responsesPath = "/v1/responses"
		d.health = "/api/tags"
	default:
		return profileDefaults{}, false
	}
	return d, true
}

// ResolveProfile turns an openai_compat adapter's named profile plus its
// overrides into the ConcreteProtocolProfile the node receives. It returns
// nil for other adapter types or an unknown profile (validate rejects both).
func ResolveProfile(a *Adapter) *iop.ConcreteProtocolProfile {
	if a.Type != TypeOpenAICompat {
		return nil
	}
	d, ok := namedProfile(a.Profile)
	if !ok {
		return nil
	}
	p := &iop.ConcreteProtocolProfile{
		Name: a.Profile, BaseUrl: a.BaseURL,
		AuthHeader: d.authHeader, AuthScheme: d.authScheme,
		ModelsPath: d.modelsPath, ChatCompletionsPath: d.chatCompletionsPath,
		MessagesPath: d.messagesPath, CountTokensPath: d.countTokensPath,
		ResponsesPath: d.responsesPath, NativeTools: d.nativeTools, HealthPath: d.health,
		CompletionsPath: d.completionsPath, EmbeddingsPath: d.embeddingsPath,
	}
	if o := a.ProfileOverrides; o != nil {
		set := func(dst *string, v *string) {
			if v != nil {
				*dst = *v
			}
		}
		set(&p.AuthHeader, o.AuthHeader)
		set(&p.AuthScheme, o.AuthScheme)
		set(&p.ModelsPath, o.ModelsPath)
		set(&p.ChatCompletionsPath, o.ChatCompletionsPath)
		set(&p.MessagesPath, o.MessagesPath)
		set(&p.CountTokensPath, o.CountTokensPath)
		set(&p.ResponsesPath, o.ResponsesPath)
		set(&p.HealthPath, o.HealthPath)
		set(&p.CompletionsPath, o.CompletionsPath)
		set(&p.EmbeddingsPath, o.EmbeddingsPath)
		if o.NativeTools != nil {
			p.NativeTools = *o.NativeTools
		}
	}
	return p
}

// EffectiveUpstreamIdleTimeoutMs is how long (ms) the node may reuse an
// idle upstream connection of adapter a: its upstream_idle_timeout_ms, else
// its profile's default (llamacpp, vllm: DefaultKeepAliveIdleMs), else 0
// (the node's default, 90000: Ollama's server and hosted APIs keep idle
// connections).
func EffectiveUpstreamIdleTimeoutMs(a *Adapter) int64 {
	if a.UpstreamIdleTimeoutMs > 0 {
		return a.UpstreamIdleTimeoutMs
	}
	if a.Type == TypeOpenAICompat {
		if d, ok := namedProfile(a.Profile); ok {
			return d.idleMs
		}
	}
	return 0
}

// Operations lists the operations adapter a serves: an ollama adapter
// serves chat_completions, messages, count_tokens, responses and embeddings
// through the normalized run path (Ollama's /api/chat and /api/embed) and
// models and completions through the node's tunnel to Ollama's /v1 layer; an
// openai_compat adapter serves each operation its resolved profile has a
// path for.
func Operations(a *Adapter) []string {
	if a.Type == TypeOllama {
		return []string{OpChatCompletions, OpModels, OpMessages, OpCountTokens, OpResponses, OpCompletions, OpEmbeddings}
	}
	p := ResolveProfile(a)
	if p == nil {
		return nil
	}
	var ops []string
	for _, o := range []struct {
		op, path string
	}{{OpModels, p.ModelsPath}, {OpChatCompletions, p.ChatCompletionsPath}, {OpMessages, p.MessagesPath},
		{OpCountTokens, p.CountTokensPath}, {OpResponses, p.ResponsesPath},
		{OpCompletions, p.CompletionsPath}, {OpEmbeddings, p.EmbeddingsPath}} {
		if o.path != "" {
			ops = append(ops, o.op)
		}
	}
	return ops
}
