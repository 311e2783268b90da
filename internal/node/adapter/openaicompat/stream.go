package openaicompat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"iop/internal/node/adapter/upstream"
	"iop/internal/sse"
	iop "iop/proto/gen/iop"
)

// chunk is one chat.completion.chunk (OpenAI API reference, streaming).
type chunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   *string         `json:"content"`
			ToolCalls []toolCallDelta `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

type toolCallDelta struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// ReadChatStream reads a chat-completions SSE stream to its end and returns
// the result; content deltas of choice 0 go to h as read. The stream ends at
// "data: [DONE]"; without it, the end of the body is a normal end only when a
// finish_reason was seen. Streamed tool calls are assembled by index (a whole
// call in one chunk and fragments across many both work; a fragment without
// index continues the call with its id, or the last call); calls without an
// id get one. Errors: upstream.ErrProtocol for a malformed event, an error
// object mid-stream or an unfinished stream; read errors as is.
func ReadChatStream(r io.Reader, h upstream.Hooks) (upstream.Result, error) {
	events := sse.NewReader(r, 0)
	var (
		content strings.Builder
		calls   toolCalls
		finish  string
		usage   *iop.Usage
		done    bool
	)
	for n := 1; !done; n++ {
		ev, err := events.Next()
		if err == io.EOF {
			if finish == "" {
				return upstream.Result{}, fmt.Errorf("%w: chat stream ended without finish_reason or [DONE]", upstream.ErrProtocol)
			}
			break
		}
		if err != nil {
			if errors.Is(err, sse.ErrLineTooLong) || errors.Is(err, sse.ErrEventTooLarge) {
				return upstream.Result{}, fmt.Errorf("%w: %v", upstream.ErrProtocol, err)
			}
			return upstream.Result{}, err
		}
		data := bytes.TrimSpace(ev.Data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		if string(ev.Type) == "error" {
			return upstream.Result{}, fmt.Errorf("%w: error event mid-stream: %s", upstream.ErrProtocol, upstream.ErrorMessage(data, "unknown error"))
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return upstream.Result{}, fmt.Errorf("%w: chat stream event %d is not JSON: %v", upstream.ErrProtocol, n, err)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			return upstream.Result{}, fmt.Errorf("%w: error mid-stream: %s", upstream.ErrProtocol, upstream.ErrorMessage(data, "unknown error"))
		}
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				continue // n = 1: only the first choice is the run's
			}
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				if content.Len()+len(*ch.Delta.Content)+calls.size > upstream.MaxResultBytes {
					return upstream.Result{}, upstream.ErrResultTooLarge
				}
				content.WriteString(*ch.Delta.Content)
				h.Delta(*ch.Delta.Content, nil)
			}
			for _, tc := range ch.Delta.ToolCalls {
				calls.add(tc)
				if content.Len()+calls.size > upstream.MaxResultBytes || len(calls.list) > upstream.MaxToolCalls {
					return upstream.Result{}, upstream.ErrResultTooLarge
				}
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			usage = &iop.Usage{PromptTokens: c.Usage.PromptTokens, CompletionTokens: c.Usage.CompletionTokens, TotalTokens: c.Usage.TotalTokens}
			if usage.TotalTokens == 0 {
				usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
			}
		}
	}
	res := upstream.Result{Content: content.String(), FinishReason: normalizeFinish(finish), Usage: usage}
	res.SetToolCalls(calls.result())
	return res, nil
}

// normalizeFinish keeps OpenAI's reasons and maps the rest ("" after a bare
// [DONE], "eos", "end_turn"…) to "stop".
func normalizeFinish(s string) string {
	switch s {
	case "length", "tool_calls", "content_filter":
		return s
	}
	return "stop"
}

// toolCalls assembles streamed tool-call fragments.
type toolCalls struct {
	list []*callBuilder
	size int // bytes counted toward upstream.MaxResultBytes
}

type callBuilder struct {
	index int
	id    string
	typ   string
	name  strings.Builder
	args  strings.Builder
}

func (t *toolCalls) add(d toolCallDelta) {
	var b *callBuilder
	switch {
	case d.Index != nil:
		b = t.find(func(c *callBuilder) bool { return c.index == *d.Index })
		if b == nil {
			b = t.open(*d.Index)
		}
	case d.ID != "":
		b = t.find(func(c *callBuilder) bool { return c.id == d.ID })
		if b == nil {
			b = t.open(t.nextIndex())
		}
	case len(t.list) > 0:
		b = t.list[len(t.list)-1]
	default:
		b = t.open(0)
	}
	if b.id == "" {
		b.id = d.ID
	}
	if b.typ == "" {
		b.typ = d.Type
	}
	b.name.WriteString(d.Function.Name)
	b.args.WriteString(d.Function.Arguments)
	t.size += len(d.Function.Name) + len(d.Function.Arguments)
}

func (t *toolCalls) find(match func(*callBuilder) bool) *callBuilder {
	for _, c := range t.list {
		if match(c) {
			return c
		}
	}
	return nil
}

func (t *toolCalls) open(index int) *callBuilder {
	t.size += upstream.ToolCallOverhead
	b := &callBuilder{index: index}
	t.list = append(t.list, b)
	return b
}

func (t *toolCalls) nextIndex() int {
	next := 0
	for _, c := range t.list {
		if c.index >= next {
			next = c.index + 1
		}
	}
	return next
}

// result returns the calls ordered by index, with ids and type filled in.
func (t *toolCalls) result() []upstream.ToolCall {
	if len(t.list) == 0 {
		return nil
	}
	sort.SliceStable(t.list, func(i, j int) bool { return t.list[i].index < t.list[j].index })
	out := make([]upstream.ToolCall, 0, len(t.list))
	for _, b := range t.list {
		id := b.id
		if id == "" {
			id = upstream.NewToolCallID()
		}
		args := b.args.String()
		if strings.TrimSpace(args) == "" {
			args = "{}" // a call without arguments: keep the string valid JSON
		}
		out = append(out, upstream.ToolCall{ID: id, Type: "function", Function: upstream.ToolFunction{Name: b.name.String(), Arguments: args}})
	}
	return out
}
