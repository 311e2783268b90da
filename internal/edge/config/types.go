package config

// Config is the Edge config file.
type Config struct {
	HTTPListen  string      `json:"http_listen"`
	NodeListen  string      `json:"node_listen"`
	AdminListen string      `json:"admin_listen"`
	TLS         TLS         `json:"tls"`
	Heartbeat   Heartbeat   `json:"heartbeat"`
	APIKeys     []APIKey    `json:"api_keys"`
	Nodes       []Node      `json:"nodes"`
	Models      []Model     `json:"models"`
	Queue       Queue       `json:"queue"`
	Credentials Credentials `json:"credentials"`
	HTTP        HTTP        `json:"http"`
	Admin       Admin       `json:"admin"`
	Shutdown    Shutdown    `json:"shutdown"`
	// OutlierDetection is passive health: providers whose requests fail
	// are skipped for a while.
	OutlierDetection OutlierDetection `json:"outlier_detection"`
	// Keys is the key store of `edge keys` (docs/keys.md).
	Keys Keys `json:"keys"`
	// Enrollment: node join tokens and short-lived certificates (SPEC J1-J6).
	Enrollment Enrollment `json:"enrollment"`
	// NodeTemplates give nodes not listed in Nodes their adapters (SPEC J7).
	NodeTemplates []NodeTemplate `json:"node_templates"`
	// ModelDiscovery makes model groups from what the nodes' backends
	// serve (SPEC D2).
	ModelDiscovery []ModelDiscovery `json:"model_discovery"`
	Discovery      Discovery        `json:"discovery"`
	// Tracing exports OpenTelemetry traces (tracing.go).
	Tracing Tracing `json:"tracing"`
	// Batches serves the OpenAI Batch and Files API (batches.go).
	Batches Batches `json:"batches"`

	// CredentialProjection is not read from the file: the Edge sets it
	// after loading the secret store (internal/edge/creds), and NodePayload
	// sends each node its part (SPEC C6).
	CredentialProjection CredentialProjection `json:"-"`

	// file is the config Effective derived this one from; nil for a
	// config read from a file.
	file *Config
}

// CredentialProjection is the non-secret credential state each node
// receives in its payload: per node id, the projection generation and the
// revisions of the slots its routes use.
type CredentialProjection struct {
	Nodes map[string]NodeCredentials
}

// NodeCredentials is one node's part of the CredentialProjection.
type NodeCredentials struct {
	Generation    uint64
	SlotRevisions map[string]uint64
	// RecipientKeyID and IssuerKeyID are the key ids the node's leases are
	// sealed to and signed with (lease.KeyID; public).
	RecipientKeyID, IssuerKeyID string
}

// DefaultEjectStatuses are the upstream statuses that count as a provider
// failure by default: 500 and the gateway errors. The edge validates the
// JSON it forwards, so llama-server's 500 for malformed JSON cannot be a
// client's doing; a deployment whose backend answers some valid but
// unservable requests with 500 sets outlier_detection.statuses without it.
var DefaultEjectStatuses = []int{500, 502, 503, 504}

// OutlierDetection is the passive-health policy: a provider
// whose request fails before the first byte — the connection could not be
// opened, it was reset before the response head, the upstream answered one
// of Statuses, or 429 — is ejected (skipped while another live candidate
// can take the request) for a cooling-down window: 429 for its
// Retry-After, otherwise BaseEjectionMs doubled for every consecutive
// failure, at most MaxEjectionMs; a success resets the doubling. Such a
// request is re-dispatched to a candidate it has not tried yet
// (models[].max_attempts).
type OutlierDetection struct {
	// Enabled: omitted = true; false turns ejection off (re-dispatch stays).
	Enabled        *bool `json:"enabled"`
	BaseEjectionMs int64 `json:"base_ejection_ms"`
	MaxEjectionMs  int64 `json:"max_ejection_ms"`
	// Statuses: 5xx statuses that count as a failure; omitted =
	// DefaultEjectStatuses, [] = none (429 always counts).
	Statuses []int `json:"statuses"`
}

// TLS holds the Edge's workload certificate for the node listener (SPEC I1).
// Relative paths are resolved against the config file's directory.
type TLS struct {
	CertFile    string `json:"cert_file"`
	KeyFile     string `json:"key_file"`
	CAFile      string `json:"ca_file"`
	TrustDomain string `json:"trust_domain"`
}

