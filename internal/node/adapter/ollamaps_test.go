package adapter_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// fakeOllama serves /api/tags, /api/ps and /api/chat like Ollama 0.17.4:
// a chat loads its model, which stays in /api/ps until its expires_at
// (now + ttl), then leaves it. hold, when set, keeps a chat waiting
// before it answers.
type fakeOllama struct {
	mu        sync.Mutex
	loadedTil map[string]time.Time
	ttl       time.Duration
	hold      chan struct{}
	psCalls   int
	keepAlive []json.RawMessage
	chat      []byte
}

func (o *fakeOllama) handler(w http.ResponseWriter, r *http.Request, body []byte) {
	switch r.URL.Path {
	case "/api/tags":
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprint(w, `{"models":[{"name":"tiny:latest","model":"tiny:latest","size":5750784},{"name":"tiny-tool:latest","model":"tiny-tool:latest","size":5747712}]}`)
	case "/api/ps":
		o.mu.Lock()
		o.psCalls++
		var ms []string
		now := time.Now()
		for name, til := range o.loadedTil {
			if now.Before(til) {
				ms = append(ms, fmt.Sprintf(`{"name":%q,"model":%q,"size":5750784,"size_vram":0,"expires_at":%q,"context_length":4096}`,
					name, name, til.UTC().Format(time.RFC3339Nano)))
			}
		}
		o.mu.Unlock()
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprintf(w, `{"models":[%s]}`, strings.Join(ms, ","))
	case "/api/chat":
		var req struct {
			Model     string          `json:"model"`
			KeepAlive json.RawMessage `json:"keep_alive"`
		}
		_ = json.Unmarshal(body, &req)
		o.mu.Lock()
		o.keepAlive = append(o.keepAlive, req.KeepAlive)
		hold := o.hold
		o.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		o.mu.Lock()
		o.loadedTil[req.Model+":latest"] = time.Now().Add(o.ttl)
		o.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write(o.chat)
	default:
		http.NotFound(w, r)
	}
}

// residencyOf is the adapter's models' states and load times by model.
func residencyOf(s *adapter.Set, name string) map[string]*iop.ModelResidency {
	out := map[string]*iop.ModelResidency{}
	for _, a := range s.Residency() {
		if a.GetAdapter() == name {
			for _, m := range a.GetModels() {
				out[m.GetModel()] = m
			}
		}
	}
	return out
}

// waitResidency waits, woken by the Set's ResidencyChanged, until ok
// holds of the adapter's residency.
func waitResidency(t *testing.T, s *adapter.Set, name, what string, ok func(map[string]*iop.ModelResidency) bool) map[string]*iop.ModelResidency {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		ch := s.ResidencyChanged()
		r := residencyOf(s, name)
		if ok(r) {
			return r
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: never seen; last %v", what, r)
		}
	}
}

func state(r map[string]*iop.ModelResidency, model string) string { return r[model].GetState() }

