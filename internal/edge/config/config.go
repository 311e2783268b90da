// Package config is the Edge's configuration: the JSON file's shape,
// defaults, validation and the projections other packages need (the
// NodeConfigPayload a node receives, resolved protocol profiles, effective
// stall timeouts). It performs no I/O beyond Load reading the file, and never
// logs.
//
// Every key is documented in README.md ("Edge config"). Unknown keys are
// errors naming their path; validate reports every problem at once.
package config

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/routing"
	"iop/internal/jsonconfig"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// Defaults (docs/config.md lists each key with its default).
const (
	DefaultHTTPListen           = "127.0.0.1:8080"
	DefaultNodeListen           = "127.0.0.1:7443"
	DefaultAdminListen          = "127.0.0.1:9090"
	DefaultTrustDomain          = "iop.local"
	DefaultHeartbeatIntervalMs  = 5000
	DefaultHeartbeatTimeoutMs   = 20000 // the Edge fences a silent ready node
	DefaultNodeHeartbeatTimeout = 15000 // the Node gives up on a silent Edge first
	DefaultMaxWaiters           = 1024  // queue.max_waiters
	DefaultWaitTimeoutMs        = 30000 // queue.wait_timeout_ms
	DefaultCapacity             = 4
	DefaultMaxBodyBytes         = 8 << 20 // http.max_body_bytes
	// DefaultMaxInflightBodyBytes bounds the request-body bytes the Edge
	// holds at once across all connections (http.max_inflight_body_bytes).
	DefaultMaxInflightBodyBytes = 256 << 20
	// DefaultMaxConnections bounds concurrent client connections
	// (http.max_connections).
	DefaultMaxConnections = 4096
	MaxBodyBytesLimit     = 15 << 20
	DefaultDrainTimeoutMs = 30000 // shutdown.drain_timeout_ms
	MaxDrainTimeoutMs     = 3600000
	DefaultLeaseTTLMs     = 60000  // credentials.lease_ttl_ms
	MinLeaseTTLMs         = 1000   // a lease must outlive one dispatch
	MaxLeaseTTLMs         = 300000 // lease.MaxTTL
	// MaxAffinityEpsilon bounds models[].affinity_epsilon: beyond it the
	// load bound no longer bounds anything.
	MaxAffinityEpsilon = 100.0
	// MaxAffinityBalance bounds models[].affinity_balance.
	MaxAffinityBalance = 100.0
	// MaxPrefillTokensPerS bounds adapters[].prefill_tokens_per_s.
	MaxPrefillTokensPerS  = 1e7
	DefaultBaseEjectionMs = 1000  // outlier_detection.base_ejection_ms
	DefaultMaxEjectionMs  = 30000 // outlier_detection.max_ejection_ms
	// MaxIdleTimeoutMs bounds upstream_idle_timeout_ms (a day).
	MaxIdleTimeoutMs = 86400000
	// MaxStallTimeoutMs is the largest stall timeout that is still a
	// time.Duration (SPEC E2).
	MaxStallTimeoutMs = math.MaxInt64 / int64(time.Millisecond)
)

// Provider categories (SPEC N3).
const (
	CategoryAPI            = "api"
	CategoryLocalInference = "local_inference"
)

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

// AdminLoopbackOnly reports whether admin_listen accepts connections only
// from the local host (a loopback IP or "localhost"); an empty host,
// 0.0.0.0, ::, another address or another name is not.
func (c *Config) AdminLoopbackOnly() bool {
	host, _, err := net.SplitHostPort(c.AdminListen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Warnings are what the config allows but an operator should hear about;
// `edge -check` prints them and the edge logs them at start.
func (c *Config) Warnings() []string {
	var w []string
	if !c.AdminLoopbackOnly() && c.Admin.TokenSHA256 == "" {
		w = append(w, fmt.Sprintf("admin_listen %s is not loopback-only and admin.token_sha256 is not set: "+
			"anyone who can reach it reads /status, /metrics and /events (node and provider state, model names, recent errors with request ids)", c.AdminListen))
	}
	return w
}

// Shutdown tunes the graceful drain on SIGTERM.
type Shutdown struct {
	// DrainTimeoutMs: how long requests in flight may go on after SIGTERM
	// (new ones get 503 meanwhile); what is left then ends with an error
	// in its surface's shape. 0 = DefaultDrainTimeoutMs.
	DrainTimeoutMs int64 `json:"drain_timeout_ms"`
}

// Load reads, decodes strictly, applies defaults and validates the file at
// path. Relative TLS paths are resolved against the file's directory. The
// error lists every problem, one per line, each naming its key path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("edge config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("edge config %s:\n%w", path, err)
	}
	c.resolvePaths(dirOf(path))
	return c, nil
}