// Heartbeat settings in ms (SPEC L7).
type Heartbeat struct {
	IntervalMs int64 `json:"interval_ms"`
	// TimeoutMs: the Edge fences a ready node silent this long.
	TimeoutMs int64 `json:"timeout_ms"`
	// NodeTimeoutMs: sent to nodes; a node gives up on a silent Edge after
	// this long. Must be below TimeoutMs so the node notices first.
	NodeTimeoutMs int64 `json:"node_timeout_ms"`
}

// APIKey is one client credential: the hex SHA-256 of the key a client sends
// as "Authorization: Bearer <key>" (or x-api-key on /v1/messages).
type APIKey struct {
	Principal string `json:"principal"`
	KeySHA256 string `json:"key_sha256"`
	// MaxConcurrent bounds this key's requests in flight (0 = no bound);
	// beyond it a 429 with Retry-After.
	MaxConcurrent int `json:"max_concurrent"`
	// RequestsPerMinute bounds this key's request rate (0 = no bound): a
	// token bucket of that many requests refilled evenly over a minute;
	// beyond it a 429 with Retry-After naming when the next one fits.
	RequestsPerMinute int `json:"requests_per_minute"`
	// Weight, Class and MaxClass are the key's fair share and priority
	// classes (fairshare.go, SPEC G1, G4).
	Weight   int    `json:"weight"`
	Class    string `json:"class"`
	MaxClass string `json:"max_class"`
	// LocalOnly keeps the key's requests off every adapter whose location
	// is "remote", in its group and through a fallback (SPEC V3).
	LocalOnly bool `json:"local_only"`
}

// Node is one configured node and its adapter instances.
type Node struct {
	ID string `json:"id"`
	// Base64 of the node's 32-byte X25519 lease recipient key (SPEC C2).
	LeaseRecipientPublicKey string    `json:"lease_recipient_public_key"`
	Adapters                []Adapter `json:"adapters"`
	// Enrolled is not read from the file: Effective sets it on a node
	// that joined with a token and renews its certificate (SPEC J5).
	Enrolled bool `json:"-"`
}

// Adapter is one provider resource on a node (SPEC E1).
type Adapter struct {
	Name         string `json:"name"`
	Type         string `json:"type"`
	Profile      string `json:"profile"`
	Category     string `json:"category"`
	Capacity     int    `json:"capacity"`
	LongCapacity *int   `json:"long_capacity"`
	BaseURL      string `json:"base_url"`
	// APIKeyEnv names an environment variable on the node holding the
	// upstream key; the key never travels (SPEC C5).
	APIKeyEnv string `json:"api_key_env"`
	// CredentialSlot names the secret store slot whose secret a lease
	// carries to this adapter when the credential plane is on (SPEC C2).
	CredentialSlot string `json:"credential_slot"`
	// ResponseStallTimeoutMs: the stall timeout of the requests routed to
	// this adapter whose models[].providers entry sets none; 0 = 300000.
	// The Edge resolves it into each request (EffectiveStallTimeoutMs,
	// SPEC Q6); the node payload does not carry it.
	ResponseStallTimeoutMs int64             `json:"response_stall_timeout_ms"`
	ProfileOverrides       *ProfileOverrides `json:"profile_overrides"`
	// UpstreamIdleTimeoutMs: how long the node reuses an idle upstream
	// connection; 0 = the profile's default (EffectiveUpstreamIdleTimeoutMs).
	UpstreamIdleTimeoutMs int64 `json:"upstream_idle_timeout_ms"`
	// PrefillTokensPerS is the prefill speed (prompt tokens per second,
	// by the Edge's estimate of body bytes ÷ 4) prefix_affinity assumes
	// for this provider until it has timed the provider's streamed
	// answers; 0 = routing.DefaultTokenTime's 2,000. Edge-side only.
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	// Managed names a managed backend of the node's own config (its
	// managed[].name, SPEC U1): the node starts one process per model of
	// it on demand and this adapter's requests go to the process of their
	// target; base_url is then unused. openai_compat only.
	Managed string `json:"managed"`
	// KeepAlive is Ollama's keep_alive, sent with every request of this
	// ollama adapter (SPEC U7): a duration ("10m", "24h", "-1m" = keep
	// loaded, "0" = unload after each request) or whole seconds ("3600",
	// "-1"); "" = Ollama's own default. Ollama adapters only.
	KeepAlive string `json:"keep_alive"`
	// Location is where a request's data goes: "local" (the default, this
	// site) or "remote" (a hosted API); a local-only key is never routed
	// to a remote adapter (fallbacks.go, SPEC V3).
	Location string `json:"location"`
}

