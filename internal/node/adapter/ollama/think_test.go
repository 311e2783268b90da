package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"iop/internal/node/adapter/upstream"
	iop "iop/proto/gen/iop"
)

// fakeOllama answers /api/show with caps and family (caps nil: 404, as an
// older Ollama) and /api/chat like Ollama 0.17.4 (server/routes.go
// ChatHandler): a 400 "does not support thinking" for think on a model
// without the capability, a 400 `think value "high" is not supported for
// this model` for a level on a model that is not gpt-oss (levels are the
// harmony parser's only), else a thinking stream.
type fakeOllama struct {
	mu     sync.Mutex
	caps   []string
	family string // details.family; "gptoss" takes levels
	noShow bool   // /api/show is a 404 whatever caps says
	shows  int
	chats  []string // the /api/chat bodies
}

func (f *fakeOllama) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case ShowPath:
		f.shows++
		if f.caps == nil || f.noShow {
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
			return
		}
		b, _ := json.Marshal(map[string]any{"capabilities": f.caps, "details": map[string]any{"family": f.family}})
		w.Write(b)
	case ChatPath:
		f.chats = append(f.chats, string(body))
		var q struct {
			Think json.RawMessage `json:"think"`
		}
		_ = json.Unmarshal(body, &q)
		canThink := false
		for _, c := range f.caps {
			canThink = canThink || c == "thinking"
		}
		if len(q.Think) > 0 && string(q.Think) != "false" && !canThink {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"\"m\" does not support thinking"}`)
			return
		}
		if len(q.Think) > 0 && q.Think[0] == '"' && f.family != "gptoss" {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"think value `+strings.ReplaceAll(string(q.Think), `"`, `\"`)+` is not supported for this model"}`)
			return
		}
		// Ollama 0.17.4's lines: thinking first, content "" beside it.
		io.WriteString(w, `{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":"Let me"},"done":false}`+"\n"+
			`{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":" think."},"done":false}`+"\n"+
			`{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"Hi"},"done":false}`+"\n"+
			`{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":5}`+"\n")
	}
}

func (f *fakeOllama) driver(t *testing.T) *Driver {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return &Driver{EP: &upstream.Endpoint{Client: srv.Client(), Base: u}, Caps: &Capabilities{}}
}

// E8: think reaches Ollama as its "think" for a model that can think, and
// its streamed message.thinking comes back as reasoning (before the text)
// and the Result's Reasoning; an assistant message's thinking is sent as
// message.thinking.
func TestThinkingStream(t *testing.T) {
	f := &fakeOllama{caps: []string{"completion", "thinking"}, family: "gptoss"}
	d := f.driver(t)
	var order []string
	h := upstream.Hooks{
		OnReasoning: func(s string) { order = append(order, "think:"+s) },
		OnDelta:     func(s string, _ []*iop.TokenLogprob) { order = append(order, "text:"+s) },
	}
	in := &iop.RunInput{Think: "high", Messages: []*iop.ChatMessage{{Role: "user", Content: "hi"},
		{Role: "assistant", Content: "hello", Thinking: "earlier"}, {Role: "user", Content: "again"}}}
	res, err := d.Run(context.Background(), "m", in, h)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reasoning != "Let me think." || res.Content != "Hi" {
		t.Fatalf("reasoning %q content %q", res.Reasoning, res.Content)
	}
	if len(order) == 0 || !strings.HasPrefix(order[0], "think:") || order[len(order)-1] != "text:Hi" {
		t.Fatalf("hook order %q: want the reasoning before the text", order)
	}
	if len(f.chats) != 1 || !strings.Contains(f.chats[0], `"think":"high"`) || !strings.Contains(f.chats[0], `"thinking":"earlier"`) {
		t.Fatalf("chat bodies %q: want think \"high\" and the history's thinking", f.chats)
	}
}

