// Package ollama drives an Ollama server's native API for the node's
// normalized runs (SPEC E8): POST /api/chat with NDJSON streaming, and the
// exact-target health probe on GET /api/tags.
//
// It converts the OpenAI-shaped RunInput to Ollama's message format and
// Ollama's answer back to the OpenAI shape (tool calls with string arguments
// and ids, finish reason "tool_calls" whenever there are tool calls). It owns
// no capacity, emits no run events (the adapter Set does, from Hooks and the
// Result) and never parses assistant text into tool calls.
package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"iop/internal/ndjson"
	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// Paths of the Ollama API used here (Ollama docs/api.md).
const (
	ChatPath = "/api/chat"
	TagsPath = "/api/tags"
)

// Driver runs chats against one Ollama server. Caps, when set, caches
// which targets can think (shared by an adapter instance's runners); nil
// = think is sent as the input asks. Watch, when set, is told of every
// chat and embedding call (SPEC U6: the adapter's /api/ps watcher).
// KeepAlive, when set, is sent as every request's keep_alive (a JSON
// string or number, Ollama 0.17.4 api.Duration; adapter.KeepAlive).
type Driver struct {
	EP        *upstream.Endpoint
	Caps      *Capabilities
	Watch     Watcher
	KeepAlive json.RawMessage
}

// Watcher is told of each request to the server: Begin as it is about to
// be sent, the function it returns once it ended, with the load time the
// server reported (ns, 0 = none).
type Watcher interface {
	Begin(target string) func(loadNs int64)
}

// begin is Watch.Begin, or a no-op without a Watcher.
func (d *Driver) begin(target string) func(int64) {
	if d.Watch == nil {
		return func(int64) {}
	}
	return d.Watch.Begin(target)
}

// Run streams one chat for target and returns the finished result. Text
// deltas go to h as they are read. Errors: upstream.ErrInvalidInput for an
// input that cannot be converted, *upstream.StatusError for a non-2xx answer
// (Ollama's {"error":"…"} message), upstream.ErrProtocol for a malformed or
// unfinished stream or an error line mid-stream, or the transport's error
// (including ctx's) as is.
//
// Thinking: when the input asks for it (think true or a level) and Caps
// says the target cannot think, think is left out; when Caps does not know
// and Ollama refuses think ("does not support thinking"), the run is sent
// once more without it and the target is remembered as one that cannot.
// A level goes only to a target that takes levels: to any other thinking
// model it is sent as true (Caps knows, from /api/show, or Ollama refuses
// the level and the run is sent once more with true, remembered). think
// false goes out only to a target that can think (elsewhere it changes
// nothing).
func (d *Driver) Run(ctx context.Context, target string, in *iop.RunInput, h upstream.Hooks) (res upstream.Result, err error) {
	end := d.begin(target)
	defer func() { end(res.LoadNs) }()
	think, known := in.GetThink(), false
	if think != "" && d.Caps != nil {
		can, levels, ok := d.Caps.CanThink(ctx, d.EP, target)
		switch known = ok; {
		case ok && !can:
			think = ""
		case ok && !levels && isLevel(think):
			think = "true"
		}
	}
	body, err := buildChatRequest(target, in, think, d.KeepAlive)
	if err != nil {
		return upstream.Result{}, err
	}
	resp, err := d.EP.PostJSON(ctx, ChatPath, body, "application/x-ndjson")
	if err != nil && think != "" {
		retry := think
		switch {
		case !known && noThinking(err):
			retry = ""
			if d.Caps != nil {
				d.Caps.set(target, false, false)
			}
		case isLevel(think) && noLevels(err):
			retry = "true"
			if d.Caps != nil {
				d.Caps.learnNoLevels(target)
			}
		}
		if retry != think {
			if body, err = buildChatRequest(target, in, retry, d.KeepAlive); err != nil {
				return upstream.Result{}, err
			}
			resp, err = d.EP.PostJSON(ctx, ChatPath, body, "application/x-ndjson")
		}
	}
	if err != nil {
		return upstream.Result{}, err
	}
	h.Activity() // the response headers arrived (SPEC H1)
	defer resp.Body.Close()
	return readChatStream(h.Body(resp.Body), h)
}

