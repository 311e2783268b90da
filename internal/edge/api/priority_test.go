package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/edge/config"
	"iop/internal/edge/pool"
	"iop/internal/edge/reply"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// TestRequestClass: the class, key, weight, completion bound and
// local-only mark (SPEC V3: only the local-only key's) each
// request asks the pool with (SPEC G1, G4): the key's default class,
// lowered or raised by Iop-Priority or service_tier as documented, never
// above the key's max_class; a bad header is a 400 naming it, asking
// nothing of the pool.
func TestRequestClass(t *testing.T) {
	leakcheck.Check(t)
	const chat = `{"model":"tiny","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`
	tier := func(v string) string { return strings.Replace(chat, `"model"`, `"service_tier":"`+v+`","model"`, 1) }
	rows := []struct {
		name, path, body string
		key              string // "" = open mode
		hdr              []string
		want             pool.Priority
		status           int
	}{
		{"G4 open mode: interactive", "/v1/chat/completions", chat, "", nil, pool.PriorityInteractive, 200},
		{"G4 open mode: the header lowers to batch", "/v1/chat/completions", chat, "", []string{"Iop-Priority", "batch"}, pool.PriorityBatch, 200},
		{"G4 open mode: critical is above the ceiling", "/v1/chat/completions", chat, "", []string{"Iop-Priority", "critical"}, pool.PriorityInteractive, 200},
		{"G4 OpenAI service_tier flex is batch", "/v1/chat/completions", tier("flex"), "", nil, pool.PriorityBatch, 200},
		{"G4 OpenAI service_tier auto keeps the key's class", "/v1/chat/completions", tier("auto"), "", nil, pool.PriorityInteractive, 200},
		{"G4 Anthropic service_tier standard_only is batch", "/v1/messages", tier("standard_only"), "", nil, pool.PriorityBatch, 200},
		{"G4 the header wins over service_tier", "/v1/chat/completions", tier("flex"), "", []string{"Iop-Priority", "interactive"}, pool.PriorityInteractive, 200},
		{"G4 the key's default class", "/v1/chat/completions", chat, "bulk", nil, pool.PriorityBatch, 200},
		{"G4 a key may rise to its max class", "/v1/chat/completions", tier("priority"), "bulk", nil, pool.PriorityCritical, 200},
		{"G4 a key without a higher max class stays", "/v1/chat/completions", chat, "team", []string{"Iop-Priority", "critical"}, pool.PriorityInteractive, 200},
		{"G4 a bad header is a 400 naming it", "/v1/chat/completions", chat, "", []string{"Iop-Priority", "urgent"}, 0, 400},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			keys := map[string]string{}
			if row.key != "" {
				keys = map[string]string{"bulk": "sk-bulk", "team": "sk-team"}
			}
			r := &rig{fp: newFakePool(protocol.TypeOllama), st: newFakeStream("run-1"), cfg: testConfig(keys)}
			for i := range r.cfg.APIKeys {
				if k := &r.cfg.APIKeys[i]; k.Principal == "bulk" {
					k.Weight, k.Class, k.MaxClass = 3, config.ClassBatch, config.ClassCritical
				} else if k.Principal == "team" {
					k.LocalOnly = true // V3
				}
			}
			r.fp.err = pool.ErrUnknownModel
			r.p, r.d = r.fp, newFakeDispatcher(r.st)
			r.start(t)
			hdr := row.hdr
			if row.key != "" {
				hdr = append(hdr, "Authorization", "Bearer sk-"+row.key)
			}
			resp, body := r.do(t, "POST", row.path, row.body, hdr...)
			reqs := r.fp.requests()
			if row.status == 400 {
				if resp.StatusCode != 400 || !strings.Contains(body, "Iop-Priority") || len(reqs) != 0 {
					t.Fatalf("got %d %s and %d pool requests, want a 400 naming Iop-Priority and none", resp.StatusCode, body, len(reqs))
				}
				return
			}
			if len(reqs) != 1 {
				t.Fatalf("pool requests %+v (answer %d %s), want one", reqs, resp.StatusCode, body)
			}
			q := reqs[0]
			wantWeight := 1
			if row.key == "bulk" {
				wantWeight = 3
			}
			if q.LocalOnly != (row.key == "team") {
				t.Fatalf("V3 pool request local-only %v for key %q, want it for team only", q.LocalOnly, row.key)
			}
			if q.Priority != row.want || q.Key != row.key || q.Weight != wantWeight || q.MaxTokens != 50 {
				t.Fatalf("pool request class %v key %q weight %d max_tokens %d; want %v %q %d 50", q.Priority, q.Key, q.Weight, q.MaxTokens,
					row.want, row.key, wantWeight)
			}
		})
	}
}

// TestWithPriority: the edge's own callers (the batch runner) ask for a
// class through the context, ahead of the header (SPEC G4).
func TestWithPriority(t *testing.T) {
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	req.Header.Set(HeaderPriority, "interactive")
	acc := &reply.Recorder{}
	sched, e := decideSchedule(WithPriority(context.Background(), pool.PriorityBatch), req, &epChat, "", acc)
	if e != nil || sched.Priority != pool.PriorityBatch || acc.Rec.Class != "batch" {
		t.Fatalf("class %v (record %q) err %v, want batch", sched.Priority, acc.Rec.Class, e)
	}
}

