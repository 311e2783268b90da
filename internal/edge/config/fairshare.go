package config

import (
	"strconv"

	"iop/internal/edge/keystore"
)

// Fair share and priority classes of the queue (docs/config.md, SPEC
// G1–G4): queue.starvation_grants and api_keys[].weight, class and
// max_class. The key store's keys carry the same three (keystore.Key).

// Bounds and defaults.
const (
	DefaultStarvationGrants = 8                  // queue.starvation_grants
	MaxStarvationGrants     = 1000               // queue.starvation_grants
	MaxKeyWeight            = keystore.MaxWeight // api_keys[].weight, edge keys -weight
	DefaultClass            = ClassInteractive
)

// The priority classes, highest first (SPEC G2).
const (
	ClassCritical    = keystore.ClassCritical
	ClassInteractive = keystore.ClassInteractive
	ClassBatch       = keystore.ClassBatch
)

// ClassRank is keystore.ClassRank: critical 2, interactive 1, batch 0,
// -1 for anything else.
func ClassRank(class string) int { return keystore.ClassRank(class) }

// Sched is k's place in the queue, defaults filled in.
func (k APIKey) Sched() keystore.Sched {
	return keystore.Sched{Weight: k.Weight, Class: k.Class, MaxClass: k.MaxClass}.Effective()
}

func (c *Config) fairDefaults() {
	if c.Queue.StarvationGrants == 0 {
		c.Queue.StarvationGrants = DefaultStarvationGrants
	}
	for i := range c.APIKeys {
		k := &c.APIKeys[i]
		if k.Weight == 0 {
			k.Weight = 1
		}
		if k.Class == "" {
			k.Class = DefaultClass
		}
		if k.MaxClass == "" {
			k.MaxClass = k.Class
		}
	}
}

// validateFair checks queue.starvation_grants and each api_keys entry's
// weight, class and max_class.
func (c *Config) validateFair(add func(string, string, ...any)) {
	if n := c.Queue.StarvationGrants; n < 1 || n > MaxStarvationGrants {
		add("queue.starvation_grants", "must be between 1 and %d, got %d", MaxStarvationGrants, n)
	}
	for i, k := range c.APIKeys {
		p := "api_keys[" + strconv.Itoa(i) + "]"
		if k.Weight < 1 || k.Weight > MaxKeyWeight {
			add(p+".weight", "must be between 1 and %d, got %d", MaxKeyWeight, k.Weight)
		}
		ok := true
		if ClassRank(k.Class) < 0 {
			add(p+".class", "must be critical, interactive or batch, got %q", k.Class)
			ok = false
		}
		if ClassRank(k.MaxClass) < 0 {
			add(p+".max_class", "must be critical, interactive or batch, got %q", k.MaxClass)
			ok = false
		}
		if ok && ClassRank(k.Class) > ClassRank(k.MaxClass) {
			add(p+".class", "%q is above the key's max_class %q", k.Class, k.MaxClass)
		}
	}
}
