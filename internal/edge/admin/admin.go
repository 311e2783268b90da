// Package admin serves the Edge's operator surface on admin_listen:
//
//	GET /         the operator page: one self-contained HTML page (no
//	              external assets) whose script polls /status and follows
//	              /events
//	GET /status   JSON: configured nodes and their ProviderSnapshots (SPEC
//	              N3), model groups with their waiters and routing mode and
//	              hit ratio (R1), the last errors
//	GET /status/keys  JSON: every API key's usage (docs/keys.md K7)
//	GET /metrics  Prometheus text exposition format 0.0.4
//	GET /events   SSE of node and provider events (SPEC N4)
//	GET /series   JSON: the last 15 minutes per model group and provider
//	              (access.Series), drawn as the page's charts
//	/debug/pprof/ net/http/pprof, only when Options.Pprof is set
//
// It reads state through small interfaces and never changes it. It never
// shows node addresses, tokens, keys or transport internals (SPEC N3, P4).
// Every request but /healthz passes guard first: a Host header that is not
// an IP literal, localhost or an allowed name is refused (DNS rebinding),
// and with an admin token configured the token is required.
// A node's generation is shown (A2): it is the Edge's own fencing
// counter for the node id (SPEC L8), not something of the transport — no
// address, connection, session or stream id — and it is how an operator
// sees a node reconnecting (every new session is a new generation).
package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/events"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/encoding/protojson"
)

// StatusSource gives the node and provider projection (the pool).
type StatusSource interface {
	Snapshot() []pool.NodeSnapshot
	Stats() (leases, waiters int)
}

// EventSource is the droppable node-event fan-out.
type EventSource interface {
	Subscribe(buf int) (<-chan events.Event, func())
	Dropped() uint64
}

// RoutingSource gives each model group's routing mode and its
// prefix_affinity decisions (the pool, R1).
type RoutingSource interface {
	Routing() []pool.GroupRouting
}

// Counter is one extra metric family other packages export: name, help, and
// samples keyed by a pre-rendered, bounded label set (e.g. `code="200"`).
type Counter struct {
	Name, Help, Type string
	Samples          func() map[string]float64
}

// Collector writes metric families of its own in the text format 0.0.4
// (e.g. access.Metrics: request counts, latencies, tokens).
type Collector interface {
	WritePrometheus(w io.Writer) error
}

// RecentSource lists the last failed requests (access.Recent).
type RecentSource interface {
	List() []access.RecentError
}

// PayloadSource says, for each ready node, whether it runs the Edge's
// current config payload (SPEC N2; the transport): "current", "outdated"
// (a refresh failed or is on its way) or "restart_required" (the node
// answered RESTART_REQUIRED and runs an older payload until restarted).
type PayloadSource interface {
	NodePayloads() map[string]string
}

// ConfigErrorSource, when the PayloadSource is one too, says why a node
// could not run the Edge's config (SPEC N2): "config_error" in /status,
// connected or not (a node that refused the payload at registration is
// not connected).
type ConfigErrorSource interface {
	ConfigErrors() map[string]string
}

// WaitingSource gives the queue's waiting requests per key ("" in open
// mode) and per priority class, highest first (the pool, SPEC G6).
type WaitingSource interface {
	Waiting() (byKey map[string]int, byClass [pool.NumPriorities]int)
}

// GroupSource gives the model groups' queues (the pool).
type GroupSource interface {
	Groups() []pool.GroupSnapshot
}

