package api

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/config"
	"iop/internal/edge/exchange"
	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/edge/pool"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// afterFleet: big on n1/ollama (capacity 1) falls back to small (n2/ollama)
// when unavailable; small falls back to hosted (n3/hosted, a remote API)
// when unavailable. No condition moves a request on arrival while big is
// up: what moves it is what happens after its admission. maxAttempts is
// big's models[].max_attempts (0: every provider once, the chain's
// included).
func afterFleet(maxAttempts int) (*config.Config, pool.Config) {
	cfg, pc := fallbackFleet("")
	cfg.Models[0].Fallbacks = []config.Fallback{{Model: "small", On: []string{config.OnUnavailable}}}
	cfg.Models[0].MaxAttempts = maxAttempts
	pc.Groups[0].Timed = false
	pc.WaitTimeout = 5 * time.Second
	return cfg, pc
}

// SPEC V1, V2, V3, H11, L8: a request admitted to big (big looked able to
// serve it) whose group then cannot serve it before any byte reached the
// client — its only provider failed it (a 503, a lost node session), or,
// while it waited in big's queue, big's node was fenced or its provider
// ejected — is decided again and served by small: the answer is small's,
// 200, naming big, with Iop-Served-Model small, counted in
// iop_edge_fallbacks_total{from="big",to="small",reason="unavailable"}.
// Never after a byte reached the client (the stream ends with its error
// event), never once max_attempts is spent, never outside the key's scope,
// never to a remote group for a local-only key; through the chain (two
// hops) when small is down too. On the real pool; fails without the
// fallback after admission (the client got big's failure, or waited out
// the queue).
func TestFallbackAfterAdmission(t *testing.T) {
	fail503 := func() []*iop.RunEvent {
		return []*iop.RunEvent{evStart(), runStatus(503, 0, "503 Service Unavailable: loading")}
	}
	answer := func() []*iop.RunEvent { return []*iop.RunEvent{evStart(), evComplete(2, "hi", "stop", nil, nil)} }
	for _, row := range []struct {
		name        string
		maxAttempts int
		ready       []string
		key         string
		stream      bool
		streams     [][]*iop.RunEvent  // nil entry: a session lost before any event
		queued      func(p *pool.Pool) // with big's one slot held, what happens while the request waits
		wantNodes   []string
		wantCode    int
		wantServe   string // Iop-Served-Model
		wantCount   string // the fallbacks series counted, "" = none
		wantInBody  string
	}{
		{name: "V1 H11 big's only provider answers 503 before any byte: small answers", ready: []string{"n1", "n2", "n3"}, key: "any",
			streams: [][]*iop.RunEvent{fail503(), answer()}, wantNodes: []string{"n1", "n2"}, wantCode: 200, wantServe: "small",
			wantCount: `from="big",to="small",reason="unavailable"`, wantInBody: `"hi"`},
		{name: "V1 L8 big's node session is lost before any byte: small answers", ready: []string{"n1", "n2", "n3"}, key: "any",
			streams: [][]*iop.RunEvent{nil, answer()}, wantNodes: []string{"n1", "n2"}, wantCode: 200, wantServe: "small",
			wantCount: `from="big",to="small",reason="unavailable"`, wantInBody: `"hi"`},
		{name: "V1 L8 queued on big, big's node fenced: small answers", ready: []string{"n1", "n2", "n3"}, key: "any",
			queued:  func(p *pool.Pool) { p.NodeFenced("n1", 1) },
			streams: [][]*iop.RunEvent{answer()}, wantNodes: []string{"n2"}, wantCode: 200, wantServe: "small",
			wantCount: `from="big",to="small",reason="unavailable"`, wantInBody: `"hi"`},
		{name: "V1 H9 queued on big, big's provider cooling: small answers", ready: []string{"n1", "n2", "n3"}, key: "any",
			queued: func(p *pool.Pool) {
				p.Eject(pool.Key{Node: "n1", Provider: "ollama"}, time.Now().Add(time.Minute), "status")
			},
			streams: [][]*iop.RunEvent{answer()}, wantNodes: []string{"n2"}, wantCode: 200, wantServe: "small",
			wantCount: `from="big",to="small",reason="unavailable"`, wantInBody: `"hi"`},
		{name: "V1 two hops: small is down too, hosted answers", ready: []string{"n1", "n3"}, key: "any",
			streams: [][]*iop.RunEvent{fail503(), answer()}, wantNodes: []string{"n1", "n3"}, wantCode: 200, wantServe: "hosted",
			wantCount: `from="big",to="hosted",reason="unavailable"`, wantInBody: `"hi"`},
		{name: "H11 a byte reached the client: the stream ends with its error event, no fallback", ready: []string{"n1", "n2", "n3"}, key: "any",
			stream:    true,
			streams:   [][]*iop.RunEvent{{evStart(), evDelta(2, "a"), evError(3, protocol.CodeUpstreamError.String(), "broken")}},
			wantNodes: []string{"n1"}, wantCode: 200, wantServe: "big", wantInBody: `"error"`},
		{name: "V1 H11 max_attempts 1 is spent: big's failure answers", maxAttempts: 1, ready: []string{"n1", "n2", "n3"}, key: "any",
			streams: [][]*iop.RunEvent{fail503()}, wantNodes: []string{"n1"}, wantCode: 503, wantServe: "big"},
		{name: "V2 a key scoped to big: big's failure answers", ready: []string{"n1", "n2", "n3"}, key: "big-only",
			streams: [][]*iop.RunEvent{fail503()}, wantNodes: []string{"n1"}, wantCode: 503, wantServe: "big"},
		{name: "V3 a local-only key with small down never reaches hosted: big's failure answers", ready: []string{"n1", "n3"}, key: "site",
			streams: [][]*iop.RunEvent{fail503()}, wantNodes: []string{"n1"}, wantCode: 503, wantServe: "big"},
	} {
		t.Run(row.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg, pc := afterFleet(row.maxAttempts)
				p := pool.New(pc, nil)
				for _, n := range row.ready {
					p.NodeReady(n, 1)
				}
				var held *pool.Lease
				if row.queued != nil {
					l, err := p.Acquire(t.Context(), pool.Request{Model: "big", Operation: protocol.OpChatCompletions})
					if err != nil {
						t.Fatal(err)
					}
					held = l
				}
				st := keystore.New()
				sec := map[string]string{}
				for _, s := range []keystore.Spec{{Name: "any"}, {Name: "big-only", Models: []string{"big"}}, {Name: "site", LocalOnly: true}} {
					k, err := st.Create(s, fixedNow().Add(-time.Hour))
					if err != nil {
						t.Fatal(err)
					}
					sec[s.Name] = k
				}
				set, err := keys.Build(nil, st, true, 1)
				if err != nil {
					t.Fatal(err)
				}
				d := &streamDispatcher{}
				for i, evs := range row.streams {
					fs := newFakeStream("run-" + string(rune('a'+i)))
					if evs == nil {
						fs.kill() // the node's session is lost before the first event
					} else {
						fs.run(evs...)
					}
					t.Cleanup(fs.kill)
					d.streams = append(d.streams, fs)
				}
				sink, ft := newAccessSink(), &fakeTracer{}
				h := New(Options{Config: func() *config.Config { return cfg }, Pool: p, Dispatcher: d, Now: fixedNow, NewID: seqIDs(), Keys: keys.New(set),
					AccessLog: slog.New(sink), Tracer: ft, TraceRatio: 1})
				body := `{"model":"big","messages":[{"role":"user","content":"hi"}]}`
				if row.stream {
					body = `{"model":"big","stream":true,"messages":[{"role":"user","content":"hi"}]}`
				}
				rec := httptest.NewRecorder()
				req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+sec[row.key])
				done := make(chan struct{})
				go func() {
					defer close(done)
					h.ServeHTTP(rec, req)
				}()
				if row.queued != nil {
					synctest.Wait() // the request waits in big's queue
					if _, waiters := p.Stats(); waiters != 1 {
						t.Fatalf("%d waiters, want the request queued in big", waiters)
					}
					row.queued(p)
				}
				<-done
				if held != nil {
					p.Release(held)
				}
				if rec.Code != row.wantCode {
					t.Fatalf("status %d, want %d: %s", rec.Code, row.wantCode, rec.Body)
				}
				var nodes []string
				for _, tg := range d.dispatched() {
					nodes = append(nodes, tg.Node)
				}
				if !slices.Equal(nodes, row.wantNodes) {
					t.Errorf("dispatched to %v, want %v", nodes, row.wantNodes)
				}
				if got := rec.Header().Get(exchange.HeaderServedModel); got != row.wantServe {
					t.Errorf("Iop-Served-Model %q, want %q", got, row.wantServe)
				}
				samples := h.ex.FallbackSamples()
				if row.wantCount == "" && len(samples) > 0 || row.wantCount != "" && (len(samples) != 1 || samples[row.wantCount] != 1) {
					t.Errorf("iop_edge_fallbacks_total %v, want %s 1", samples, row.wantCount)
				}
				if !strings.Contains(rec.Body.String(), row.wantInBody) {
					t.Errorf("body %s, want %s in it", rec.Body, row.wantInBody)
				}
				if row.wantCode == 200 && !row.stream {
					var got struct{ Model string }
					if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Model != "big" {
						t.Errorf("response model %q (%v), want the group asked for, big", got.Model, err)
					}
				}
				if leases, waiters := p.Stats(); leases != 0 || waiters != 0 {
					t.Errorf("Q2: %d leases and %d waiters left", leases, waiters)
				}
				// The access line and each attempt's span say what served it.
				synctest.Wait()
				sink.mu.Lock()
				lines := sink.lines
				sink.mu.Unlock()
				var line map[string]any
				for _, l := range lines {
					if l["msg"] == access.Msg {
						line = l
					}
				}
				wantServed, wantReason := "", ""
				if row.wantCount != "" {
					wantServed, wantReason = row.wantServe, "unavailable"
				}
				if line == nil || line["served_model"] != wantServed || line["fallback"] != wantReason || line["model"] != "big" {
					t.Errorf("access line %v, want model big, served_model %q, fallback %q", line, wantServed, wantReason)
				}
				var served []string
				for _, sp := range ft.last(t) {
					if sp.Name != "attempt" {
						continue
					}
					for _, a := range sp.Attrs {
						if a.Key == "iop.served_model" {
							served = append(served, a.Str)
						}
					}
				}
				if len(served) != len(row.wantNodes) || served[len(served)-1] != row.wantServe {
					t.Errorf("attempt spans' iop.served_model %v, want %d attempts, the last %s", served, len(row.wantNodes), row.wantServe)
				}
			})
		})
	}
}
