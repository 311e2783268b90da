package edge

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"iop/internal/edge/config"
	"iop/internal/edge/creds"
	"iop/internal/edge/pool"
	"iop/internal/edge/secretstore"
	"iop/internal/identity"
	"iop/internal/protocol"
)

// C2, C6: with the credential plane on, every pool candidate carries its
// route's credential slot (a models[].providers entry's own, else its
// adapter's), which the pool keeps a re-dispatch within; with the plane
// off no candidate has one.
func TestPoolConfigSlots(t *testing.T) {
	cfg := func(enabled bool) *config.Config {
		return &config.Config{
			Credentials: config.Credentials{Enabled: enabled},
			Nodes: []config.Node{{ID: "n1", Adapters: []config.Adapter{
				{Name: "a", Type: protocol.TypeOpenAICompat, CredentialSlot: "slot-a", LongCapacity: new(int)},
				{Name: "b", Type: protocol.TypeOpenAICompat, CredentialSlot: "slot-b", LongCapacity: new(int)},
			}}},
			Queue: config.Queue{MaxWaiters: new(int)},
			Models: []config.Model{{Name: "m", Providers: []config.ModelProvider{
				{Node: "n1", Provider: "a", Target: "t"},
				{Node: "n1", Provider: "b", Target: "t", CredentialSlot: "slot-c"},
			}}},
		}
	}
	for _, row := range []struct {
		enabled bool
		want    []string
	}{{true, []string{"slot-a", "slot-c"}}, {false, []string{"", ""}}} {
		pc := PoolConfig(cfg(row.enabled), nil)
		for i, cd := range pc.Groups[0].Candidates {
			if cd.Slot != row.want[i] {
				t.Errorf("credentials.enabled %v: candidate %d slot %q, want %q", row.enabled, i, cd.Slot, row.want[i])
			}
		}
	}
}

// Q6: every pool candidate carries its route's effective stall timeout,
// resolved here once (config.EffectiveStallTimeoutMs): the providers
// entry's, else its adapter's, else protocol.DefaultStallTimeoutMs — never
// 0, which would leave the node to apply its own default (SPEC E2) — and
// the node payload carries none (the node does not resolve it again).
func TestQ6PoolConfigStallTimeouts(t *testing.T) {
	c := &config.Config{
		Nodes: []config.Node{{ID: "n1", Adapters: []config.Adapter{
			{Name: "a", Type: protocol.TypeOllama, ResponseStallTimeoutMs: 7000, LongCapacity: new(int)},
			{Name: "b", Type: protocol.TypeOllama, LongCapacity: new(int)},
		}}},
		Queue: config.Queue{MaxWaiters: new(int)},
		Models: []config.Model{{Name: "m", Providers: []config.ModelProvider{
			{Node: "n1", Provider: "a", Target: "route", ResponseStallTimeoutMs: 60000},
			{Node: "n1", Provider: "a", Target: "adapter"},
			{Node: "n1", Provider: "b", Target: "default"},
			{Node: "n1", Provider: "b", Target: "route-over-default", ResponseStallTimeoutMs: 1500},
		}}},
	}
	want := map[string]int64{"route": 60000, "adapter": 7000, "default": protocol.DefaultStallTimeoutMs, "route-over-default": 1500}
	for _, cd := range PoolConfig(c, nil).Groups[0].Candidates {
		if cd.StallTimeoutMs != want[cd.Target] {
			t.Errorf("Q6 candidate %s: stall timeout %d ms, want %d", cd.Target, cd.StallTimeoutMs, want[cd.Target])
		}
	}
	if b, err := protojson.Marshal(c.NodePayload("n1")); err != nil || strings.Contains(string(b), "Stall") || strings.Contains(string(b), "stall") {
		t.Errorf("Q6 the node payload carries a stall timeout (%v): %s", err, b)
	}
}