// U6, U7: an Ollama adapter's residency comes from /api/ps (and its models
// from /api/tags): a model is unloaded until a request for it, loading
// while the node has a request for it that /api/ps does not show yet,
// loaded with its size and the load_duration Ollama reported once /api/ps
// lists it, and unloaded again when its expires_at passed — each seen
// without a poll of the session (the Set's ResidencyChanged), under the
// tagged and the bare name.
func TestOllamaResidency(t *testing.T) {
	leakcheck.Check(t)
	o := &fakeOllama{loadedTil: map[string]time.Time{}, ttl: 600 * time.Millisecond, hold: make(chan struct{}),
		chat: sample(t, "ollama_api_chat_stream.ndjson")}
	up := newFake(t, o.handler)
	ac := ollamaAdapter("ollama", up.URL, 2)
	ac.DiscoveryIntervalMs = 10000 // residency comes with discovery (U7)
	s := newSet(t, adapter.Options{}, ac)

	r := waitResidency(t, s, "ollama", "the models of /api/tags, unloaded", func(r map[string]*iop.ModelResidency) bool {
		return state(r, "tiny:latest") == protocol.ResidencyUnloaded && state(r, "tiny") == protocol.ResidencyUnloaded &&
			state(r, "tiny-tool") == protocol.ResidencyUnloaded
	})
	if len(r) != 4 {
		t.Errorf("want tiny, tiny:latest, tiny-tool, tiny-tool:latest; got %v", r)
	}

	done := make(chan []*iop.RunEvent, 1)
	go func() {
		done <- runAll(context.Background(), s, &iop.RunRequest{Adapter: "ollama", Target: "tiny", Input: userInput("hi"), Stream: true})
	}()
	waitResidency(t, s, "ollama", "loading while the request waits", func(r map[string]*iop.ModelResidency) bool {
		return state(r, "tiny") == protocol.ResidencyLoading && r["tiny"].GetInFlight() == 1
	})
	close(o.hold)
	last, _ := checkRun(t, <-done)
	if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
		t.Fatalf("run: %v %q", last.GetType(), last.GetError())
	}
	r = waitResidency(t, s, "ollama", "loaded after the request", func(r map[string]*iop.ModelResidency) bool {
		return state(r, "tiny") == protocol.ResidencyLoaded && state(r, "tiny:latest") == protocol.ResidencyLoaded
	})
	if m := r["tiny"]; m.GetLoads() != 1 || m.GetLoadMsTotal() != 315 {
		t.Errorf("U8 tiny's counters: loads %d load_ms_total %d, want 1, 315", m.GetLoads(), m.GetLoadMsTotal())
	}
	if m := r["tiny"]; m.GetLoadMs() != 315 || m.GetMemoryMb() != 6 || m.GetInFlight() != 0 {
		t.Errorf("U6 loaded tiny: load_ms %d (want load_duration's 315), memory_mb %d (want 6), in_flight %d", m.GetLoadMs(), m.GetMemoryMb(), m.GetInFlight())
	}
	if state(r, "tiny-tool") != protocol.ResidencyUnloaded {
		t.Errorf("tiny-tool %q", state(r, "tiny-tool"))
	}
	loadedAt := time.Now()
	r = waitResidency(t, s, "ollama", "unloaded after expires_at", func(r map[string]*iop.ModelResidency) bool {
		return state(r, "tiny") == protocol.ResidencyUnloaded
	})
	if m := r["tiny"]; m.GetIdleUnloads() != 1 || m.GetEvictions() != 0 {
		t.Errorf("U8 an expiry counts as an idle unload: idle %d evictions %d", m.GetIdleUnloads(), m.GetEvictions())
	}
	// The expiry is seen by a poll at expires_at, not by the 5 s safety
	// poll: well before it.
	if d := time.Since(loadedAt); d > 4*time.Second {
		t.Errorf("U6 the expiry was seen %v after the load (ttl 600 ms): not at expires_at", d)
	}
	o.mu.Lock()
	calls := o.psCalls
	o.mu.Unlock()
	if calls > 12 {
		t.Errorf("U6 %d /api/ps polls for one request and one expiry", calls)
	}
}

// U7: an ollama adapter's keep_alive goes out with every chat as Ollama
// takes it — a duration as a JSON string, whole seconds as a JSON number —
// and nothing without one; a value Ollama would refuse, or keep_alive on
// an openai_compat adapter, fails NewSet naming the adapter.
func TestOllamaKeepAlive(t *testing.T) {
	leakcheck.Check(t)
	for _, tc := range []struct{ keepAlive, want string }{
		{"", ""}, {"10m", `"10m"`}, {"-1m", `"-1m"`}, {"0", `0`}, {"-1", `-1`}, {"3600", `3600`},
	} {
		o := &fakeOllama{loadedTil: map[string]time.Time{}, ttl: time.Minute, chat: sample(t, "ollama_api_chat_stream.ndjson")}
		up := newFake(t, o.handler)
		ac := ollamaAdapter("ollama", up.URL, 1)
		ac.KeepAlive = tc.keepAlive
		s := newSet(t, adapter.Options{}, ac)
		last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "ollama", Target: "tiny", Input: userInput("hi")}))
		if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
			t.Fatalf("%q: %v %q", tc.keepAlive, last.GetType(), last.GetError())
		}
		o.mu.Lock()
		got := string(o.keepAlive[0])
		psCalls := o.psCalls
		o.mu.Unlock()
		if s.Residency() != nil || psCalls != 0 {
			t.Errorf("U7 an adapter without discovery reported residency or read /api/ps (%d)", psCalls)
		}
		if got != tc.want {
			t.Errorf("U7 keep_alive %q sent as %s, want %s", tc.keepAlive, got, tc.want)
		}
	}
	for _, tc := range []struct {
		ac   *iop.AdapterConfig
		want string
	}{
		{&iop.AdapterConfig{Name: "o", Type: protocol.TypeOllama, BaseUrl: "http://127.0.0.1:1", KeepAlive: "300s0"}, `adapter "o": bad keep_alive`},
		{&iop.AdapterConfig{Name: "o", Type: protocol.TypeOllama, BaseUrl: "http://127.0.0.1:1", KeepAlive: "forever"}, `bad keep_alive: "forever"`},
		{&iop.AdapterConfig{Name: "o", Type: protocol.TypeOllama, BaseUrl: "http://127.0.0.1:1", KeepAlive: strings.Repeat("1", 40)}, "longer than 32 bytes"},
		{func() *iop.AdapterConfig {
			ac := compatAdapter("c", llamaProfile("http://127.0.0.1:1"), 1)
			ac.KeepAlive = "5m"
			return ac
		}(), `adapter "c": bad keep_alive: keep_alive is Ollama's`},
	} {
		_, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{tc.ac}}, adapter.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("U7 keep_alive %q on %s: err %v, want %q", tc.ac.GetKeepAlive(), tc.ac.GetType(), err, tc.want)
		}
	}
}

