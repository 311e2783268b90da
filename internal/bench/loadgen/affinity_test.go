package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// R1: the workload sends every conversation's turns in order, each
// with the whole history (the previous answers exactly as streamed), and
// sums the backend-reported tokens per replica.
func TestAffinityWorkload(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{} // conversation prefix → turns seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []message `json:"messages"`
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		n := len(req.Messages)
		first := req.Messages[1].Content[:strings.Index(req.Messages[1].Content, ",")]
		mu.Lock()
		turn := seen[first]
		seen[first] = turn + 1
		mu.Unlock()
		if n != 2+2*turn || req.Messages[0].Role != "system" {
			http.Error(w, fmt.Sprintf("turn %d of %s has %d messages", turn, first, n), 400)
			return
		}
		for i := 2; i < n; i += 2 {
			if want := fmt.Sprintf("answer %d", i/2-1); req.Messages[i].Content != want {
				http.Error(w, fmt.Sprintf("message %d = %q, want %q", i, req.Messages[i].Content, want), 400)
				return
			}
		}
		replica := "r1"
		if len(first)%2 == 0 {
			replica = "r2"
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"model\":%q,\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n", replica)
		fmt.Fprintf(w, "data: {\"model\":%q,\"choices\":[{\"delta\":{\"content\":\"answer \"}}]}\n\n", replica)
		fmt.Fprintf(w, "data: {\"model\":%q,\"choices\":[{\"delta\":{\"content\":\"%d\"}}]}\n\n", replica, turn)
		fmt.Fprintf(w, "data: {\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", replica, 10*turn)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	w := &workload{url: srv.URL, model: "m", turns: 3, maxTokens: 8, system: "sys", userBytes: 20, seed: 1, cl: srv.Client()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rec := w.run(ctx, 7, 3).record("prefix_affinity", time.Second)
	if rec.Requests != 21 || rec.OK != 21 {
		t.Fatalf("requests %d ok %d, want 21 and 21; errors %v", rec.Requests, rec.OK, rec.Errors)
	}
	if rec.PromptTokens != 2100 || rec.CachedTokens != 7*(0+10+20) {
		t.Errorf("prompt %d cached %d, want 2100 and 210", rec.PromptTokens, rec.CachedTokens)
	}
	if rec.Replicas["r1"]+rec.Replicas["r2"] != 21 || rec.FirstP50 <= 0 {
		t.Errorf("replicas %v, TTFT p50 %v", rec.Replicas, rec.FirstP50)
	}
}

// R1: cached tokens come from usage details, else llama-server's
// timings.cache_n; the first content (not the role chunk) stamps TTFT.
func TestAffinityChunk(t *testing.T) {
	var tr turnResult
	var answer strings.Builder
	start := time.Now().Add(-time.Millisecond)
	for _, c := range []string{
		`{"model":"r1","choices":[{"delta":{"role":"assistant","content":null}}]}`,
		`{"choices":[{"delta":{"content":"hi"}}]}`,
		`{"choices":[],"usage":{"prompt_tokens":55},"timings":{"cache_n":54}}`,
	} {
		if err := tr.chunk([]byte(c), &answer, start); err != nil {
			t.Fatal(err)
		}
	}
	if tr.ttft <= 0 || answer.String() != "hi" || tr.replica != "r1" || tr.prompt != 55 || tr.cached != 54 {
		t.Fatalf("turn %+v answer %q", tr, answer.String())
	}
	if err := tr.chunk([]byte(`{"error":{"message":"x"}}`), &answer, start); err == nil {
		t.Fatal("an error event was accepted")
	}
	if got := filler(rand.New(rand.NewPCG(1, 2)), 100); len(got) != 100 || strings.ContainsAny(got, "\"\\\n") {
		t.Fatalf("filler: %q", got)
	}
}
