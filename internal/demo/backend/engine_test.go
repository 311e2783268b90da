package backend

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// promptBody is a streamed tiny-loop chat request whose prompt is 120
// tokens by the package estimate (16 + 4 + 400/4), tag first so that
// prompts differ, answering tokens tokens.
func promptBody(tag string, tokens int) string {
	content := tag + strings.Repeat("x", 400-len(tag))
	return fmt.Sprintf(`{"model":"tiny-loop","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, tokens, content)
}

// contentAt returns when, since start, each content chunk of w was
// written (the role chunk and the terminal chunks are left out).
func contentAt(w *timedWriter, start time.Time) []time.Duration {
	var out []time.Duration
	for i, s := range w.writes {
		if strings.Contains(s, `"content":"`) && !strings.Contains(s, `"content":""`) {
			out = append(out, w.start.Sub(start)+w.writeAt[i])
		}
	}
	return out
}

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

// TestEngine: with Options.Slots the instance shares its compute as
// llama-server's slots do (tools/server/server-context.cpp update_slots):
// the first token comes with the step that ends the prompt, every
// generating slot adds a token delay to each step on a CPU (a GPU's batch
// does not), prompts are processed in turn up to a batch per step, a
// generating slot waits for the step carrying a prompt, and a request
// waits for a free slot.
func TestEngine(t *testing.T) {
	type req struct {
		at     int // ms after the start
		tokens int
	}
	rows := []struct {
		name string
		opts Options
		reqs []req
		want [][]time.Duration // content chunk times per request
	}{
		{name: "an idle instance: the prefill, the first token with it, then a token delay each",
			opts: Options{Slots: 4},
			reqs: []req{{0, 3}}, want: [][]time.Duration{ms(120, 130, 140)}},
		{name: "two generating slots on a CPU: each token takes two token delays",
			// A's prompt 0–120; B's joins no started step: 120–240 plus
			// one decoding step of A (10); then both generate
			opts: Options{Slots: 4},
			reqs: []req{{0, 4}, {1, 3}},
			want: [][]time.Duration{ms(120, 250, 270, 290), ms(250, 270, 290)}},
		{name: "a GPU's batch: two generating slots at the cost of one",
			opts: Options{Slots: 4, Parallel: 4},
			reqs: []req{{0, 4}, {1, 3}},
			want: [][]time.Duration{ms(120, 250, 260, 270), ms(250, 260, 270)}},
		{name: "prompts queued together share steps up to the batch and end with their step",
			// A alone in the first step (0–120); B and C (240 tokens, of a
			// batch of 250) in the next, 120–370 with A's decoding step
			opts: Options{Slots: 4, Batch: 250},
			reqs: []req{{0, 1}, {1, 1}, {2, 1}},
			want: [][]time.Duration{ms(120), ms(370), ms(370)}},
		{name: "a prompt beyond the batch spills into the next step",
			// B in step 2 (120–240), C's first 10 tokens there too, and
			// A's decoding (to 260); C's other 110 in step 3 with A's and
			// B's decoding (260–390)
			opts: Options{Slots: 4, Batch: 130},
			reqs: []req{{0, 1}, {1, 1}, {2, 1}},
			want: [][]time.Duration{ms(120), ms(260), ms(390)}},
		{name: "a generating slot waits for the step carrying a prompt",
			// A generates from 120; B's prompt is a step 125–245 (+10 for
			// A's decoding): A's token due at 130 comes at 255
			opts: Options{Slots: 4},
			reqs: []req{{0, 3}, {125, 1}},
			want: [][]time.Duration{ms(120, 130, 255), ms(255)}},
		{name: "all slots busy: a request waits for a free slot",
			opts: Options{Slots: 1},
			reqs: []req{{0, 2}, {1, 1}},
			want: [][]time.Duration{ms(120, 130), ms(250)}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := r.opts
				o.TokenDelay, o.PrefillPerToken = 10*time.Millisecond, time.Millisecond
				b, err := New(o)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				ws := make([]*timedWriter, len(r.reqs))
				var dones []chan struct{}
				for i, q := range r.reqs {
					time.Sleep(time.Until(start.Add(time.Duration(q.at) * time.Millisecond)))
					w, cancel, done := serveInBubble(b, "/v1/chat/completions", promptBody(fmt.Sprint(i), q.tokens))
					defer cancel()
					ws[i] = w
					dones = append(dones, done)
				}
				for _, d := range dones {
					<-d
				}
				for i, w := range ws {
					if got := contentAt(w, start); fmt.Sprint(got) != fmt.Sprint(r.want[i]) {
						t.Errorf("request %d: tokens at %v, want %v", i, got, r.want[i])
					}
				}
			})
		})
	}
}
