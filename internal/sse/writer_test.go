package sse

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestWriteEvent(t *testing.T) {
	cases := []struct {
		name  string
		event string
		data  string
		want  string
	}{
		{"T5 data only", "", `{"a":1}`, "data: {\"a\":1}\n\n"},
		{"T5 named event", "message_stop", `{"type":"message_stop"}`, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		{"T5 multi-line data", "", "a\nb\r\nc\rd", "data: a\ndata: b\ndata: c\ndata: d\n\n"},
		{"T5 empty data", "ping", "", "event: ping\ndata: \n\n"},
		{"T5 trailing newline kept", "", "a\n", "data: a\ndata: \n\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			if err := w.WriteEvent(tc.event, []byte(tc.data)); err != nil {
				t.Fatal(err)
			}
			if buf.String() != tc.want {
				t.Fatalf("got %q, want %q", buf.String(), tc.want)
			}
			var buf2 bytes.Buffer
			if err := WriteEvent(&buf2, tc.event, []byte(tc.data)); err != nil || buf2.String() != tc.want {
				t.Fatalf("package WriteEvent: got %q, %v", buf2.String(), err)
			}
			// Round trip: the Reader gets back the event, line breaks as "\n".
			got, err := collect(NewReader(&buf, 0))
			want := referenceParse(tc.want)
			if err != io.EOF || !equalEvents(got, want) || len(got) != 1 {
				t.Fatalf("round trip: got %q, %v; want %q", got, err, want)
			}
		})
	}
}

func TestWriterRejectsBadName(t *testing.T) {
	var buf bytes.Buffer
	if err := NewWriter(&buf).WriteEvent("a\nb", nil); !errors.Is(err, ErrInvalidEventName) {
		t.Fatalf("got %v, want ErrInvalidEventName", err)
	}
	if buf.Len() != 0 {
		t.Fatalf("wrote %q for a rejected event", buf.String())
	}
}

func TestWriteComment(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.WriteComment("keep\r\nalive"); err != nil {
		t.Fatal(err)
	}
	if buf.String() != ":keep\n:alive\n\n" {
		t.Fatalf("got %q", buf.String())
	}
	if got, err := collect(NewReader(&buf, 0)); err != io.EOF || len(got) != 0 {
		t.Fatalf("comment produced events %q, %v", got, err)
	}
}

// T5: a warmed-up Writer allocates nothing per event.
func TestWriterAllocs(t *testing.T) {
	w := NewWriter(io.Discard)
	data := []byte(`{"choices":[{"delta":{"content":"hi"}}]}`)
	allocs := testing.AllocsPerRun(100, func() { _ = w.WriteEvent("", data) })
	if allocs > 0 {
		t.Fatalf("got %.1f allocs per event, want 0", allocs)
	}
}
