// Package adapter executes the work an Edge sends to a Node against the
// Node's inference backends (SPEC E1–E9, T1, T2, T4): a Set holds the adapter
// instances of one NodeConfigPayload, each an "ollama" or an "openai_compat"
// backend with its own capacity gate, and runs normalized runs (RunRequest →
// RunEvent stream), raw provider tunnels (ProviderTunnelRequest →
// ProviderTunnelFrame stream) and exact-target health probes on them.
//
// Guarantees, per request:
//   - Run emits START (seq 1), DELTA*, then exactly one COMPLETE, ERROR or
//     CANCELLED, seq strictly increasing, emit calls never overlapping,
//     and returns after the terminal (SPEC E3). Rejections at the boundary
//     (unknown adapter, bad stall timeout, over capacity…) are START + ERROR.
//   - Tunnel emits RESPONSE_START? (BODY | USAGE)* (END | ERROR), seq from 1,
//     BODY frames of at most 32 KiB sent as read, body bytes unchanged, usage
//     observed beside them (SPEC T2).
//   - Cancelling ctx aborts the upstream HTTP request; the stream still ends
//     with one terminal (SPEC E5, E6, T3).
//   - A provider that sends nothing for the stall timeout ends the request
//     with one "response_stalled" terminal carrying ExecutionFailure; a
//     fenced call that ignores its cancel keeps its capacity slot until it
//     returns (SPEC H1–H7; see Run).
//
// Run and Tunnel share one sender type and one prelude (sender.go): the
// sender numbers the messages, stamps adapter and target, drops all but the
// terminal once the attempt is fenced, sends exactly one terminal and
// returns the capacity slot just before it; open runs the boundary checks,
// the capacity gate, the credential lease and a managed model's load in
// that order. run.go and tunnel.go keep what differs: the checks of their
// own, the provider call and its terminals.
//
// The package never queues (over capacity is an immediate error, SPEC E4),
// never treats RunRequest.metadata as control input (SPEC E7), never parses
// assistant text into tool calls (SPEC E9), never forwards client auth,
// hop-by-hop or Edge-internal headers upstream (SPEC T4), never reads the
// environment itself (Options.LookupEnv) and never logs a secret or a body.
//
// # Peer input
//
// Every buffer that holds a backend's bytes grows with the bytes received
// and has a cap:
//   - tunnel bodies: read into one pooled MaxBodyFrame (32 KiB) buffer per
//     tunnel and sent as read, never accumulated; the usage scanner beside
//     them carries at most 256 KiB of a line or 1 MiB of a JSON body and
//     skips the rest (usage.go);
//   - run streams: Ollama's NDJSON lines (internal/ndjson, 4 MiB a line) and
//     OpenAI-compatible SSE (internal/sse, 1 MiB a line, 4 MiB an event);
//     what a driver accumulates for COMPLETE is capped at
//     upstream.MaxResultBytes and upstream.MaxToolCalls (ErrResultTooLarge,
//     "upstream_error");
//   - error bodies of a non-2xx answer: 64 KiB (upstream.ReadStatusError);
//     probe answers: 4 MiB (model lists), health bodies unread;
//   - response heads: maxResponseHeaderBytes (1 MiB, client.go).
//
// Goroutines: Run and Tunnel make their provider call on one goroutine of
// their own and, after a stall, probe on another; both have ended when Run
// or Tunnel returns. Probe runs on the caller's goroutine. The HTTP client
// may start its own connection goroutines, which Close releases when idle.
package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"iop/internal/gopool"
	"iop/internal/lease"
	"iop/internal/node/adapter/ollama"
	"iop/internal/node/adapter/openaicompat"
	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// maxIdleCalls is how many finished watchdog-loop goroutines a Set keeps
// for the next ones (gopool).
const maxIdleCalls = 64

// Defaults.
const (
	DefaultStallTimeout = protocol.DefaultStallTimeoutMs * time.Millisecond // SPEC E2: a request carrying 0 gets it
	DefaultProbeTimeout = 2 * time.Second                                   // health probe timeout (SPEC H1)
	DefaultCloseGrace   = 2 * time.Second                                   // stall close grace (SPEC H1, H7)
	DefaultOllamaURL    = "http://127.0.0.1:11434"                          // Ollama's own default
	MaxBodyFrame        = 32 << 10                                          // bytes per BODY frame (SPEC T2)
)

// ErrNodeShutdown is the cause the node's drain cancels its work in flight
// with once shutdown.drain_timeout_ms has passed (session
// Options.DrainCause): the terminal is an ERROR with failure code
// node_shutdown instead of CANCELLED, so the Edge can tell a node going
// away from a cancel of its own.
var ErrNodeShutdown = errors.New("the node is shutting down: its drain timeout passed")

