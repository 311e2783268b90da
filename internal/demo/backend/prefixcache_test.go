package backend

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
)

const answerText = "Hello from tiny-gguf! This reply is deterministic."

// msgTokens is the package's prompt estimate of one message with content s.
func msgTokens(s string) int { return 4 + (len(s)+3)/4 }

// chatBody renders a /v1/chat/completions (or /v1/messages, with system
// given apart) body of messages alternating user/assistant after an
// optional system message.
func chatBody(system string, anthropic bool, msgs ...string) string {
	var parts []string
	if system != "" && !anthropic {
		parts = append(parts, fmt.Sprintf(`{"role":"system","content":%q}`, system))
	}
	for i, m := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		parts = append(parts, fmt.Sprintf(`{"role":%q,"content":%q}`, role, m))
	}
	sys := ""
	if anthropic && system != "" {
		sys = fmt.Sprintf(`"system":%q,`, system)
	}
	return `{"model":"tiny",` + sys + `"max_tokens":64,"messages":[` + strings.Join(parts, ",") + `]}`
}

type cacheReport struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		InputTokens          int `json:"input_tokens"`
		CacheReadInputTokens int `json:"cache_read_input_tokens"`
	} `json:"usage"`
	Timings struct {
		CacheN  int `json:"cache_n"`
		PromptN int `json:"prompt_n"`
	} `json:"timings"`
}

// TestPrefixCache: R1 — each demo instance models a prompt cache
// and reports it where llama-server does: a later turn of a conversation
// on the same instance is cached up to the answer it generated; another
// instance, or another conversation, caches only what it saw.
func TestPrefixCache(t *testing.T) {
	const sys = "You are terse."
	leakcheck.Check(t) // registered first: runs after every server closed
	instance := func(opts Options) *harness {
		b, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(b)
		t.Cleanup(srv.Close)
		return &harness{b: b, srv: srv}
	}
	a, b, off := instance(Options{PrefixCache: 64}), instance(Options{PrefixCache: 64}), instance(Options{})
	base := 16 + msgTokens(sys)
	turn1 := base + msgTokens("q1")
	turn2 := turn1 + msgTokens(answerText) + msgTokens("q2")
	rows := []struct {
		name       string
		h          *harness
		path, body string
		prompt     int
		cached     int
	}{
		{"issue16 first turn: nothing cached", a, "/v1/chat/completions", chatBody(sys, false, "q1"), turn1, 0},
		{"issue16 second turn on the same instance: cached through the answer it generated", a, "/v1/chat/completions",
			chatBody(sys, false, "q1", answerText, "q2"), turn2, turn2 - msgTokens("q2")},
		{"issue16 second turn on another instance: nothing cached", b, "/v1/chat/completions",
			chatBody(sys, false, "q1", answerText, "q2"), turn2, 0},
		{"issue16 another conversation with the same system prompt: the system prompt is cached", a, "/v1/chat/completions",
			chatBody(sys, false, "other"), base + msgTokens("other"), base},
		{"issue16 the same prompt again: all but the last token (as llama-server)", a, "/v1/chat/completions",
			chatBody(sys, false, "other"), base + msgTokens("other"), base + msgTokens("other") - 1},
		{"issue16 no prefix cache configured: never cached", off, "/v1/chat/completions", chatBody(sys, false, "q1"), turn1, 0},
		{"issue16 messages first turn", b, "/v1/messages", chatBody(sys, true, "m1"), base + msgTokens("m1"), 0},
		{"issue16 messages second turn: cache_read_input_tokens", b, "/v1/messages",
			chatBody(sys, true, "m1", answerText, "m2"), base + msgTokens("m1") + msgTokens(answerText) + msgTokens("m2"),
			base + msgTokens("m1") + msgTokens(answerText)},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			code, _, body := r.h.do(t, "POST", r.path, r.body)
			if code != 200 {
				t.Fatalf("status %d: %s", code, body)
			}
			var rep cacheReport
			if err := json.Unmarshal(body, &rep); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			u := rep.Usage
			if strings.HasPrefix(r.path, "/v1/messages") {
				if u.CacheReadInputTokens != r.cached || u.InputTokens != r.prompt-r.cached {
					t.Fatalf("usage cache_read_input_tokens %d input_tokens %d, want %d and %d", u.CacheReadInputTokens, u.InputTokens, r.cached, r.prompt-r.cached)
				}
				return
			}
			if u.PromptTokens != r.prompt || u.PromptTokensDetails.CachedTokens != r.cached {
				t.Fatalf("usage prompt_tokens %d cached_tokens %d, want %d and %d", u.PromptTokens, u.PromptTokensDetails.CachedTokens, r.prompt, r.cached)
			}
			if rep.Timings.CacheN != r.cached || rep.Timings.PromptN != r.prompt-r.cached {
				t.Fatalf("timings cache_n %d prompt_n %d, want %d and %d", rep.Timings.CacheN, rep.Timings.PromptN, r.cached, r.prompt-r.cached)
			}
		})
	}
	if st := a.b.Stats(); st.CachedTokens != uint64(turn2-msgTokens("q2")+base+base+msgTokens("other")-1) {
		t.Errorf("instance a: Stats().CachedTokens = %d, want the sum of its rows", st.CachedTokens)
	}
}

// TestPrefillPerToken: R1 — each uncached prompt token costs
// PrefillPerToken before the first byte, so a cached turn answers sooner.
func TestPrefillPerToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := New(Options{PrefixCache: 64, PrefillPerToken: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		first := chatBody("", false, "q1")
		later := chatBody("", false, "q1", answerText, "q2")
		for _, r := range []struct {
			name string
			body string
			want time.Duration
		}{
			{"issue16 first turn: every prompt token", first, time.Duration(16+msgTokens("q1")) * time.Millisecond},
			{"issue16 second turn: only the new message", later, time.Duration(msgTokens("q2")) * time.Millisecond},
		} {
			w, cancel, done := serveInBubble(b, "/v1/chat/completions", r.body)
			<-done
			cancel()
			if w.status != 200 || w.headAt != r.want {
				t.Errorf("%s: status %d after %s, want 200 after %s", r.name, w.status, w.headAt, r.want)
			}
		}
	})
}
