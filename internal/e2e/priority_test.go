package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// bodyCaptor records the last body of each POST path before the demo
// backend answers it.
type bodyCaptor struct {
	next http.Handler
	mu   sync.Mutex
	last map[string][]byte
}

func (c *bodyCaptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.last[r.URL.Path] = b
		c.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	c.next.ServeHTTP(w, r)
}

func (c *bodyCaptor) take(path string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.last[path]
	delete(c.last, path)
	return b
}

// TestG7PriorityThroughTheFleet: the real edge and node, over mutual TLS,
// in front of a backend that records what it got. A group on an adapter
// whose profile says its backend schedules by priority (vLLM's order) has
// every chat and embedding body reach the backend with "priority" set to
// the request's class — the key's, or what it asked within its max_class —
// whatever the client put there; a group on an adapter without the setting
// gets the client's body with only model replaced (SPEC G7).
func TestG7PriorityThroughTheFleet(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	bp := startBackend(t, backend.Options{})
	capt := &bodyCaptor{next: bp.b, last: map[string][]byte{}}
	url := bp.serve(t, capt)
	lowerFirst := protocol.PriorityLowerFirst
	prio := compatAdapter("prio", url, 4)
	prio.ProfileOverrides = &config.ProfileOverrides{PriorityField: &lowerFirst}
	keys := map[string]string{"ops": "sk-ops-key", "bulk": "sk-bulk-key"}
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{prio, compatAdapter("plain", url, 4)}}},
		[]config.Model{modelGroup("prio", provider("gpu-1", "prio", "tiny")), modelGroup("plain", provider("gpu-1", "plain", "tiny"))},
		func(c *config.Config) {
			for name, key := range keys {
				sum := sha256.Sum256([]byte(key))
				k := config.APIKey{Principal: name, KeySHA256: hex.EncodeToString(sum[:]), MaxClass: config.ClassCritical}
				if name == "bulk" {
					k.Class, k.MaxClass = config.ClassBatch, config.ClassBatch
				}
				c.APIKeys = append(c.APIKeys, k)
			}
		})
	_, _, api := startReady(t, p, cfg, logs)
	post := func(t *testing.T, key, path, body string, hdr ...string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, api.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+keys[key])
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := api.hc.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
	}
	chat := func(model string) string {
		return `{"model":"` + model + `","priority":-100,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	}
	for _, row := range []struct {
		name, key, path, body string
		hdr                   []string
		want                  int
	}{
		{"G7 a batch key's -100 is served as batch", "bulk", "/v1/chat/completions", chat("prio"), nil, 1},
		{"G7 a batch key asking for critical stays batch", "bulk", "/v1/chat/completions", chat("prio"), []string{"Iop-Priority", "critical"}, 1},
		{"G7 the key's default class", "ops", "/v1/chat/completions", chat("prio"), nil, 0},
		{"G7 a class the key may ask for", "ops", "/v1/chat/completions", chat("prio"), []string{"Iop-Priority", "critical"}, -1},
		{"G7 service_tier flex is batch", "ops", "/v1/chat/completions", strings.Replace(chat("prio"), `"max_tokens"`, `"service_tier":"flex","max_tokens"`, 1), nil, 1},
		{"G7 embeddings too", "ops", "/v1/embeddings", `{"model":"prio","input":"hi","priority":-100}`, []string{"Iop-Priority", "batch"}, 1},
	} {
		t.Run(row.name, func(t *testing.T) {
			post(t, row.key, row.path, row.body, row.hdr...)
			got := capt.take(row.path)
			var v struct {
				Priority *int   `json:"priority"`
				Model    string `json:"model"`
			}
			if err := json.Unmarshal(got, &v); err != nil || v.Priority == nil || *v.Priority != row.want || v.Model != "tiny" {
				t.Fatalf("the backend got %s (%v), want priority %d and model tiny", got, err, row.want)
			}
		})
	}
	t.Run("G7 without priority_field the body is the client's", func(t *testing.T) {
		post(t, "bulk", "/v1/chat/completions", chat("plain"))
		if got, want := string(capt.take("/v1/chat/completions")), chat("tiny"); got != want {
			t.Fatalf("the backend got %s, want %s (only model replaced)", got, want)
		}
	})
}
