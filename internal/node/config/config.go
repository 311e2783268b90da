// Package config is the Node's own configuration file: who the node is, where
// the Edge is, its workload certificate and its reconnect policy. Adapter
// settings are not here: they arrive from the Edge in NodeConfigPayload
// (SPEC N2). The package reads the file in Load and does nothing else.
package config

import (
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"iop/internal/jsonconfig"
)

// Defaults (SPEC S2, DESIGN.md).
const (
	DefaultTrustDomain      = "iop.local"
	DefaultExpectedEdgeName = "edge-1"
	DefaultIntervalSec      = 10
	DefaultMaxAttempts      = 10
	// MaxIntervalSec bounds reconnect.interval_sec (one day).
	MaxIntervalSec = 86400
	// DefaultDrainTimeoutMs is shutdown.drain_timeout_ms.
	DefaultDrainTimeoutMs = 30000
	// MaxDrainTimeoutMs bounds shutdown.drain_timeout_ms (one hour).
	MaxDrainTimeoutMs = 3600000
)

// Config is the Node config file.
type Config struct {
	NodeID      string      `json:"node_id"`
	EdgeAddr    string      `json:"edge_addr"`
	TLS         TLS         `json:"tls"`
	Reconnect   Reconnect   `json:"reconnect"`
	Credentials Credentials `json:"credentials"`
	Shutdown    Shutdown    `json:"shutdown"`
	// APIKeyEnvAllow lists the environment variables this node offers as
	// upstream keys to an adapter's api_key_env (the Edge's config names
	// the variable; the node reads it): each entry is an exact variable
	// name, or a prefix ending in "*" ("IOP_KEY_*"). Omitted or empty = the
	// node reads no variable, and an adapter naming one is refused. A bare
	// "*" is invalid: an edge config could then read any variable on the
	// node (PATH, a cloud token) and send it to a base_url of its choosing.
	APIKeyEnvAllow []string `json:"api_key_env_allow"`
}

// APIKeyEnvAllowed reports whether name is offered by api_key_env_allow:
// equal to an entry, or starting with an entry's prefix before its "*".
func (c *Config) APIKeyEnvAllowed(name string) bool {
	for _, e := range c.APIKeyEnvAllow {
		if prefix, ok := strings.CutSuffix(e, "*"); ok {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		} else if name == e {
			return true
		}
	}
	return false
}

// Shutdown tunes the graceful drain on SIGTERM.
type Shutdown struct {
	// DrainTimeoutMs: after SIGTERM the node tells the edge it is draining
	// (no new work) and lets its runs and tunnels finish for this long;
	// then it cancels what is left and exits 0. 0 = 30000.
	DrainTimeoutMs int64 `json:"drain_timeout_ms"`
}

// TLS holds the node's workload certificate and the Edge identity it expects
// (SPEC I1, I2). Relative paths are resolved against the config file's
// directory.
type TLS struct {
	CertFile         string `json:"cert_file"`
	KeyFile          string `json:"key_file"`
	CAFile           string `json:"ca_file"`
	TrustDomain      string `json:"trust_domain"`
	ExpectedEdgeName string `json:"expected_edge_name"`
}

// Reconnect is the one dial/reconnect policy (SPEC S2). Pointers tell an
// omitted key from an explicit 0.
type Reconnect struct {
	// Seconds between attempts; omitted = 10; must be positive in unlimited
	// mode, ≥ 0 otherwise.
	IntervalSec *int `json:"interval_sec"`
	// Consecutive failed attempts before exit 1; omitted = 10; 0 = unlimited
	// until local shutdown; negative = invalid.
	MaxAttempts *int `json:"max_attempts"`
}

// Credentials locates the node's lease keys (SPEC C3): both or neither. A
// node without them serves only while the Edge's credential plane is off.
type Credentials struct {
	// RecipientPrivateKeyFile is the node's X25519 lease recipient key
	// (`edge pki` writes <node>.recipient.key, mode 0600).
	RecipientPrivateKeyFile string `json:"recipient_private_key_file"`
	// IssuerPublicKey is the Edge's Ed25519 lease issuer public key: the
	// base64 line `edge pki init` prints, or the path of issuer.pub.
	IssuerPublicKey string `json:"issuer_public_key"`
	// IssuerPublicKeys are more issuer public keys to trust, in the same
	// forms: while the Edge's issuer key is rotated the node trusts the
	// old and the new one, so no lease fails at the switch (README,
	// "Rotating the lease issuer key").
	IssuerPublicKeys []string `json:"issuer_public_keys"`
}

// IssuerKeys are every trusted issuer public key entry: issuer_public_key
// (when set) then issuer_public_keys.
func (c Credentials) IssuerKeys() []string {
	var out []string
	if c.IssuerPublicKey != "" {
		out = append(out, c.IssuerPublicKey)
	}
	return append(out, c.IssuerPublicKeys...)
}

// Interval is the reconnect interval.
func (c *Config) Interval() time.Duration {
	return time.Duration(*c.Reconnect.IntervalSec) * time.Second
}

// DrainTimeout is shutdown.drain_timeout_ms.
func (c *Config) DrainTimeout() time.Duration {
	return time.Duration(c.Shutdown.DrainTimeoutMs) * time.Millisecond
}

