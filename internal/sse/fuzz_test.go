package sse

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// referenceParse is a deliberately naive, string-based reading of the WHATWG
// event-stream algorithm (plus this package's dispatch-at-EOF rule), used as
// the oracle of FuzzReader.
func referenceParse(in string) []ev {
	var lines []string
	for len(in) > 0 {
		i := strings.IndexAny(in, "\r\n")
		if i < 0 {
			lines = append(lines, in)
			break
		}
		lines = append(lines, in[:i])
		if in[i] == '\r' && i+1 < len(in) && in[i+1] == '\n' {
			i++
		}
		in = in[i+1:]
	}
	var out []ev
	typ, data, id := "", "", ""
	has := false
	flush := func() {
		if has {
			out = append(out, ev{typ, strings.TrimSuffix(data, "\n"), id})
		}
		typ, data, has = "", "", false
	}
	for _, l := range lines {
		switch {
		case l == "":
			flush()
		case l[0] == ':':
		default:
			f, v, ok := strings.Cut(l, ":")
			if ok {
				v = strings.TrimPrefix(v, " ")
			}
			switch f {
			case "event":
				typ = v
			case "data":
				data += v + "\n"
				has = true
			case "id":
				if !strings.Contains(v, "\x00") {
					id = v
				}
			}
		}
	}
	flush()
	return out
}

// E9, T2: the Reader agrees with the reference parser on any input, read
// whole, one byte at a time, and split in two at every byte boundary.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		"data: x\n\n", "data: a\r\ndata: b\r\n\r\n", "event: e\rdata: 1\r\r", ":c\n\ndata",
		"id: 1\ndata: [DONE]", "data:\r\n\r", "\r\n\r\n\n", "data: {\"x\":\"\\r\"}\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want := referenceParse(string(in))
		check := func(how string, r io.Reader) {
			got, err := collect(NewReader(r, 0))
			if err != io.EOF {
				t.Fatalf("%s: got error %v, want io.EOF", how, err)
			}
			if !equalEvents(got, want) {
				t.Fatalf("%s: got %q, want %q", how, got, want)
			}
		}
		check("whole", bytes.NewReader(in))
		check("one byte per read", iotest.OneByteReader(bytes.NewReader(in)))
		if len(in) <= 4096 {
			for k := 1; k < len(in); k++ {
				check("split", io.MultiReader(bytes.NewReader(in[:k]), bytes.NewReader(in[k:])))
			}
		}
	})
}

// A small line cap must never panic, and must fail with a line error only.
func FuzzReaderSmallCap(f *testing.F) {
	f.Add([]byte("data: 0123456789abcdef\n\n"), uint8(8))
	f.Fuzz(func(t *testing.T, in []byte, c uint8) {
		r := NewReader(iotest.HalfReader(bytes.NewReader(in)), int(c%32)+1)
		for {
			_, err := r.Next()
			if err == nil {
				continue
			}
			if err != io.EOF && !errors.Is(err, ErrLineTooLong) && !errors.Is(err, ErrEventTooLarge) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
	})
}