// ProfileOverrides replaces single fields of a named profile. A path set to
// "" disables that operation.
type ProfileOverrides struct {
	AuthHeader          *string `json:"auth_header"`
	AuthScheme          *string `json:"auth_scheme"`
	ModelsPath          *string `json:"models_path"`
	ChatCompletionsPath *string `json:"chat_completions_path"`
	MessagesPath        *string `json:"messages_path"`
	CountTokensPath     *string `json:"count_tokens_path"`
	ResponsesPath       *string `json:"responses_path"`
	CompletionsPath     *string `json:"completions_path"`
	EmbeddingsPath      *string `json:"embeddings_path"`
	HealthPath          *string `json:"health_path"`
	NativeTools         *bool   `json:"native_tools"`
	// PriorityField says the backend schedules by a "priority" body field
	// of its own and how it orders it (SPEC G7): "lower_first" (vLLM
	// --scheduling-policy priority) or "higher_first" (SGLang
	// --enable-priority-scheduling); the node then sets it to the
	// request's class in every chat, completion, response and embedding
	// body. "" or absent = off, the body as it came (every profile's
	// default).
	PriorityField *string `json:"priority_field"`
}

// Model is one client-visible model group and its dispatch targets (SPEC Q1).
type Model struct {
	Name string `json:"name"`
	// Requests whose estimated prompt reaches this many tokens are long
	// (SPEC Q7); 0 = never long.
	LongContextTokens int             `json:"long_context_tokens"`
	Providers         []ModelProvider `json:"providers"`
	// Routing chooses among the free providers: "least_loaded"
	// (the default), "ordered" or "prefix_affinity".
	Routing string `json:"routing"`
	// AffinityEpsilon is prefix_affinity's load-bound slack ε: a provider
	// is handed a new conversation (or one tied between holders) only
	// while its in-flight count stays within (1+ε) × its capacity share of
	// the group's load; the holder of a conversation takes its later turns
	// up to its capacity. Omitted = 0.5.
	AffinityEpsilon *float64 `json:"affinity_epsilon"`
	// AffinityWaitMs: under prefix_affinity, how long (ms) a request waits
	// for the busy provider holding its conversation while another
	// provider is free (on arrival, or once queued when another provider
	// frees first); 0 = never.
	AffinityWaitMs int64 `json:"affinity_wait_ms"`
	// AffinityBalance: under prefix_affinity, the weight of the prefill
	// queued on a provider against the prefill a turn saves there: a busy
	// holder of a conversation yields a turn to another provider when
	// balance × its queued prefill exceeds the saving. 0 = the holder takes
	// every turn while it has a free slot. Omitted = 1.
	AffinityBalance *float64 `json:"affinity_balance"`
	// MaxAttempts bounds the providers one request is sent to: the first
	// plus re-dispatches after a failure or stall before the first byte
	// (SPEC H11), never the same provider twice. 0 = every
	// provider of the group once; 1 = no re-dispatch.
	MaxAttempts int `json:"max_attempts"`
	// ContextTokens is the group's context window in tokens, against the
	// request's estimated prompt tokens for a fallback on "context"
	// (fallbacks.go, SPEC V1); 0 = not known.
	ContextTokens int `json:"context_tokens"`
	// Fallbacks are the other groups a request goes to when this group
	// cannot serve it (fallbacks.go, SPEC V1), in order.
	Fallbacks []Fallback `json:"fallbacks"`
}