// U7 against a real Ollama (IOP_TEST_OLLAMA_URL): its /api/tags models are
// reported, a chat with the adapter's keep_alive ("5m", Ollama's default,
// so other users of the server are not disturbed) leaves the target
// loaded with the size /api/ps gives, and the answer's expires_at is read.
func TestRealOllamaResidency(t *testing.T) {
	base := realURL(t, "IOP_TEST_OLLAMA_URL")
	leakcheck.Check(t)
	target := envOr("IOP_TEST_OLLAMA_TARGET", "tiny")
	ac := ollamaAdapter("ollama", base, 1)
	ac.KeepAlive, ac.DiscoveryIntervalMs = "5m", 10000
	s := newSet(t, adapter.Options{}, ac)
	waitResidency(t, s, "ollama", "the real server's models", func(r map[string]*iop.ModelResidency) bool { return r[target] != nil })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "ollama", Target: target, Input: userInput("hi"), Stream: true,
		TimeoutSec: 60}))
	if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
		t.Fatalf("run: %v %q", last.GetType(), last.GetError())
	}
	r := waitResidency(t, s, "ollama", "the target loaded", func(r map[string]*iop.ModelResidency) bool {
		return state(r, target) == protocol.ResidencyLoaded
	})
	t.Logf("U7 real Ollama residency of %s: %v", target, r[target])
	if r[target].GetMemoryMb() <= 0 {
		t.Errorf("U7 memory_mb %d, want /api/ps's size", r[target].GetMemoryMb())
	}
}

// U7: two Sets (two edges' payloads) sharing the node's OllamaWatchers
// share one watcher of their Ollama: a request through one shows its
// model loading in the other's report, and the watcher stops with the
// last Set — also when a payload was refused after its ollama adapter
// took the watcher.
func TestOllamaWatchersShared(t *testing.T) {
	leakcheck.Check(t)
	o := &fakeOllama{loadedTil: map[string]time.Time{}, ttl: time.Minute, hold: make(chan struct{}),
		chat: sample(t, "ollama_api_chat_stream.ndjson")}
	up := newFake(t, o.handler)
	shared, sig := adapter.NewOllamaWatchers(), adapter.NewSignal()
	opts := adapter.Options{Ollama: shared, Residency: sig}
	ac := func() *iop.AdapterConfig {
		a := ollamaAdapter("ollama", up.URL, 2)
		a.DiscoveryIntervalMs = 10000
		return a
	}
	a, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ac()}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ac()}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	waitResidency(t, b, "ollama", "the models", func(r map[string]*iop.ModelResidency) bool { return r["tiny"] != nil })
	done := make(chan []*iop.RunEvent, 1)
	go func() {
		done <- runAll(context.Background(), a, &iop.RunRequest{Adapter: "ollama", Target: "tiny", Input: userInput("hi")})
	}()
	waitResidency(t, b, "ollama", "edge b sees edge a's load", func(r map[string]*iop.ModelResidency) bool {
		return state(r, "tiny") == protocol.ResidencyLoading
	})
	close(o.hold)
	<-done
	waitResidency(t, b, "ollama", "loaded in b's report", func(r map[string]*iop.ModelResidency) bool {
		return state(r, "tiny") == protocol.ResidencyLoaded
	})
	a.Close()
	b.Close() // the last: the watcher's goroutine ends (leakcheck)
	// A payload refused after its ollama adapter was built returns its
	// watcher too.
	bad := ac()
	bad.Managed = "llama"
	if _, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{bad}}, opts); err == nil {
		t.Fatal("managed on an ollama adapter applied")
	}
	c, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{ac()}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	c.Residency() // starts a watcher: a fresh one, ended by Close
	c.Close()
}
