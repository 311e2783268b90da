package backend

import (
	"strconv"
	"time"
)

// Ollama 0.17.4 native formats (samples ollama_api_*).

// ollamaFormat renders /api/chat: NDJSON lines when streaming, one object
// (no trailing newline, as Ollama's c.JSON) when not.
type ollamaFormat struct{}

func (ollamaFormat) contentType() string { return "application/x-ndjson" }

func (ollamaFormat) begin(_ *call, dst []byte) []byte { return dst }

// head appends `{"model":M,"created_at":"T","message":{"role":"assistant","content":`.
func (ollamaFormat) head(c *call, dst []byte) []byte {
	dst = append(dst, `{"model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"created_at":`...)
	dst = appendTime(dst, c.clock())
	return append(dst, `,"message":{"role":"assistant","content":`...)
}

// toolCalls appends `,"tool_calls":[…]` with Ollama's native shape.
func (ollamaFormat) toolCalls(c *call, dst []byte) []byte {
	dst = append(dst, `,"tool_calls":[{"id":"call_`...)
	dst = appendID(dst, c.b.opts.Seed, c.seq*4+2, lower36, 8)
	dst = append(dst, `","function":{"index":0,"name":"`...)
	dst = append(dst, c.plan.toolName()...)
	dst = append(dst, `","arguments":`...)
	dst = append(dst, c.plan.toolArgsObject()...)
	return append(dst, `}}]`...)
}

func (o ollamaFormat) chunk(c *call, dst []byte, i int) []byte {
	dst = o.head(c, dst)
	if c.plan.kind == kindTool {
		dst = append(dst, `""`...)
		dst = o.toolCalls(c, dst)
	} else if t, ok := c.thought(i); ok {
		dst = append(dst, `"","thinking":"`...)
		dst = append(dst, t...)
		dst = append(dst, '"')
	} else {
		dst = append(dst, '"')
		dst = append(dst, c.plan.token(i)...)
		dst = append(dst, '"')
	}
	dst = append(dst, "},\"done\":false"...)
	if c.req.Logprobs && c.plan.kind != kindTool {
		dst = append(dst, `,"logprobs":[`...)
		dst = appendLogprob(dst, c.plan.token(i), c.req.TopLogprobs)
		dst = append(dst, ']')
	}
	return append(dst, "}\n"...)
}

// Log probabilities as real Ollama 0.17.4 reports them for the tiny models
// (which are certain of every token): the chosen token at
// -8.799627693178991e-13 with its UTF-8 bytes, and as the top alternatives
// that token itself and then "<unk>" at -33.91942596435547 (the stand-in
// lists at most these two).
const (
	logprobChosen = "-8.799627693178991e-13"
	logprobUnk    = `{"token":"\u003cunk\u003e","logprob":-33.91942596435547,"bytes":[60,117,110,107,62]}`
)