// chatLine is one line of the /api/chat stream (Ollama 0.17.4
// api.ChatResponse: message.thinking streams before message.content
// when the model thinks).
type chatLine struct {
	Message struct {
		Content   string         `json:"content"`
		Thinking  string         `json:"thinking"`
		ToolCalls []chatToolCall `json:"tool_calls"`
	} `json:"message"`
	Logprobs        []logprob `json:"logprobs"`
	Done            bool      `json:"done"`
	DoneReason      string    `json:"done_reason"`
	PromptEvalCount int64     `json:"prompt_eval_count"`
	EvalCount       int64     `json:"eval_count"`
	LoadDuration    int64     `json:"load_duration"` // ns
	Error           string    `json:"error"`
}

// logprob is one token's log probability on a chat line (Ollama 0.17's
// api.Logprob): token, logprob, bytes and the top alternatives.
type logprob struct {
	Token       string    `json:"token"`
	Logprob     float64   `json:"logprob"`
	Bytes       []int     `json:"bytes"`
	TopLogprobs []logprob `json:"top_logprobs"`
}

func (l *logprob) proto() *iop.TokenLogprob {
	out := &iop.TokenLogprob{Token: l.Token, Logprob: l.Logprob}
	if l.Bytes != nil {
		out.Bytes = make([]byte, len(l.Bytes))
		for i, b := range l.Bytes {
			out.Bytes[i] = byte(b)
		}
	}
	for i := range l.TopLogprobs {
		out.TopLogprobs = append(out.TopLogprobs, l.TopLogprobs[i].proto())
	}
	return out
}

type chatToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// readChatStream reads Ollama's NDJSON chat stream (SPEC E8). Text of lines
// that arrived together is passed to h.Delta in one piece: a delta waits for
// nothing that has not arrived, and a burst of tokens costs one DELTA frame
// instead of one per token.
func readChatStream(r io.Reader, h upstream.Hooks) (upstream.Result, error) {
	lines := ndjson.NewReader(r, 0)
	var (
		content  strings.Builder
		thinking strings.Builder
		thPend   int // bytes at the end of thinking not yet passed to h.Reasoning
		calls    []upstream.ToolCall
		pending  int                 // bytes at the end of content not yet passed to h.Delta
		lps      []*iop.TokenLogprob // every token's log probability
		lpSent   int                 // lps already passed to h.Delta
		size     int                 // counted toward upstream.MaxResultBytes
	)
	flush := func() {
		if thPend > 0 {
			s := thinking.String()
			h.Reasoning(s[len(s)-thPend:])
			thPend = 0
		}
		if pending > 0 || lpSent < len(lps) {
			s := content.String()
			h.Delta(s[len(s)-pending:], lps[lpSent:len(lps):len(lps)])
			pending, lpSent = 0, len(lps)
		}
	}
	defer flush() // text read before a failure still goes out before the terminal
	for n := 1; ; n++ {
		raw, err := lines.Next()
		if err == io.EOF {
			return upstream.Result{}, fmt.Errorf("%w: ollama stream ended before its done line", upstream.ErrProtocol)
		}
		if err != nil {
			return upstream.Result{}, err
		}
		var line chatLine
		if err := json.Unmarshal(raw, &line); err != nil {
			return upstream.Result{}, fmt.Errorf("%w: ollama stream line %d is not JSON: %v", upstream.ErrProtocol, n, err)
		}
		if line.Error != "" {
			return upstream.Result{}, fmt.Errorf("%w: ollama error mid-stream: %s", upstream.ErrProtocol, line.Error)
		}
		if line.Message.Thinking != "" {
			if size += len(line.Message.Thinking); size > upstream.MaxResultBytes {
				return upstream.Result{}, upstream.ErrResultTooLarge
			}
			thinking.WriteString(line.Message.Thinking)
			thPend += len(line.Message.Thinking)
		}
		if line.Message.Content != "" {
			if thPend > 0 {
				flush() // the thinking goes out before the text that follows it
			}
			if size += len(line.Message.Content); size > upstream.MaxResultBytes {
				return upstream.Result{}, upstream.ErrResultTooLarge
			}
			content.WriteString(line.Message.Content)
			pending += len(line.Message.Content)
		}
		for i := range line.Logprobs {
			lp := line.Logprobs[i].proto()
			if size += proto.Size(lp); size > upstream.MaxResultBytes {
				return upstream.Result{}, upstream.ErrResultTooLarge
			}
			lps = append(lps, lp)
		}
		if line.Done || len(line.Message.ToolCalls) > 0 || !lines.LineBuffered() {
			flush()
		}
		for _, tc := range line.Message.ToolCalls {
			call, err := toOpenAIToolCall(tc)
			if err != nil {
				return upstream.Result{}, fmt.Errorf("%w: ollama stream line %d: %v", upstream.ErrProtocol, n, err)
			}
			size += len(call.Function.Name) + len(call.Function.Arguments) + upstream.ToolCallOverhead
			if size > upstream.MaxResultBytes || len(calls) >= upstream.MaxToolCalls {
				return upstream.Result{}, upstream.ErrResultTooLarge
			}
			calls = append(calls, call)
		}
		if line.Done {
			res := upstream.Result{
				Content:      content.String(),
				FinishReason: finishReason(line.DoneReason),
				Usage: &iop.Usage{
					PromptTokens:     line.PromptEvalCount,
					CompletionTokens: line.EvalCount,
					TotalTokens:      line.PromptEvalCount + line.EvalCount,
				},
				Logprobs:  lps,
				Reasoning: thinking.String(),
				LoadNs:    max(line.LoadDuration, 0),
			}
			res.SetToolCalls(calls)
			return res, nil
		}
	}
}