// Errors of NewSet (each wrapped with the adapter's name) and StallTimeout;
// test with errors.Is.
var (
	ErrNoConfig        = errors.New("adapter: no node config")
	ErrUnknownType     = errors.New("unknown adapter type")
	ErrDuplicateName   = errors.New("duplicate adapter name")
	ErrBadBaseURL      = errors.New("bad base_url")
	ErrNoProfile       = errors.New("openai_compat adapter without protocol_profile")
	ErrBadProfile      = errors.New("bad protocol_profile")
	ErrBadCapacity     = errors.New("bad capacity")
	ErrBadStallTimeout = errors.New("bad response_stall_timeout_ms")
	ErrBadIdleTimeout  = errors.New("bad upstream_idle_timeout_ms")
	ErrMissingAPIKey   = errors.New("api_key_env names no set environment variable")
	ErrBadAuthHeader   = errors.New("bad upstream auth header")
	// ErrAdapterConflict: the payload names another backend (type or
	// base URL) under an adapter name than another edge's payload this
	// node runs (Options.Capacity).
	ErrAdapterConflict  = errors.New("another edge runs another backend under this adapter name")
	errRunDeadline      = errors.New("request timeout_sec expired")
	errUnknownOperation = errors.New("unknown operation")
	errUnsafePath       = errors.New("unsafe path") // absolute, with a host, or escaping the base
	errUnsupported      = errors.New("operation not supported by the profile")
	errPanic            = errors.New("adapter panicked")
)

// ErrAPIKeyEnvNotAllowed (NewSet): the Edge's config names an api_key_env
// this node does not offer (its own config's api_key_env_allow); the
// variable is not read.
var ErrAPIKeyEnvNotAllowed = errors.New("api_key_env is not offered by this node (see api_key_env_allow in the node's config)")

// Options for NewSet; zero values get defaults.
type Options struct {
	// HTTPClient, when set, is the upstream client of every instance (tests);
	// its Timeout must be 0 (streams last long) and the adapters'
	// upstream_idle_timeout_ms does not apply to it. Its CheckRedirect is
	// replaced (in a copy): the Set never follows a redirect. nil = a client per
	// instance, tuned for long streams to one backend, with that instance's
	// idle lifetime (client.go).
	HTTPClient *http.Client
	// Logger; nil = slog.Default().
	Logger *slog.Logger
	// LookupEnv resolves AdapterConfig.api_key_env (os.LookupEnv in main);
	// nil = no variables, so an adapter with api_key_env fails NewSet.
	LookupEnv func(string) (string, bool)
	// AllowEnv reports whether this node offers the environment variable
	// an AdapterConfig.api_key_env names (the node config's
	// api_key_env_allow): the Edge's config must not be able to read any
	// variable on the node and send it to a base_url of its choosing.
	// LookupEnv is called only for a name AllowEnv accepts; nil = none, so
	// an adapter with api_key_env fails NewSet with ErrAPIKeyEnvNotAllowed.
	AllowEnv func(name string) bool
	// ProbeTimeout bounds one Probe; 0 = 2 s.
	ProbeTimeout time.Duration
	// StallCloseGrace is how long a fenced attempt (stall, cancel or
	// deadline) waits for its provider call to return before the terminal
	// goes out anyway (fence "unconfirmed", slot kept until the return;
	// SPEC H1, H7); 0 = 2 s.
	StallCloseGrace time.Duration
	// ReuseBodyBuffers lets Tunnel reuse the Body slice of a BODY frame after
	// emit returns (1 allocation per frame instead of 2). Set it only when
	// emit serializes or copies the frame before returning.
	ReuseBodyBuffers bool
	// NodeID is this node's id, which a lease's binding must name (SPEC
	// C3); required when the payload turns the credential plane on.
	NodeID string
	// Leases verifies and opens credential leases (SPEC C3); shared by
	// every Set of the process so its replay cache outlives config
	// refreshes. Required when the payload turns the credential plane on
	// (else NewSet fails with ErrNoLeaseKeys); its keys must be the ones the
	// payload names (else ErrLeaseKeyMismatch).
	Leases *lease.Opener
	// Now is the wall clock leases are checked against; nil = time.Now.
	Now func() time.Time
	// Capacity is the node's capacity gates, shared by every Set the
	// process builds (SPEC E4: an adapter admits at most its capacity
	// across every edge and refresh); nil = gates of this Set's own.
	Capacity *Capacity
	// Edge names the edge whose payload this Set runs ("edge-1 at
	// 10.0.0.1:7443"): its requests count against CapacityShare, and its
	// adapters' backends must agree with other edges' (ErrAdapterConflict).
	Edge string
	// CapacityShare, in (0, 1], bounds this edge's requests on each
	// adapter to protocol.ShareOf(capacity, share); 0 = no bound of its own.
	CapacityShare float64
	// Managed is the node config's managed backends by name, which an
	// AdapterConfig.managed may name (SPEC U1; managed.go); nil = none.
	Managed map[string]ManagedBackend
	// Residency is notified when a model's residency may have changed
	// (SPEC U6): the node's one Signal, which its managed backends notify
	// too; nil = a Signal of this Set's own.
	Residency *Signal
	// Ollama is the node's Ollama residency watchers, one per server,
	// shared by every Set the process builds (SPEC U7); nil = watchers of
	// this Set's own.
	Ollama *OllamaWatchers
}