// Parse decodes data strictly, applies defaults and validates.
func Parse(data []byte) (*Config, error) {
	var c Config
	decodeErrs, usable := jsonconfig.Decode(data, &c)
	if !usable {
		return nil, decodeErrs
	}
	c.applyDefaults()
	if errs := append(decodeErrs, c.validate()...); len(errs) > 0 {
		return nil, errs
	}
	return &c, nil
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:i+1]
	}
	return ""
}

func (c *Config) resolvePaths(dir string) {
	for _, p := range []*string{&c.TLS.CertFile, &c.TLS.KeyFile, &c.TLS.CAFile,
		&c.Credentials.StoreFile, &c.Credentials.StoreKeyFile, &c.Credentials.IssuerKeyFile,
		&c.Keys.StoreFile, &c.Keys.UsageFile,
		&c.Enrollment.CAKeyFile, &c.Enrollment.StoreFile} {
		if *p != "" && !strings.HasPrefix(*p, "/") {
			*p = dir + *p
		}
	}
}

func (c *Config) applyDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.HTTPListen, DefaultHTTPListen)
	def(&c.NodeListen, DefaultNodeListen)
	def(&c.AdminListen, DefaultAdminListen)
	def(&c.TLS.TrustDomain, DefaultTrustDomain)
	if c.Heartbeat.IntervalMs == 0 {
		c.Heartbeat.IntervalMs = DefaultHeartbeatIntervalMs
	}
	if c.Heartbeat.TimeoutMs == 0 {
		c.Heartbeat.TimeoutMs = DefaultHeartbeatTimeoutMs
	}
	if c.Heartbeat.NodeTimeoutMs == 0 {
		c.Heartbeat.NodeTimeoutMs = DefaultNodeHeartbeatTimeout
	}
	if c.Queue.MaxWaiters == nil {
		n := DefaultMaxWaiters
		c.Queue.MaxWaiters = &n
	}
	if c.Queue.WaitTimeoutMs == 0 {
		c.Queue.WaitTimeoutMs = DefaultWaitTimeoutMs
	}
	if c.HTTP.MaxBodyBytes == 0 {
		c.HTTP.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.HTTP.MaxInflightBodyBytes == 0 {
		c.HTTP.MaxInflightBodyBytes = DefaultMaxInflightBodyBytes
	}
	if c.HTTP.UnknownFields == "" {
		c.HTTP.UnknownFields = "report"
	}
	if c.HTTP.MaxConnections == 0 {
		c.HTTP.MaxConnections = DefaultMaxConnections
	}
	if c.Shutdown.DrainTimeoutMs == 0 {
		c.Shutdown.DrainTimeoutMs = DefaultDrainTimeoutMs
	}
	if c.Credentials.LeaseTTLMs == 0 {
		c.Credentials.LeaseTTLMs = DefaultLeaseTTLMs
	}
	for i := range c.Models {
		m := &c.Models[i]
		def(&m.Routing, routing.NameLeastLoaded)
		if m.AffinityEpsilon == nil {
			e := routing.DefaultEpsilon
			m.AffinityEpsilon = &e
		}
		if m.AffinityBalance == nil {
			b := routing.DefaultBalance
			m.AffinityBalance = &b
		}
	}
	c.keysDefaults()
	c.tracingDefaults()
	od := &c.OutlierDetection
	if od.Enabled == nil {
		on := true
		od.Enabled = &on
	}
	if od.BaseEjectionMs == 0 {
		od.BaseEjectionMs = DefaultBaseEjectionMs
	}
	if od.MaxEjectionMs == 0 {
		od.MaxEjectionMs = max(DefaultMaxEjectionMs, od.BaseEjectionMs)
	}
	if od.Statuses == nil {
		od.Statuses = append([]int(nil), DefaultEjectStatuses...)
	}
	for i := range c.Nodes {
		for j := range c.Nodes[i].Adapters {
			applyAdapterDefaults(&c.Nodes[i].Adapters[j])
		}
	}
	c.applyEnrollmentDefaults()
}

