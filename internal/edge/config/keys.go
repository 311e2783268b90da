package config

import "time"

// Key store defaults and bounds (docs/keys.md K2, K7, K8).
const (
	DefaultUsageFlushMs = 5000   // keys.usage_flush_ms
	MinUsageFlushMs     = 1000   // at most one write a second
	MaxUsageFlushMs     = 600000 // ten minutes
	MaxEdgeCount        = 1000   // keys.edge_count
	// UsageFileSuffix names the default usage file: store_file + suffix.
	UsageFileSuffix = ".usage"
)

// Keys configures the key store (`edge keys`, docs/keys.md). Relative
// paths are resolved against the config file's directory.
type Keys struct {
	// StoreFile is the key store; with it set the Edge is never open,
	// even before the first key exists. "" = api_keys only.
	StoreFile string `json:"store_file"`
	// UsageFile is where this Edge persists its per-key counters and
	// budgets (K7); "" = StoreFile + ".usage" (none without a store).
	// Each Edge needs its own.
	UsageFile string `json:"usage_file"`
	// UsageFlushMs is how often at most the usage file is written, while
	// anything changed; 0 = 5000.
	UsageFlushMs int64 `json:"usage_flush_ms"`
	// EdgeCount is how many Edges serve the same keys (K8): each enforces
	// every bound divided by it, rounded up. 0 = 1.
	EdgeCount int `json:"edge_count"`
}

// UsageFlush is keys.usage_flush_ms as a duration.
func (k Keys) UsageFlush() time.Duration { return time.Duration(k.UsageFlushMs) * time.Millisecond }

func (c *Config) keysDefaults() {
	k := &c.Keys
	if k.UsageFile == "" && k.StoreFile != "" {
		k.UsageFile = k.StoreFile + UsageFileSuffix
	}
	if k.UsageFlushMs == 0 {
		k.UsageFlushMs = DefaultUsageFlushMs
	}
	if k.EdgeCount == 0 {
		k.EdgeCount = 1
	}
}

// validateKeys checks the keys block.
func (c *Config) validateKeys(add func(string, string, ...any)) {
	k := c.Keys
	if k.UsageFlushMs < MinUsageFlushMs || k.UsageFlushMs > MaxUsageFlushMs {
		add("keys.usage_flush_ms", "must be between %d and %d, got %d", MinUsageFlushMs, MaxUsageFlushMs, k.UsageFlushMs)
	}
	if k.EdgeCount < 1 || k.EdgeCount > MaxEdgeCount {
		add("keys.edge_count", "must be between 1 and %d, got %d", MaxEdgeCount, k.EdgeCount)
	}
	if k.StoreFile != "" && k.UsageFile == k.StoreFile {
		add("keys.usage_file", "must not be keys.store_file")
	}
}
