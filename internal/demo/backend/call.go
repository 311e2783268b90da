package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// shape selects a route family's response and error format.
type shape uint8

const (
	shapeOllama      shape = iota // /api/*: Ollama 0.17 native
	shapeOpenAI                   // /v1/chat/completions, /v1/models: llama-server (errors: Ollama /v1)
	shapeAnthropic                // /v1/messages*: llama-server's Anthropic endpoint
	shapeResponses                // /v1/responses: llama-server (errors: Ollama /v1)
	shapeCompletions              // /v1/completions: llama-server (errors: Ollama /v1)
)

func shapeFor(path string) shape {
	switch {
	case strings.HasPrefix(path, "/api/"):
		return shapeOllama
	case strings.HasPrefix(path, "/v1/messages"):
		return shapeAnthropic
	}
	return shapeOpenAI
}

// chatRequest holds the request fields the stand-in reads; the three chat
// routes share it (OpenAI chat, Ollama /api/chat, Anthropic messages).
type chatRequest struct {
	Model               string `json:"model"`
	Stream              *bool  `json:"stream"`
	MaxTokens           *int   `json:"max_tokens"`
	MaxCompletionTokens *int   `json:"max_completion_tokens"`
	MaxOutputTokens     *int   `json:"max_output_tokens"` // /v1/responses
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Options *struct {
		NumPredict *int `json:"num_predict"`
	} `json:"options"`
	Messages []struct {
		Role    json.RawMessage `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	System json.RawMessage `json:"system"`
	Tools  json.RawMessage `json:"tools"`
	// /v1/completions.
	Prompt json.RawMessage `json:"prompt"`
	// Embeddings (/api/embed, /v1/embeddings).
	Input      json.RawMessage `json:"input"`
	Dimensions int             `json:"dimensions"`
	// Ollama /api/chat: log probabilities of the output tokens.
	Logprobs    bool `json:"logprobs"`
	TopLogprobs int  `json:"top_logprobs"`
	// Ollama /api/chat: whether a thinking model thinks (true, false or a
	// level); nil = the model's default.
	Think json.RawMessage `json:"think"`
	// Ollama /api/chat and /api/embed: how long the model stays loaded
	// after the request (/api/ps's expires_at; keepAlive).
	KeepAlive json.RawMessage `json:"keep_alive"`
}

// limit returns the request's token limit (0 = none): max_completion_tokens,
// else max_tokens, else Ollama's options.num_predict.
func (q *chatRequest) limit() int {
	switch {
	case q.MaxCompletionTokens != nil:
		return *q.MaxCompletionTokens
	case q.MaxTokens != nil:
		return *q.MaxTokens
	case q.MaxOutputTokens != nil:
		return *q.MaxOutputTokens
	case q.Options != nil && q.Options.NumPredict != nil:
		return *q.Options.NumPredict
	}
	return 0
}

// hasTools reports whether the request carries a non-empty tools array.
func (q *chatRequest) hasTools() bool {
	t := q.Tools
	return len(t) > 0 && t[0] == '[' && strings.TrimSpace(string(t[1:])) != "]"
}

// promptTokens is the deterministic prompt-size estimate of the package doc
// (tokens).
func (q *chatRequest) promptTokens() int {
	n := 16
	for _, m := range q.Messages {
		n += 4 + (textLen(m.Content)+3)/4
	}
	if len(q.Prompt) > 0 && string(q.Prompt) != "null" {
		n += 4 + (textLen(q.Prompt)+3)/4
	}
	if len(q.Input) > 0 && string(q.Input) != "null" {
		n += 4 + (textLen(q.Input)+3)/4
	}
	if len(q.System) > 0 && string(q.System) != "null" {
		n += 4 + (textLen(q.System)+3)/4
	}
	if q.hasTools() {
		n += (len(q.Tools) + 3) / 4
	}
	return n
}

// textLen is the length of a JSON string's contents (bytes), or of the raw
// JSON for other values.
func textLen(raw json.RawMessage) int {
	if len(raw) >= 2 && raw[0] == '"' {
		return len(raw) - 2
	}
	return len(raw)
}

// call is one request's state, owned by the request's goroutine.
type call struct {
	b     *Backend
	w     http.ResponseWriter
	r     *http.Request
	rc    *http.ResponseController // set for streams
	ctx   context.Context
	seq   uint64
	start time.Time

	bufp *[]byte // pooled; returned in finish
	buf  []byte  // request body, then the response being rendered

	req          chatRequest
	m            *model
	echo         string // model name as echoed (without fault suffix)
	modelJSON    []byte // echo as a JSON string
	modelArr     [64]byte
	fault        fault
	plan         plan
	stream       bool
	includeUsage bool
	prompt       int      // prompt tokens
	cached       int      // of those, served from the prefix cache (Options.PrefixCache)
	last         boundary // the prompt's whole-prompt boundary, when the cache is on
	created      int64
	idArr        [32]byte // chatcmpl id characters
	toolArr      [32]byte // tool-call id characters

	timer    *time.Timer
	decoded  time.Time // body decoded
	firstTok time.Time // first content token generated
	doneAt   time.Time // generation end of a non-stream answer; zero = ask the clock
	emitted  int
	status   int
	outcome  Outcome
	err      error

	// With Options.Slots: the request holds an engine slot (released in
	// finish) and, once its prompt is done, counts as generating.
	slot, generating bool
}

// buffer returns the request's empty scratch buffer.
func (c *call) buffer() []byte {
	if c.bufp == nil {
		c.bufp = c.b.bufs.Get().(*[]byte)
		c.buf = (*c.bufp)[:0]
	}
	return c.buf[:0]
}

// readBody reads the whole body (at most maxBody bytes) into the scratch buffer.
func (c *call) readBody() ([]byte, error) {
	buf := c.buffer()
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := c.r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > maxBody {
			c.buf = buf
			return nil, fmt.Errorf("request body over %d bytes: %w", maxBody, ErrBadRequest)
		}
		if err == io.EOF {
			c.buf = buf
			return buf, nil
		}
		if err != nil {
			c.buf = buf
			return nil, fmt.Errorf("read request body: %w", err)
		}
	}
}

// decode reads and parses a chat-shaped request and resolves its model;
// it answers the error itself and returns false when the request is bad.
func (c *call) decode(sh shape) bool {
	body, err := c.readBody()
	if err != nil {
		c.writeError(sh, http.StatusBadRequest, err.Error(), err)
		return false
	}
	if err := json.Unmarshal(body, &c.req); err != nil {
		// The message is encoding/json's, as Ollama (also Go) writes it.
		c.writeError(sh, http.StatusBadRequest, err.Error(), fmt.Errorf("%w: %w", ErrBadRequest, err))
		return false
	}
	c.decoded = c.b.now()
	if c.req.Model == "" {
		c.writeError(sh, http.StatusBadRequest, "model is required", fmt.Errorf("model is required: %w", ErrBadRequest))
		return false
	}
	echo, name, f, err := parseModelName(c.req.Model)
	c.echo, c.fault = echo, f
	c.modelJSON = appendJSONString(c.modelArr[:0], echo)
	if err != nil {
		c.writeError(sh, http.StatusBadRequest, err.Error(), err)
		return false
	}
	m := c.b.byName[name]
	if m == nil {
		c.writeError(sh, http.StatusNotFound, "model '"+echo+"' not found", fmt.Errorf("%q: %w", echo, ErrUnknownModel))
		return false
	}
	c.m = m
	c.prompt = c.req.promptTokens()
	c.created = c.start.Unix()
	appendID(c.idArr[:0], c.b.opts.Seed, c.seq*4, alnum62, len(c.idArr))
	appendID(c.toolArr[:0], c.b.opts.Seed, c.seq*4+1, alnum62, len(c.toolArr))
	return true
}

// headerFaults applies the slowheaders and status faults; it returns false
// when the request is finished.
func (c *call) headerFaults(sh shape) bool {
	if d := c.fault.slowHeaders; d > 0 && !c.wait(d) {
		c.outcome = OutcomeClientGone
		return false
	}
	if s := c.fault.status; s != 0 {
		c.writeError(sh, s, "demo fault: forced status "+strconv.Itoa(s), nil)
		c.outcome = OutcomeOK
		return false
	}
	return true
}

// format renders one route family's chat answer.
type format interface {
	contentType() string
	begin(c *call, dst []byte) []byte          // stream prologue, before any content
	chunk(c *call, dst []byte, i int) []byte   // stream content chunk i (a token, or the tool call)
	end(c *call, dst []byte) []byte            // stream epilogue after the last chunk
	whole(c *call, dst []byte, pad int) []byte // non-stream body, text padded with pad filler bytes
}

// chat serves /api/chat, /v1/chat/completions and /v1/messages.
func (c *call) chat(sh shape) {
	if !c.decode(sh) {
		return
	}
	if sh == shapeOllama {
		c.stream = c.req.Stream == nil || *c.req.Stream
	} else {
		c.stream = c.req.Stream != nil && *c.req.Stream
	}
	c.includeUsage = c.req.StreamOptions != nil && c.req.StreamOptions.IncludeUsage
	c.plan = c.b.script.planFor(c.m, c.req.limit(), c.req.hasTools())
	if !c.thinkPlan(sh) {
		return
	}
	if c.m.kind == kindAgent {
		c.plan = agentPlan(c.buf, sh)
	}
	if !c.headerFaults(sh) {
		return
	}
	c.b.markLoaded(c.m, c.start, c.req.KeepAlive)
	if !c.prefill() {
		c.outcome = OutcomeClientGone
		return
	}
	var f format
	switch sh {
	case shapeOllama:
		f = ollamaFormat{}
	case shapeOpenAI:
		f = llamaChatFormat{}
	case shapeResponses:
		f = llamaResponsesFormat{}
	case shapeCompletions:
		f = llamaCompletionFormat{}
	default:
		f = anthropicFormat{}
	}
	if c.stream {
		c.runStream(f)
	} else {
		c.runOnce(f)
	}
	c.cacheAnswer()
}

// prefill looks the prompt up in the instance's prefix cache and waits
// Options.PrefillPerToken for each prompt token not served from it,
// before anything is written (a real server's time to first token); with
// Options.Slots it first takes a slot and waits for the prompts queued
// ahead too (engine). It reports whether the client is still there.
func (c *call) prefill() bool {
	if pc := c.b.cache; pc != nil {
		bs := pc.boundaries(c.m.name, &c.req)
		c.last = bs[len(bs)-1]
		c.cached = pc.use(bs, c.prompt)
	}
	c.b.promptTokens.Add(uint64(c.prompt))
	c.b.cachedTokens.Add(uint64(c.cached))
	e := c.b.engine
	if e == nil {
		return c.wait(time.Duration(c.prompt-c.cached) * c.b.opts.PrefillPerToken)
	}
	if !e.acquire(c.ctx) {
		return false
	}
	c.slot = true
	step := e.queuePrompt(c.prompt - c.cached)
	for d := e.promptWait(step); d > 0; d = e.promptWait(step) {
		if !c.wait(d) {
			e.abandon(step)
			return false
		}
	}
	e.generate()
	c.generating = true
	return true
}

// tokenDelay is the wait before the next content token: TokenDelay, or
// with Options.Slots the engine's step (the first token comes with the
// step that ended the prompt).
func (c *call) tokenDelay() time.Duration {
	switch e := c.b.engine; {
	case e == nil:
		return c.b.opts.TokenDelay
	case c.emitted == 0:
		return 0
	default:
		return e.tokenStep()
	}
}

// cacheAnswer caches the prompt followed by the generated text answer,
// once it was generated in full.
func (c *call) cacheAnswer() {
	if c.b.cache == nil || c.outcome != OutcomeOK || c.plan.kind == kindTool || c.emitted < c.plan.n {
		return
	}
	var text []byte
	for i := range c.plan.n {
		text = append(text, c.plan.token(i)...)
	}
	c.b.cache.add(c.b.cache.answer(c.last, text))
}

// runStream writes a streamed answer, one flush per chunk.
func (c *call) runStream(f format) {
	c.rc = http.NewResponseController(c.w)
	c.w.Header().Set("Content-Type", f.contentType())
	c.writeHeader(http.StatusOK)
	if !c.out(f.begin(c, c.buffer())) || !c.flush() {
		return
	}
	for c.emitted < c.plan.n {
		if c.faultAt(false) {
			return
		}
		if !c.wait(c.tokenDelay()) {
			c.outcome = OutcomeClientGone
			return
		}
		c.tokenTime()
		if !c.out(f.chunk(c, c.buffer(), c.emitted)) {
			return
		}
		c.emitted++
		if !c.flush() {
			return
		}
	}
	if c.faultAt(true) {
		return
	}
	if c.out(f.end(c, c.buffer())) {
		c.flush()
	}
}

// runOnce generates the answer, then writes it as one JSON body.
func (c *call) runOnce(f format) {
	for c.emitted < c.plan.n {
		if c.faultAt(false) {
			return
		}
		if !c.wait(c.tokenDelay()) {
			c.outcome = OutcomeClientGone
			return
		}
		c.tokenTime()
		c.emitted++
	}
	if c.faultAt(true) {
		return
	}
	// One timestamp for both renders, so padding sees the final length.
	c.doneAt = c.b.now()
	body := f.whole(c, c.buffer(), 0)
	if pad := c.b.opts.PadBytes - len(body); pad > 0 && c.plan.kind != kindTool {
		body = f.whole(c, body[:0], pad)
	}
	c.buf = body
	c.w.Header().Set("Content-Type", "application/json; charset=utf-8")
	c.writeHeader(http.StatusOK)
	c.out(body)
}

// clock returns the time for timestamps and durations being rendered.
func (c *call) clock() time.Time {
	if !c.doneAt.IsZero() {
		return c.doneAt
	}
	return c.b.now()
}

func (c *call) tokenTime() {
	if c.emitted == 0 {
		c.firstTok = c.b.now()
	}
}

// faultAt applies a stall or reset fault that is due now: before content
// chunk c.emitted, or (atEnd) before the terminal chunks, where any count
// not yet reached is due. It returns true when the request is finished.
func (c *call) faultAt(atEnd bool) bool {
	due := func(n int) bool { return n >= 0 && (n == c.emitted || atEnd && n > c.emitted) }
	switch {
	case due(c.fault.stall):
		if c.rc != nil {
			c.rc.Flush()
		}
		<-c.ctx.Done()
		c.outcome = OutcomeStalled
		return true
	case due(c.fault.reset):
		c.outcome = OutcomeReset
		rc := c.rc
		if rc == nil {
			rc = http.NewResponseController(c.w)
		}
		conn, _, err := rc.Hijack()
		if err != nil {
			// HTTP/2 or a recorder: abort the response the way net/http offers.
			c.err = fmt.Errorf("%w: %w", ErrHijack, err)
			panic(http.ErrAbortHandler)
		}
		conn.Close()
		return true
	}
	return false
}

// wait waits d (0 = not at all) or until the request's context ends; it
// reports whether the request is still wanted.
func (c *call) wait(d time.Duration) bool {
	if d <= 0 {
		return c.ctx.Err() == nil
	}
	if c.timer == nil {
		c.timer = time.NewTimer(d)
	} else {
		c.timer.Reset(d)
	}
	select {
	case <-c.timer.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

func (c *call) writeHeader(status int) {
	c.status = status
	c.w.WriteHeader(status)
}

// out writes p; on failure the client is gone.
func (c *call) out(p []byte) bool {
	c.buf = p[:0]
	if len(p) == 0 {
		return true
	}
	if _, err := c.w.Write(p); err != nil {
		c.outcome = OutcomeClientGone
		return false
	}
	return true
}

func (c *call) flush() bool {
	if err := c.rc.Flush(); err != nil {
		c.outcome = OutcomeClientGone
		return false
	}
	return true
}

func (c *call) writeJSON(status int, body []byte) {
	c.w.Header().Set("Content-Type", "application/json; charset=utf-8")
	c.writeHeader(status)
	c.out(body)
}

// writeError answers status with msg in the route family's error shape
// (see the package doc); err, if not nil, becomes RequestEnd.Err.
func (c *call) writeError(sh shape, status int, msg string, err error) {
	c.err = err
	if status < 500 {
		c.outcome = OutcomeError
	}
	buf := c.buffer()
	switch sh {
	case shapeOllama:
		buf = append(buf, `{"error":`...)
		buf = appendJSONString(buf, msg)
		buf = append(buf, '}')
	case shapeAnthropic:
		buf = append(buf, `{"type":"error","error":{"type":`...)
		buf = appendJSONString(buf, anthropicErrorType(status))
		buf = append(buf, `,"message":`...)
		buf = appendJSONString(buf, msg)
		buf = append(buf, `}}`...)
	default:
		typ := "api_error"
		if status == http.StatusBadRequest {
			typ = "invalid_request_error"
		}
		buf = append(buf, `{"error":{"message":`...)
		buf = appendJSONString(buf, msg)
		buf = append(buf, `,"type":"`...)
		buf = append(buf, typ...)
		buf = append(buf, `","param":null,"code":null}}`...)
		if status == http.StatusNotFound {
			buf = append(buf, '\n') // as Ollama's /v1 writes its 404
		}
	}
	c.writeJSON(status, buf)
}

// anthropicErrorType maps a status to the Anthropic API reference's error types.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529, http.StatusServiceUnavailable:
		return "overloaded_error"
	}
	return "api_error"
}

// appendPadding appends n filler bytes of words that need no JSON escaping.
func appendPadding(dst []byte, n int) []byte {
	const filler = " lorem ipsum dolor sit amet,"
	for n > 0 {
		k := min(n, len(filler))
		dst = append(dst, filler[:k]...)
		n -= k
	}
	return dst
}