// C6 (a revoked route is no candidate): after `edge secrets rm` a route of
// the removed slot issues no lease, and a request bound to it falls back
// to no other slot, so while its model group has another route it is no
// pool candidate — choosing it failed requests another route could serve
// (under load, most of a two-route group's requests got 502
// credential_unavailable). A group whose every route is revoked keeps
// them: its requests get 502 credential_unavailable, which says why.
func TestC6RevokedRouteNoCandidate(t *testing.T) {
	dir := t.TempDir()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1"}}); err != nil {
		t.Fatal(err)
	}
	keyFile, storeFile := filepath.Join(dir, "store.key"), filepath.Join(dir, "secrets.json")
	if err := secretstore.WriteNewKey(keyFile); err != nil {
		t.Fatal(err)
	}
	key, err := secretstore.LoadKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_760_000_000_000)
	s, err := secretstore.LoadOrNew(storeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, slot := range []string{"slot-a", "slot-b"} {
		if _, err := s.Set(key, slot, []byte("sk-"+slot), now); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Remove("slot-b", now) { // edge secrets rm -slot slot-b
		t.Fatal("slot-b not in the store")
	}
	if err := s.Save(storeFile); err != nil {
		t.Fatal(err)
	}
	pub, err := identity.LoadRecipientPublicKey(filepath.Join(dir, identity.RecipientPubFileName("gpu-1")))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(fmt.Appendf(nil, `{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "credentials": {"enabled": true, "store_file": %q, "store_key_file": %q, "issuer_key_file": %q},
  "nodes": [{"id": "gpu-1", "lease_recipient_public_key": %q, "adapters": [
    {"name": "a", "type": "openai_compat", "profile": "openai", "base_url": "http://127.0.0.1:1", "credential_slot": "slot-a"},
    {"name": "b", "type": "openai_compat", "profile": "openai", "base_url": "http://127.0.0.1:2", "credential_slot": "slot-b"}]}],
  "models": [
    {"name": "two", "providers": [{"node": "gpu-1", "provider": "b", "target": "t"}, {"node": "gpu-1", "provider": "a", "target": "t"}]},
    {"name": "only-revoked", "providers": [{"node": "gpu-1", "provider": "b", "target": "t"}]},
    {"name": "one-slot-a", "providers": [{"node": "gpu-1", "provider": "a", "target": "t"}]}]
}`, storeFile, keyFile, filepath.Join(dir, identity.IssuerKeyFile), identity.RecipientPublicKeyBase64(pub)))
	if err != nil {
		t.Fatal(err)
	}
	mat, err := creds.Load(cfg, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"two": {"a"}, "only-revoked": {"b"}, "one-slot-a": {"a"}}
	for _, g := range PoolConfig(cfg, mat).Groups {
		var got []string
		for _, cd := range g.Candidates {
			got = append(got, cd.Provider)
		}
		if !slices.Equal(got, want[g.Name]) {
			t.Errorf("C6 group %s: candidates %v, want %v", g.Name, got, want[g.Name])
		}
	}
	// Without the material (the plane's routes unknown) nothing is dropped.
	if n := len(PoolConfig(cfg, nil).Groups[0].Candidates); n != 2 {
		t.Errorf("no material: %d candidates in group two, want 2", n)
	}
}

// N2 (the pool follows the payload a node runs): after a reload, a node
// that answered the refresh RESTART_REQUIRED or FAILED runs the payload
// its registration got, so the pool serves it only the adapters that
// payload gives as the current config does: one the reload added or
// changed is no candidate on it (its group's requests wait for another
// node — here, with no queue, a 429 — as for an offline provider, never a
// request the node answers unknown_adapter), the unchanged ones serve,
// and one the reload removed is gone at once; one whose capacity alone
// changed serves with the capacity the node runs it with. APPLIED, or a
// new registration (which gets the current payload), makes the added and
// changed ones live with the current capacities.
func TestN2PoolFollowsRunningPayload(t *testing.T) {
	parse := func(adapters, models string) *config.Config {
		t.Helper()
		c, err := config.Parse(fmt.Appendf(nil, `{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "queue": {"max_waiters": 0},
  "nodes": [
    {"id": "gpu-1", "adapters": [%s]},
    {"id": "gpu-2", "adapters": [{"name": "b", "type": "ollama", "base_url": "http://127.0.0.1:2"}]}],
  "models": [%s]
}`, adapters, models))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const same = `{"name": "a", "type": "ollama", "base_url": "http://127.0.0.1:1", "capacity": %d}`
	v1 := parse(fmt.Sprintf(same, 1)+`,
      {"name": "c", "type": "ollama", "base_url": "http://127.0.0.1:3"},
      {"name": "gone", "type": "ollama", "base_url": "http://127.0.0.1:4"}`,
		`{"name": "old", "providers": [{"node": "gpu-1", "provider": "a", "target": "t"}]},
    {"name": "changed", "providers": [{"node": "gpu-1", "provider": "c", "target": "t"}]},
    {"name": "gone", "providers": [{"node": "gpu-1", "provider": "gone", "target": "t"}, {"node": "gpu-2", "provider": "b", "target": "t"}]}`)
	// The reload adds "new" with an api_key_env the node may not offer
	// (RESTART_REQUIRED), moves "c" to another backend, removes "gone".
	v2 := parse(fmt.Sprintf(same, 3)+`,
      {"name": "c", "type": "ollama", "base_url": "http://127.0.0.1:33"},
      {"name": "new", "type": "openai_compat", "profile": "openai", "base_url": "http://127.0.0.1:5", "api_key_env": "NEW_KEY"}`,
		`{"name": "old", "providers": [{"node": "gpu-1", "provider": "a", "target": "t"}]},
    {"name": "changed", "providers": [{"node": "gpu-1", "provider": "c", "target": "t"}]},
    {"name": "fresh", "providers": [{"node": "gpu-1", "provider": "new", "target": "t"}]},
    {"name": "either", "providers": [{"node": "gpu-1", "provider": "new", "target": "t"}, {"node": "gpu-2", "provider": "b", "target": "t"}]},
    {"name": "gone", "providers": [{"node": "gpu-2", "provider": "b", "target": "t"}]}`)

	// served is where each group's request goes: a provider key, or "" for
	// no free live candidate (with no queue, a QueueFullError).
	type served map[string]string
	afterV2 := func(runs map[string]string) served {
		return served{"old": "gpu-1/a", "changed": runs["changed"], "fresh": runs["fresh"], "either": runs["either"], "gone": "gpu-2/b"}
	}
	notRun := afterV2(map[string]string{"either": "gpu-2/b"})
	allRun := afterV2(map[string]string{"changed": "gpu-1/c", "fresh": "gpu-1/new", "either": "gpu-1/new"})
	rows := []struct {
		name string
		// gen and the payload the node's generation runs after the reload.
		gen  uint64
		runs *config.Config
		want served
		capA int32 // gpu-1/a's capacity in the snapshot
	}{
		{"N2 APPLIED: the added and changed adapters serve", 1, v2, allRun, 3},
		{"N2 RESTART_REQUIRED: the node runs its registration's payload", 1, v1, notRun, 1},
		{"N2 FAILED: the node keeps its previous payload", 1, v1, notRun, 1},
		{"N2 re-registration: the new generation runs the current payload", 2, v2, allRun, 3},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			p := pool.New(PoolConfig(v1, nil), nil)
			for _, n := range []string{"gpu-1", "gpu-2"} {
				p.NodeRuns(n, 1, RunsOf(v1.NodePayload(n)))
				p.NodeReady(n, 1)
			}
			if l, err := p.Acquire(context.Background(), pool.Request{Model: "gone", Operation: protocol.OpChatCompletions}); err != nil || l.Key.String() != "gpu-1/gone" {
				t.Fatalf("before the reload: %v %v, want gpu-1/gone", l, err)
			} else {
				p.Release(l)
			}
			p.Reconfigure(PoolConfig(v2, nil)) // the reload, before any answer
			if r.gen > 1 {
				p.NodeFenced("gpu-1", 1)
				p.NodeRuns("gpu-1", r.gen, RunsOf(r.runs.NodePayload("gpu-1")))
				p.NodeReady("gpu-1", r.gen)
			} else {
				p.NodeRuns("gpu-1", r.gen, RunsOf(r.runs.NodePayload("gpu-1")))
			}
			for _, model := range []string{"old", "changed", "fresh", "either", "gone"} {
				l, err := p.Acquire(context.Background(), pool.Request{Model: model, Operation: protocol.OpChatCompletions})
				got := ""
				if err == nil {
					got = l.Key.String()
					p.Release(l)
				} else if !errors.Is(err, pool.ErrQueueFull) {
					t.Errorf("group %s: %v, want a lease or no free live candidate (queue full)", model, err)
				}
				if got != r.want[model] {
					t.Errorf("group %s served by %q, want %q", model, got, r.want[model])
				}
			}
			for _, ns := range p.Snapshot() {
				for _, ps := range ns.Providers {
					key := ns.Node + "/" + ps.GetProviderId()
					if key == "gpu-1/a" && ps.GetCapacity() != r.capA {
						t.Errorf("gpu-1/a: capacity %d, want %d (the one the node runs)", ps.GetCapacity(), r.capA)
					}
					if key == "gpu-1/gone" {
						t.Errorf("the removed adapter is still in the snapshot: %v", ps)
					}
					// N3: one the generation does not run shows unavailable.
					if live := slices.Contains([]string{r.want["changed"], r.want["fresh"], "gpu-1/a", "gpu-2/b"}, key); live != (ps.GetStatus() == pool.StatusAvailable) {
						t.Errorf("snapshot of %s: status %s", key, ps.GetStatus())
					}
				}
			}
		})
	}
}

