// Package upstream holds what the node's adapter drivers (ollama,
// openaicompat) share to talk to one backend over HTTP: the Endpoint (base
// URL and upstream auth), the Hooks of one attempt (text deltas, read
// activity for the stall watchdog of SPEC H1), the Result of a normalized run,
// the OpenAI tool-call shape of SPEC E8/E9, and the typed errors that the
// adapter Set maps to failure codes.
//
// The package never emits run events or tunnel frames, never holds capacity,
// never reads the environment and never logs: the secret in Endpoint.AuthValue
// goes only into outgoing request headers, never into an error or a message.
package upstream

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Errors a driver returns; the adapter Set maps them to failure codes (test
// with errors.Is / errors.As).
var (
	// ErrInvalidInput: the RunRequest cannot be turned into a provider
	// request (bad tools JSON, bad tool-call arguments…) → "invalid_request".
	ErrInvalidInput = errors.New("invalid run input")
	// ErrUnsupported: the adapter's profile lacks the operation the run
	// needs (e.g. no chat_completions path) → "unsupported_operation".
	ErrUnsupported = errors.New("operation not supported by the profile")
	// ErrProtocol: the provider's answer broke its own format (malformed
	// JSON line, stream ended before it finished, error object mid-stream)
	// → "upstream_error".
	ErrProtocol = errors.New("upstream protocol error")
)

// FieldError is an ErrInvalidInput about one request field the driver
// cannot honour (e.g. a tool_choice Ollama cannot enforce): Field is its
// name in the client's API ("tool_choice"), sent to the Edge as
// RunEvent.param so the client's 400 names it in "param".
// errors.Is(err, ErrInvalidInput) holds.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return ErrInvalidInput.Error() + ": " + e.Msg }
func (e *FieldError) Unwrap() error { return ErrInvalidInput }

// StatusError: the provider answered a non-2xx HTTP status before any
// output. Message is the provider's own error message (from its JSON error
// object when it sent one), at most 1 KiB. RetryAfter is the answer's
// Retry-After (RFC 9110 §10.2.3: delay-seconds or an HTTP date), 0 when
// absent or unreadable. → "upstream_status".
type StatusError struct {
	Status     int
	Message    string
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("upstream status %d: %s", e.Status, e.Message)
}

// RequestError: the request got no response head. Connect says the
// connection could not be opened at all (the dial failed: refused,
// unreachable, DNS, dial timeout) → "upstream_connect"; otherwise the
// connection was closed, reset or broken after it was opened and before the
// status line arrived → "upstream_reset". The caller's own cancel and
// deadline are not RequestErrors' business: the adapter checks its contexts
// first.
type RequestError struct {
	Err     error
	Connect bool
}

func (e *RequestError) Error() string { return e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

// Do sends req with e.Client and wraps a transport failure (no response
// head) as *RequestError. A body in gzip or deflate, sent although the
// request asked for identity, reads decoded; another coding's first read
// fails with *EncodingError (SPEC B3, see decodeBody). With a Trace on req's context (WithTrace) it
// notes when the first request went out and when the first response head
// came, and the last status.
func (e *Endpoint) Do(req *http.Request) (*http.Response, error) {
	tr := traceOf(req.Context())
	if tr != nil {
		tr.sending()
	}
	resp, err := e.Client.Do(req)
	if tr != nil && err == nil {
		tr.answered(resp.StatusCode)
	}
	if err != nil {
		var op *net.OpError
		return nil, &RequestError{Err: err, Connect: errors.As(err, &op) && op.Op == "dial"}
	}
	decodeBody(resp)
	return resp, nil
}

// Endpoint is where and how to reach one backend.
type Endpoint struct {
	Client *http.Client
	// Base is scheme://host[:port][/path] without query, fragment or user
	// info; operation paths are joined below its path.
	Base *url.URL
	// AuthHeader and AuthValue: the upstream auth header, e.g.
	// "Authorization" and "Bearer sk-…"; empty = no auth. AuthValue is a
	// secret.
	AuthHeader string
	AuthValue  string
}

// URL returns the absolute URL of rel, a path already validated as relative
// (see adapter's path rules), optionally with a query.
func (e *Endpoint) URL(rel string) string {
	p, q, _ := strings.Cut(rel, "?")
	var b strings.Builder
	b.WriteString(e.Base.Scheme)
	b.WriteString("://")
	b.WriteString(e.Base.Host)
	b.WriteString(strings.TrimSuffix(e.Base.EscapedPath(), "/"))
	b.WriteByte('/')
	b.WriteString(strings.TrimPrefix(p, "/"))
	if q != "" {
		b.WriteByte('?')
		b.WriteString(q)
	}
	return b.String()
}

// HeaderRequestID carries the client request's id to the backend.
const HeaderRequestID = "X-Request-Id"

type requestIDKey struct{}

// WithRequestID returns ctx carrying the client request's id (the Edge's
// X-Request-Id, RunRequest/ProviderTunnelRequest.request_id) for every
// upstream request made under it; "" leaves ctx as it is.
func WithRequestID(ctx context.Context, id string) context.Context {
	if id == "" {
		return ctx
	}
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID returns the request id WithRequestID put on ctx, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// NewRequest builds a request to rel with the endpoint's auth, a fixed
// User-Agent, "Accept-Encoding: identity" (so bodies stream as sent,
// without transparent decompression buffering them), when ctx carries
// one (WithRequestID), the X-Request-Id header, and when ctx carries a
// Trace (WithTrace) its traceparent and tracestate headers (W3C Trace
// Context). An id with a byte that cannot be in a header value is left
// out.
func (e *Endpoint) NewRequest(ctx context.Context, method, rel string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.URL(rel), body)
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	req.Header.Set("User-Agent", "iop-node")
	req.Header.Set("Accept-Encoding", "identity")
	if id := RequestID(ctx); id != "" && !strings.ContainsAny(id, "\r\n\x00") {
		req.Header.Set(HeaderRequestID, id)
	}
	if tr := traceOf(ctx); tr != nil {
		tr.request(req.Header, method, rel)
	}
	if e.AuthHeader != "" && e.AuthValue != "" {
		req.Header.Set(e.AuthHeader, e.AuthValue)
	}
	return req, nil
}

// PostJSON sends body as application/json to rel and returns the response
// when its status is 2xx. A non-2xx response is read (at most 64 KiB),
// closed and returned as *StatusError; no response at all is a
// *RequestError.
func (e *Endpoint) PostJSON(ctx context.Context, rel string, body []byte, accept string) (*http.Response, error) {
	req, err := e.NewRequest(ctx, http.MethodPost, rel, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := e.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, ReadStatusError(resp)
	}
	return resp, nil
}

// ReadStatusError reads at most 64 KiB of a non-2xx response body, closes it
// and returns the provider's error message as a *StatusError.
func ReadStatusError(resp *http.Response) *StatusError {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return &StatusError{Status: resp.StatusCode, Message: ErrorMessage(b, resp.Status),
		RetryAfter: RetryAfter(resp.Header.Get("Retry-After"), time.Now())}
}

// MaxRetryAfter bounds a parsed Retry-After: a larger value is taken as
// this (a day), so that no later arithmetic overflows.
const MaxRetryAfter = 24 * time.Hour

// RetryAfter parses a Retry-After value (RFC 9110 §10.2.3): delay-seconds
// or an HTTP date, which counts from now. It returns 0 for an empty,
// malformed or past value, and at most MaxRetryAfter.
func RetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		if n > uint64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return max(0, min(d, MaxRetryAfter))
}

// ErrorMessage extracts the human message of a provider error body: OpenAI
// and llama-server {"error":{"message":…}}, Ollama {"error":"…"}, Anthropic
// {"type":"error","error":{"message":…}}, or {"message":…}. Otherwise it is
// the trimmed body, or fallback when the body is empty. At most 1 KiB.
func ErrorMessage(body []byte, fallback string) string {
	var doc struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	msg := ""
	if json.Unmarshal(body, &doc) == nil {
		var s string
		var obj struct {
			Message string `json:"message"`
		}
		switch {
		case json.Unmarshal(doc.Error, &s) == nil && s != "":
			msg = s
		case json.Unmarshal(doc.Error, &obj) == nil && obj.Message != "":
			msg = obj.Message
		case doc.Message != "":
			msg = doc.Message
		}
	}
	if msg == "" {
		msg = strings.TrimSpace(string(body))
	}
	if msg == "" {
		msg = fallback
	}
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	return msg
}

// Hooks observe one attempt. Nil fields are ignored.
type Hooks struct {
	// OnDelta receives each piece of assistant text as it is read, with the
	// log probabilities of its tokens when the input asked for them.
	OnDelta func(text string, logprobs []*iop.TokenLogprob)
	// OnActivity is called when the response headers arrive and after
	// every upstream read that returned bytes; the stall watchdog (SPEC H1)
	// measures idleness from it. It must be cheap and safe to call from the
	// provider call's goroutine.
	OnActivity func()
	// OnReasoning receives each piece of the model's reasoning (its
	// thinking, which comes before the text) as it is read.
	OnReasoning func(text string)
}

// Reasoning calls OnReasoning when set and there is text.
func (h Hooks) Reasoning(text string) {
	if h.OnReasoning != nil && text != "" {
		h.OnReasoning(text)
	}
}

// Activity calls OnActivity when set; drivers call it when the response
// headers arrive (SPEC H1: a stall before the first body byte still counts
// from there).
func (h Hooks) Activity() {
	if h.OnActivity != nil {
		h.OnActivity()
	}
}

// Delta calls OnDelta when set and there is text or a log probability.
func (h Hooks) Delta(text string, logprobs []*iop.TokenLogprob) {
	if h.OnDelta != nil && (text != "" || len(logprobs) > 0) {
		h.OnDelta(text, logprobs)
	}
}

// Body wraps r so that every read returning bytes calls OnActivity.
func (h Hooks) Body(r io.Reader) io.Reader {
	if h.OnActivity == nil {
		return r
	}
	return &activityReader{r: r, fn: h.OnActivity}
}

type activityReader struct {
	r  io.Reader
	fn func()
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.fn()
	}
	return n, err
}

