package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/outlier"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// evidenceRig is a Handler with the real provider pool and the real
// passive-health Detector (internal/edge/outlier) over a streamDispatcher:
// what a failure before the first byte does to the request (re-dispatch)
// and to the provider (ejection) end to end. Model "tiny" has the routes
// of slots: n1/ollama, n2/ollama, … on the credential slots given.
type evidenceRig struct {
	p   *pool.Pool
	od  *outlier.Detector
	d   *streamDispatcher
	srv *httptest.Server
}

var evidenceKeys = map[string]string{"team-a": "sk-team-a", "team-b": "sk-team-b"}

func newEvidenceRig(t *testing.T, slots ...string) *evidenceRig {
	t.Helper()
	cfg := retryConfig(len(slots))
	for p, k := range evidenceKeys {
		cfg.APIKeys = append(cfg.APIKeys, config.APIKey{Principal: p, KeySHA256: keySum(k)})
	}
	pc := pool.Config{MaxWaiters: 8, WaitTimeout: 2 * time.Second}
	g := pool.Group{Name: "tiny"}
	for i, slot := range slots {
		k := pool.Key{Node: cfg.Models[0].Providers[i].Node, Provider: "ollama"}
		pc.Nodes = append(pc.Nodes, k.Node)
		pc.Resources = append(pc.Resources, pool.Resource{Key: k, Type: protocol.TypeOllama, Category: "local_inference",
			Capacity: 4, LongCapacity: 4, Operations: []string{protocol.OpChatCompletions}})
		g.Candidates = append(g.Candidates, pool.Candidate{Key: k, Target: "tiny:latest", StallTimeoutMs: 60000, Slot: slot})
	}
	pc.Groups = []pool.Group{g}
	r := &evidenceRig{p: pool.New(pc, nil), d: &streamDispatcher{}}
	for _, n := range pc.Nodes {
		r.p.NodeReady(n, 1)
	}
	r.od = outlier.New(outlier.Options{Pool: r.p, Policy: outlier.Policy{Base: 30 * time.Second, Max: time.Minute}})
	t.Cleanup(r.od.Close)
	h := New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Outlier: r.od,
		Now: time.Now, NewID: seqIDs()})
	r.srv = httptest.NewServer(h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	return r
}

func (r *evidenceRig) stream(t *testing.T, evs ...*iop.RunEvent) {
	st := newFakeStream("s")
	t.Cleanup(st.kill)
	st.run(evs...)
	r.d.mu.Lock()
	r.d.streams = append(r.d.streams, st)
	r.d.mu.Unlock()
}

// post sends a chat request with principal's key; it returns the status.
func (r *evidenceRig) post(t *testing.T, principal string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+evidenceKeys[principal])
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// cooling lists the providers the pool shows ejected.
func (r *evidenceRig) cooling() []string {
	var out []string
	for _, ns := range r.p.Snapshot() {
		for _, p := range ns.Providers {
			if p.Health == pool.HealthCooling {
				out = append(out, ns.Node+"/"+p.ProviderId)
			}
		}
	}
	return out
}