// Set is the adapter instances of one NodeConfigPayload. Its methods are safe
// for concurrent use.
type Set struct {
	instances map[string]*instance
	names     []string
	shared    *http.Client   // Options.HTTPClient
	clients   []*http.Client // one per instance when shared is nil
	log       *slog.Logger
	probeTO   time.Duration
	grace     time.Duration
	reuseBody bool
	creds     bool // NodeRuntimeConfig.credentials_enabled (SPEC C4)
	// The credential plane (SPEC C3, C6): this node's id, the lease opener,
	// the clock, and the projection the payload named.
	nodeID   string
	leases   *lease.Opener
	now      func() time.Time
	credGen  uint64
	credRevs map[string]uint64
	bufs     sync.Pool
	// capacity holds the instances' gates; edge is the key this Set's
	// claims are under (Options.Edge).
	capacity *Capacity
	edge     string
	// observing holds one token per stall log line a logger still has
	// (observeStall, SPEC O2).
	observing chan struct{}
	// signal is Options.Residency (SPEC U6); psw Options.Ollama (U7).
	signal *Signal
	psw    *OllamaWatchers
	// calls runs the watchdog loops that take over an attempt whose stall
	// timer fired or whose context ended (supervise) on kept goroutines
	// (gopool); closed by Close.
	calls *gopool.Pool
}

// instance is one adapter instance.
type instance struct {
	name    string
	typ     string
	ep      *upstream.Endpoint
	profile *iop.ConcreteProtocolProfile // never nil; built in for ollama
	gate    gate
	runner  runner
	// newRunner builds a runner calling another endpoint (a request
	// carrying a lease's credential, a managed model's process).
	newRunner func(*upstream.Endpoint) runner
	// managed, when set, serves the instance's models, one process each
	// (SPEC U1, U2; managed.go).
	managed ManagedBackend
	// ps watches an ollama instance's /api/ps (SPEC U6, U7; ollamaps.go).
	ps *psWatch
}

// runner is what the two adapter types implement for runs and probes.
type runner interface {
	Run(ctx context.Context, target string, in *iop.RunInput, h upstream.Hooks) (upstream.Result, error)
	Probe(ctx context.Context, target string) string
}

