package config

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"iop/internal/edge/routing"
	"iop/internal/jsonconfig"
	"iop/internal/protocol"
)

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
	c.validateListens(add)
	c.validateTLS(add)
	c.validateAdmin(add)
	c.validateHeartbeat(add)
	c.validateAPIKeys(add)
	c.validateNodes(add)
	c.validateModels(add)
	c.validateQueue(add)
	c.validateCredentials(add)
	c.validateKeys(add)
	c.validateFair(add)
	c.validateFallbacks(add)
	c.validateEnrollment(add)
	c.validateTracing(add)
	c.validateBatches(add)
	c.validateOutlierDetection(add)
	c.validateHTTP(add)
	return errs
}

// validateListens checks the three listen addresses and that no two bind
// the same port.
func (c *Config) validateListens(add func(string, string, ...any)) {
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
}

// validateTLS checks the files of mutual TLS with nodes and the trust domain.
func (c *Config) validateTLS(add func(string, string, ...any)) {
	for _, f := range []struct{ path, v string }{{"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}, {"tls.ca_file", c.TLS.CAFile}} {
		if f.v == "" {
			add(f.path, "required (mutual TLS with nodes is mandatory; `edge pki init` makes the files)")
		}
	}
	if !tdRE.MatchString(c.TLS.TrustDomain) {
		add("tls.trust_domain", "invalid trust domain %q (lowercase letters, digits, '.', '-')", c.TLS.TrustDomain)
	}
}

// validateAdmin checks the admin surface's token, pprof and allowed hosts.
func (c *Config) validateAdmin(add func(string, string, ...any)) {
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
}

// validateHeartbeat checks that the node notices a dead link before the
// edge fences it.
func (c *Config) validateHeartbeat(add func(string, string, ...any)) {
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
}

// validateAPIKeys checks api_keys[]: unique principals and keys, bounds ≥ 0.
func (c *Config) validateAPIKeys(add func(string, string, ...any)) {
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
}

// validateNodes checks nodes[] and each node's adapters.
func (c *Config) validateNodes(add func(string, string, ...any)) {
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
}

// validateModels checks models[] and each group's providers.
func (c *Config) validateModels(add func(string, string, ...any)) {
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
}

// validateQueue checks the wait queue's bounds and the shutdown drain.
func (c *Config) validateQueue(add func(string, string, ...any)) {
	if *c.Queue.MaxWaiters < 0 {
		add("queue.max_waiters", "must be ≥ 0, got %d", *c.Queue.MaxWaiters)
	}
	if c.Queue.WaitTimeoutMs < 0 {
		add("queue.wait_timeout_ms", "must be positive, got %d", c.Queue.WaitTimeoutMs)
	}
	if c.Shutdown.DrainTimeoutMs < 0 || c.Shutdown.DrainTimeoutMs > MaxDrainTimeoutMs {
		add("shutdown.drain_timeout_ms", "must be between 1 and %d, got %d", MaxDrainTimeoutMs, c.Shutdown.DrainTimeoutMs)
	}
}

// validateOutlierDetection checks passive health's ejection times and
// statuses.
func (c *Config) validateOutlierDetection(add func(string, string, ...any)) {
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
}

// validateHTTP checks the client surface's body, connection, header and
// unknown-field bounds.
func (c *Config) validateHTTP(add func(string, string, ...any)) {
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
	if c.HTTP.MaxHeaderBytes < MinMaxHeaderBytes || c.HTTP.MaxHeaderBytes > MaxMaxHeaderBytes {
		add("http.max_header_bytes", "must be between %d and %d, got %d", MinMaxHeaderBytes, MaxMaxHeaderBytes, c.HTTP.MaxHeaderBytes)
	}
	if c.HTTP.MaxHeaderFields < MinMaxHeaderFields || c.HTTP.MaxHeaderFields > MaxMaxHeaderFields {
		add("http.max_header_fields", "must be between %d and %d, got %d", MinMaxHeaderFields, MaxMaxHeaderFields, c.HTTP.MaxHeaderFields)
	}
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
			if o.PriorityField != nil && *o.PriorityField != "" {
				if _, ok := protocol.PriorityFieldOf(*o.PriorityField); !ok {
					add(ap+".profile_overrides.priority_field", "want %q (vLLM --scheduling-policy priority: lower is served first), %q (SGLang --enable-priority-scheduling) or \"\" (off), got %q",
						protocol.PriorityLowerFirst, protocol.PriorityHigherFirst, *o.PriorityField)
				}
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
	if a.Managed != "" {
		if !nameRE.MatchString(a.Managed) {
			add(ap+".managed", "invalid managed backend name %q (1-63 of letters, digits, '.', '_', '-')", a.Managed)
		}
		if a.Type != protocol.TypeOpenAICompat {
			add(ap+".managed", "a managed backend serves an openai_compat adapter, not %q", a.Type)
		}
	}
	if a.KeepAlive != "" {
		if _, err := protocol.KeepAliveSeconds(a.KeepAlive); err != nil {
			add(ap+".keep_alive", "%v", err)
		} else if a.Type != protocol.TypeOllama {
			add(ap+".keep_alive", "keep_alive is Ollama's: only an %s adapter takes it, not %q", protocol.TypeOllama, a.Type)
		}
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
