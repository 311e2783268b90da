package edge

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"iop/internal/edge/config"
	"iop/internal/edge/creds"
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
				{Name: "a", Type: config.TypeOpenAICompat, CredentialSlot: "slot-a", LongCapacity: new(int)},
				{Name: "b", Type: config.TypeOpenAICompat, CredentialSlot: "slot-b", LongCapacity: new(int)},
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
			{Name: "a", Type: config.TypeOllama, ResponseStallTimeoutMs: 7000, LongCapacity: new(int)},
			{Name: "b", Type: config.TypeOllama, LongCapacity: new(int)},
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
