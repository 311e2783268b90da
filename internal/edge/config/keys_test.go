package config

import (
	"strings"
	"testing"
)

// K7, K8, K9: the keys block: defaults, paths resolved against the
// config's directory, and every bad value named by its path.
func TestKeysConfig(t *testing.T) {
	withKeys := func(block string) string {
		return strings.Replace(valid, `"models"`, `"keys": `+block+`, "models"`, 1)
	}
	c := mustParse(t, withKeys(`{"store_file": "keys.json"}`))
	if k := c.Keys; k.UsageFile != "keys.json.usage" || k.UsageFlushMs != DefaultUsageFlushMs || k.EdgeCount != 1 {
		t.Fatalf("defaults: %+v", k)
	}
	if c := mustParse(t, valid); c.Keys.UsageFile != "" {
		t.Fatalf("no store, no usage file: got %q", c.Keys.UsageFile)
	}
	c.resolvePaths("/etc/iop/")
	if c.Keys.StoreFile != "/etc/iop/keys.json" || c.Keys.UsageFile != "/etc/iop/keys.json.usage" {
		t.Fatalf("resolved: %+v", c.Keys)
	}
	rows := []struct{ block, want string }{
		{`{"store_file": "k.json", "usage_flush_ms": 999}`, "keys.usage_flush_ms: must be between 1000 and 600000, got 999"},
		{`{"store_file": "k.json", "edge_count": -2}`, "keys.edge_count: must be between 1 and 1000, got -2"},
		{`{"store_file": "k.json", "usage_file": "k.json"}`, "keys.usage_file: must not be keys.store_file"},
		{`{"store_fil": "k.json"}`, "keys.store_fil: unknown field"},
	}
	for _, row := range rows {
		_, err := Parse([]byte(withKeys(row.block)))
		if err == nil || !strings.Contains(err.Error(), row.want) {
			t.Errorf("%s: got %v, want %q", row.block, err, row.want)
		}
	}
}
