package config

import (
	"fmt"
	"strings"

	"iop/internal/edge/keystore"
	"iop/internal/edge/routing"
	"iop/internal/wire"

	"google.golang.org/protobuf/proto"
)

// Defaults of joining, templates and discovery (SPEC J1-J7, D1, D2).
const (
	// DefaultEnrollmentStore is enrollment.store_file, relative to the
	// config file's directory.
	DefaultEnrollmentStore = "enrollment.json"
	// DefaultCertificateTTLMs is enrollment.certificate_ttl_ms: a day. A
	// node renews at two thirds of it over its live session (SPEC J5); a
	// node that is away longer than a day joins again with a new token.
	DefaultCertificateTTLMs = 24 * 3600 * 1000
	MinCertificateTTLMs     = 60 * 1000
	MaxCertificateTTLMs     = 30 * 24 * 3600 * 1000
	// DefaultJoinsPerMinute bounds join attempts on node_listen (SPEC J4).
	DefaultJoinsPerMinute = 30
	MaxJoinsPerMinute     = 6000
	// DefaultDiscoveryIntervalMs is discovery.poll_interval_ms (SPEC D1).
	DefaultDiscoveryIntervalMs = 10000
	MinDiscoveryIntervalMs     = 100
	MaxDiscoveryIntervalMs     = 3600 * 1000
)

// Enrollment configures node joining and certificate renewal (SPEC J1-J6).
// It is on when CAKeyFile is set: the CA's private key is then online on
// the edge host, so a compromise of the edge can mint node certificates
// (it can already route every request; the CA key also lets it impersonate
// nodes to another edge of the same CA). Relative paths are resolved
// against the config file's directory.
type Enrollment struct {
	// CAKeyFile is the CA's private key (pki/ca.key), whose certificate is
	// in tls.ca_file. "" = enrollment off.
	CAKeyFile string `json:"ca_key_file"`
	// StoreFile holds the join tokens (their secrets only hashed) and the
	// enrolled nodes; `edge tokens` and `edge nodes` rewrite it under a
	// lock, the edge re-reads it when it changes. Default enrollment.json.
	StoreFile string `json:"store_file"`
	// CertificateTTLMs is an enrolled node certificate's lifetime, ms;
	// default a day, 60000 to 30 days.
	CertificateTTLMs int64 `json:"certificate_ttl_ms"`
	// JoinsPerMinute bounds join connections, all peers together (SPEC J4).
	JoinsPerMinute int `json:"joins_per_minute"`
}

// Enabled reports whether joins and renewals are served.
func (e Enrollment) Enabled() bool { return e.CAKeyFile != "" }

// NodeTemplate gives every node whose name matches Match, and that is not
// listed in nodes[], its adapters: an enrolled node needs no entry of its
// own (SPEC J7). The first matching template in config order applies.
type NodeTemplate struct {
	// Match is a glob over node names ('*' any run of characters, '?' one).
	Match    string    `json:"match"`
	Adapters []Adapter `json:"adapters"`
}

// ModelDiscovery makes one model group per model that the backends of the
// matching providers report (SPEC D2): the group is named after the
// model (an Ollama ":latest" tag dropped, or Aliases' name) and every
// (node, provider) reporting the model is its provider. A configured
// group of the same name wins over a discovered one.
type ModelDiscovery struct {
	// Node is a node name or a glob over node names.
	Node string `json:"node"`
	// Provider is the adapter name on those nodes.
	Provider string `json:"provider"`
	// Match is a glob over the backend's model names; default "*".
	Match string `json:"match"`
	// Aliases renames discovered models: backend model name (or the name
	// without ":latest") → group name.
	Aliases map[string]string `json:"aliases"`
	// Routing of the discovered groups; default least_loaded.
	Routing string `json:"routing"`
}

// Discovery tunes model discovery (SPEC D1).
type Discovery struct {
	// PollIntervalMs: how often a node lists a discovering adapter's
	// models; a change reaches the edge within one interval. Default 10000.
	PollIntervalMs int64 `json:"poll_interval_ms"`
}