// E8: a model that cannot think is run without think, never refused: from
// /api/show's capabilities (asked once, then cached), or — when /api/show
// does not tell — after Ollama's 400 "does not support thinking", once,
// and remembered.
func TestThinkOnModelThatCannotThink(t *testing.T) {
	in := &iop.RunInput{Think: "true", Messages: []*iop.ChatMessage{{Role: "user", Content: "hi"}}}
	t.Run("E8 capabilities say no", func(t *testing.T) {
		f := &fakeOllama{caps: []string{"completion"}}
		d := f.driver(t)
		for range 2 {
			if _, err := d.Run(context.Background(), "m", in, upstream.Hooks{}); err != nil {
				t.Fatal(err)
			}
		}
		if f.shows != 1 || len(f.chats) != 2 || strings.Contains(f.chats[0]+f.chats[1], `"think"`) {
			t.Fatalf("shows %d, chats %q: want one /api/show and no think", f.shows, f.chats)
		}
	})
	t.Run("E8 no capabilities: the 400 teaches", func(t *testing.T) {
		f := &fakeOllama{}
		d := f.driver(t)
		for range 2 {
			if _, err := d.Run(context.Background(), "m", in, upstream.Hooks{}); err != nil {
				t.Fatal(err)
			}
		}
		if len(f.chats) != 3 || !strings.Contains(f.chats[0], `"think":true`) || strings.Contains(f.chats[1]+f.chats[2], `"think"`) {
			t.Fatalf("chats %q: want think once, refused, then without it (and without it next time)", f.chats)
		}
	})
	t.Run("E8 think false goes nowhere it changes nothing", func(t *testing.T) {
		f := &fakeOllama{caps: []string{"completion"}}
		off := &iop.RunInput{Think: "false", Messages: in.Messages}
		if _, err := f.driver(t).Run(context.Background(), "m", off, upstream.Hooks{}); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(f.chats[0], `"think"`) {
			t.Fatalf("chat %q: want no think", f.chats[0])
		}
	})
}

// E8: a level ("low", "medium", "high": Messages' effort, chat's and
// Responses' reasoning effort) reaches only a model that takes levels
// (gpt-oss in Ollama 0.17.4); any other thinking model gets think true,
// never Ollama's 400 `think value "high" is not supported for this model`:
// from /api/show's family (asked once), or — when /api/show does not tell,
// or tells wrong — after that 400, once, and remembered.
func TestThinkLevelOnModelWithoutLevels(t *testing.T) {
	in := &iop.RunInput{Think: "high", Messages: []*iop.ChatMessage{{Role: "user", Content: "hi"}}}
	run := func(t *testing.T, f *fakeOllama, d *Driver) {
		for range 2 {
			res, err := d.Run(context.Background(), "m", in, upstream.Hooks{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Reasoning != "Let me think." {
				t.Fatalf("reasoning %q: want the model's thinking", res.Reasoning)
			}
		}
	}
	t.Run("E8 the family says no levels", func(t *testing.T) {
		f := &fakeOllama{caps: []string{"completion", "thinking"}, family: "qwen3"}
		run(t, f, f.driver(t))
		if f.shows != 1 || len(f.chats) != 2 || !strings.Contains(f.chats[0], `"think":true`) || !strings.Contains(f.chats[1], `"think":true`) {
			t.Fatalf("shows %d, chats %q: want one /api/show and think true", f.shows, f.chats)
		}
	})
	t.Run("E8 no capabilities: the 400 teaches", func(t *testing.T) {
		f := &fakeOllama{caps: []string{"completion", "thinking"}, family: "qwen3", noShow: true}
		run(t, f, f.driver(t))
		if len(f.chats) != 3 || !strings.Contains(f.chats[0], `"think":"high"`) || !strings.Contains(f.chats[1], `"think":true`) ||
			!strings.Contains(f.chats[2], `"think":true`) {
			t.Fatalf("chats %q: want the level once, refused, then think true (and think true next time)", f.chats)
		}
	})
}

// E8: a think value that is not Ollama's is an invalid input naming it.
func TestThinkInvalid(t *testing.T) {
	_, err := BuildChatRequest("m", &iop.RunInput{Think: "maximum", Messages: []*iop.ChatMessage{{Role: "user", Content: "hi"}}})
	var fe *upstream.FieldError
	if !errors.As(err, &fe) || fe.Field != "think" {
		t.Fatalf("got %v, want a FieldError naming think", err)
	}
}
