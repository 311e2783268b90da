package config

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
)

// plane is the valid config with the credential plane on: files, a
// recipient key and a slot on each adapter (no api_key_env).
func plane(extra ...[2]string) string {
	s := strings.Replace(valid, `"models"`, `"credentials": {"enabled": true, "store_file": "secrets.json", "store_key_file": "store.key", "issuer_key_file": "pki/issuer.key"}, "models"`, 1)
	s = strings.Replace(s, `"id": "gpu-1",`, `"id": "gpu-1", "lease_recipient_public_key": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",`, 1)
	s = strings.Replace(s, `"api_key_env": "LLAMA_KEY"`, `"credential_slot": "llama"`, 1)
	s = strings.Replace(s, `"base_url": "http://127.0.0.1:11434"`, `"base_url": "http://127.0.0.1:11434", "credential_slot": "ollama"`, 1)
	for _, e := range extra {
		if !strings.Contains(s, e[0]) {
			panic("plane: no " + e[0])
		}
		s = strings.Replace(s, e[0], e[1], 1)
	}
	return s
}

// C1, C2: the credentials block and the slots validate, naming every
// problem's key path.
func TestCredentialsConfig(t *testing.T) {
	rows := []struct {
		name string
		cfg  string
		want []string // substrings of the error; none = valid
	}{
		{"C1 plane on, complete", plane(), nil},
		{"C1 plane on without files", strings.Replace(valid, `"models"`, `"credentials": {"enabled": true}, "models"`, 1), []string{
			"credentials.store_file: required", "credentials.store_key_file: required", "credentials.issuer_key_file: required"}},
		{"C2 lease TTL above 5 min", plane([2]string{`"enabled": true,`, `"enabled": true, "lease_ttl_ms": 300001,`}), []string{"credentials.lease_ttl_ms: must be between 1000 and 300000"}},
		{"C2 lease TTL below 1 s", plane([2]string{`"enabled": true,`, `"enabled": true, "lease_ttl_ms": 999,`}), []string{"credentials.lease_ttl_ms"}},
		{"C2 a route without a slot", plane([2]string{`, "credential_slot": "ollama"`, ``}), []string{
			"models[0].providers[0].credential_slot: required when credentials.enabled"}},
		{"C2 a route's own slot suffices", plane([2]string{`, "credential_slot": "ollama"`, ``},
			[2]string{`"target": "tiny", "response_stall_timeout_ms": 60000`, `"target": "tiny", "response_stall_timeout_ms": 60000, "credential_slot": "o2"`}), nil},
		{"C2 bad slot name", plane([2]string{`"credential_slot": "llama"`, `"credential_slot": "../x"`}), []string{"nodes[0].adapters[1].credential_slot: invalid slot name"}},
		{"C2 slot and api_key_env together", plane([2]string{`"credential_slot": "llama"`, `"credential_slot": "llama", "api_key_env": "K"`}), []string{
			"nodes[0].adapters[1].credential_slot: set either"}},
		{"C2 no auth header to carry the credential", plane([2]string{`"credential_slot": "llama"`, `"credential_slot": "llama", "profile_overrides": {"auth_header": ""}`}), []string{
			"models[0].providers[1].credential_slot: adapter gpu-1/llama-server has no auth header"}},
		{"C2 plane off: slots are allowed and unused", strings.Replace(valid, `"base_url": "http://127.0.0.1:11434"`, `"base_url": "http://127.0.0.1:11434", "credential_slot": "x"`, 1), nil},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			c, err := Parse([]byte(row.cfg))
			if len(row.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				if c.Credentials.LeaseTTLMs != DefaultLeaseTTLMs {
					t.Fatalf("lease_ttl_ms default %d", c.Credentials.LeaseTTLMs)
				}
				return
			}
			if err == nil {
				t.Fatal("got valid, want errors")
			}
			for _, w := range row.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
		})
	}
	c := mustParse(t, plane([2]string{`"target": "tiny", "response_stall_timeout_ms": 60000`, `"target": "tiny", "response_stall_timeout_ms": 60000, "credential_slot": "o2"`}))
	a := c.NodeByID("gpu-1")
	if got := RouteSlot(c.Models[0].Providers[0], a.Adapter("ollama")); got != "o2" {
		t.Errorf("C2 route override: got slot %q, want o2", got)
	}
	if got := RouteSlot(c.Models[0].Providers[1], a.Adapter("llama-server")); got != "llama" {
		t.Errorf("C2 adapter slot: got %q, want llama", got)
	}
}

// C3, C5, C6: with the plane on, a payload carries the node's projection
// generation, slot revisions and the ids of the keys its leases are sealed
// to and signed with — names and numbers, never a path, a key or a secret;
// with it off, nothing.
func TestNodePayloadCredentials(t *testing.T) {
	c := mustParse(t, plane())
	c.CredentialProjection = CredentialProjection{Nodes: map[string]NodeCredentials{
		"gpu-1": {Generation: 1234, SlotRevisions: map[string]uint64{"llama": 3, "ollama": 1},
			RecipientKeyID: "00112233aabbccdd", IssuerKeyID: "ffeeddcc44332211"}}}
	rt := c.NodePayload("gpu-1").GetRuntime()
	if !rt.CredentialsEnabled || rt.CredentialProjectionGeneration != 1234 || rt.CredentialSlotRevisions["llama"] != 3 ||
		rt.CredentialRecipientKeyId != "00112233aabbccdd" || rt.CredentialIssuerKeyId != "ffeeddcc44332211" {
		t.Fatalf("runtime %v", rt)
	}
	js := protojson.Format(c.NodePayload("gpu-1"))
	for _, banned := range []string{"secrets.json", "store.key", "issuer.key", "AAAAAAAA"} {
		if strings.Contains(js, banned) {
			t.Errorf("C5: payload mentions %q: %s", banned, js)
		}
	}
	off := mustParse(t, valid)
	off.CredentialProjection = c.CredentialProjection
	if rt := off.NodePayload("gpu-1").GetRuntime(); rt.CredentialProjectionGeneration != 0 || len(rt.CredentialSlotRevisions) != 0 ||
		rt.CredentialRecipientKeyId != "" {
		t.Fatalf("plane off: runtime %v", rt)
	}
}