// applyAdapterDefaults fills an adapter's omitted keys (nodes[] and
// node_templates[] alike).
func applyAdapterDefaults(a *Adapter) {
	if a.Name == "" {
		a.Name = a.Type
	}
	if a.Type == protocol.TypeOpenAICompat && a.Profile == "" {
		a.Profile = protocol.ProfileOpenAI
	}
	if a.Category == "" {
		a.Category = CategoryLocalInference
		if a.Type == protocol.TypeOpenAICompat && a.Profile == protocol.ProfileOpenAI {
			a.Category = CategoryAPI
		}
	}
	if a.Capacity == 0 {
		a.Capacity = DefaultCapacity
	}
	if a.LongCapacity == nil {
		n := a.Capacity
		a.LongCapacity = &n
	}
	if a.BaseURL == "" && a.Type == protocol.TypeOpenAICompat {
		if d, ok := protocol.NamedProfile(a.Profile); ok {
			a.BaseURL = d.DefaultBaseURL
		}
	}
}

// Read-only patterns.
var (
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	tdRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,252}$`)
	hex64RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	hostRE  = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$`)
)

// validate reports every problem, each prefixed by its key path.
func (c *Config) validate() jsonconfig.Errors {
	var errs jsonconfig.Errors
	add := func(path, format string, args ...any) {
		errs = append(errs, path+": "+fmt.Sprintf(format, args...))
	}
	type bound struct{ path, host, port string }
	var listens []bound
	for _, l := range []struct{ path, v string }{{"http_listen", c.HTTPListen}, {"node_listen", c.NodeListen}, {"admin_listen", c.AdminListen}} {
		host, port, err := net.SplitHostPort(l.v)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
			add(l.path, "want host:port with a port from 0 to 65535, got %q", l.v)
			continue
		}
		for _, o := range listens {
			if port != "0" && port == o.port && hostsOverlap(host, o.host) {
				add(l.path, "%s clashes with %s (%s)", l.v, o.path, net.JoinHostPort(o.host, o.port))
			}
		}
		listens = append(listens, bound{l.path, host, port})
	}
	for _, f := range []struct{ path, v string }{{"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}, {"tls.ca_file", c.TLS.CAFile}} {
		if f.v == "" {
			add(f.path, "required (mutual TLS with nodes is mandatory; `edge pki init` makes the files)")
		}
	}
	if !tdRE.MatchString(c.TLS.TrustDomain) {
		add("tls.trust_domain", "invalid trust domain %q (lowercase letters, digits, '.', '-')", c.TLS.TrustDomain)
	}
	if t := c.Admin.TokenSHA256; t != "" && !hex64RE.MatchString(t) {
		add("admin.token_sha256", "want 64 lowercase hex characters (SHA-256 of the token)")
	}
	if c.Admin.Pprof && c.Admin.TokenSHA256 == "" && !c.AdminLoopbackOnly() {
		add("admin.pprof", "pprof on admin_listen %s, which is not loopback-only, needs admin.token_sha256 (profiles and goroutine dumps expose the process)", c.AdminListen)
	}
	for i, h := range c.Admin.AllowedHosts {
		if !hostRE.MatchString(h) {
			add(fmt.Sprintf("admin.allowed_hosts[%d]", i), "want a host name without port (letters, digits, '.', '-'), got %q", h)
		}
	}
	hb := c.Heartbeat
	if hb.IntervalMs < 0 {
		add("heartbeat.interval_ms", "must be positive, got %d", hb.IntervalMs)
	}
	if hb.TimeoutMs <= hb.IntervalMs {
		add("heartbeat.timeout_ms", "must exceed heartbeat.interval_ms (%d), got %d", hb.IntervalMs, hb.TimeoutMs)
	}
	if hb.NodeTimeoutMs <= hb.IntervalMs || hb.NodeTimeoutMs >= hb.TimeoutMs {
		add("heartbeat.node_timeout_ms", "must be between heartbeat.interval_ms (%d) and heartbeat.timeout_ms (%d) exclusive, so the node notices a dead link first; got %d", hb.IntervalMs, hb.TimeoutMs, hb.NodeTimeoutMs)
	}
	principals, hashes := map[string]bool{}, map[string]bool{}
	for i, k := range c.APIKeys {
		p := fmt.Sprintf("api_keys[%d]", i)
		if k.Principal == "" {
			add(p+".principal", "required")
		} else if principals[k.Principal] {
			add(p+".principal", "duplicate principal %q", k.Principal)
		}
		principals[k.Principal] = true
		if !hex64RE.MatchString(k.KeySHA256) {
			add(p+".key_sha256", "want 64 lowercase hex characters (SHA-256 of the key)")
		} else if hashes[k.KeySHA256] {
			add(p+".key_sha256", "the same key is configured twice")
		}
		hashes[k.KeySHA256] = true
		if k.MaxConcurrent < 0 {
			add(p+".max_concurrent", "must be ≥ 0 (0 = no bound), got %d", k.MaxConcurrent)
		}
		if k.RequestsPerMinute < 0 {
			add(p+".requests_per_minute", "must be ≥ 0 (0 = no bound), got %d", k.RequestsPerMinute)
		}
	}
	if len(c.Nodes) == 0 && len(c.NodeTemplates) == 0 {
		add("nodes", "at least one node or node template is required")
	}
	adapters := map[string]map[string]*Adapter{}
	for i := range c.Nodes {
		n := &c.Nodes[i]
		p := fmt.Sprintf("nodes[%d]", i)
		if !nameRE.MatchString(n.ID) {
			add(p+".id", "invalid node id %q (1-63 of letters, digits, '.', '_', '-')", n.ID)
		}
		if _, dup := adapters[n.ID]; dup {
			add(p+".id", "duplicate node id %q", n.ID)
		}
		byName := map[string]*Adapter{}
		adapters[n.ID] = byName
		if n.LeaseRecipientPublicKey != "" {
			if b, err := base64.StdEncoding.DecodeString(n.LeaseRecipientPublicKey); err != nil || len(b) != 32 {
				add(p+".lease_recipient_public_key", "want base64 of a 32-byte X25519 public key")
			}
		} else if c.Credentials.Enabled {
			add(p+".lease_recipient_public_key", "required when credentials.enabled is true")
		}
		if len(n.Adapters) == 0 {
			add(p+".adapters", "at least one adapter is required")
		}
		for j := range n.Adapters {
			a := &n.Adapters[j]
			ap := fmt.Sprintf("%s.adapters[%d]", p, j)
			c.validateAdapter(ap, a, add)
			if _, dup := byName[a.Name]; dup {
				add(ap+".name", "duplicate adapter name %q on node %q", a.Name, n.ID)
			}
			byName[a.Name] = a
		}
	}
	if len(c.Models) == 0 && len(c.ModelDiscovery) == 0 {
		add("models", "at least one model (or a model_discovery rule) is required")
	}
	models := map[string]bool{}
	for i, m := range c.Models {
		p := fmt.Sprintf("models[%d]", i)
		if !validModelName(m.Name) {
			add(p+".name", "required, without surrounding spaces")
		} else if models[m.Name] {
			add(p+".name", "duplicate model %q", m.Name)
		}
		models[m.Name] = true
		if m.LongContextTokens < 0 {
			add(p+".long_context_tokens", "must be ≥ 0, got %d", m.LongContextTokens)
		}
		if m.MaxAttempts < 0 || (m.MaxAttempts > len(m.Providers) && !m.hasPatterns()) {
			add(p+".max_attempts", "must be between 0 (every provider once) and the number of providers (%d), got %d", len(m.Providers), m.MaxAttempts)
		}
		if len(m.Providers) == 0 {
			add(p+".providers", "at least one provider is required")
		}
		if _, err := routing.ParseMode(m.Routing); err != nil {
			add(p+".routing", "want %q, %q or %q, got %q", routing.NameLeastLoaded, routing.NameOrdered, routing.NamePrefixAffinity, m.Routing)
		}
		if e := *m.AffinityEpsilon; !(e >= 0 && e <= MaxAffinityEpsilon) {
			add(p+".affinity_epsilon", "must be between 0 and %g, got %g", float64(MaxAffinityEpsilon), e)
		}
		if b := *m.AffinityBalance; !(b >= 0 && b <= MaxAffinityBalance) {
			add(p+".affinity_balance", "must be between 0 (the holder takes every turn) and %g, got %g", float64(MaxAffinityBalance), b)
		}
		// Against a queue.wait_timeout_ms that is itself refused, only the
		// sign is checked: that one error is enough.
		if m.AffinityWaitMs < 0 || (c.Queue.WaitTimeoutMs > 0 && m.AffinityWaitMs > c.Queue.WaitTimeoutMs) {
			add(p+".affinity_wait_ms", "must be between 0 and queue.wait_timeout_ms (%d), got %d", c.Queue.WaitTimeoutMs, m.AffinityWaitMs)
		}
		seen := map[[2]string]bool{}
		for j, mp := range m.Providers {
			pp := fmt.Sprintf("%s.providers[%d]", p, j)
			a := c.checkProviderNode(pp, mp.Node, mp.Provider, add)
			c.validateRouteSlot(pp, mp, a, add)
			if seen[[2]string{mp.Node, mp.Provider}] {
				add(pp, "provider %s/%s listed twice in model %q", mp.Node, mp.Provider, m.Name)
			}
			seen[[2]string{mp.Node, mp.Provider}] = true
			if mp.Target == "" {
				add(pp+".target", "required (the backend's own model name, or a glob over the names discovery reports)")
			} else if err := checkGlob(mp.Target); IsPattern(mp.Target) && err != nil {
				add(pp+".target", "invalid glob %q: %v", mp.Target, err)
			}
			if mp.ResponseStallTimeoutMs < 0 || mp.ResponseStallTimeoutMs > MaxStallTimeoutMs {
				add(pp+".response_stall_timeout_ms", "must be between 0 and %d, got %d", MaxStallTimeoutMs, mp.ResponseStallTimeoutMs)
			}
		}
	}
	if *c.Queue.MaxWaiters < 0 {
		add("queue.max_waiters", "must be ≥ 0, got %d", *c.Queue.MaxWaiters)
	}
	if c.Queue.WaitTimeoutMs < 0 {
		add("queue.wait_timeout_ms", "must be positive, got %d", c.Queue.WaitTimeoutMs)
	}
	if c.Shutdown.DrainTimeoutMs < 0 || c.Shutdown.DrainTimeoutMs > MaxDrainTimeoutMs {
		add("shutdown.drain_timeout_ms", "must be between 1 and %d, got %d", MaxDrainTimeoutMs, c.Shutdown.DrainTimeoutMs)
	}
	c.validateCredentials(add)
	c.validateKeys(add)
	c.validateEnrollment(add)
	c.validateTracing(add)
	od := c.OutlierDetection
	if od.BaseEjectionMs < 0 || od.BaseEjectionMs > MaxIdleTimeoutMs {
		add("outlier_detection.base_ejection_ms", "must be between 1 and %d, got %d", int64(MaxIdleTimeoutMs), od.BaseEjectionMs)
	}
	if od.MaxEjectionMs < od.BaseEjectionMs || od.MaxEjectionMs > MaxIdleTimeoutMs {
		add("outlier_detection.max_ejection_ms", "must be between base_ejection_ms (%d) and %d, got %d", od.BaseEjectionMs, int64(MaxIdleTimeoutMs), od.MaxEjectionMs)
	}
	for i, st := range od.Statuses {
		if st < 500 || st > 599 {
			add(fmt.Sprintf("outlier_detection.statuses[%d]", i), "want a 5xx status (429 always counts), got %d", st)
		}
	}
	if c.HTTP.MaxBodyBytes < 0 || c.HTTP.MaxBodyBytes > MaxBodyBytesLimit {
		add("http.max_body_bytes", "must be between 1 and %d (a tunnel frame carries the whole body), got %d", MaxBodyBytesLimit, c.HTTP.MaxBodyBytes)
	}
	if c.HTTP.MaxInflightBodyBytes < c.HTTP.MaxBodyBytes {
		add("http.max_inflight_body_bytes", "must be at least http.max_body_bytes (%d), got %d", c.HTTP.MaxBodyBytes, c.HTTP.MaxInflightBodyBytes)
	}
	if c.HTTP.UnknownFields != "report" && c.HTTP.UnknownFields != "reject" {
		add("http.unknown_fields", "must be \"report\" or \"reject\", got %q", c.HTTP.UnknownFields)
	}
	if c.HTTP.MaxConnections < 0 {
		add("http.max_connections", "must be ≥ 1, got %d", c.HTTP.MaxConnections)
	}
	return errs
}