// N2, J7 (joined nodes and glob providers): the pool follows what each
// joined node runs, per node: after a node_templates change adds an
// adapter that a glob provider routes to, the joined node that answered
// APPLIED serves it and the one that answered RESTART_REQUIRED does not
// (the group's second request finds no free live candidate); the
// unchanged adapter serves on both.
func TestN2PoolFollowsRunningPayloadJoinedNodes(t *testing.T) {
	parse := func(adapters, models string) *config.Config {
		t.Helper()
		c, err := config.Parse(fmt.Appendf(nil, `{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "queue": {"max_waiters": 0},
  "node_templates": [{"match": "gpu-*", "adapters": [%s]}],
  "models": [%s]
}`, adapters, models))
		if err != nil {
			t.Fatal(err)
		}
		return c.Effective([]config.EnrolledNode{{ID: "gpu-7"}, {ID: "gpu-8"}}, nil, nil)
	}
	const a = `{"name": "a", "type": "ollama", "base_url": "http://127.0.0.1:1", "capacity": 1}`
	const tiny = `{"name": "tiny", "providers": [{"node": "gpu-*", "provider": "a", "target": "t"}]}`
	v1 := parse(a, tiny)
	v2 := parse(a+`, {"name": "new", "type": "ollama", "base_url": "http://127.0.0.1:2", "capacity": 1}`,
		tiny+`, {"name": "fresh", "providers": [{"node": "gpu-*", "provider": "new", "target": "t"}]}`)
	p := pool.New(PoolConfig(v1, nil), nil)
	for _, n := range []string{"gpu-7", "gpu-8"} {
		p.NodeRuns(n, 1, RunsOf(v1.NodePayload(n)))
		p.NodeReady(n, 1)
	}
	p.Reconfigure(PoolConfig(v2, nil))
	p.NodeRuns("gpu-7", 1, RunsOf(v2.NodePayload("gpu-7"))) // APPLIED; gpu-8 answered RESTART_REQUIRED
	for model, want := range map[string][]string{"tiny": {"gpu-7/a", "gpu-8/a", ""}, "fresh": {"gpu-7/new", ""}} {
		var got []string
		for range want {
			l, err := p.Acquire(context.Background(), pool.Request{Model: model, Operation: protocol.OpChatCompletions})
			switch {
			case err == nil:
				got = append(got, l.Key.String())
				defer p.Release(l)
			case errors.Is(err, pool.ErrQueueFull):
				got = append(got, "")
			default:
				t.Fatalf("group %s: %v", model, err)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("group %s served by %q, want %q", model, got, want)
		}
	}
}
