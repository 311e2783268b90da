package admin

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"

	"iop/internal/edge/batch"
	"iop/internal/edge/keys"
)

// KeySource gives every API key's usage (keys.Registry, docs/keys.md K7):
// names, counters and what is left of the bounds, never a key or a hash.
type KeySource interface {
	Status(now time.Time) []keys.KeyStatus
}

// BatchSource gives the batches in progress per key (batch.Manager,
// SPEC X6): names and counts, never a request or an answer.
type BatchSource interface {
	InProgress() []batch.KeyBatches
}

// StatusKeys is how many keys /status lists (the most tokens today
// first); GET /status/keys lists them all.
const StatusKeys = 100

// writeKeys appends ,"keys_total":N,"keys":[…] to /status: the
// StatusKeys keys with the most tokens today, then the most requests,
// then by name.
func writeKeys(buf *bytes.Buffer, src KeySource, now time.Time) {
	all := src.Status(now)
	sort.SliceStable(all, func(i, j int) bool {
		a, b := &all[i], &all[j]
		if a.TokensToday != b.TokensToday {
			return a.TokensToday > b.TokensToday
		}
		return a.Requests > b.Requests
	})
	buf.WriteString(`,"keys_total":` + strconv.Itoa(len(all)) + `,"keys":`)
	b, _ := json.Marshal(all[:min(len(all), StatusKeys)])
	buf.Write(b)
}

// serveKeys answers GET /status/keys: {"keys":[…]} of every key, by name.
func serveKeys(w http.ResponseWriter, src KeySource) {
	if src == nil {
		http.Error(w, "no API keys configured", http.StatusNotFound)
		return
	}
	b, _ := json.Marshal(struct {
		Keys []keys.KeyStatus `json:"keys"`
	}{src.Status(time.Now())})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(append(b, '\n'))
}