// TestKeyShareAnswer: a request refused for its key's share of the queue
// gets 429 with Retry-After, saying it was this key's share (SPEC G3).
func TestKeyShareAnswer(t *testing.T) {
	leakcheck.Check(t)
	r := newRig(t, protocol.TypeOllama, nil)
	r.fp.err = &pool.KeyShareError{Model: "tiny", Key: "", Share: 4, Waiting: 4, RetryAfter: pool.KeyShareRetryAfter}
	if !errors.Is(r.fp.err, pool.ErrQueueFull) {
		t.Fatal("a KeyShareError is no ErrQueueFull")
	}
	resp, body := r.do(t, "POST", "/v1/chat/completions", chatBody)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, "this key's share of the queue") {
		t.Fatalf("got %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// TestRedispatchKeepsPlace: a re-dispatch asks the pool again with the
// arrival number of its first lease, and the same class (SPEC G5).
func TestRedispatchKeepsPlace(t *testing.T) {
	leakcheck.Check(t)
	a, b := withType(leaseA, protocol.TypeOllama), withType(leaseB, protocol.TypeOllama)
	a.Arrival = 42
	r := newRetryRig(t, retryConfig(2), Options{}, a, b)
	f := failures()[0]
	r.stream(t, "a", f.events, nil)
	r.stream(t, "b", []*iop.RunEvent{evStart(), evDelta(2, "hello"), evComplete(3, "hello", "stop", nil, nil)}, nil)
	req, _ := http.NewRequest("POST", r.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set(HeaderPriority, "batch")
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reqs := r.p.reqs
	if resp.StatusCode != 200 || len(reqs) != 2 || reqs[0].Arrival != 0 || reqs[1].Arrival != 42 || reqs[1].Priority != pool.PriorityBatch {
		t.Fatalf("status %d, pool requests %+v; want the second with arrival 42 and class batch", resp.StatusCode, reqs)
	}
}

// TestG7ClassReachesNode: the class a request is queued in goes to the node
// with it, on the tunnel (priority_class of the ProviderTunnelRequest) and
// on the run path (of the RunRequest), so that a node whose backend
// schedules by priority can pass it on (SPEC G7).
func TestG7ClassReachesNode(t *testing.T) {
	leakcheck.Check(t)
	rows := []struct {
		name, typ, key string
		hdr            []string
		want           string
	}{
		{"G7 tunnel: open mode is interactive", protocol.TypeOpenAICompat, "", nil, protocol.ClassInteractive},
		{"G7 tunnel: the key's default class", protocol.TypeOpenAICompat, "bulk", nil, protocol.ClassBatch},
		{"G7 tunnel: a class the key may ask for", protocol.TypeOpenAICompat, "bulk", []string{"Iop-Priority", "critical"}, protocol.ClassCritical},
		{"G7 tunnel: never above the ceiling", protocol.TypeOpenAICompat, "", []string{"Iop-Priority", "critical"}, protocol.ClassInteractive},
		{"G7 run: the header's class", protocol.TypeOllama, "", []string{"Iop-Priority", "batch"}, protocol.ClassBatch},
		{"G7 run: a class the key may ask for", protocol.TypeOllama, "bulk", []string{"Iop-Priority", "critical"}, protocol.ClassCritical},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			keys := map[string]string{}
			if row.key != "" {
				keys = map[string]string{"bulk": "sk-bulk"}
			}
			r := &rig{fp: newFakePool(row.typ), st: newFakeStream("run-1"), cfg: testConfig(keys)}
			for i := range r.cfg.APIKeys {
				if k := &r.cfg.APIKeys[i]; k.Principal == "bulk" {
					k.Class, k.MaxClass = config.ClassBatch, config.ClassCritical
				}
			}
			r.p, r.d = r.fp, newFakeDispatcher(r.st)
			r.start(t)
			hdr := row.hdr
			if row.key != "" {
				hdr = append(hdr, "Authorization", "Bearer sk-"+row.key)
			}
			if row.typ == protocol.TypeOpenAICompat {
				r.st.frames(fStart(200, "Content-Type", "application/json"), fBody([]byte(`{}`)), fEnd())
			} else {
				r.st.run(evStart(), evComplete(2, "hello", "stop", nil, nil))
			}
			if resp, body := r.do(t, "POST", "/v1/chat/completions", chatBody, hdr...); resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			var got string
			if row.typ == protocol.TypeOpenAICompat {
				got = r.d.lastTunnel().GetPriorityClass()
				if b, want := string(r.d.lastTunnel().GetBody()), strings.Replace(chatBody, `"tiny"`, `"tiny:latest"`, 1); b != want {
					t.Errorf("tunnel body %s, want %s: the client's with only model replaced (the node sets the backend's field)", b, want)
				}
			} else {
				got = r.d.lastRun().GetPriorityClass()
			}
			if got != row.want {
				t.Fatalf("priority_class %q, want %q", got, row.want)
			}
		})
	}
}