// ModelProvider is one (node, provider, target) candidate.
type ModelProvider struct {
	Node     string `json:"node"`
	Provider string `json:"provider"`
	Target   string `json:"target"`
	// ResponseStallTimeoutMs: this route's stall timeout; 0 = the
	// adapter's value, else protocol.DefaultStallTimeoutMs
	// (EffectiveStallTimeoutMs, SPEC Q6).
	ResponseStallTimeoutMs int64 `json:"response_stall_timeout_ms"`
	// CredentialSlot overrides the adapter's credential_slot for this
	// route (SPEC C2); "" = the adapter's.
	CredentialSlot string `json:"credential_slot"`
}

// Queue bounds waiting (SPEC Q4). Omitted values take the defaults; an
// explicit max_waiters of 0 disables queueing.
type Queue struct {
	MaxWaiters    *int  `json:"max_waiters"`
	WaitTimeoutMs int64 `json:"wait_timeout_ms"`
	// StarvationGrants bounds how long a lower priority class waits
	// (fairshare.go, SPEC G2); 0 = DefaultStarvationGrants.
	StarvationGrants int `json:"starvation_grants"`
}

// Credentials configures the managed credential plane (SPEC C1–C6).
// Relative paths are resolved against the config file's directory.
type Credentials struct {
	Enabled bool `json:"enabled"`
	// StoreFile is the secret store (`edge secrets set`).
	StoreFile string `json:"store_file"`
	// StoreKeyFile is the store's 32-byte key (`edge secrets init`).
	StoreKeyFile string `json:"store_key_file"`
	// IssuerKeyFile is the Ed25519 lease issuer private key (`edge pki`).
	IssuerKeyFile string `json:"issuer_key_file"`
	// LeaseTTLMs is a lease's lifetime; 0 = 60000, at most 300000.
	LeaseTTLMs int64 `json:"lease_ttl_ms"`
}

// HTTP tunes the client surface.
type HTTP struct {
	// Request bodies over this many bytes get 413.
	MaxBodyBytes int64 `json:"max_body_bytes"`
	// MaxInflightBodyBytes bounds the request-body bytes held at once
	// across all connections, counted as they arrive; a request that
	// would pass it gets 503 with Retry-After.
	MaxInflightBodyBytes int64 `json:"max_inflight_body_bytes"`
	// MaxConnections bounds concurrent client connections; a connection
	// beyond it gets 503 with Retry-After and is closed.
	MaxConnections int `json:"max_connections"`
	// MaxHeaderBytes bounds one request's head, the request line and
	// header fields, in bytes; past it the request gets 431 before
	// anything else is done with it (SPEC B4). A reload may lower it;
	// raising it takes effect after a restart.
	MaxHeaderBytes int `json:"max_header_bytes"`
	// MaxHeaderFields bounds one request's header fields (each value of a
	// repeated name counts); past it 431, before authentication (SPEC B4).
	MaxHeaderFields int `json:"max_header_fields"`
	// UnknownFields is the run path's policy for a request member its
	// field tables do not know (surface.UnknownFields): "report" (the
	// default: accepted, not sent to the backend, reported) or "reject"
	// (a 400 naming its path). Unknown types of message, content block,
	// input item or tool are a 400 under both.
	UnknownFields string `json:"unknown_fields"`
}

// Admin tunes the admin surface.
type Admin struct {
	// Pprof exposes net/http/pprof under /debug/pprof/ on admin_listen.
	// On a listener that is not loopback-only it needs TokenSHA256.
	Pprof bool `json:"pprof"`
	// TokenSHA256 is the hex SHA-256 of the admin token; when set, every
	// admin request but /healthz must carry it as "Authorization: Bearer
	// <token>" or as the password of HTTP Basic authentication (any user
	// name; what a browser sends for the operator page after its prompt).
	// Empty = no token.
	TokenSHA256 string `json:"token_sha256"`
	// AllowedHosts are host names (without port) the admin surface answers
	// to besides IP literals and "localhost": a request whose Host header
	// names another host is refused (403), which stops a DNS-rebinding
	// page from reading /status or /events through a victim's browser.
	AllowedHosts []string `json:"allowed_hosts"`
}

// Shutdown tunes the graceful drain on SIGTERM.
type Shutdown struct {
	// DrainTimeoutMs: how long requests in flight may go on after SIGTERM
	// (new ones get 503 meanwhile); what is left then ends with an error
	// in its surface's shape. 0 = DefaultDrainTimeoutMs.
	DrainTimeoutMs int64 `json:"drain_timeout_ms"`
}