// NewSet builds the adapter instances of cfg (SPEC E1): an empty name is the
// type name; names are unique. It fails, naming the adapter, on an unknown
// type, a duplicate name, a negative capacity, a bad
// upstream_idle_timeout_ms, a base URL that is not absolute http(s) (or has
// user info, a query or a fragment), an openai_compat adapter without
// protocol_profile or with an unsafe profile path, an api_key_env this
// node does not offer (AllowEnv, ErrAPIKeyEnvNotAllowed) or one that
// LookupEnv cannot resolve. Capacity 0 means no local limit.
func NewSet(cfg *iop.NodeConfigPayload, o Options) (*Set, error) {
	if cfg == nil {
		return nil, ErrNoConfig
	}
	s := &Set{
		instances: map[string]*instance{},
		shared:    o.HTTPClient,
		log:       o.Logger,
		probeTO:   o.ProbeTimeout,
		grace:     o.StallCloseGrace,
		reuseBody: o.ReuseBodyBuffers,
		creds:     cfg.GetRuntime().GetCredentialsEnabled(),
		nodeID:    o.NodeID,
		leases:    o.Leases,
		now:       o.Now,
		credGen:   cfg.GetRuntime().GetCredentialProjectionGeneration(),
		credRevs:  cfg.GetRuntime().GetCredentialSlotRevisions(),
		capacity:  o.Capacity,
		edge:      o.Edge,
		observing: make(chan struct{}, maxStuckObservations),
		signal:    o.Residency,
		psw:       o.Ollama,
		calls:     gopool.New(maxIdleCalls),
	}
	if s.psw == nil {
		s.psw = NewOllamaWatchers()
	}
	if s.signal == nil {
		s.signal = NewSignal()
	}
	if s.capacity == nil {
		s.capacity = NewCapacity()
	}
	if s.shared != nil {
		s.shared = noRedirects(s.shared) // a 3xx is the upstream's answer, whichever client sends it
	}
	if s.creds && (s.leases == nil || s.nodeID == "") {
		return nil, ErrNoLeaseKeys
	}
	if s.creds {
		if err := checkLeaseKeys(cfg.GetRuntime(), s.leases); err != nil {
			return nil, err
		}
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.probeTO <= 0 {
		s.probeTO = DefaultProbeTimeout
	}
	if s.grace <= 0 {
		s.grace = DefaultCloseGrace
	}
	s.bufs.New = func() any { b := make([]byte, MaxBodyFrame); return &b }
	for i, ac := range cfg.GetAdapters() {
		inst, err := s.build(ac, o.AllowEnv, o.LookupEnv)
		if err == nil {
			if err = bindManaged(inst, ac, o.Managed); err != nil {
				err = fmt.Errorf("adapter %q: %w", inst.name, err)
			}
		}
		if err == nil {
			if _, dup := s.instances[inst.name]; dup {
				err = fmt.Errorf("adapter %q: %w", inst.name, ErrDuplicateName)
			}
		}
		if err != nil {
			if inst != nil && inst.ps != nil {
				s.psw.release(inst.ps) // never added: Close does not see it
			}
			s.Close()
			return nil, fmt.Errorf("adapters[%d]: %w", i, err)
		}
		s.instances[inst.name] = inst
		s.names = append(s.names, inst.name)
	}
	if err := s.capacity.bind(s, s.edge, o.CapacityShare); err != nil {
		s.names = nil // nothing was claimed
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Set) build(ac *iop.AdapterConfig, allowEnv func(string) bool, lookupEnv func(string) (string, bool)) (*instance, error) {
	name := ac.GetName()
	if name == "" {
		name = ac.GetType()
	}
	inst := &instance{name: name, typ: ac.GetType()}
	keepAlive, err := KeepAlive(ac.GetKeepAlive())
	fail := func(err error, format string, args ...any) error {
		if format == "" {
			return fmt.Errorf("adapter %q: %w", name, err)
		}
		return fmt.Errorf("adapter %q: %w: %s", name, err, fmt.Sprintf(format, args...))
	}
	if err != nil {
		return nil, fail(err, "")
	}
	if keepAlive != nil && inst.typ != protocol.TypeOllama {
		return nil, fail(ErrBadKeepAlive, "keep_alive is Ollama's: only an %s adapter takes it", protocol.TypeOllama)
	}
	if ac.GetCapacity() < 0 {
		return nil, fail(ErrBadCapacity, "%d is negative", ac.GetCapacity())
	}
	inst.gate.limit = int64(ac.GetCapacity()) // its counters come from Capacity (bind)
	idle, err := idleTimeout(ac.GetUpstreamIdleTimeoutMs())
	if err != nil {
		return nil, fail(err, "")
	}
	var base string
	switch ac.GetType() {
	case protocol.TypeOllama:
		base = ac.GetBaseUrl()
		if base == "" {
			base = DefaultOllamaURL
		}
		inst.profile = protocol.OllamaProfile(base)
	case protocol.TypeOpenAICompat:
		p := ac.GetOpenaiCompat().GetProtocolProfile()
		if p == nil {
			return nil, fail(ErrNoProfile, "")
		}
		if err := checkProfile(p); err != nil {
			return nil, fail(err, "")
		}
		inst.profile = p
		base = p.GetBaseUrl()
		if base == "" {
			base = ac.GetBaseUrl()
		}
	default:
		return nil, fail(ErrUnknownType, "%q (want %q or %q)", ac.GetType(), protocol.TypeOllama, protocol.TypeOpenAICompat)
	}
	u, err := parseBaseURL(base)
	if err != nil {
		return nil, fail(err, "")
	}
	client := s.shared
	if client == nil {
		client = newClient(idle)
		s.clients = append(s.clients, client)
	}
	inst.ep = &upstream.Endpoint{Client: client, Base: u}
	if env := ac.GetApiKeyEnv(); env != "" {
		if allowEnv == nil || !allowEnv(env) {
			return nil, fail(ErrAPIKeyEnvNotAllowed, "%s", env)
		}
		if err := setAuth(inst, env, lookupEnv); err != nil {
			return nil, fail(err, "")
		}
	}
	switch inst.typ {
	case protocol.TypeOllama:
		caps := &ollama.Capabilities{} // shared by the instance's runners (one per credential lease)
		var watch ollama.Watcher
		if ac.GetDiscoveryIntervalMs() > 0 { // SPEC U7: residency is part of discovery (D1)
			inst.ps = s.psw.acquire(inst.ep, s.signal)
			watch = inst.ps
		}
		inst.newRunner = func(ep *upstream.Endpoint) runner {
			return &ollama.Driver{EP: ep, Caps: caps, Watch: watch, KeepAlive: keepAlive}
		}
	default:
		inst.newRunner = func(ep *upstream.Endpoint) runner { return &openaicompat.Driver{EP: ep, Profile: inst.profile} }
	}
	inst.runner = inst.newRunner(inst.ep)
	return inst, nil
}

// setAuth resolves the upstream key named by api_key_env and the header that
// carries it: the profile's auth_header/auth_scheme for openai_compat,
// "Authorization: Bearer" for ollama (a server behind an auth proxy).
func setAuth(inst *instance, env string, lookupEnv func(string) (string, bool)) error {
	key, ok := "", false
	if lookupEnv != nil {
		key, ok = lookupEnv(env)
	}
	if !ok || key == "" {
		return fmt.Errorf("%w: %s", ErrMissingAPIKey, env)
	}
	header, scheme := "Authorization", "Bearer"
	if inst.typ == protocol.TypeOpenAICompat {
		header, scheme = inst.profile.GetAuthHeader(), inst.profile.GetAuthScheme()
	}
	if !validToken(header) {
		return fmt.Errorf("%w: %q (api_key_env is set, so protocol_profile.auth_header must name a header)", ErrBadAuthHeader, header)
	}
	if strings.ContainsAny(key+scheme, "\r\n\x00") {
		return fmt.Errorf("%w: the key in %s or the scheme contains a line break", ErrBadAuthHeader, env)
	}
	inst.ep.AuthHeader = header
	inst.ep.AuthValue = key
	if scheme != "" {
		inst.ep.AuthValue = scheme + " " + key
	}
	return nil
}

// parseBaseURL accepts an absolute http(s) URL with a host and without user
// info, query or fragment.
func parseBaseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadBaseURL, raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: %q is not an absolute http or https URL", ErrBadBaseURL, raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return nil, fmt.Errorf("%w: %q has user info, a query or a fragment", ErrBadBaseURL, u.Redacted())
	}
	return u, nil
}