// What counts as evidence when a request fails before the first byte, one
// row per rule, end to end through the real pool and passive health:
//   - C6: a re-dispatch of a failed request stays within the credential
//     slot of the route it was bound to;
//   - H8: no terminal affects provider health before its typed adapter and
//     target are checked against the lease it ends (the lease still goes
//     back exactly once);
//   - a failure the request's own input may have caused (a 500, a reset
//     before the head) cools a shared provider only when corroborated: by
//     another provider answering the same request, or by a second
//     principal's request failing the same way (docs/operating.md,
//     "Passive health"); the upstream's own state (503, 429, connect)
//     ejects at once.
//
// Each row sends its requests in order (principal → wanted status), the
// dispatched streams answering in order, then checks which nodes the
// requests went to and which providers are cooling.
func TestFailureEvidence(t *testing.T) {
	ok := []*iop.RunEvent{evStart(), evDelta(2, "hello"), evComplete(3, "hello", "stop", nil, nil)}
	status := func(s int32) []*iop.RunEvent { return []*iop.RunEvent{evStart(), runStatus(s, 0, "boom: boom")} }
	naming := func(adapter, target string, evs []*iop.RunEvent) []*iop.RunEvent {
		last := evs[len(evs)-1]
		last.Adapter, last.Target = adapter, target
		return evs
	}
	connect := func() []*iop.RunEvent {
		return []*iop.RunEvent{evStart(), evError(2, protocol.CodeUpstreamConnect.String(), "connection refused")}
	}
	overCapacity := []*iop.RunEvent{evStart(), evError(2, protocol.CodeOverCapacity.String(), "adapter \"ollama\" is at its capacity of 4 concurrent requests")}
	type req struct {
		principal string
		want      int
	}
	rows := []struct {
		name       string
		slots      []string
		streams    [][]*iop.RunEvent
		reqs       []req
		dispatched []string // node of each dispatch, in order
		cooling    []string
	}{
		{name: "C6 slot-a's route answers 503: never resent on slot-b; the client gets the 503",
			slots: []string{"slot-a", "slot-b"}, streams: [][]*iop.RunEvent{status(503), ok},
			reqs: []req{{"team-a", 503}}, dispatched: []string{"n1"}, cooling: []string{"n1/ollama"}},
		{name: "C6 a re-dispatch takes another route of the same slot",
			slots: []string{"slot-a", "slot-a"}, streams: [][]*iop.RunEvent{status(503), ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n2"}, cooling: []string{"n1/ollama"}},
		{name: "C6 with slots a, b, a the re-dispatch skips b",
			slots: []string{"slot-a", "slot-b", "slot-a"}, streams: [][]*iop.RunEvent{status(503), ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n3"}, cooling: []string{"n1/ollama"}},
		{name: "C6 E4 slot-a's route refuses over capacity, then frees: the request waits for it, never slot-b",
			slots: []string{"slot-a", "slot-b"}, streams: [][]*iop.RunEvent{overCapacity, ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n1"}},
		{name: "C6 E4 over capacity with slots a, b, a: the other route of slot-a takes it",
			slots: []string{"slot-a", "slot-b", "slot-a"}, streams: [][]*iop.RunEvent{overCapacity, ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n3"}},
		{name: "E4 over capacity with one shared slot: another route takes it",
			slots: []string{"slot-a", "slot-a"}, streams: [][]*iop.RunEvent{overCapacity, ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n2"}},
		{name: "E4 over capacity without slots: another route takes it",
			slots: []string{"", ""}, streams: [][]*iop.RunEvent{overCapacity, ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n2"}},
		{name: "H8 a connect failure naming another adapter ejects nothing; the request still fails over",
			slots: []string{"", ""}, streams: [][]*iop.RunEvent{naming("other", "tiny:latest", connect()), ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n2"}},
		{name: "H8 a 503 naming another target ejects nothing",
			slots: []string{""}, streams: [][]*iop.RunEvent{naming("ollama", "other:latest", status(503))},
			reqs: []req{{"team-a", 503}}, dispatched: []string{"n1"}},
		{name: "H8 the same connect failure naming the lease's adapter and target ejects",
			slots: []string{"", ""}, streams: [][]*iop.RunEvent{connect(), ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n2"}, cooling: []string{"n1/ollama"}},
		{name: "one key's input answered 500 twice cools nothing: the other key is served at once",
			slots: []string{""}, streams: [][]*iop.RunEvent{status(500), status(500), ok},
			reqs: []req{{"team-a", 502}, {"team-a", 502}, {"team-b", 200}}, dispatched: []string{"n1", "n1", "n1"}},
		{name: "a reset before the head is the input's too while one key meets it",
			slots: []string{""}, streams: [][]*iop.RunEvent{
				{evStart(), evError(2, protocol.CodeUpstreamReset.String(), "EOF")},
				{evStart(), evError(2, protocol.CodeUpstreamReset.String(), "EOF")}, ok},
			reqs: []req{{"team-a", 502}, {"team-a", 502}, {"team-b", 200}}, dispatched: []string{"n1", "n1", "n1"}},
		{name: "a 500 for two principals is the provider's: ejected",
			slots: []string{""}, streams: [][]*iop.RunEvent{status(500), status(500)},
			reqs: []req{{"team-a", 502}, {"team-b", 502}}, dispatched: []string{"n1", "n1"}, cooling: []string{"n1/ollama"}},
		{name: "a success between clears the suspicion",
			slots: []string{""}, streams: [][]*iop.RunEvent{status(500), ok, status(500)},
			reqs: []req{{"team-a", 502}, {"team-b", 200}, {"team-b", 502}}, dispatched: []string{"n1", "n1", "n1"}},
		{name: "a 500 that another provider answered for the same request is the first provider's: ejected",
			slots: []string{"", ""}, streams: [][]*iop.RunEvent{status(500), ok},
			reqs: []req{{"team-a", 200}}, dispatched: []string{"n1", "n2"}, cooling: []string{"n1/ollama"}},
		{name: "a 500 that every provider gives the same request is the input's: nothing cools",
			slots: []string{"", ""}, streams: [][]*iop.RunEvent{status(500), status(500)},
			reqs: []req{{"team-a", 502}}, dispatched: []string{"n1", "n2"}},
		{name: "a 503 is the upstream's own state: one key's request ejects",
			slots: []string{""}, streams: [][]*iop.RunEvent{status(503)},
			reqs: []req{{"team-a", 503}}, dispatched: []string{"n1"}, cooling: []string{"n1/ollama"}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newEvidenceRig(t, row.slots...)
			for _, s := range row.streams {
				r.stream(t, s...)
			}
			for i, q := range row.reqs {
				if got, body := r.post(t, q.principal); got != q.want {
					t.Fatalf("request %d (%s): status %d, want %d; body %s", i, q.principal, got, q.want, body)
				}
			}
			var nodes []string
			for _, d := range r.d.dispatched() {
				nodes = append(nodes, d.Node)
			}
			if strings.Join(nodes, ",") != strings.Join(row.dispatched, ",") {
				t.Errorf("dispatched to %v, want %v", nodes, row.dispatched)
			}
			if got := r.cooling(); strings.Join(got, ",") != strings.Join(row.cooling, ",") {
				t.Errorf("cooling %v, want %v", got, row.cooling)
			}
			r.srv.Close() // waits for the handlers
			if leases, waiters := r.p.Stats(); leases != 0 || waiters != 0 {
				t.Errorf("Q2: %d leases held and %d waiters after every request ended, want none", leases, waiters)
			}
		})
	}
}