// MaxResultBytes bounds what a driver accumulates from a backend's stream
// for one Result, in bytes: the assistant text plus every tool
// call's name and arguments, and ToolCallOverhead per call. The Result
// travels in one COMPLETE frame (16 MiB cap); a backend that streams past
// the bound fails the run with ErrResultTooLarge instead of growing the
// node's memory without end.
const MaxResultBytes = 8 << 20

// ToolCallOverhead is what one tool call counts toward MaxResultBytes
// besides its name and arguments (its id, type and framing).
const ToolCallOverhead = 64

// MaxToolCalls bounds the tool calls of one Result; more fail the run with
// ErrResultTooLarge.
const MaxToolCalls = 1024

// ErrResultTooLarge: the backend's answer passed MaxResultBytes; it wraps
// ErrProtocol (→ "upstream_error").
var ErrResultTooLarge = fmt.Errorf("%w: the answer exceeds %d bytes", ErrProtocol, MaxResultBytes)

// Result is a finished normalized run (the COMPLETE event of SPEC E3).
type Result struct {
	// Content is the whole assistant text.
	Content string
	// FinishReason is "stop", "length" or "tool_calls" ("tool_calls"
	// whenever the message carries tool calls).
	FinishReason string
	// Usage in tokens; nil when the backend reported none.
	Usage *iop.Usage
	// Metadata holds protocol.MetaToolCalls and protocol.MetaTextToolFallback when set.
	Metadata map[string]string
	// Logprobs holds every output token's log probability when the input
	// asked for them (RunInput.logprobs).
	Logprobs []*iop.TokenLogprob
	// Embeddings holds one vector per input of an "embeddings" run.
	Embeddings []*iop.Embedding
	// Reasoning is the model's whole reasoning (its thinking), "" when it
	// produced none.
	Reasoning string
	// LoadNs is how long the backend says loading the model took for this
	// request, ns (Ollama's load_duration); 0 = not reported.
	LoadNs int64
}