// Options configures the admin handler.
type Options struct {
	Status StatusSource
	// Routing, when set, adds the routing fields to "models" in /status
	// and iop_edge_routing_decisions_total to /metrics.
	Routing RoutingSource
	// Groups, when set, adds the queue fields to "models" in /status.
	Groups GroupSource
	// Waiting, when set, adds "queue" to /status: the waiting requests by
	// key and by priority class (SPEC G6).
	Waiting    WaitingSource
	Events     EventSource
	Metrics    []Counter
	Collectors []Collector
	// Recent, when set, is shown as "recent_errors" in /status.
	Recent RecentSource
	// Payloads, when set, adds "config" to each connected node in /status.
	Payloads PayloadSource
	// Access, when set, is called for every request (guard): the admin
	// token and the allowed Host names. nil = no token, IP literals and
	// localhost only.
	Access  func() Access
	Pprof   bool
	Version string

	// Keys, when set, adds per-key usage to /status ("keys", keys.go)
	// and serves GET /status/keys.
	Keys KeySource
	// Series, when set, is served as GET /series and drawn on the page.
	Series SeriesSource
	// Batches, when set, adds the batches in progress per key to /status
	// ("batches") and the page (SPEC X6).
	Batches BatchSource
	// Discovered, when set, adds each node's "discovered" models, by
	// adapter, to /status (SPEC D1: what its backends serve now).
	Discovered func() map[string]map[string][]string
}

// New returns the admin http.Handler.
func New(o Options) http.Handler {
	mux := http.NewServeMux()
	page := pageTemplate()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { servePage(w, page, o.Version) })
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) { serveStatus(w, o) })
	mux.HandleFunc("GET /status/keys", func(w http.ResponseWriter, r *http.Request) { serveKeys(w, o.Keys) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) { serveMetrics(w, o) })
	mux.HandleFunc("GET /series", func(w http.ResponseWriter, r *http.Request) { serveSeries(w, o.Series) })
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) { serveEvents(w, r, o.Events) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	if o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return guard(mux, o.Access)
}

var providerJSON = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// serveStatus writes {"nodes":[{"id","connected","generation","draining",
// "ready_since","config","providers":[…]}],"models":[…],"recent_errors":[…]}.
// ready_since (RFC 3339) and generation are present only while connected,
// and so is "config" (with Payloads: whether the node runs the current
// config payload, SPEC N2) and "discovered" (with Discovered: adapter →
// the models its backend lists, SPEC D1); draining only while true.
// "config_error" when the node could not run the Edge's config
// (ConfigErrorSource), connected or not. "models" lists the model groups when a group or
// routing source is set: {"name","waiters","long_waiters","candidates",
// "live"} from Groups and {"routing","decisions":{"prefix_hit","hash",
// "fallback","yield"},"hit_ratio"} from Routing (R1; hit_ratio is prefix_hit
// over all decisions, 0 without any). "queue" with Waiting:
// {"waiting_by_key":{"team-a":3,"_open":1},"waiting_by_class":{"critical":0,
// "interactive":3,"batch":1}} (keys that wait only; _open is open mode's).
// recent_errors only with Recent.
func serveStatus(w http.ResponseWriter, o Options) {
	var buf bytes.Buffer
	buf.WriteString(`{"nodes":[`)
	var payloads, configErrs map[string]string
	var discovered map[string]map[string][]string
	if o.Discovered != nil {
		discovered = o.Discovered()
	}
	if o.Payloads != nil {
		payloads = o.Payloads.NodePayloads()
		if ce, ok := o.Payloads.(ConfigErrorSource); ok {
			configErrs = ce.ConfigErrors()
		}
	}
	for i, n := range o.Status.Snapshot() {
		if i > 0 {
			buf.WriteByte(',')
		}
		id, _ := json.Marshal(n.Node)
		fmt.Fprintf(&buf, `{"id":%s,"connected":%t`, id, n.Connected)
		if n.Connected {
			fmt.Fprintf(&buf, `,"generation":%d,"ready_since":%q`, n.Generation, n.ReadySince.UTC().Format(time.RFC3339))
			if n.Draining {
				buf.WriteString(`,"draining":true`)
			}
			if st := payloads[n.Node]; st != "" {
				b, _ := json.Marshal(st)
				fmt.Fprintf(&buf, `,"config":%s`, b)
			}
			if d := discovered[n.Node]; len(d) > 0 {
				b, _ := json.Marshal(d)
				buf.WriteString(`,"discovered":`)
				buf.Write(b)
			}
		}
		if e := configErrs[n.Node]; e != "" {
			b, _ := json.Marshal(e)
			fmt.Fprintf(&buf, `,"config_error":%s`, b)
		}
		buf.WriteString(`,"providers":[`)
		for j, p := range n.Providers {
			if j > 0 {
				buf.WriteByte(',')
			}
			b, err := providerJSON.Marshal(p)
			if err != nil {
				http.Error(w, "status: "+err.Error(), http.StatusInternalServerError)
				return
			}
			buf.Write(compactJSON(b))
		}
		buf.WriteString(`]}`)
	}
	buf.WriteByte(']')
	if o.Groups != nil || o.Routing != nil {
		writeModels(&buf, o.Groups, o.Routing)
	}
	if o.Waiting != nil {
		writeWaiting(&buf, o.Waiting)
	}
	if o.Keys != nil {
		writeKeys(&buf, o.Keys, time.Now())
	}
	if o.Batches != nil {
		b, _ := json.Marshal(o.Batches.InProgress())
		buf.WriteString(`,"batches":`)
		buf.Write(b)
	}
	if o.Recent != nil {
		b, _ := json.Marshal(o.Recent.List())
		buf.WriteString(`,"recent_errors":`)
		buf.Write(b)
	}
	buf.WriteString("}\n")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(buf.Bytes())
}

