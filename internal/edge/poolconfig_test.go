package edge

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"iop/internal/edge/config"
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
		pc := PoolConfig(cfg(row.enabled))
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
	for _, cd := range PoolConfig(c).Groups[0].Candidates {
		if cd.StallTimeoutMs != want[cd.Target] {
			t.Errorf("Q6 candidate %s: stall timeout %d ms, want %d", cd.Target, cd.StallTimeoutMs, want[cd.Target])
		}
	}
	if b, err := protojson.Marshal(c.NodePayload("n1")); err != nil || strings.Contains(string(b), "Stall") || strings.Contains(string(b), "stall") {
		t.Errorf("Q6 the node payload carries a stall timeout (%v): %s", err, b)
	}
}