func (c *Config) validateAdapter(ap string, a *Adapter, add func(string, string, ...any)) {
	if !nameRE.MatchString(a.Name) {
		add(ap+".name", "invalid adapter name %q", a.Name)
	}
	switch a.Type {
	case protocol.TypeOllama:
		if a.Profile != "" {
			add(ap+".profile", "only openai_compat adapters have a profile")
		}
		if a.ProfileOverrides != nil {
			add(ap+".profile_overrides", "only openai_compat adapters have a profile")
		}
	case protocol.TypeOpenAICompat:
		if _, ok := protocol.NamedProfile(a.Profile); !ok {
			add(ap+".profile", "unknown profile %q (want openai, vllm, llamacpp or ollama)", a.Profile)
		}
		if o := a.ProfileOverrides; o != nil {
			for _, f := range []struct {
				name string
				v    *string
			}{{"models_path", o.ModelsPath}, {"chat_completions_path", o.ChatCompletionsPath}, {"messages_path", o.MessagesPath},
				{"count_tokens_path", o.CountTokensPath}, {"responses_path", o.ResponsesPath}, {"health_path", o.HealthPath},
				{"completions_path", o.CompletionsPath}, {"embeddings_path", o.EmbeddingsPath}} {
				if f.v != nil && *f.v != "" && !validPath(*f.v) {
					add(ap+".profile_overrides."+f.name, "want a path starting with '/', without a host, query or '..', got %q", *f.v)
				}
			}
			if o.AuthHeader != nil && *o.AuthHeader != "" && !tokenRE.MatchString(*o.AuthHeader) {
				add(ap+".profile_overrides.auth_header", "invalid header name %q", *o.AuthHeader)
			}
		}
	case "":
		add(ap+".type", "required (ollama or openai_compat)")
	default:
		add(ap+".type", "unknown adapter type %q (want ollama or openai_compat)", a.Type)
	}
	switch a.Category {
	case CategoryAPI, CategoryLocalInference:
	default:
		add(ap+".category", "want api or local_inference, got %q", a.Category)
	}
	if a.Capacity < 1 {
		add(ap+".capacity", "must be ≥ 1, got %d", a.Capacity)
	}
	if lc := *a.LongCapacity; lc < 0 || lc > a.Capacity {
		add(ap+".long_capacity", "must be between 0 and capacity (%d), got %d", a.Capacity, lc)
	}
	if u, err := url.Parse(a.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		add(ap+".base_url", "want an http(s) URL with a host and no query, got %q", a.BaseURL)
	}
	if a.APIKeyEnv != "" && !envRE.MatchString(a.APIKeyEnv) {
		add(ap+".api_key_env", "invalid environment variable name %q", a.APIKeyEnv)
	}
	if a.ResponseStallTimeoutMs < 0 || a.ResponseStallTimeoutMs > MaxStallTimeoutMs {
		add(ap+".response_stall_timeout_ms", "must be between 0 and %d, got %d", MaxStallTimeoutMs, a.ResponseStallTimeoutMs)
	}
	if a.CredentialSlot != "" {
		if !nameRE.MatchString(a.CredentialSlot) {
			add(ap+".credential_slot", "invalid slot name %q (1-63 of letters, digits, '.', '_', '-')", a.CredentialSlot)
		}
		if a.APIKeyEnv != "" {
			add(ap+".credential_slot", "set either credential_slot (the edge's secret store) or api_key_env (the node's environment), not both")
		}
	}
	if v := a.PrefillTokensPerS; !(v >= 0 && v <= MaxPrefillTokensPerS) {
		add(ap+".prefill_tokens_per_s", "must be between 0 (the default) and %g, got %g", float64(MaxPrefillTokensPerS), v)
	}
	if a.UpstreamIdleTimeoutMs < 0 || a.UpstreamIdleTimeoutMs > MaxIdleTimeoutMs {
		add(ap+".upstream_idle_timeout_ms", "must be between 0 (the profile's default) and %d, got %d", int64(MaxIdleTimeoutMs), a.UpstreamIdleTimeoutMs)
	}
}