func compactJSON(b []byte) []byte {
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return b
	}
	return out.Bytes()
}

// writeModels appends ,"models":[…] (see serveStatus): groups in config
// order, then any routed model the group source does not list.
func writeModels(buf *bytes.Buffer, gs GroupSource, rs RoutingSource) {
	var groups []pool.GroupSnapshot
	if gs != nil {
		groups = gs.Groups()
	}
	routes := map[string]pool.GroupRouting{}
	var order []string
	if rs != nil {
		for _, g := range rs.Routing() {
			routes[g.Model] = g
			order = append(order, g.Model)
		}
	}
	buf.WriteString(`,"models":[`)
	n := 0
	one := func(name string, g *pool.GroupSnapshot) {
		if n > 0 {
			buf.WriteByte(',')
		}
		n++
		nb, _ := json.Marshal(name)
		fmt.Fprintf(buf, `{"name":%s`, nb)
		if g != nil {
			fmt.Fprintf(buf, `,"waiters":%d,"long_waiters":%d,"candidates":%d,"live":%d`, g.Waiters, g.LongWaiters, g.Candidates, g.Live)
		}
		if r, ok := routes[name]; ok {
			mode, _ := json.Marshal(r.Mode)
			fmt.Fprintf(buf, `,"routing":%s,"decisions":{"prefix_hit":%d,"hash":%d,"fallback":%d,"yield":%d},"hit_ratio":%s`,
				mode, r.PrefixHit, r.Hash, r.Fallback, r.Yield, strconv.FormatFloat(r.HitRatio(), 'g', 4, 64))
			delete(routes, name)
		}
		buf.WriteByte('}')
	}
	for i := range groups {
		one(groups[i].Name, &groups[i])
	}
	for _, name := range order {
		if _, ok := routes[name]; ok {
			one(name, nil)
		}
	}
	buf.WriteByte(']')
}