// IsPattern reports whether a node name or target in the config is a glob:
// it holds '*' or '?' (keystore.IsPattern; node and model names never do).
func IsPattern(s string) bool { return keystore.IsPattern(s) }

// Matches reports whether name matches pattern: a glob where '*' stands for
// any run of characters ('/' and ':' included: "library/llama3*") and '?'
// for one, as a key's model scope (keystore.Match); without either, the
// exact name.
func Matches(pattern, name string) bool {
	if !IsPattern(pattern) {
		return pattern == name
	}
	return keystore.Match(pattern, name)
}

func checkGlob(p string) error { return keystore.ValidatePattern(p) }

func (c *Config) applyEnrollmentDefaults() {
	if c.Enrollment.StoreFile == "" {
		c.Enrollment.StoreFile = DefaultEnrollmentStore
	}
	if c.Enrollment.CertificateTTLMs == 0 {
		c.Enrollment.CertificateTTLMs = DefaultCertificateTTLMs
	}
	if c.Enrollment.JoinsPerMinute == 0 {
		c.Enrollment.JoinsPerMinute = DefaultJoinsPerMinute
	}
	if c.Discovery.PollIntervalMs == 0 {
		c.Discovery.PollIntervalMs = DefaultDiscoveryIntervalMs
	}
	for i := range c.NodeTemplates {
		for j := range c.NodeTemplates[i].Adapters {
			applyAdapterDefaults(&c.NodeTemplates[i].Adapters[j])
		}
	}
	for i := range c.ModelDiscovery {
		d := &c.ModelDiscovery[i]
		if d.Match == "" {
			d.Match = "*"
		}
		if d.Routing == "" {
			d.Routing = routing.NameLeastLoaded
		}
	}
}

// validateEnrollment checks enrollment, node_templates, model_discovery
// and discovery.
func (c *Config) validateEnrollment(add func(string, string, ...any)) {
	e := c.Enrollment
	if e.CertificateTTLMs < MinCertificateTTLMs || e.CertificateTTLMs > MaxCertificateTTLMs {
		add("enrollment.certificate_ttl_ms", "must be between %d (a minute) and %d (30 days), got %d",
			int64(MinCertificateTTLMs), int64(MaxCertificateTTLMs), e.CertificateTTLMs)
	}
	if e.JoinsPerMinute < 1 || e.JoinsPerMinute > MaxJoinsPerMinute {
		add("enrollment.joins_per_minute", "must be between 1 and %d, got %d", MaxJoinsPerMinute, e.JoinsPerMinute)
	}
	if d := c.Discovery.PollIntervalMs; d < MinDiscoveryIntervalMs || d > MaxDiscoveryIntervalMs {
		add("discovery.poll_interval_ms", "must be between %d and %d, got %d", int64(MinDiscoveryIntervalMs), int64(MaxDiscoveryIntervalMs), d)
	}
	for i := range c.NodeTemplates {
		t := &c.NodeTemplates[i]
		p := fmt.Sprintf("node_templates[%d]", i)
		switch {
		case t.Match == "":
			add(p+".match", "required (a glob over node names, e.g. \"gpu-*\")")
		case checkGlob(t.Match) != nil:
			add(p+".match", "invalid glob %q: %v", t.Match, checkGlob(t.Match))
		}
		if len(t.Adapters) == 0 {
			add(p+".adapters", "at least one adapter is required")
		}
		byName := map[string]bool{}
		for j := range t.Adapters {
			a := &t.Adapters[j]
			ap := fmt.Sprintf("%s.adapters[%d]", p, j)
			c.validateAdapter(ap, a, add)
			if byName[a.Name] {
				add(ap+".name", "duplicate adapter name %q in the template", a.Name)
			}
			byName[a.Name] = true
		}
		if size := c.payloadSize(&Node{ID: strings.Repeat("n", 63), Adapters: t.Adapters}); size > maxPayloadBytes {
			add(p+".adapters", "a matching node's config payload would be %d bytes, over the %d a node reads before ready (SPEC N6)", size, maxPayloadBytes)
		}
	}
	for i := range c.Nodes {
		if size := c.payloadSize(&c.Nodes[i]); size > maxPayloadBytes {
			add(fmt.Sprintf("nodes[%d].adapters", i), "the node's config payload is %d bytes, over the %d a node reads before ready (SPEC N6)", size, maxPayloadBytes)
		}
	}
	for i, d := range c.ModelDiscovery {
		p := fmt.Sprintf("model_discovery[%d]", i)
		c.checkProviderNode(p, d.Node, d.Provider, add)
		if err := checkGlob(d.Match); err != nil {
			add(p+".match", "invalid glob %q: %v", d.Match, err)
		}
		if !validRouting(d.Routing) {
			add(p+".routing", "want least_loaded, ordered or prefix_affinity, got %q", d.Routing)
		}
		for from, to := range d.Aliases {
			if from == "" || !validModelName(to) {
				add(p+".aliases", "%q → %q: want a backend model name and a group name without surrounding spaces", from, to)
			}
		}
	}
}