var (
	tokenRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	envRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// hostsOverlap reports whether two listen hosts would bind the same port
// twice: equal hosts (localhost = 127.0.0.1), or either one a wildcard.
func hostsOverlap(a, b string) bool {
	norm := func(h string) string {
		switch h {
		case "", "0.0.0.0", "::", "[::]":
			return "*"
		case "localhost":
			return "127.0.0.1"
		}
		return h
	}
	a, b = norm(a), norm(b)
	return a == "*" || b == "*" || a == b
}

func validPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "?#\\") || strings.Contains(p, "://") {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." || seg == "." {
			return false
		}
	}
	return true
}

// NodeIndex returns the configured node with that id, or nil.
func (c *Config) NodeByID(id string) *Node {
	for i := range c.Nodes {
		if c.Nodes[i].ID == id {
			return &c.Nodes[i]
		}
	}
	return nil
}

// Adapter returns the named adapter of node, or nil.
func (n *Node) Adapter(name string) *Adapter {
	for i := range n.Adapters {
		if n.Adapters[i].Name == name {
			return &n.Adapters[i]
		}
	}
	return nil
}

// ModelByName returns the model group with that name, or nil.
func (c *Config) ModelByName(name string) *Model {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return &c.Models[i]
		}
	}
	return nil
}

