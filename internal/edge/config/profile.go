package config

import (
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// ResolveProfile turns an openai_compat adapter's named profile plus its
// overrides into the ConcreteProtocolProfile the node receives. It returns
// nil for other adapter types or an unknown profile (validate rejects both).
func ResolveProfile(a *Adapter) *iop.ConcreteProtocolProfile {
	if a.Type != protocol.TypeOpenAICompat {
		return nil
	}
	d, ok := protocol.NamedProfile(a.Profile)
	if !ok {
		return nil
	}
	p := d.Concrete(a.BaseURL)
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
		if o.PriorityField != nil {
			p.PriorityField, _ = protocol.PriorityFieldOf(*o.PriorityField) // "" = off; validate refuses the rest
		}
	}
	return p
}

// EffectiveUpstreamIdleTimeoutMs is how long (ms) the node may reuse an
// idle upstream connection of adapter a: its upstream_idle_timeout_ms, else
// its profile's default (llamacpp, vllm: protocol.DefaultKeepAliveIdleMs), else 0
// (the node's default, 90000: Ollama's server and hosted APIs keep idle
// connections).
func EffectiveUpstreamIdleTimeoutMs(a *Adapter) int64 {
	if a.UpstreamIdleTimeoutMs > 0 {
		return a.UpstreamIdleTimeoutMs
	}
	if a.Type == protocol.TypeOpenAICompat {
		if d, ok := protocol.NamedProfile(a.Profile); ok {
			return d.IdleMs
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
	if a.Type == protocol.TypeOllama {
		return []string{protocol.OpChatCompletions, protocol.OpModels, protocol.OpMessages, protocol.OpCountTokens, protocol.OpResponses, protocol.OpCompletions, protocol.OpEmbeddings}
	}
	p := ResolveProfile(a)
	if p == nil {
		return nil
	}
	var ops []string
	for _, o := range []struct {
		op, path string
	}{{protocol.OpModels, p.ModelsPath}, {protocol.OpChatCompletions, p.ChatCompletionsPath}, {protocol.OpMessages, p.MessagesPath},
		{protocol.OpCountTokens, p.CountTokensPath}, {protocol.OpResponses, p.ResponsesPath},
		{protocol.OpCompletions, p.CompletionsPath}, {protocol.OpEmbeddings, p.EmbeddingsPath}} {
		if o.path != "" {
			ops = append(ops, o.op)
		}
	}
	return ops
}