// checkProviderNode checks a provider entry's node (a name or a glob) and
// adapter name; it returns the adapter it names (for a glob, the first
// matching configured node's or else the first template's), or nil.
func (c *Config) checkProviderNode(pp, node, provider string, add func(string, string, ...any)) *Adapter {
	switch {
	case node == "":
		add(pp+".node", "required")
		return nil
	case IsPattern(node):
		if err := checkGlob(node); err != nil {
			add(pp+".node", "invalid glob %q: %v", node, err)
			return nil
		}
		if a := c.patternAdapter(node, provider); a != nil {
			return a
		}
		add(pp+".provider", "no node matching %q and no node template has an adapter %q", node, provider)
		return nil
	}
	n := c.NodeByID(node)
	if n == nil {
		if t := c.TemplateFor(node); t != nil {
			if a := t.adapter(provider); a != nil {
				return a
			}
			add(pp+".provider", "the node template for %q has no adapter %q", node, provider)
			return nil
		}
		add(pp+".node", "no configured node %q (and no node template matches it)", node)
		return nil
	}
	a := n.Adapter(provider)
	if a == nil {
		add(pp+".provider", "node %q has no adapter %q", node, provider)
	}
	return a
}

// patternAdapter is the adapter named provider of the first configured
// node matching the glob, else of the first template that has one.
func (c *Config) patternAdapter(glob, provider string) *Adapter {
	for i := range c.Nodes {
		if Matches(glob, c.Nodes[i].ID) {
			if a := c.Nodes[i].Adapter(provider); a != nil {
				return a
			}
		}
	}
	for i := range c.NodeTemplates {
		if a := c.NodeTemplates[i].adapter(provider); a != nil {
			return a
		}
	}
	return nil
}

// TemplateFor is the first node template whose glob matches name, or nil.
func (c *Config) TemplateFor(name string) *NodeTemplate {
	for i := range c.NodeTemplates {
		if Matches(c.NodeTemplates[i].Match, name) {
			return &c.NodeTemplates[i]
		}
	}
	return nil
}

func (t *NodeTemplate) adapter(name string) *Adapter {
	for i := range t.Adapters {
		if t.Adapters[i].Name == name {
			return &t.Adapters[i]
		}
	}
	return nil
}

// maxPayloadBytes is the largest NodeConfigPayload a node reads before
// ready (SPEC N6): the pre-ready frame cap minus room for the envelope,
// the RegisterResponse around it and the credential projection's slot
// revisions, which depend on the routes.
const maxPayloadBytes = wire.DefaultPreReadyCap - 4<<10

// payloadSize is the encoded size of n's NodeConfigPayload.
func (c *Config) payloadSize(n *Node) int {
	return proto.Size(c.nodePayload(n))
}

func validRouting(r string) bool {
	_, err := routing.ParseMode(r)
	return err == nil
}
