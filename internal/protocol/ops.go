package protocol

// Adapter types: AdapterConfig.type (SPEC E1, Q3). An ollama provider is
// driven by normalized run (its /api/chat and /api/embed) and, for what the
// run path does not serve, by tunnel to its /v1 layer (OllamaProfile); an
// openai_compat provider by tunnel, on its protocol profile.
const (
	TypeOllama       = "ollama"
	TypeOpenAICompat = "openai_compat"
)

// Tunnel operations: ProviderTunnelRequest.operation, each mapped to one
// path of the adapter's protocol profile (SPEC T1). The Edge's pool admits a
// request only to a provider whose profile has the operation's path.
const (
	OpModels          = "models"
	OpChatCompletions = "chat_completions"
	OpMessages        = "messages"
	OpCountTokens     = "count_tokens"
	OpResponses       = "responses"
	OpCompletions     = "completions"
	OpEmbeddings      = "embeddings"
)

// Run operations: RunRequest.operation; "" is RunChat.
const (
	RunChat       = "chat"
	RunEmbeddings = "embeddings"
)