// finishReason maps Ollama's done_reason to OpenAI's finish_reason: "length"
// stays, everything else ("stop", "load", "unload") is "stop".
func finishReason(doneReason string) string {
	if doneReason == "length" {
		return "length"
	}
	return "stop"
}

// toOpenAIToolCall converts a native tool call (arguments a JSON object) to
// the OpenAI shape (arguments the same JSON text, as a string), generating an
// id when Ollama sent none.
func toOpenAIToolCall(tc chatToolCall) (upstream.ToolCall, error) {
	if tc.Function.Name == "" {
		return upstream.ToolCall{}, errors.New("tool call without a function name")
	}
	args := strings.TrimSpace(string(tc.Function.Arguments))
	switch {
	case args == "" || args == "null":
		args = "{}"
	case args[0] == '"': // a JSON string holding the JSON text
		var s string
		if err := json.Unmarshal(tc.Function.Arguments, &s); err != nil {
			return upstream.ToolCall{}, fmt.Errorf("tool call arguments: %v", err)
		}
		args = s
	}
	id := tc.ID
	if id == "" {
		id = upstream.NewToolCallID()
	}
	return upstream.ToolCall{ID: id, Type: "function", Function: upstream.ToolFunction{Name: tc.Function.Name, Arguments: args}}, nil
}

// Probe reports whether target is served: "available" when GET /api/tags
// lists it (tag-aware: "tiny" matches "tiny:latest"), "unavailable" when the
// list lacks it, the server answers non-2xx or cannot be reached, and
// "unknown" when ctx ended first or the answer is not a tag list. The caller
// bounds ctx.
func (d *Driver) Probe(ctx context.Context, target string) string {
	req, err := d.EP.NewRequest(ctx, http.MethodGet, TagsPath, nil)
	if err != nil {
		return protocol.HealthUnknown
	}
	resp, err := d.EP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return protocol.HealthUnknown
		}
		return protocol.HealthUnavailable
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return protocol.HealthUnavailable
	}
	var tags struct {
		Models []struct {
			Name  string `json:"name"`
			Model string `json:"model"`
		} `json:"models"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&tags); err != nil {
		return protocol.HealthUnknown
	}
	for _, m := range tags.Models {
		if upstream.SameModel(m.Name, target) || upstream.SameModel(m.Model, target) {
			return protocol.HealthAvailable
		}
	}
	return protocol.HealthUnavailable
}

// NormalizeTag returns an Ollama model name with its tag; see
// upstream.NormalizeTag.
func NormalizeTag(name string) string { return upstream.NormalizeTag(name) }

// Models lists the models the server has (GET /api/tags, their "name"s:
// "tiny:latest"), for discovery (SPEC D1); see upstream.ListModels.
func (d *Driver) Models(ctx context.Context) ([]string, error) {
	return upstream.ListModels(ctx, d.EP, TagsPath)
}
