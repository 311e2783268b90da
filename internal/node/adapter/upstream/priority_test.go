package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"iop/internal/jsonscan"
)

// member is one top-level member of an object: its decoded key and raw value.
type member struct{ key, val string }

func members(t testing.TB, b []byte) []member {
	t.Helper()
	it, ok := jsonscan.NewMembers(b, jsonscan.All(b))
	if !ok {
		t.Fatalf("%s is not an object", b)
	}
	var out []member
	for {
		k, v, more := it.Next()
		if !more {
			return out
		}
		out = append(out, member{jsonscan.Key(k), string(b[v.Start:v.End])})
	}
}

// checkPriority asserts what SetPriority promises of out, made from in:
// valid JSON; every member named priority in any case holds n, one is
// named exactly so; the other members are in's, in order (SPEC G7).
func checkPriority(t testing.TB, in, out []byte, n int32) {
	t.Helper()
	if !json.Valid(out) {
		t.Fatalf("SetPriority(%s) = %s: not JSON", in, out)
	}
	rest := func(ms []member) []member {
		var r []member
		for _, m := range ms {
			if !strings.EqualFold(m.key, "priority") {
				r = append(r, m)
			}
		}
		return r
	}
	exact := false
	for _, m := range members(t, out) {
		if strings.EqualFold(m.key, "priority") {
			if m.val != strconv.Itoa(int(n)) {
				t.Fatalf("SetPriority(%s) = %s: member %q is %s, want %d", in, out, m.key, m.val, n)
			}
			exact = exact || m.key == "priority"
		}
	}
	if !exact {
		t.Fatalf("SetPriority(%s) = %s: no member named priority", in, out)
	}
	a, b := rest(members(t, in)), rest(members(t, out))
	if len(a) != len(b) {
		t.Fatalf("SetPriority(%s) = %s: other members %v, want %v", in, out, b, a)
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("SetPriority(%s) = %s: other members %v, want %v", in, out, b, a)
		}
	}
	// What a decoder that keeps the last duplicate (Python's json, Go's) reads.
	var v struct{ Priority int32 }
	if err := json.Unmarshal(out, &v); err != nil || v.Priority != n {
		t.Fatalf("SetPriority(%s) = %s decodes to priority %d (%v), want %d", in, out, v.Priority, err, n)
	}
}

// TestG7SetPriority: the class's value goes in as the last member, or in
// place of every member a client named priority — duplicates, escaped
// spellings and other letter cases included — with every other byte kept;
// a body that is not one JSON object is refused (SPEC G7).
func TestG7SetPriority(t *testing.T) {
	rows := []struct {
		name, in, want string
		n              int32
	}{
		{"G7 appended last", `{"model":"m","messages":[]}`, `{"model":"m","messages":[],"priority":1}`, 1},
		{"G7 into an empty object", `{}`, `{"priority":-1}`, -1},
		{"G7 into an empty object with space", " { \n} ", " { \n\"priority\":0} ", 0},
		{"G7 spacing kept", "{\n  \"model\": \"m\"\n}\n", "{\n  \"model\": \"m\"\n,\"priority\":1}\n", 1},
		{"G7 the client's value replaced", `{"priority":-100,"model":"m"}`, `{"priority":1,"model":"m"}`, 1},
		{"G7 every duplicate replaced", `{"priority":-100,"model":"m","priority":-7}`, `{"priority":1,"model":"m","priority":1}`, 1},
		{"G7 an escaped key replaced", `{"pr\u0069ority":-100}`, `{"pr\u0069ority":0}`, 0},
		{"G7 another case replaced, and the exact key added", `{"PRIORITY":-100,"model":"m"}`, `{"PRIORITY":-1,"model":"m","priority":-1}`, -1},
		{"G7 any value replaced", `{"priority":{"a":[1,2]},"x":"priority"}`, `{"priority":1,"x":"priority"}`, 1},
		{"G7 a nested priority is not the backend's", `{"metadata":{"priority":-100}}`, `{"metadata":{"priority":-100},"priority":1}`, 1},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			in := []byte(r.in)
			got, err := SetPriority(in, r.n)
			if err != nil || string(got) != r.want {
				t.Fatalf("SetPriority(%s, %d) = %s, %v; want %s", r.in, r.n, got, err, r.want)
			}
			if string(in) != r.in {
				t.Fatalf("SetPriority modified its input: %s", in)
			}
			checkPriority(t, in, got, r.n)
		})
	}
	for _, bad := range []string{``, `[]`, `"priority"`, `{"priority":NaN}`, `{"a":1`, `{"a":1}{"b":2}`, `null`} {
		if got, err := SetPriority([]byte(bad), 1); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("G7 SetPriority(%q) = %s, %v; want ErrInvalidInput", bad, got, err)
		}
	}
}

// FuzzSetPriority: for any body (what a client sent through the edge),
// SetPriority either refuses a body that is not one JSON object or
// returns one in which every priority member holds the value and every
// other member is the client's (SPEC G7).
func FuzzSetPriority(f *testing.F) {
	for _, s := range []string{`{}`, `{"model":"m","priority":-100}`, `{"priority":1,"priority":2}`, `{"pr\u0069ority":3}`,
		`{"Priority":4,"messages":[{"priority":5}]}`, " {\"a\" : [1, {\"b\":\"}\"}] } ", `[1]`, `{"a":"\"}"}`} {
		f.Add([]byte(s), int32(1))
	}
	f.Fuzz(func(t *testing.T, body []byte, n int32) {
		in := bytes.Clone(body)
		out, err := SetPriority(body, n)
		if !bytes.Equal(in, body) {
			t.Fatal("SetPriority modified its input")
		}
		if err != nil {
			if _, ok := jsonscan.NewMembers(body, jsonscan.All(body)); json.Valid(body) && ok {
				t.Fatalf("SetPriority(%q) refused a JSON object: %v", body, err)
			}
			return
		}
		checkPriority(t, body, out, n)
	})
}

// BenchmarkSetPriority: what the node adds to a tunnel whose backend takes
// the priority field (SPEC G7): json.Valid, one scan of the top level and
// one copy, for a chat body of 1 KiB and of 256 KiB (one long message).
func BenchmarkSetPriority(b *testing.B) {
	for _, size := range []int{1 << 10, 256 << 10} {
		body := []byte(`{"model":"tiny","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"` +
			strings.Repeat("x", size-100) + `"}]}`)
		b.Run(strconv.Itoa(len(body))+"B", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := SetPriority(body, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