// appendLogprob appends one token's log-probability object with top
// alternatives (Ollama's api.Logprob); tok is already JSON-escaped text.
func appendLogprob(dst []byte, tok string, top int) []byte {
	one := func(dst []byte) []byte {
		dst = append(dst, `{"token":"`...)
		dst = append(dst, tok...)
		dst = append(dst, `","logprob":`+logprobChosen+`,"bytes":[`...)
		for j := 0; j < len(tok); j++ {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(tok[j]), 10)
		}
		return append(dst, ']')
	}
	dst = one(dst)
	if top > 0 {
		dst = append(dst, `,"top_logprobs":[`...)
		dst = one(dst)
		dst = append(dst, '}')
		if top > 1 {
			dst = append(dst, ',')
			dst = append(dst, logprobUnk...)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

func (o ollamaFormat) end(c *call, dst []byte) []byte {
	dst = o.head(c, dst)
	dst = append(dst, `""}`...)
	dst = o.done(c, dst)
	return append(dst, '\n')
}

// done appends `,"done":true,"done_reason":…,"total_duration":…}` with
// durations in nanoseconds.
func (ollamaFormat) done(c *call, dst []byte) []byte {
	now := c.clock()
	first := c.firstTok
	if first.IsZero() {
		first = now
	}
	reason := `stop`
	if c.plan.finish == finishLength {
		reason = `length`
	}
	dst = append(dst, `,"done":true,"done_reason":"`...)
	dst = append(dst, reason...)
	dst = append(dst, '"')
	if !c.stream {
		dst = appendLogprobs(c, dst) // a stream's done line carries none
	}
	dst = append(dst, `,"total_duration":`...)
	dst = strconv.AppendInt(dst, int64(now.Sub(c.start)), 10)
	dst = append(dst, `,"load_duration":`...)
	dst = strconv.AppendInt(dst, int64(c.decoded.Sub(c.start)), 10)
	dst = append(dst, `,"prompt_eval_count":`...)
	dst = strconv.AppendInt(dst, int64(c.prompt), 10)
	dst = append(dst, `,"prompt_eval_duration":`...)
	dst = strconv.AppendInt(dst, int64(first.Sub(c.decoded)), 10)
	dst = append(dst, `,"eval_count":`...)
	dst = strconv.AppendInt(dst, int64(c.plan.completion), 10)
	dst = append(dst, `,"eval_duration":`...)
	dst = strconv.AppendInt(dst, int64(now.Sub(first)), 10)
	return append(dst, '}')
}

func (o ollamaFormat) whole(c *call, dst []byte, pad int) []byte {
	dst = o.head(c, dst)
	dst = append(dst, '"')
	if c.plan.kind == kindTool {
		dst = append(dst, '"')
		dst = o.toolCalls(c, dst)
	} else {
		for i := range c.plan.n {
			dst = append(dst, c.plan.token(i)...)
		}
		dst = appendPadding(dst, pad)
		dst = append(dst, '"')
		if c.plan.think > 0 {
			dst = append(dst, `,"thinking":"`...)
			dst = c.appendThoughts(dst)
			dst = append(dst, '"')
		}
	}
	dst = append(dst, '}')
	return o.done(c, dst)
}

// appendLogprobs appends `,"logprobs":[…]` for every token of a non-stream
// answer when the request asked for them.
func appendLogprobs(c *call, dst []byte) []byte {
	if !c.req.Logprobs || c.plan.kind == kindTool {
		return dst
	}
	dst = append(dst, `,"logprobs":[`...)
	for i := range c.plan.n {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendLogprob(dst, c.plan.token(i), c.req.TopLogprobs)
	}
	return append(dst, ']')
}

// renderTags renders /api/tags for the served models.
func (b *Backend) renderTags() []byte {
	dst := []byte(`{"models":[`)
	for i, m := range b.models {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"name":"`+m.name+`:latest","model":"`+m.name+`:latest","modified_at":"`+m.modified+`","size":`...)
		dst = strconv.AppendInt(dst, m.size, 10)
		dst = append(dst, `,"digest":"`+m.digest+`","details":`...)
		dst = appendDetails(dst, m)
		dst = append(dst, '}')
	}
	return append(dst, `]}`...)
}

func appendDetails(dst []byte, m *model) []byte {
	return append(dst, `{"parent_model":"","format":"gguf","family":"llama","families":["llama"],"parameter_size":"`+
		m.paramSize+`","quantization_level":"unknown"}`...)
}

// psKeepAlive is how long Ollama keeps a model loaded after its last use.
const psKeepAlive = 5 * time.Minute

// renderPS renders /api/ps: the models used since New whose keep_alive
// has not run out, sorted by name.
func (b *Backend) renderPS(dst []byte) []byte {
	dst = append(dst, `{"models":[`...)
	first := true
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.models { // catalogue order is name order
		until, ok := b.loaded[m.name]
		if !ok || !b.now().Before(until) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, `{"name":"`+m.name+`:latest","model":"`+m.name+`:latest","size":`...)
		dst = strconv.AppendInt(dst, m.psSize, 10)
		dst = append(dst, `,"digest":"`+m.digest+`","details":`...)
		dst = appendDetails(dst, m)
		dst = append(dst, `,"expires_at":`...)
		dst = appendTime(dst, until)
		dst = append(dst, `,"size_vram":0,"context_length":4096}`...)
	}
	return append(dst, `]}`...)
}
