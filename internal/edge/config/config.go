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
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"iop/internal/edge/routing"
	"iop/internal/jsonconfig"
	"iop/internal/protocol"
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
	// DefaultMaxHeaderBytes and DefaultMaxHeaderFields bound one request's
	// head (http.max_header_bytes: the request line and header fields, in
	// bytes; http.max_header_fields: header fields), with their ranges
	// (SPEC B4).
	DefaultMaxHeaderBytes  = 64 << 10
	MinMaxHeaderBytes      = 4 << 10
	MaxMaxHeaderBytes      = 1 << 20
	DefaultMaxHeaderFields = 256
	MinMaxHeaderFields     = 16
	MaxMaxHeaderFields     = 10000
	MaxBodyBytesLimit      = 15 << 20
	DefaultDrainTimeoutMs  = 30000 // shutdown.drain_timeout_ms
	MaxDrainTimeoutMs      = 3600000
	DefaultLeaseTTLMs      = 60000  // credentials.lease_ttl_ms
	MinLeaseTTLMs          = 1000   // a lease must outlive one dispatch
	MaxLeaseTTLMs          = 300000 // lease.MaxTTL
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
		&c.Enrollment.CAKeyFile, &c.Enrollment.StoreFile, &c.Batches.Dir} {
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
	if c.HTTP.MaxHeaderBytes == 0 {
		c.HTTP.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.HTTP.MaxHeaderFields == 0 {
		c.HTTP.MaxHeaderFields = DefaultMaxHeaderFields
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
	c.fairDefaults()
	c.tracingDefaults()
	c.batchesDefaults()
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

// ManagedBaseURL is the base_url of a managed adapter that sets none
// (SPEC U1): the node sends its requests to the processes it starts on
// ports of its own, so only the URL's path would count, and this one has
// none.
const ManagedBaseURL = "http://127.0.0.1"

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
	if a.BaseURL == "" && a.Managed != "" {
		a.BaseURL = ManagedBaseURL
	}
	if a.BaseURL == "" && a.Type == protocol.TypeOpenAICompat {
		if d, ok := protocol.NamedProfile(a.Profile); ok {
			a.BaseURL = d.DefaultBaseURL
		}
	}
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

// AttemptBound is how many providers one request naming group m may be
// sent to, across the groups its fallbacks move it to (SPEC V1, H11):
// m.MaxAttempts, or (0) every provider once of m and of each group its
// fallbacks reach (each group once, at most MaxFallbackDepth hops), so a
// request whose attempts in m all failed may still fall back.
func (c *Config) AttemptBound(m *Model) int {
	if m.MaxAttempts > 0 {
		return m.MaxAttempts
	}
	n := 0
	seen := map[string]bool{}
	var walk func(g *Model, depth int)
	walk = func(g *Model, depth int) {
		if g == nil || seen[g.Name] {
			return
		}
		seen[g.Name] = true
		n += len(g.Providers)
		if depth == MaxFallbackDepth {
			return
		}
		for _, f := range g.Fallbacks {
			walk(c.ModelByName(f.Model), depth+1)
		}
	}
	walk(m, 0)
	return n
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