func serveMetrics(w http.ResponseWriter, o Options) {
	var buf bytes.Buffer
	family := func(name, typ, help string) {
		fmt.Fprintf(&buf, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	snaps := o.Status.Snapshot()
	family("iop_edge_node_connected", "gauge", "1 while the configured node has a ready session (SPEC N3).")
	for _, n := range snaps {
		v := 0
		if n.Connected {
			v = 1
		}
		fmt.Fprintf(&buf, "iop_edge_node_connected{node=%s} %d\n", label(n.Node), v)
	}
	gauges := []struct {
		name, help string
		get        func(n pool.NodeSnapshot, i int) int32
	}{
		{"iop_edge_provider_capacity", "Effective capacity of the provider, requests.", func(n pool.NodeSnapshot, i int) int32 { return n.Providers[i].Capacity }},
		{"iop_edge_provider_in_flight", "Leases held on the provider (SPEC Q8).", func(n pool.NodeSnapshot, i int) int32 { return n.Providers[i].InFlight }},
		{"iop_edge_provider_long_in_flight", "Long-context leases held on the provider (SPEC Q8).", func(n pool.NodeSnapshot, i int) int32 { return n.Providers[i].LongInFlight }},
		{"iop_edge_provider_queued", "Pending requests counting the provider as a live candidate (SPEC Q8).", func(n pool.NodeSnapshot, i int) int32 { return n.Providers[i].Queued }},
	}
	for _, g := range gauges {
		family(g.name, "gauge", g.help)
		for _, n := range snaps {
			for i, p := range n.Providers {
				fmt.Fprintf(&buf, "%s{node=%s,provider=%s} %d\n", g.name, label(n.Node), label(p.ProviderId), g.get(n, i))
			}
		}
	}
	modelMetrics(&buf, snaps, family)
	leases, waiters := o.Status.Stats()
	family("iop_edge_leases", "gauge", "Provider leases held.")
	fmt.Fprintf(&buf, "iop_edge_leases %d\n", leases)
	family("iop_edge_waiters", "gauge", "Requests waiting for a provider.")
	fmt.Fprintf(&buf, "iop_edge_waiters %d\n", waiters)
	if o.Routing != nil {
		family("iop_edge_routing_decisions_total", "counter",
			"prefix_affinity routing decisions per model: prefix_hit (the holder of the longest prefix took it), hash (nobody held a prefix; the bounded-load hash chose), fallback (the holder was at capacity or the request had no conversation), yield (the prefill queued on the holder outweighed what it saves; another provider took it).")
		for _, g := range o.Routing.Routing() {
			if g.Mode != "prefix_affinity" && g.PrefixHit+g.Hash+g.Fallback+g.Yield == 0 {
				continue
			}
			for _, r := range []struct {
				name string
				n    uint64
			}{{"prefix_hit", g.PrefixHit}, {"hash", g.Hash}, {"fallback", g.Fallback}, {"yield", g.Yield}} {
				fmt.Fprintf(&buf, "iop_edge_routing_decisions_total{model=%s,result=%q} %d\n", label(g.Model), r.name, r.n)
			}
		}
	}
	if o.Events != nil {
		family("iop_edge_events_dropped_total", "counter", "Node events dropped by the droppable fan-out (SPEC N4).")
		fmt.Fprintf(&buf, "iop_edge_events_dropped_total %d\n", o.Events.Dropped())
	}
	for _, c := range o.Metrics {
		typ := c.Type
		if typ == "" {
			typ = "counter"
		}
		family(c.Name, typ, c.Help)
		samples := c.Samples()
		keys := make([]string, 0, len(samples))
		for k := range samples {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == "" {
				fmt.Fprintf(&buf, "%s %v\n", c.Name, samples[k])
			} else {
				fmt.Fprintf(&buf, "%s{%s} %v\n", c.Name, k, samples[k])
			}
		}
	}
	for _, c := range o.Collectors {
		_ = c.WritePrometheus(&buf)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write(buf.Bytes())
}

// serveEvents streams node events as SSE until the client leaves. Events a
// slow client cannot take are dropped by the bus, never queued (SPEC N4).
func serveEvents(w http.ResponseWriter, r *http.Request, src EventSource) {
	if src == nil {
		http.Error(w, "events unavailable", http.StatusNotFound)
		return
	}
	ch, cancel := src.Subscribe(64)
	defer cancel()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	ctx := r.Context()
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-keepalive.C:
			if _, err := w.Write([]byte(": keepalive\n\n")); err != nil {
				return
			}
			rc.Flush()
		case ev, ok := <-ch:
			if !ok {
				return
			}
			b, _ := json.Marshal(struct {
				Type     string `json:"type"`
				Node     string `json:"node"`
				Provider string `json:"provider,omitempty"`
				Time     string `json:"time"`
				Reason   string `json:"reason,omitempty"`
			}{ev.Type, ev.Node, ev.Provider, ev.Time.UTC().Format(time.RFC3339Nano), ev.Reason})
			if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Type, b); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
	}
}

// writeWaiting appends ,"queue":{…} (see serveStatus).
func writeWaiting(buf *bytes.Buffer, ws WaitingSource) {
	byKey, byClass := ws.Waiting()
	keys := make(map[string]int, len(byKey))
	for k, n := range byKey {
		if k == "" {
			k = access.OpenKey
		}
		keys[k] = n
	}
	b, _ := json.Marshal(keys)
	buf.WriteString(`,"queue":{"waiting_by_key":`)
	buf.Write(b)
	buf.WriteString(`,"waiting_by_class":{`)
	for i, p := range pool.Priorities {
		if i > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(buf, "%q:%d", p.String(), byClass[i])
	}
	buf.WriteString("}}")
}

// modelMetrics writes the residency of the models of managed and Ollama
// providers as their nodes last reported it (SPEC U8): whether each is
// loaded, and its load, failure, crash, eviction and idle-unload counters
// and summed load seconds since its node started (a node restart resets
// them, as Prometheus counters may). A model is listed once it was loaded
// or counted anything; the edge keeps at most 4096 per provider.
func modelMetrics(buf *bytes.Buffer, snaps []pool.NodeSnapshot, family func(name, typ, help string)) {
	type row struct {
		labels string
		m      *iop.ModelResidency
	}
	var rows []row
	for _, n := range snaps {
		for _, p := range n.Providers {
			for _, m := range p.Residency {
				if m.GetState() == protocol.ResidencyUnloaded && m.GetLoads()+m.GetLoadFailures()+m.GetCrashes()+m.GetEvictions()+m.GetIdleUnloads() == 0 {
					continue
				}
				rows = append(rows, row{fmt.Sprintf("node=%s,provider=%s,model=%s", label(n.Node), label(p.ProviderId), label(m.GetModel())), m})
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	family("iop_edge_model_loaded", "gauge", "1 while the model is loaded on the provider, by its node's last residency report (SPEC U6, U8).")
	for _, r := range rows {
		v := 0
		if r.m.GetState() == protocol.ResidencyLoaded {
			v = 1
		}
		fmt.Fprintf(buf, "iop_edge_model_loaded{%s} %d\n", r.labels, v)
	}
	for _, c := range []struct {
		name, help string
		get        func(*iop.ModelResidency) uint64
	}{
		{"iop_edge_model_loads_total", "Successful loads of the model on the provider since its node started (SPEC U8).", (*iop.ModelResidency).GetLoads},
		{"iop_edge_model_load_failures_total", "Failed loads of the model (its process exited or was not healthy in time) since its node started (SPEC U8).", (*iop.ModelResidency).GetLoadFailures},
		{"iop_edge_model_crashes_total", "Exits of the model's process after it was ready since its node started (SPEC U8).", (*iop.ModelResidency).GetCrashes},
		{"iop_edge_model_evictions_total", "Stops of the model to make room for another since its node started (SPEC U8).", (*iop.ModelResidency).GetEvictions},
		{"iop_edge_model_idle_unloads_total", "Stops of the model for idleness (Ollama: its keep_alive ran out) since its node started (SPEC U8).", (*iop.ModelResidency).GetIdleUnloads},
	} {
		family(c.name, "counter", c.help)
		for _, r := range rows {
			fmt.Fprintf(buf, "%s{%s} %d\n", c.name, r.labels, c.get(r.m))
		}
	}
	family("iop_edge_model_load_seconds_total", "counter", "Summed time of the model's successful loads since its node started, seconds (÷ iop_edge_model_loads_total = the mean load; SPEC U8).")
	for _, r := range rows {
		fmt.Fprintf(buf, "iop_edge_model_load_seconds_total{%s} %s\n", r.labels, strconv.FormatFloat(float64(r.m.GetLoadMsTotal())/1000, 'f', 3, 64))
	}
}

// label is s as a quoted label value of the text format (Prometheus
// exposition format 0.0.4): only backslash, double quote and line feed
// escaped, bytes that are not UTF-8 replaced by U+FFFD. strconv.Quote's
// \x00, \t or \u2028, which a node's model name may bring (SPEC U8), are
// not escapes of the format: a scraper would refuse the whole page.
func label(s string) string {
	return `"` + access.EscapeLabel(strings.ToValidUTF8(s, "\uFFFD")) + `"`
}
