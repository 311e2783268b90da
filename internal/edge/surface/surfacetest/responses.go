package surfacetest

import (
	"bytes"
	"encoding/json"
	"testing"

	"iop/internal/sse"
)

// ResponseObject is a Responses response object as a client reads it.
type ResponseObject struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Status            string `json:"status"`
	Model             string `json:"model"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []ResponseItem `json:"output"`
	Usage  *struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
		TotalTokens  int64 `json:"total_tokens"`
	} `json:"usage"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// ResponseItem is one output item: a message or a function_call.
type ResponseItem struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Status  string `json:"status"`
	Role    string `json:"role"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Text is the concatenated output_text of r's message items.
func (r *ResponseObject) Text() string {
	var s string
	for _, it := range r.Output {
		for _, c := range it.Content {
			if c.Type == "output_text" {
				s += c.Text
			}
		}
	}
	return s
}

// CheckResponse parses a non-stream Responses body and checks its shape.
func CheckResponse(t testing.TB, body []byte) ResponseObject {
	t.Helper()
	var r ResponseObject
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	checkResponse(t, &r, body)
	return r
}

func checkResponse(t testing.TB, r *ResponseObject, raw []byte) {
	t.Helper()
	if r.Object != "response" || r.Model != "tiny" || r.ID == "" {
		t.Errorf("object/model/id = %q/%q/%q: %s", r.Object, r.Model, r.ID, raw)
	}
	switch r.Status {
	case "completed":
	case "incomplete":
		if r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" {
			t.Errorf("incomplete without reason max_output_tokens: %s", raw)
		}
	default:
		t.Errorf("status %q", r.Status)
	}
	if r.Usage == nil || r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Errorf("usage: %s", raw)
	}
	for i, it := range r.Output {
		switch it.Type {
		case "message":
			if it.Role != "assistant" || it.ID == "" || len(it.Content) != 1 || it.Content[0].Type != "output_text" {
				t.Errorf("output %d: bad message %+v", i, it)
			}
		case "function_call":
			if it.ID == "" || it.CallID == "" || it.Name == "" || !json.Valid([]byte(it.Arguments)) || it.Status != "completed" {
				t.Errorf("output %d: bad function_call %+v", i, it)
			}
		default:
			t.Errorf("output %d: type %q", i, it.Type)
		}
	}
}

// CheckResponseStream parses a Responses event stream as the SDKs do and
// checks its rules: every event's name is its data's type; sequence
// numbers count from 0; response.created first; text deltas add up to the
// done text; items are added before their deltas and done after; the last
// event is response.completed or response.incomplete (response.failed when
// wantError) and its response is consistent with the deltas. It returns
// the final response.
func CheckResponseStream(t testing.TB, body []byte, wantError bool) ResponseObject {
	t.Helper()
	r := sse.NewReader(bytes.NewReader(body), sse.DefaultMaxLine)
	var final ResponseObject
	var names []string
	var text, args string
	added := map[int]string{}
	done := map[int]bool{}
	for seq := 0; ; seq++ {
		ev, err := r.Next()
		if err != nil {
			break
		}
		name := string(ev.Type)
		names = append(names, name)
		var d struct {
			Type        string          `json:"type"`
			Seq         *int            `json:"sequence_number"`
			OutputIndex *int            `json:"output_index"`
			ItemID      string          `json:"item_id"`
			Item        *ResponseItem   `json:"item"`
			Delta       string          `json:"delta"`
			Text        string          `json:"text"`
			Arguments   string          `json:"arguments"`
			Response    json.RawMessage `json:"response"`
		}
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatalf("event %q: data is not JSON: %s", name, ev.Data)
		}
		if d.Type != name || d.Seq == nil || *d.Seq != seq {
			t.Errorf("event %q: type %q, sequence_number %v, want %d", name, d.Type, d.Seq, seq)
		}
		if seq == 0 && name != "response.created" {
			t.Fatalf("first event %q, want response.created", name)
		}
		switch name {
		case "response.created", "response.in_progress":
		case "response.output_item.added":
			if d.OutputIndex == nil || d.Item == nil || added[*d.OutputIndex] != "" {
				t.Fatalf("bad output_item.added: %s", ev.Data)
			}
			added[*d.OutputIndex] = d.Item.ID
		case "response.content_part.added", "response.content_part.done":
		case "response.output_text.delta":
			if d.ItemID != added[0] {
				t.Errorf("delta for item %q, added %q", d.ItemID, added[0])
			}
			text += d.Delta
		case "response.output_text.done":
			if d.Text != text {
				t.Errorf("output_text.done text %q, deltas %q", d.Text, text)
			}
		case "response.function_call_arguments.delta":
			args = d.Delta
		case "response.function_call_arguments.done":
			if d.Arguments != args {
				t.Errorf("arguments.done %q, delta %q", d.Arguments, args)
			}
		case "response.output_item.done":
			if d.OutputIndex == nil || added[*d.OutputIndex] == "" || done[*d.OutputIndex] || d.Item == nil || d.Item.ID != added[*d.OutputIndex] {
				t.Fatalf("bad output_item.done: %s", ev.Data)
			}
			done[*d.OutputIndex] = true
		case "response.completed", "response.incomplete", "response.failed":
			if err := json.Unmarshal(d.Response, &final); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		default:
			t.Errorf("unknown event %q", name)
		}
	}
	last := ""
	if len(names) > 0 {
		last = names[len(names)-1]
	}
	if wantError {
		if last != "response.failed" || final.Status != "failed" || final.Error == nil {
			t.Fatalf("stream ends with %q (status %q), want response.failed", last, final.Status)
		}
		return final
	}
	if last != "response.completed" && last != "response.incomplete" {
		t.Fatalf("stream ends with %q", last)
	}
	if len(added) != len(done) || len(final.Output) != len(added) {
		t.Errorf("items added %d, done %d, in the response %d", len(added), len(done), len(final.Output))
	}
	if final.Text() != text {
		t.Errorf("response text %q, deltas %q", final.Text(), text)
	}
	checkResponse(t, &final, body)
	return final
}
