package backend

import (
	"context"
	"sync"
	"time"
)

// engine models how one llama-server instance shares its compute among
// its slots (Options.Slots > 0), following llama.cpp's server loop
// (tools/server/server-context.cpp, update_slots, at e95dae18): at most
// Slots requests are processed at once and a later one waits for a free
// slot; every step decodes one token for each generating slot and then
// fills the same batch with prompt tokens of the slots processing their
// prompt, in turn, up to the batch size; a step lasts as long as its
// tokens take. So on a CPU (one thread, Options.Parallel 1) each of N
// generating slots gets a token every N × TokenDelay, a prompt waits for
// the prompts queued before it, every generating slot stalls while a
// prompt is processed in its step, and the first token comes with the step
// that ends the prompt. A GPU decodes a batch of tokens in about the time
// of one: Options.Parallel tokens cost one TokenDelay.
//
// The step loop is modelled per request, with no goroutine of its own:
// under one mutex the engine keeps the count of generating slots and the
// steps that carry prompt tokens, queued first come first served: a prompt
// joins the last step that has not started while it has room (the step in
// progress is fixed), then as many new steps as it needs, each starting
// when the one before it ends and lasting its prompt tokens plus the
// decoding of the slots generating then; the prompt is done, and its
// first token out, when the step holding its last token ends. A
// generating slot's next token comes at the end of the step in progress,
// or after one decoding step when no prompt is being processed.
type engine struct {
	slots    chan struct{} // one value per busy slot
	batch    int           // prompt tokens per step (llama-server's -b, n_batch)
	parallel int           // generated tokens a step decodes at the cost of one
	token    time.Duration // TokenDelay: one generated token on an idle instance
	prompt   time.Duration // PrefillPerToken: one prompt token

	mu         sync.Mutex
	generating int           // guarded by mu
	prefilling int           // guarded by mu: slots whose prompt is queued
	steps      []*promptStep // guarded by mu: steps carrying prompt tokens, in order, none ended before the last call
}

// promptStep is one step that carries prompt tokens; its end moves while
// prompts join it before it starts.
type promptStep struct {
	start, end time.Time
	tokens     int
	ending     int // prompts whose last token it carries
}

// DefaultBatch is the prompt tokens one step processes when Options.Batch
// is 0: llama-server's default n_batch.
const DefaultBatch = 2048

func newEngine(o Options) *engine {
	e := &engine{slots: make(chan struct{}, o.Slots), batch: o.Batch, parallel: max(o.Parallel, 1),
		token: o.TokenDelay, prompt: o.PrefillPerToken}
	if e.batch <= 0 {
		e.batch = DefaultBatch
	}
	return e
}

// acquire takes a slot, waiting for one as llama-server queues a task
// while every slot is busy; false when ctx ended first.
func (e *engine) acquire(ctx context.Context) bool {
	select {
	case e.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// release frees the slot; generating says the request had started
// generating.
func (e *engine) release(generating bool) {
	if generating {
		e.mu.Lock()
		e.generating--
		e.mu.Unlock()
	}
	<-e.slots
}

// decodeStep is one step's decoding time with n generating slots
// (called with mu held).
func (e *engine) decodeStep(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return e.token * time.Duration((n+e.parallel-1)/e.parallel)
}

// queuePrompt queues the processing of tokens prompt tokens and returns
// the step that ends with its last one (wait for it with promptWait); the
// request then generates (generate).
func (e *engine) queuePrompt(tokens int) *promptStep {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	e.expire(now)
	// The slots generating when a new step runs: those generating now and
	// those whose prompts are queued ahead (they end before it).
	decoding := e.decodeStep(e.generating + e.prefilling)
	e.prefilling++
	for left := max(tokens, 1); left > 0; {
		if n := len(e.steps); n > 0 && e.steps[n-1].start.After(now) && e.steps[n-1].tokens < e.batch {
			last := e.steps[n-1]
			take := min(e.batch-last.tokens, left)
			last.tokens += take
			last.end = last.end.Add(time.Duration(take) * e.prompt)
			left -= take
			continue
		}
		start := now
		if n := len(e.steps); n > 0 {
			start = e.steps[n-1].end
		}
		take := min(e.batch, left)
		e.steps = append(e.steps, &promptStep{start: start, tokens: take,
			end: start.Add(time.Duration(take)*e.prompt + decoding)})
		left -= take
	}
	last := e.steps[len(e.steps)-1]
	last.ending++
	return last
}

// promptWait is how long from now until step ends (≤ 0: it has); a step
// that has not started may still grow, so the caller asks again after
// waiting.
func (e *engine) promptWait(step *promptStep) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return time.Until(step.end)
}

// expire drops the steps that ended by now (called with mu held).
func (e *engine) expire(now time.Time) {
	i := 0
	for i < len(e.steps) && !e.steps[i].end.After(now) {
		i++
	}
	if i > 0 {
		n := copy(e.steps, e.steps[i:])
		clear(e.steps[n:])
		e.steps = e.steps[:n]
	}
}

// generate counts the request, whose prompt is done, as generating from
// now on.
func (e *engine) generate() {
	e.mu.Lock()
	e.prefilling--
	e.generating++
	e.mu.Unlock()
}

// abandon uncounts a request whose client left before its prompt, ending
// in step, was done (its queued tokens stay: the step was built).
func (e *engine) abandon(step *promptStep) {
	e.mu.Lock()
	e.prefilling--
	step.ending--
	e.mu.Unlock()
}

// tokenStep is how long the request's next token takes: until the end of
// the step in progress while prompts are processed, else one decoding step
// at the current count of generating slots.
func (e *engine) tokenStep() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	e.expire(now)
	if len(e.steps) > 0 && !e.steps[0].start.After(now) {
		return e.steps[0].end.Sub(now)
	}
	// A slot whose prompt step has ended generates in this step too.
	n := e.generating + e.prefilling
	for _, st := range e.steps {
		n -= st.ending
	}
	return e.decodeStep(n)
}