// hasPatterns reports whether a provider entry names a node glob or a
// target glob (expanded by Effective).
func (m *Model) hasPatterns() bool {
	for _, mp := range m.Providers {
		if IsPattern(mp.Node) || IsPattern(mp.Target) {
			return true
		}
	}
	return false
}

// AttemptBound is how many providers one request of model m may be sent
// to: m.MaxAttempts, or (0) every provider of the group once.
func (m *Model) AttemptBound() int {
	if m.MaxAttempts > 0 {
		return m.MaxAttempts
	}
	return len(m.Providers)
}

// EffectiveStallTimeoutMs is the stall timeout, in ms, a request
// dispatched to mp carries (SPEC Q6): the provider entry's value, else its
// adapter's, else protocol.DefaultStallTimeoutMs; always > 0. It is the one
// place the stall timeout is resolved: the pool copies it into each lease,
// the api into each RunRequest and ProviderTunnelRequest and its response
// wait, and the node takes the request's value as it is (SPEC E2).
func (c *Config) EffectiveStallTimeoutMs(mp ModelProvider) int64 {
	if mp.ResponseStallTimeoutMs > 0 {
		return mp.ResponseStallTimeoutMs
	}
	if n := c.NodeByID(mp.Node); n != nil {
		if a := n.Adapter(mp.Provider); a != nil && a.ResponseStallTimeoutMs > 0 {
			return a.ResponseStallTimeoutMs
		}
	}
	return protocol.DefaultStallTimeoutMs
}

