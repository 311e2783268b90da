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

// Defaults (SPEC S2; docs/config.md lists each key with its default).
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
	// MaxEdges bounds edges[]: each edge is one supervisor goroutine and
	// one connection.
	MaxEdges = 16
)

// Config is the Node config file.
type Config struct {
	NodeID string `json:"node_id"`
	// EdgeAddr and TLS.ExpectedEdgeName name the one edge of a node that
	// serves one; Edges lists several. A file sets one form or the other;
	// after Parse, Edges always lists every edge (the one-edge form becomes
	// its single entry).
	EdgeAddr    string      `json:"edge_addr"`
	Edges       []Edge      `json:"edges"`
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
	// Managed lists the programs this node may start, one process per
	// loaded model (SPEC U1-U5; managed.go). Only this file declares
	// them: an edge names one, never what it runs.
	Managed []Managed `json:"managed"`
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

// Edge is one edge the node dials and serves (edges[]). Each gets its own
// supervisor and session under the one reconnect policy (SPEC S1, S2).
type Edge struct {
	// Addr is host:port of the edge's node_listen.
	Addr string `json:"addr"`
	// Name is the name in the edge's certificate (SPEC I2); omitted =
	// DefaultExpectedEdgeName. Edges may share a name (one certificate
	// copied to every edge); Addr tells them apart.
	Name string `json:"name"`
	// CapacityShare, in (0, 1], is the part of every adapter's capacity
	// this edge may use, a hard split (SPEC E4): its requests are admitted
	// while fewer than ceil(capacity × share) of them run on the adapter
	// (and the node-wide count is below capacity), refused above it even
	// with a slot free. 0 (omitted) = no share of its own: the edge takes
	// any free slot but the last ones held for another edge's due retry,
	// and a refusal tells it its fair share.
	CapacityShare float64 `json:"capacity_share"`
}

// String names the edge for logs and errors: "edge-1 at 10.0.0.1:7443".
func (e Edge) String() string { return e.Name + " at " + e.Addr }

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
	if errs := c.resolveManaged(dir); len(errs) > 0 {
		return nil, fmt.Errorf("node config %s:\n%w", path, errs)
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
	// Which form names the edges, before defaults fill the one-edge form.
	var formErrs jsonconfig.Errors
	switch {
	case len(c.Edges) > 0 && (c.EdgeAddr != "" || c.TLS.ExpectedEdgeName != ""):
		formErrs = append(formErrs, "edges: set either edges or edge_addr and tls.expected_edge_name, not both (edges[].addr and edges[].name say the same for each edge)")
	case len(c.Edges) == 0 && c.EdgeAddr == "":
		formErrs = append(formErrs, "edge_addr: required (or edges: one entry per edge)")
	}
	if c.TLS.TrustDomain == "" {
		c.TLS.TrustDomain = DefaultTrustDomain
	}
	if c.TLS.ExpectedEdgeName == "" && len(c.Edges) == 0 {
		c.TLS.ExpectedEdgeName = DefaultExpectedEdgeName
	}
	if len(c.Edges) == 0 && len(formErrs) == 0 {
		c.Edges = []Edge{{Addr: c.EdgeAddr, Name: c.TLS.ExpectedEdgeName}}
	}
	for i := range c.Edges {
		if c.Edges[i].Name == "" {
			c.Edges[i].Name = DefaultExpectedEdgeName
		}
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
	c.applyManagedDefaults()
	if errs := append(append(decodeErrs, formErrs...), c.validate(len(formErrs) == 0)...); len(errs) > 0 {
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

// validate checks every key; edges says whether the edges are named in
// one form (else Parse reported it and they are not checked).
func (c *Config) validate(edges bool) jsonconfig.Errors {
	var errs jsonconfig.Errors
	add := func(path, format string, args ...any) {
		errs = append(errs, path+": "+fmt.Sprintf(format, args...))
	}
	if !nameRE.MatchString(c.NodeID) {
		add("node_id", "invalid node id %q (1-63 of letters, digits, '.', '_', '-')", c.NodeID)
	}
	if edges {
		errs = append(errs, c.validateEdges()...)
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
	return append(errs, c.validateManaged()...)
}

// validateEdges checks the edges, in whichever form the file named them:
// a host:port each, a valid certificate name, no address twice, a share in
// (0, 1].
func (c *Config) validateEdges() jsonconfig.Errors {
	var errs jsonconfig.Errors
	one := c.EdgeAddr != "" // the one-edge form: its keys are edge_addr and tls.expected_edge_name
	if len(c.Edges) > MaxEdges {
		return append(errs, fmt.Sprintf("edges: at most %d edges, got %d", MaxEdges, len(c.Edges)))
	}
	seen := map[string]int{}
	for i, e := range c.Edges {
		addrKey, nameKey := fmt.Sprintf("edges[%d].addr", i), fmt.Sprintf("edges[%d].name", i)
		if one {
			addrKey, nameKey = "edge_addr", "tls.expected_edge_name"
		}
		if host, port, err := net.SplitHostPort(e.Addr); err != nil || host == "" || !validPort(port) {
			errs = append(errs, fmt.Sprintf("%s: want host:port with a port from 1 to 65535, got %q", addrKey, e.Addr))
		} else if j, dup := seen[e.Addr]; dup {
			errs = append(errs, fmt.Sprintf("%s: %q is edges[%d].addr too", addrKey, e.Addr, j))
		} else {
			seen[e.Addr] = i
		}
		if !nameRE.MatchString(e.Name) {
			errs = append(errs, fmt.Sprintf("%s: invalid edge name %q", nameKey, e.Name))
		}
		if s := e.CapacityShare; s < 0 || s > 1 || s != s {
			errs = append(errs, fmt.Sprintf("edges[%d].capacity_share: want a share in (0, 1] (0 or omitted = none), got %v", i, s))
		}
	}
	return errs
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}
