package sse

import (
	"bytes"
	"errors"
	"io"
	"iop/internal/samples"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

// ev is a comparable copy of an Event.
type ev struct{ Type, Data, ID string }

// collect reads every event of r until an error and returns them with it.
func collect(r *Reader) ([]ev, error) {
	var out []ev
	for {
		e, err := r.Next()
		if err != nil {
			return out, err
		}
		out = append(out, ev{string(e.Type), string(e.Data), string(e.ID)})
	}
}

func TestReaderCases(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []ev
	}{
		{"E9 one data event LF", "data: {\"a\":1}\n\n", []ev{{"", `{"a":1}`, ""}}},
		{"E9 CRLF line endings", "data: x\r\n\r\ndata: y\r\n\r\n", []ev{{"", "x", ""}, {"", "y", ""}}},
		{"E9 CR line endings", "data: x\r\rdata: y\r\r", []ev{{"", "x", ""}, {"", "y", ""}}},
		{"E9 mixed line endings", "data: a\r\ndata: b\rdata: c\n\r\n", []ev{{"", "a\nb\nc", ""}}},
		{"E9 multi-line data joined by LF", "data: a\ndata: b\n\n", []ev{{"", "a\nb", ""}}},
		{"E9 comments ignored", ": keep-alive\n\n:x\ndata: d\n\n", []ev{{"", "d", ""}}},
		{"T2 event field (Anthropic)", "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			[]ev{{"message_stop", `{"type":"message_stop"}`, ""}}},
		{"E9 missing final blank line dispatches", "data: [DONE]", []ev{{"", "[DONE]", ""}}},
		{"E9 missing final blank line after LF", "data: a\n\ndata: [DONE]\n", []ev{{"", "a", ""}, {"", "[DONE]", ""}}},
		{"E9 no space after colon", "data:x\n\n", []ev{{"", "x", ""}}},
		{"E9 only one space stripped", "data:  x\n\n", []ev{{"", " x", ""}}},
		{"E9 field without colon is empty value", "data\n\n", []ev{{"", "", ""}}},
		{"E9 empty data dispatches empty event", "data:\n\n", []ev{{"", "", ""}}},
		{"E9 event without data is not dispatched", "event: ping\n\ndata: z\n\n", []ev{{"", "z", ""}}},
		{"E9 type resets after dispatch", "event: a\ndata: 1\n\ndata: 2\n\n", []ev{{"a", "1", ""}, {"", "2", ""}}},
		{"E9 id persists", "id: 7\ndata: 1\n\ndata: 2\n\n", []ev{{"", "1", "7"}, {"", "2", "7"}}},
		{"E9 id with NUL ignored", "id: a\x00b\ndata: 1\n\n", []ev{{"", "1", ""}}},
		{"E9 retry and unknown fields ignored", "retry: 10\nfoo: bar\ndata: 1\n\n", []ev{{"", "1", ""}}},
		{"E9 blank lines only", "\n\n\r\n", nil},
		{"E9 empty stream", "", nil},
		{"E9 malformed JSON passes through unparsed", "data: {not json\n\n", []ev{{"", "{not json", ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := collect(NewReader(strings.NewReader(tc.in), 0))
			if err != io.EOF {
				t.Fatalf("got error %v, want io.EOF", err)
			}
			if !equalEvents(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			// The same input one byte per read must give the same events.
			got, _ = collect(NewReader(iotest.OneByteReader(strings.NewReader(tc.in)), 0))
			if !equalEvents(got, tc.want) {
				t.Fatalf("one byte per read: got %q, want %q", got, tc.want)
			}
		})
	}
}

// E9: CRLF split across two reads counts as one line ending, at every split.
func TestReaderSplitAtEveryByte(t *testing.T) {
	in := []byte("event: e\r\ndata: a\r\ndata: b\r\n\r\n: c\r\ndata: x\rdata: y\r\rdata: [DONE]\r\n\r\n")
	want, err := collect(NewReader(bytes.NewReader(in), 0))
	if err != io.EOF {
		t.Fatalf("whole: %v", err)
	}
	for k := 0; k <= len(in); k++ {
		got, err := collect(NewReader(io.MultiReader(bytes.NewReader(in[:k]), bytes.NewReader(in[k:])), 0))
		if err != io.EOF || !equalEvents(got, want) {
			t.Fatalf("split at %d: got %q, %v; want %q", k, got, err, want)
		}
	}
}

// E9, T2: every captured stream parses; OpenAI streams end with [DONE],
// Anthropic streams with message_stop.
func TestReaderSamples(t *testing.T) {
	dir := samples.Dir()
	cases := []struct {
		file     string
		events   int
		lastType string
		lastData string
	}{
		{"llama_v1_chat_stream.sse", 11, "", "[DONE]"},
		{"llama_v1_chat_tool_stream.sse", 5, "", "[DONE]"},
		{"ollama_v1_chat_stream.sse", 10, "", "[DONE]"},
		{"ollama_v1_chat_tool_stream.sse", 4, "", "[DONE]"},
		{"llama_v1_messages_stream.sse", 12, "message_stop", `{"type":"message_stop"}`},
		{"ollama_v1_messages_stream.sse", 12, "message_stop", `{"type":"message_stop"}`},
		{"llama_completion_stream.sse", 4, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(dir, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(NewReader(bytes.NewReader(b), 0))
			if err != io.EOF {
				t.Fatalf("got error %v, want io.EOF", err)
			}
			if len(got) != tc.events {
				t.Fatalf("got %d events, want %d", len(got), tc.events)
			}
			last := got[len(got)-1]
			if last.Type != tc.lastType || (tc.lastData != "" && last.Data != tc.lastData) {
				t.Fatalf("last event %q, want type %q data %q", last, tc.lastType, tc.lastData)
			}
			for i := 0; i <= len(b); i += 7 {
				again, err := collect(NewReader(io.MultiReader(bytes.NewReader(b[:i]), bytes.NewReader(b[i:])), 0))
				if err != io.EOF || !equalEvents(again, got) {
					t.Fatalf("split at %d differs", i)
				}
			}
		})
	}
}

func TestReaderLimits(t *testing.T) {
	t.Run("E9 line over cap is ErrLineTooLong", func(t *testing.T) {
		r := NewReader(strings.NewReader("data: "+strings.Repeat("x", 100)+"\n\n"), 64)
		if _, err := r.Next(); !errors.Is(err, ErrLineTooLong) {
			t.Fatalf("got %v, want ErrLineTooLong", err)
		}
		if _, err := r.Next(); !errors.Is(err, ErrLineTooLong) {
			t.Fatalf("second call: got %v, want sticky ErrLineTooLong", err)
		}
	})
	t.Run("E9 event data over 4x cap is ErrEventTooLarge", func(t *testing.T) {
		in := strings.Repeat("data: "+strings.Repeat("y", 50)+"\n", 10) + "\n"
		r := NewReader(strings.NewReader(in), 64)
		if _, err := r.Next(); !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("got %v, want ErrEventTooLarge", err)
		}
	})
	t.Run("E9 read error after complete events", func(t *testing.T) {
		boom := errors.New("boom")
		r := NewReader(io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom)), 0)
		got, err := collect(r)
		if !errors.Is(err, boom) || !equalEvents(got, []ev{{"", "a", ""}}) {
			t.Fatalf("got %q, %v; want [a], boom (a partial event is not dispatched on error)", got, err)
		}
	})
}

// T2 (allocation-lean relay): parsing a warmed-up stream allocates nothing per
// event.
func TestReaderAllocs(t *testing.T) {
	chunk := []byte("event: message\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
	in := bytes.Repeat(chunk, 64)
	src := bytes.NewReader(in)
	r := NewReader(src, 0)
	allocs := testing.AllocsPerRun(20, func() {
		src.Reset(in)
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		r.err = nil // restart the reader on the rewound source
	})
	if allocs > 0 {
		t.Fatalf("got %.1f allocs per 64 events, want 0", allocs)
	}
}

func equalEvents(a, b []ev) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
