package creds

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/secretstore"
	"iop/internal/identity"
	"iop/internal/lease"
	iop "iop/proto/gen/iop"
)

// fixture is a PKI for nodes gpu-1 and gpu-2, a store holding slots
// "llama" and "ollama", and an edge config routing model "tiny" to gpu-1's
// two adapters and "big" to gpu-2.
type fixture struct {
	dir       string
	storeFile string
	key       *secretstore.Key
}

var t0 = time.UnixMilli(1_760_000_000_000)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	if err := identity.InitPKI(dir, identity.PKIOptions{Edge: "edge-1", Nodes: []string{"gpu-1", "gpu-2"}}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{dir: dir, storeFile: filepath.Join(dir, "secrets.json")}
	if err := secretstore.WriteNewKey(filepath.Join(dir, "store.key")); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.key, err = secretstore.LoadKey(filepath.Join(dir, "store.key")); err != nil {
		t.Fatal(err)
	}
	f.set(t, "llama", "sk-llama-1")
	f.set(t, "ollama", "sk-ollama-1")
	return f
}

// set writes slot's secret into the store file (edge secrets set).
func (f *fixture) set(t *testing.T, slot, secret string) {
	t.Helper()
	s, err := secretstore.LoadOrNew(f.storeFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(f.key, slot, []byte(secret), t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(f.storeFile); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) recipient(t *testing.T, node string) string {
	t.Helper()
	pub, err := identity.LoadRecipientPublicKey(filepath.Join(f.dir, identity.RecipientPubFileName(node)))
	if err != nil {
		t.Fatal(err)
	}
	return identity.RecipientPublicKeyBase64(pub)
}

// config returns the edge config; edit, when set, changes the JSON.
func (f *fixture) config(t *testing.T, enabled bool, edit ...[2]string) *config.Config {
	t.Helper()
	s := fmt.Sprintf(`{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "credentials": {"enabled": %t, "store_file": %q, "store_key_file": %q, "issuer_key_file": %q},
  "nodes": [
    {"id": "gpu-1", "lease_recipient_public_key": %q, "adapters": [
      {"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434", "credential_slot": "ollama"},
      {"name": "llama", "type": "openai_compat", "profile": "llamacpp", "base_url": "http://127.0.0.1:8081", "credential_slot": "llama"}]},
    {"id": "gpu-2", "lease_recipient_public_key": %q, "adapters": [
      {"name": "vllm", "type": "openai_compat", "profile": "vllm", "base_url": "http://127.0.0.1:8000", "credential_slot": "llama",
       "profile_overrides": {"auth_header": "x-api-key", "auth_scheme": ""}}]}],
  "models": [
    {"name": "tiny", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"},
                                   {"node": "gpu-1", "provider": "llama", "target": "tiny", "credential_slot": "ollama"}]},
    {"name": "big", "providers": [{"node": "gpu-2", "provider": "vllm", "target": "big-model"}]}]
}`, enabled, f.storeFile, filepath.Join(f.dir, "store.key"), filepath.Join(f.dir, identity.IssuerKeyFile),
		f.recipient(t, "gpu-1"), f.recipient(t, "gpu-2"))
	for _, e := range edit {
		if !strings.Contains(s, e[0]) {
			t.Fatalf("config edit: no %q", e[0])
		}
		s = strings.Replace(s, e[0], e[1], 1)
	}
	c, err := config.Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) opener(t *testing.T, node string) *lease.Opener {
	t.Helper()
	priv, err := identity.LoadRecipientPrivateKey(filepath.Join(f.dir, identity.RecipientKeyFileName(node)))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := identity.LoadIssuerPublicKey(filepath.Join(f.dir, identity.IssuerPubFile))
	if err != nil {
		t.Fatal(err)
	}
	o, err := lease.NewOpener(priv, []ed25519.PublicKey{pub}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// C2, C6: a lease names exactly the route, node, adapter, target, profile,
// auth header, the slot's revision and the node's projection generation,
// opens on that node with the route's slot (a route's own slot overrides
// its adapter's; never another), and on no other node.
func TestLease(t *testing.T) {
	f := newFixture(t)
	m, err := Load(f.config(t, true), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	gen1 := m.Projection().Nodes["gpu-1"].Generation
	rows := []struct {
		name                   string
		req                    Request
		node, slot, secret     string
		profile, header, schem string
	}{
		{"C2 ollama route: adapter slot, Authorization Bearer", Request{Principal: "team-a", Model: "tiny", Node: "gpu-1", Provider: "ollama", Target: "tiny"},
			"gpu-1", "ollama", "sk-ollama-1", "ollama", "Authorization", "Bearer"},
		{"C6 route slot overrides the adapter's", Request{Model: "tiny", Node: "gpu-1", Provider: "llama", Target: "tiny"},
			"gpu-1", "ollama", "sk-ollama-1", "llamacpp", "Authorization", "Bearer"},
		{"C2 profile override: x-api-key without scheme", Request{Model: "big", Node: "gpu-2", Provider: "vllm", Target: "big-model"},
			"gpu-2", "llama", "sk-llama-1", "vllm", "x-api-key", ""},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			l, b, err := m.Lease(t0, row.req)
			if err != nil {
				t.Fatal(err)
			}
			want := &iop.CredentialLeaseBinding{Principal: row.req.Principal, Slot: row.slot, Route: row.req.Model, Profile: row.profile,
				UpstreamTarget: row.req.Target, NodeId: row.node, Provider: row.req.Provider, CredentialRevision: 1,
				ProjectionGeneration: m.Projection().Nodes[row.node].Generation, AuthHeader: row.header, AuthScheme: row.schem}
			if b.Slot != want.Slot || b.Route != want.Route || b.Profile != want.Profile || b.UpstreamTarget != want.UpstreamTarget ||
				b.NodeId != want.NodeId || b.Provider != want.Provider || b.CredentialRevision != 1 || b.ProjectionGeneration != want.ProjectionGeneration ||
				b.AuthHeader != want.AuthHeader || b.AuthScheme != want.AuthScheme || b.Principal != want.Principal || b.RouteRevision == 0 {
				t.Fatalf("binding %v\nwant %v", b, want)
			}
			scope := lease.Scope{Node: row.node, Provider: row.req.Provider, Target: row.req.Target, Profile: row.profile,
				AuthHeader: row.header, AuthScheme: row.schem, Generation: b.ProjectionGeneration}
			pt, err := f.opener(t, row.node).Open(t0, scope, l, b)
			if err != nil || string(pt) != row.secret {
				t.Fatalf("open on %s: %q, %v", row.node, pt, err)
			}
			other := map[string]string{"gpu-1": "gpu-2", "gpu-2": "gpu-1"}[row.node]
			if _, err := f.opener(t, other).Open(t0, scope, l, b); !errors.Is(err, lease.ErrRecipient) {
				t.Fatalf("C6: opened on %s: %v", other, err)
			}
			if bytes.Contains(l.Ciphertext, []byte(row.secret)) {
				t.Fatal("C5: the lease carries the plaintext")
			}
			if nc := m.Projection().Nodes[row.node]; nc.RecipientKeyID != b.Recipient || nc.IssuerKeyID != l.IssuerKeyId || nc.RecipientKeyID == "" {
				t.Fatalf("C3: the projection names keys %q/%q, the lease %q/%q", nc.RecipientKeyID, nc.IssuerKeyID, b.Recipient, l.IssuerKeyId)
			}
		})
	}
	if _, _, err := m.Lease(t0, Request{Model: "tiny", Node: "gpu-2", Provider: "vllm", Target: "tiny"}); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("C6: a lease for a route that does not exist: %v", err)
	}
	if gen1 != uint64(t0.UnixMilli()) {
		t.Fatalf("first generation %d, want the load time %d", gen1, t0.UnixMilli())
	}
	off, err := Load(f.config(t, false), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if l, b, err := off.Lease(t0, rows[0].req); l != nil || b != nil || err != nil {
		t.Fatalf("plane off: got %v %v %v, want nothing", l, b, err)
	}
}

// C3, H10: a recovery probe's lease is the lease of the first route (in
// config order) that sends the probed target to the probed provider: that
// route's slot (a route's own overrides its adapter's), the Edge's empty
// principal, opening on that node only; a target no route sends there has
// none, and the plane off issues nothing.
func TestProbeLease(t *testing.T) {
	f := newFixture(t)
	m, err := Load(f.config(t, true), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		name, node, provider, target string
		route, slot, secret, header  string
	}{
		{"C3 H10 ollama adapter's slot", "gpu-1", "ollama", "tiny", "tiny", "ollama", "sk-ollama-1", "Authorization"},
		{"C3 H10 C6 the route's own slot", "gpu-1", "llama", "tiny", "tiny", "ollama", "sk-ollama-1", "Authorization"},
		{"C3 H10 profile override: x-api-key", "gpu-2", "vllm", "big-model", "big", "llama", "sk-llama-1", "x-api-key"},
	} {
		t.Run(row.name, func(t *testing.T) {
			l, b, err := m.ProbeLease(t0, row.node, row.provider, row.target)
			if err != nil {
				t.Fatal(err)
			}
			if b.Route != row.route || b.Slot != row.slot || b.Principal != "" || b.NodeId != row.node || b.Provider != row.provider ||
				b.UpstreamTarget != row.target || b.AuthHeader != row.header {
				t.Fatalf("binding %v", b)
			}
			scope := lease.Scope{Node: row.node, Provider: row.provider, Target: row.target, Profile: b.Profile,
				AuthHeader: row.header, AuthScheme: b.AuthScheme, Generation: b.ProjectionGeneration}
			if pt, err := f.opener(t, row.node).Open(t0, scope, l, b); err != nil || string(pt) != row.secret {
				t.Fatalf("open on %s: %q, %v", row.node, pt, err)
			}
		})
	}
	if _, _, err := m.ProbeLease(t0, "gpu-2", "vllm", "tiny"); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("C6: a probe lease for a target no route sends there: %v", err)
	}
	off, err := Load(f.config(t, false), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if l, b, err := off.ProbeLease(t0, "gpu-1", "ollama", "tiny"); l != nil || b != nil || err != nil {
		t.Fatalf("plane off: got %v %v %v, want nothing", l, b, err)
	}
}

// C6: a reload keeps a node's projection generation when nothing its
// leases say changed, and raises it (and the slot revision) when its slot
// is rotated; an unaffected node keeps its generation; a clock that went
// back still raises it.
func TestProjectionGenerations(t *testing.T) {
	f := newFixture(t)
	m1, err := Load(f.config(t, true), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	g := func(m *Material, node string) uint64 { return m.Projection().Nodes[node].Generation }
	m2, _ := Load(f.config(t, true), m1, t0.Add(time.Minute))
	if g(m2, "gpu-1") != g(m1, "gpu-1") || g(m2, "gpu-2") != g(m1, "gpu-2") {
		t.Fatal("C6: an unchanged reload raised a generation")
	}
	f.set(t, "ollama", "sk-ollama-2") // edge secrets set; gpu-1's routes use it, gpu-2's do not
	m3, err := Load(f.config(t, true), m2, t0.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if g(m3, "gpu-1") != g(m2, "gpu-1")+1 {
		t.Fatalf("C6: rotation with the clock gone back: generation %d, want %d", g(m3, "gpu-1"), g(m2, "gpu-1")+1)
	}
	if g(m3, "gpu-2") != g(m2, "gpu-2") {
		t.Fatal("C6: rotating gpu-1's slot raised gpu-2's generation")
	}
	if rev := m3.Projection().Nodes["gpu-1"].SlotRevisions["ollama"]; rev != 2 {
		t.Fatalf("C6: slot revision %d after rotation, want 2", rev)
	}
	_, b, err := m3.Lease(t0, Request{Model: "tiny", Node: "gpu-1", Provider: "ollama", Target: "tiny"})
	if err != nil || b.CredentialRevision != 2 || b.ProjectionGeneration != g(m3, "gpu-1") {
		t.Fatalf("new leases: %v, %v", b, err)
	}
	m4, _ := Load(f.config(t, true, [2]string{`"target": "big-model"`, `"target": "bigger"`}), m3, t0.Add(time.Hour))
	if g(m4, "gpu-2") != uint64(t0.Add(time.Hour).UnixMilli()) || g(m4, "gpu-1") != g(m3, "gpu-1") {
		t.Fatal("C6: a route's target change must raise its node's generation only")
	}
}

// C3 (issuer key rotation with overlap): a reload that only switches the
// issuer key raises no node's projection generation, so a lease signed
// with the old key just before the switch still opens on a node that has
// applied the refreshed payload (and trusts both keys); the payload names
// the new key's id.
func TestC3IssuerSwitchKeepsGeneration(t *testing.T) {
	f := newFixture(t)
	m1, err := Load(f.config(t, true), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := identity.NewIssuer(f.dir, "issuer-2", false); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(f.dir, identity.IssuerKeyFile)
	m2, err := Load(f.config(t, true, [2]string{old, filepath.Join(f.dir, "issuer-2.key")}), m1, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"gpu-1", "gpu-2"} {
		p1, p2 := m1.Projection().Nodes[node], m2.Projection().Nodes[node]
		if p2.Generation != p1.Generation {
			t.Errorf("C3: %s's generation %d → %d on an issuer switch, want it kept (leases in flight would be refused)", node, p1.Generation, p2.Generation)
		}
		if p2.IssuerKeyID == p1.IssuerKeyID {
			t.Errorf("%s: the payload's issuer key id did not change", node)
		}
	}
}

// C1: Load fails, naming what is wrong, when a file is missing or a slot
// is absent or does not open with the key.
func TestLoadErrors(t *testing.T) {
	f := newFixture(t)
	rows := []struct {
		name string
		edit [2]string
		want string
	}{
		{"C1 slot not in the store", [2]string{`"credential_slot": "llama"}]},`, `"credential_slot": "nope"}]},`}, `models[0].providers[1]`},
		{"C1 no store file", [2]string{`secrets.json`, `missing.json`}, "credentials.store_file"},
		{"C1 no issuer key", [2]string{identity.IssuerKeyFile, "none.key"}, "credentials.issuer_key_file"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			cfg := f.config(t, true, row.edit)
			if row.name == "C1 slot not in the store" {
				cfg.Models[0].Providers[1].CredentialSlot = ""
			}
			_, err := Load(cfg, nil, t0)
			if err == nil || !strings.Contains(err.Error(), row.want) {
				t.Fatalf("got %v, want an error naming %s", err, row.want)
			}
		})
	}
	other := filepath.Join(f.dir, "other.key")
	secretstore.WriteNewKey(other)
	_, err := Load(f.config(t, true, [2]string{filepath.Join(f.dir, "store.key"), other}), nil, t0)
	if !errors.Is(err, secretstore.ErrDecrypt) {
		t.Fatalf("C1 wrong store key: got %v, want ErrDecrypt", err)
	}
}

// remove takes slot out of the store file (edge secrets rm).
func (f *fixture) remove(t *testing.T, slot string) {
	t.Helper()
	s, err := secretstore.Load(f.storeFile)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Remove(slot, t0) {
		t.Fatalf("remove %s: not in the store", slot)
	}
	if err := s.Save(f.storeFile); err != nil {
		t.Fatal(err)
	}
}

// C6: `edge secrets rm` then a reload revokes: Load accepts the config,
// every route of the removed slot issues no lease again (ErrRevoked) while
// the other routes go on, the node's generation rises so a lease issued
// before is refused once the node has the refreshed payload, and setting
// the slot again restores the routes.
func TestRevocationBySlotRemoval(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t, true)
	m1, err := Load(cfg, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	ollama := Request{Model: "tiny", Node: "gpu-1", Provider: "ollama", Target: "tiny"}
	llama := Request{Model: "big", Node: "gpu-2", Provider: "vllm", Target: "big-model"} // slot "llama"
	before, bb, err := m1.Lease(t0, ollama)
	if err != nil {
		t.Fatal(err)
	}

	f.remove(t, "ollama")
	m2, err := Load(f.config(t, true), m1, t0.Add(time.Second))
	if err != nil {
		t.Fatalf("C6: the reload after secrets rm was rejected: %v", err)
	}
	// Both of tiny's routes use slot "ollama" (the second by its own
	// credential_slot); big's uses "llama".
	for _, r := range []Request{ollama, {Model: "tiny", Node: "gpu-1", Provider: "llama", Target: "tiny"}} {
		if l, b, err := m2.Lease(t0, r); !errors.Is(err, ErrRevoked) || l != nil || b != nil {
			t.Errorf("C6: %s/%s after rm: lease %v, %v, want ErrRevoked and nothing issued", r.Node, r.Provider, l, err)
		}
	}
	if _, _, err := m2.Lease(t0, llama); err != nil {
		t.Errorf("C6: a route of another slot stopped issuing: %v", err)
	}
	if got := m2.Revoked(); len(got) != 2 || !strings.Contains(got[0], `slot "ollama"`) {
		t.Errorf("Revoked() = %q, want tiny's two routes", got)
	}
	g1, g2 := m1.Projection().Nodes["gpu-1"].Generation, m2.Projection().Nodes["gpu-1"].Generation
	if g2 <= g1 {
		t.Fatalf("C6: gpu-1's projection generation %d → %d, want it to rise", g1, g2)
	}
	if _, ok := m2.Projection().Nodes["gpu-1"].SlotRevisions["ollama"]; ok {
		t.Error("C6: the revoked slot is still in gpu-1's projection")
	}
	scope := lease.Scope{Node: "gpu-1", Provider: "ollama", Target: "tiny", Profile: bb.Profile,
		AuthHeader: bb.AuthHeader, AuthScheme: bb.AuthScheme, Generation: g2}
	if _, err := f.opener(t, "gpu-1").Open(t0, scope, before, bb); !errors.Is(err, lease.ErrScope) {
		t.Errorf("C6: a lease issued before the revocation opened on a refreshed node: %v", err)
	}

	f.set(t, "ollama", "sk-ollama-2")
	m3, err := Load(f.config(t, true), m2, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, b, err := m3.Lease(t0, ollama); err != nil || b.CredentialRevision != 2 {
		t.Errorf("slot set again: %v, %v; want a lease of revision 2", b, err)
	}
	if len(m3.Revoked()) != 0 {
		t.Errorf("Revoked() after set = %q", m3.Revoked())
	}
}

// C3: the plane binds every lease, a probe's included, to the selected
// node's boot id as the transport reports it, so the node refuses it after
// a restart; without BindBoots, or for a node that reported none, the
// binding carries none.
func TestPlaneBindsBoots(t *testing.T) {
	f := newFixture(t)
	m, err := Load(f.config(t, true), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	p := NewPlane(m, func() time.Time { return t0 })
	r := Request{Model: "tiny", Node: "gpu-1", Provider: "ollama", Target: "tiny"}
	if _, b, err := p.Lease(r); err != nil || b.NodeBootId != "" {
		t.Fatalf("before BindBoots: %v, %v", b, err)
	}
	p.BindBoots(func(node string) string { return map[string]string{"gpu-1": "boot-1"}[node] })
	if _, b, err := p.Lease(r); err != nil || b.NodeBootId != "boot-1" {
		t.Fatalf("C3: lease binding boot %q (%v), want boot-1", b.GetNodeBootId(), err)
	}
	if _, b, err := p.ProbeLease("gpu-1", "ollama", "tiny"); err != nil || b.NodeBootId != "boot-1" {
		t.Fatalf("C3: probe lease binding boot %q (%v), want boot-1", b.GetNodeBootId(), err)
	}
	if _, b, err := p.Lease(Request{Model: "big", Node: "gpu-2", Provider: "vllm", Target: "big-model"}); err != nil || b.NodeBootId != "" {
		t.Fatalf("a node that reported no boot: %v, %v", b, err)
	}
}