// MaxAttempts is the finite attempt limit, or 0 for unlimited.
func (c *Config) MaxAttempts() int { return *c.Reconnect.MaxAttempts }

// Load reads, decodes strictly, applies defaults and validates the file at
// path. The error lists every problem, one per line, each naming its key path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("node config %s:\n%w", path, err)
	}
	dir := ""
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		dir = path[:i+1]
	}
	paths := []*string{&c.TLS.CertFile, &c.TLS.KeyFile, &c.TLS.CAFile, &c.Credentials.RecipientPrivateKeyFile}
	if !IsKeyBase64(c.Credentials.IssuerPublicKey) {
		paths = append(paths, &c.Credentials.IssuerPublicKey) // a file path
	}
	for i := range c.Credentials.IssuerPublicKeys {
		if !IsKeyBase64(c.Credentials.IssuerPublicKeys[i]) {
			paths = append(paths, &c.Credentials.IssuerPublicKeys[i])
		}
	}
	for _, p := range paths {
		if *p != "" && !strings.HasPrefix(*p, "/") {
			*p = dir + *p
		}
	}
	return c, nil
}

// IsKeyBase64 reports whether s is the standard base64 of 32 bytes (an
// inline key rather than a file path).
func IsKeyBase64(s string) bool {
	b, err := base64.StdEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// Parse decodes data strictly, applies defaults and validates.
func Parse(data []byte) (*Config, error) {
	var c Config
	decodeErrs, usable := jsonconfig.Decode(data, &c)
	if !usable {
		return nil, decodeErrs
	}
	if c.TLS.TrustDomain == "" {
		c.TLS.TrustDomain = DefaultTrustDomain
	}
	if c.TLS.ExpectedEdgeName == "" {
		c.TLS.ExpectedEdgeName = DefaultExpectedEdgeName
	}
	if c.Reconnect.IntervalSec == nil {
		n := DefaultIntervalSec
		c.Reconnect.IntervalSec = &n
	}
	if c.Reconnect.MaxAttempts == nil {
		n := DefaultMaxAttempts
		c.Reconnect.MaxAttempts = &n
	}
	if c.Shutdown.DrainTimeoutMs == 0 {
		c.Shutdown.DrainTimeoutMs = DefaultDrainTimeoutMs
	}
	if errs := append(decodeErrs, c.validate()...); len(errs) > 0 {
		return nil, errs
	}
	return &c, nil
}

// Read-only patterns.
var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	// envAllowRE: an environment variable name, or a non-empty prefix of
	// one followed by "*".
	envAllowRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*\*?$`)
	tdRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,252}$`)
)

func (c *Config) validate() jsonconfig.Errors {
	var errs jsonconfig.Errors
	add := func(path, format string, args ...any) {
		errs = append(errs, path+": "+fmt.Sprintf(format, args...))
	}
	if !nameRE.MatchString(c.NodeID) {
		add("node_id", "invalid node id %q (1-63 of letters, digits, '.', '_', '-')", c.NodeID)
	}
	if host, port, err := net.SplitHostPort(c.EdgeAddr); err != nil || host == "" || !validPort(port) {
		add("edge_addr", "want host:port with a port from 1 to 65535, got %q", c.EdgeAddr)
	}
	for _, f := range []struct{ path, v string }{{"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}, {"tls.ca_file", c.TLS.CAFile}} {
		if f.v == "" {
			add(f.path, "required (mutual TLS with the edge is mandatory)")
		}
	}
	if !tdRE.MatchString(c.TLS.TrustDomain) {
		add("tls.trust_domain", "invalid trust domain %q", c.TLS.TrustDomain)
	}
	if (c.Credentials.RecipientPrivateKeyFile == "") != (len(c.Credentials.IssuerKeys()) == 0) {
		add("credentials", "set both recipient_private_key_file and issuer_public_key (or issuer_public_keys), or neither (the credential plane needs both)")
	}
	for i, k := range c.Credentials.IssuerPublicKeys {
		if k == "" {
			add(fmt.Sprintf("credentials.issuer_public_keys[%d]", i), "empty")
		}
	}
	if !nameRE.MatchString(c.TLS.ExpectedEdgeName) {
		add("tls.expected_edge_name", "invalid edge name %q", c.TLS.ExpectedEdgeName)
	}
	iv, ma := *c.Reconnect.IntervalSec, *c.Reconnect.MaxAttempts
	if ma < 0 {
		add("reconnect.max_attempts", "must be ≥ 0 (0 = unlimited), got %d", ma)
	}
	if iv < 0 || iv > MaxIntervalSec {
		add("reconnect.interval_sec", "must be between 0 and %d, got %d", MaxIntervalSec, iv)
	} else if iv == 0 && ma == 0 {
		add("reconnect.interval_sec", "must be positive when reconnect.max_attempts is 0 (unlimited)")
	}
	if d := c.Shutdown.DrainTimeoutMs; d < 0 || d > MaxDrainTimeoutMs {
		add("shutdown.drain_timeout_ms", "must be between 1 and %d, got %d", MaxDrainTimeoutMs, d)
	}
	for i, e := range c.APIKeyEnvAllow {
		if !envAllowRE.MatchString(e) {
			add(fmt.Sprintf("api_key_env_allow[%d]", i), "want an environment variable name or a prefix ending in '*' (not a bare '*'), got %q", e)
		}
	}
	return errs
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}
