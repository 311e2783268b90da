package ndjson

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

func collect(r *Reader) ([]string, error) {
	var out []string
	for {
		l, err := r.Next()
		if err != nil {
			return out, err
		}
		out = append(out, string(l))
	}
}

// reference splits like the Reader, with strings.
func reference(in string) []string {
	var out []string
	for _, l := range strings.Split(in, "\n") {
		l = strings.TrimSuffix(l, "\r")
		if strings.Trim(l, " \t\r") != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestReaderCases(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []string
	}{
		{"E8 lines", "{\"a\":1}\n{\"b\":2}\n", []string{`{"a":1}`, `{"b":2}`}},
		{"E8 CRLF", "{\"a\":1}\r\n{\"b\":2}\r\n", []string{`{"a":1}`, `{"b":2}`}},
		{"E8 last line without newline", "{\"a\":1}\n{\"b\":2}", []string{`{"a":1}`, `{"b":2}`}},
		{"E8 blank lines skipped", "\n \r\n{\"a\":1}\n\n\t\n", []string{`{"a":1}`}},
		{"E8 empty", "", nil},
		{"E8 malformed line passes through", "{not json\n", []string{"{not json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				got, err := collect(NewReader(r, 0))
				if err != io.EOF || strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
					t.Fatalf("got %q, %v; want %q, io.EOF", got, err, tc.want)
				}
			}
		})
	}
}

// E8: long lines spanning many buffer fills come back whole; over the cap is
// ErrLineTooLong, sticky.
func TestReaderLongLines(t *testing.T) {
	long := strings.Repeat("x", 10000)
	got, err := collect(NewReader(strings.NewReader(long+"\n"+long), 20000))
	if err != io.EOF || len(got) != 2 || got[0] != long || got[1] != long {
		t.Fatalf("got %d lines, %v", len(got), err)
	}
	r := NewReader(strings.NewReader(long+"\n"), 9999)
	if _, err := r.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("got %v, want ErrLineTooLong", err)
	}
	if _, err := r.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("got %v, want sticky ErrLineTooLong", err)
	}
	r = NewReader(strings.NewReader(long), 9999) // unterminated last line
	if _, err := r.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("unterminated: got %v, want ErrLineTooLong", err)
	}
}

// E8: a read error ends the stream after the complete lines; the partial
// line is dropped.
func TestReaderReadError(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("{\"a\":1}\n{\"b\""), iotest.ErrReader(boom)), 0)
	got, err := collect(r)
	if !errors.Is(err, boom) || len(got) != 1 {
		t.Fatalf("got %q, %v; want one line then boom", got, err)
	}
}

// E8: the captured Ollama streams split into their lines at every byte.
func TestReaderSamples(t *testing.T) {
	for _, f := range []string{"ollama_api_chat_stream.ndjson", "ollama_api_chat_tool_stream.ndjson", "ollama_api_generate_stream.ndjson"} {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(samples.Dir(), f))
			if err != nil {
				t.Fatal(err)
			}
			want := reference(string(b))
			for k := 0; k <= len(b); k++ {
				got, err := collect(NewReader(io.MultiReader(bytes.NewReader(b[:k]), bytes.NewReader(b[k:])), 0))
				if err != io.EOF || strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Fatalf("split at %d: got %d lines, %v", k, len(got), err)
				}
			}
		})
	}
}

// E8: reading a warmed-up stream allocates nothing per line.
func TestReaderAllocs(t *testing.T) {
	in := bytes.Repeat([]byte(`{"message":{"role":"assistant","content":"hi"},"done":false}`+"\n"), 64)
	src := bytes.NewReader(in)
	r := NewReader(src, 0)
	allocs := testing.AllocsPerRun(20, func() {
		src.Reset(in)
		r.err = nil
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
	})
	if allocs > 0 {
		t.Fatalf("got %.1f allocs per 64 lines, want 0", allocs)
	}
}

// E8: the Reader agrees with a string-splitting reference on any input, read
// whole, one byte at a time, and split at every byte boundary.
func FuzzReader(f *testing.F) {
	f.Add([]byte("{\"a\":1}\r\n\n{\"b\":2}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		want := strings.Join(reference(string(in)), "\n")
		check := func(how string, r io.Reader) {
			got, err := collect(NewReader(r, 0))
			if err != io.EOF || strings.Join(got, "\n") != want {
				t.Fatalf("%s: got %q, %v; want %q", how, got, err, want)
			}
		}
		check("whole", bytes.NewReader(in))
		check("one byte per read", iotest.OneByteReader(bytes.NewReader(in)))
		if len(in) <= 4096 {
			for k := 1; k < len(in); k++ {
				check("split", io.MultiReader(bytes.NewReader(in[:k]), bytes.NewReader(in[k:])))
			}
		}
		// A tiny cap must fail cleanly, never panic.
		r := NewReader(iotest.HalfReader(bytes.NewReader(in)), 8)
		for {
			if _, err := r.Next(); err != nil {
				if err != io.EOF && !errors.Is(err, ErrLineTooLong) {
					t.Fatalf("cap 8: unexpected error %v", err)
				}
				break
			}
		}
	})
}