// StallTimeout returns the response-stall timeout of a request whose
// response_stall_timeout_ms is ms (SPEC E2): ms > 0 as milliseconds, as it
// is (the Edge's pool dispatch sends the winning candidate's resolved
// value, SPEC Q6, and the node does not resolve it again); 0, a direct
// call's, → DefaultStallTimeout. Negative values and values too large for a
// time.Duration return ErrBadStallTimeout.
func StallTimeout(ms int64) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, fmt.Errorf("%w: %d ms is negative", ErrBadStallTimeout, ms)
	case ms > math.MaxInt64/int64(time.Millisecond):
		return 0, fmt.Errorf("%w: %d ms is too large for a duration", ErrBadStallTimeout, ms)
	case ms == 0:
		return DefaultStallTimeout, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Names lists the instance names in config order.
func (s *Set) Names() []string { return append([]string(nil), s.names...) }

// Close releases the upstream clients' idle connections. In-flight requests
// are not affected; call Close after they returned.
func (s *Set) Close() {
	s.capacity.unbind(s, s.edge)
	for _, inst := range s.instances {
		if inst.ps != nil {
			s.psw.release(inst.ps)
		}
	}
	if s.shared != nil {
		s.shared.CloseIdleConnections()
	}
	for _, c := range s.clients {
		c.CloseIdleConnections()
	}
	s.calls.Close() // every run and tunnel has returned: no call is running
}

// lookup resolves an adapter name (SPEC E1). An empty name is the legacy
// single instance: the only instance of the set, or else the one named after
// legacyType.
func (s *Set) lookup(name, legacyType string) (*instance, error) {
	if name == "" {
		if len(s.names) == 1 {
			return s.instances[s.names[0]], nil
		}
		if inst := s.instances[legacyType]; inst != nil {
			return inst, nil
		}
		return nil, fmt.Errorf("no adapter named: %d instances configured and none is named %q", len(s.names), legacyType)
	}
	if inst := s.instances[name]; inst != nil {
		return inst, nil
	}
	return nil, fmt.Errorf("unknown adapter %q", name)
}

// validToken reports whether s is a non-empty RFC 9110 token (a header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
