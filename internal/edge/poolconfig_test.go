package edge

import (
	"testing"

	"iop/internal/edge/config"
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
