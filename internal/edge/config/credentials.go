package config

import "iop/internal/protocol"

// validateCredentials checks the credentials block (SPEC C1, C2): with the
// plane on, the store, its key and the issuer key are required and the
// lease TTL is bounded.
func (c *Config) validateCredentials(add func(string, string, ...any)) {
	cr := c.Credentials
	if cr.LeaseTTLMs < MinLeaseTTLMs || cr.LeaseTTLMs > MaxLeaseTTLMs {
		add("credentials.lease_ttl_ms", "must be between %d and %d, got %d", MinLeaseTTLMs, MaxLeaseTTLMs, cr.LeaseTTLMs)
	}
	if !cr.Enabled {
		return
	}
	for _, f := range []struct{ path, v, how string }{
		{"credentials.store_file", cr.StoreFile, "`edge secrets set` writes it"},
		{"credentials.store_key_file", cr.StoreKeyFile, "`edge secrets init` writes it"},
		{"credentials.issuer_key_file", cr.IssuerKeyFile, "`edge pki init` writes issuer.key"},
	} {
		if f.v == "" {
			add(f.path, "required when credentials.enabled is true (%s)", f.how)
		}
	}
}

// validateRouteSlot checks a route's credential slot: a valid name, and
// with the plane on one must resolve (the route's or its adapter's) to an
// adapter that has an auth header to carry it. a is nil when the route
// names no configured adapter (reported elsewhere).
func (c *Config) validateRouteSlot(pp string, mp ModelProvider, a *Adapter, add func(string, string, ...any)) {
	if mp.CredentialSlot != "" && !nameRE.MatchString(mp.CredentialSlot) {
		add(pp+".credential_slot", "invalid slot name %q (1-63 of letters, digits, '.', '_', '-')", mp.CredentialSlot)
	}
	if !c.Credentials.Enabled || a == nil {
		return
	}
	if RouteSlot(mp, a) == "" {
		add(pp+".credential_slot", "required when credentials.enabled is true (here or as nodes[].adapters[].credential_slot of %s/%s): every request carries a lease", mp.Node, mp.Provider)
		return
	}
	if h, _ := AuthHeader(a); h == "" {
		add(pp+".credential_slot", "adapter %s/%s has no auth header to carry the credential (profile_overrides.auth_header is empty)", mp.Node, mp.Provider)
	}
}

// RouteSlot is the credential slot of the route mp on adapter a: the
// route's own credential_slot, else the adapter's (SPEC C2). It is a pure
// function of the configuration, so a route never falls back to another
// slot (SPEC C6).
func RouteSlot(mp ModelProvider, a *Adapter) string {
	if mp.CredentialSlot != "" {
		return mp.CredentialSlot
	}
	if a == nil {
		return ""
	}
	return a.CredentialSlot
}

// AuthHeader is the header and scheme that carry an upstream credential to
// adapter a: its resolved profile's auth_header and auth_scheme for
// openai_compat, "Authorization: Bearer" for ollama (a server behind an
// auth proxy). The node injects a lease's credential the same way.
func AuthHeader(a *Adapter) (header, scheme string) {
	if a.Type == protocol.TypeOllama {
		return "Authorization", "Bearer"
	}
	p := ResolveProfile(a)
	if p == nil {
		return "", ""
	}
	return p.AuthHeader, p.AuthScheme
}

// ProfileName is the protocol profile a lease for adapter a names: the
// openai_compat profile, or "ollama" for an ollama adapter (the name the
// node's built-in Ollama profile carries).
func ProfileName(a *Adapter) string {
	if a.Type == protocol.TypeOllama {
		return protocol.ProfileOllama
	}
	return a.Profile
}