// ToolCall is one tool call in the OpenAI chat-completions shape (OpenAI API
// reference, "tool_calls"): arguments are a JSON text in a string, passed
// through as the server wrote them.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function ToolFunction `json:"function"`
}

// ToolFunction is the function of a ToolCall.
type ToolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// SetToolCalls stores calls in r.Metadata[protocol.MetaToolCalls] and makes the
// finish reason "tool_calls"; no-op for none.
func (r *Result) SetToolCalls(calls []ToolCall) {
	if len(calls) == 0 {
		return
	}
	b, _ := json.Marshal(calls) // plain strings: cannot fail
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
	r.Metadata[protocol.MetaToolCalls] = string(b)
	r.FinishReason = "tool_calls"
}

// NewToolCallID returns a fresh tool-call id, "call_" and 24 lowercase hex
// digits, for providers that send calls without one (SPEC E8).
func NewToolCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return "call_" + hex.EncodeToString(b[:])
}

// DecodeToolCalls parses an OpenAI-shaped tool_calls array (a ChatMessage's
// tool_calls_json). Empty input or "null" is no calls.
func DecodeToolCalls(raw []byte) ([]ToolCall, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var calls []ToolCall
	if err := json.Unmarshal(raw, &calls); err != nil {
		return nil, fmt.Errorf("%w: tool_calls is not an OpenAI tool_calls array: %v", ErrInvalidInput, err)
	}
	return calls, nil
}

