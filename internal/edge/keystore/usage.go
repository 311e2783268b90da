package keystore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"time"

	"iop/internal/jsonconfig"
	"iop/internal/storefile"
)

// ErrBadUsage: the usage file does not parse or holds invalid values.
var ErrBadUsage = errors.New("invalid key usage file")

// Usage is the usage file (docs/keys.md K7): what one Edge counted per
// key, written by that Edge alone at a bounded rate (keys.usage_flush_ms)
// and at shutdown, read back when it starts (so budgets survive a
// restart) and by `edge keys usage`. Format (mode 0600, written
// atomically):
//
//	{"version": 1, "saved_at": "<RFC 3339>", "keys": [
//	  {"name": "team-a", "requests": 12, "prompt_tokens": 900,
//	   "completion_tokens": 4000, "estimated_tokens": 0, "since": "<RFC 3339>",
//	   "minute_empty_at": "<RFC 3339>", "day": "2026-01-31",
//	   "day_tokens": 4900, "refused": 3}]}
//
// minute_empty_at is when the per-minute token window would be empty
// (its GCRA state, limit.TokenState); day and day_tokens the UTC day and
// the tokens counted in it.
type Usage struct {
	Version int        `json:"version"`
	SavedAt time.Time  `json:"saved_at"`
	Keys    []KeyUsage `json:"keys"`
}

// KeyUsage is one key's counters.
type KeyUsage struct {
	Name             string `json:"name"`
	Requests         int64  `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	// EstimatedTokens were charged from estimates: answers whose backend
	// reported no usage.
	EstimatedTokens int64     `json:"estimated_tokens,omitempty"`
	Since           time.Time `json:"since,omitzero"`
	MinuteEmptyAt   time.Time `json:"minute_empty_at,omitzero"`
	Day             string    `json:"day,omitempty"`
	DayTokens       int64     `json:"day_tokens,omitempty"`
	Refused         int64     `json:"refused,omitempty"`
}

// LoadUsage reads the usage file at path; a missing file is an
// fs.ErrNotExist error, anything malformed ErrBadUsage naming it.
func LoadUsage(path string) (*Usage, error) {
	b, _, err := storefile.Read(path, storefile.MaxRead)
	if err != nil {
		return nil, fmt.Errorf("key usage: %w", err)
	}
	var u Usage
	errs, usable := jsonconfig.Decode(b, &u)
	if usable {
		if u.Version != 1 {
			errs = append(errs, fmt.Sprintf("version: want 1, got %d", u.Version))
		}
		seen := map[string]bool{}
		for i, k := range u.Keys {
			p := fmt.Sprintf("keys[%d]", i)
			switch {
			case !ValidName(k.Name):
				errs = append(errs, p+".name: invalid key name")
			case seen[k.Name]:
				errs = append(errs, fmt.Sprintf("%s.name: key %q twice", p, k.Name))
			}
			seen[k.Name] = true
			if k.Requests < 0 || k.PromptTokens < 0 || k.CompletionTokens < 0 || k.EstimatedTokens < 0 || k.DayTokens < 0 || k.Refused < 0 {
				errs = append(errs, p+": a negative counter")
			}
			if k.Day != "" {
				if _, err := time.Parse(time.DateOnly, k.Day); err != nil {
					errs = append(errs, fmt.Sprintf("%s.day: want YYYY-MM-DD, got %q", p, k.Day))
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("key usage %s: %w (remove it to start every key's counters from zero):\n%w", path, ErrBadUsage, errs)
	}
	return &u, nil
}

// LoadUsageOrEmpty is LoadUsage, or an empty Usage when path does not
// exist.
func LoadUsageOrEmpty(path string) (*Usage, error) {
	u, err := LoadUsage(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Usage{Version: 1}, nil
	}
	return u, err
}

// SaveUsage writes u to path atomically (mode 0600), keys by name.
func SaveUsage(path string, u *Usage) error {
	c := *u
	c.Version = 1
	c.Keys = append([]KeyUsage(nil), u.Keys...)
	sort.Slice(c.Keys, func(i, j int) bool { return c.Keys[i].Name < c.Keys[j].Name })
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", " ")
	if err := enc.Encode(&c); err != nil {
		return fmt.Errorf("key usage: %w", err)
	}
	if err := storefile.WriteAtomic(path, ".usage-*.tmp", buf.Bytes()); err != nil {
		return fmt.Errorf("key usage: %w", err)
	}
	return nil
}