// NodePayload builds the NodeConfigPayload a node receives at registration
// and on refresh (SPEC L3, N2, N5): its adapters with resolved profiles and
// the runtime settings. It carries no secret, store path or work directory.
// Revision is the hex SHA-256 of the payload's deterministic encoding.
// It returns nil for an unknown node id.
func (c *Config) NodePayload(nodeID string) *iop.NodeConfigPayload {
	n := c.NodeByID(nodeID)
	if n == nil {
		return nil
	}
	return c.nodePayload(n)
}

func (c *Config) nodePayload(n *Node) *iop.NodeConfigPayload {
	nodeID := n.ID
	p := &iop.NodeConfigPayload{
		Runtime: &iop.NodeRuntimeConfig{
			HeartbeatIntervalMs: c.Heartbeat.IntervalMs,
			HeartbeatTimeoutMs:  c.Heartbeat.NodeTimeoutMs,
			CredentialsEnabled:  c.Credentials.Enabled,
			CertificateRenewal:  n.Enrolled,
		},
	}
	c.addCredentials(p.Runtime, nodeID)
	for i := range n.Adapters {
		a := &n.Adapters[i]
		ac := &iop.AdapterConfig{
			Name:                  a.Name,
			Type:                  a.Type,
			Category:              a.Category,
			Capacity:              int32(a.Capacity),
			LongCapacity:          int32(*a.LongCapacity),
			BaseUrl:               a.BaseURL,
			ApiKeyEnv:             a.APIKeyEnv,
			UpstreamIdleTimeoutMs: EffectiveUpstreamIdleTimeoutMs(a),
		}
		if c.Discovers(nodeID, a.Name) {
			ac.DiscoveryIntervalMs = c.Discovery.PollIntervalMs
		}
		if a.Type == protocol.TypeOpenAICompat {
			ac.OpenaiCompat = &iop.OpenAICompatAdapterConfig{ProtocolProfile: ResolveProfile(a)}
		}
		p.Adapters = append(p.Adapters, ac)
		p.Runtime.Concurrency += int32(a.Capacity)
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	sum := sha256.Sum256(b)
	p.Revision = hex.EncodeToString(sum[:])
	return p
}

// addCredentials puts node's part of the credential projection into the
// payload's runtime (SPEC C6): nothing while the plane is off.
func (c *Config) addCredentials(rt *iop.NodeRuntimeConfig, node string) {
	if !c.Credentials.Enabled {
		return
	}
	nc := c.CredentialProjection.Nodes[node]
	rt.CredentialProjectionGeneration = nc.Generation
	rt.CredentialRecipientKeyId, rt.CredentialIssuerKeyId = nc.RecipientKeyID, nc.IssuerKeyID
	if len(nc.SlotRevisions) > 0 {
		rt.CredentialSlotRevisions = make(map[string]uint64, len(nc.SlotRevisions))
		for k, v := range nc.SlotRevisions {
			rt.CredentialSlotRevisions[k] = v
		}
	}
}

// AdapterRevision names what adapter a is as a node runs it (SPEC N2): the
// hex SHA-256 of the AdapterConfig's deterministic encoding without the
// numbers it is tuned by — capacity and long_capacity (the Edge's pool
// takes them from the payload the node runs), upstream_idle_timeout_ms
// and discovery_interval_ms (no request's outcome depends on them). Two
// payloads that give an adapter the same revision send its requests to the
// same backend the same way (type, category, base_url, api_key_env,
// protocol profile); the Edge's pool serves a node's generation only the
// adapters whose revision in the payload that generation runs is the one
// in the current config (pool.NodeRuns).
func AdapterRevision(a *iop.AdapterConfig) string {
	c := proto.CloneOf(a)
	c.Capacity, c.LongCapacity, c.UpstreamIdleTimeoutMs, c.DiscoveryIntervalMs = 0, 0, 0, 0
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