// CheckNumbers refuses a RunInput whose sampling numbers JSON cannot carry
// (NaN, ±Inf in temperature, top_p, frequency_penalty, presence_penalty):
// an Edge's surfaces never produce them (JSON has no such numbers), so one
// means a broken or hostile Edge; the error wraps ErrInvalidInput and names
// the field (found by FuzzBuildChatRequest).
func CheckNumbers(in *iop.RunInput) error {
	if in == nil {
		return nil
	}
	for _, f := range [...]struct {
		name string
		v    *float64
	}{{"temperature", in.Temperature}, {"top_p", in.TopP}, {"frequency_penalty", in.FrequencyPenalty}, {"presence_penalty", in.PresencePenalty}} {
		if f.v != nil && (math.IsNaN(*f.v) || math.IsInf(*f.v, 0)) {
			return fmt.Errorf("%w: %s is %v, not a finite number", ErrInvalidInput, f.name, *f.v)
		}
	}
	return nil
}

// Tools returns raw when it is a non-empty JSON array (an OpenAI "tools"
// value), nil when it is empty, "null" or "[]", and ErrInvalidInput
// otherwise.
func Tools(raw []byte) (json.RawMessage, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return nil, nil
	}
	var arr []json.RawMessage
	if err := json.Unmarshal(raw, &arr); err != nil {
		return nil, fmt.Errorf("%w: tools is not a JSON array: %v", ErrInvalidInput, err)
	}
	if len(arr) == 0 {
		return nil, nil
	}
	return json.RawMessage(raw), nil
}

// NormalizeTag returns a model name with its tag, adding ":latest" when the
// name (after its last "/") has none, as Ollama does: "tiny" →
// "tiny:latest", "ns/tiny:q4" unchanged. Empty stays empty.
func NormalizeTag(name string) string {
	if name == "" {
		return ""
	}
	base := name[strings.LastIndexByte(name, '/')+1:]
	if strings.Contains(base, ":") {
		return name
	}
	return name + ":latest"
}

// SameModel reports whether a listed model name serves target: equal, or
// equal once both carry a tag (NormalizeTag). An empty name never matches.
func SameModel(listed, target string) bool {
	if listed == "" || target == "" {
		return false
	}
	return listed == target || NormalizeTag(listed) == NormalizeTag(target)
}
