package jsonscan_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"iop/internal/jsonscan"
)

// members returns the decoded keys and raw values of the object body, as
// jsonscan sees them.
func members(body []byte) (keys []string, vals [][]byte, ok bool) {
	it, ok := jsonscan.NewMembers(body, jsonscan.All(body))
	if !ok {
		return nil, nil, false
	}
	for {
		k, v, more := it.Next()
		if !more {
			return keys, vals, true
		}
		keys = append(keys, jsonscan.Key(k))
		vals = append(vals, body[v.Start:v.End])
	}
}

func TestMembersAndElements(t *testing.T) {
	rows := []struct {
		name, body string
		keys       []string
		vals       []string
	}{
		{"empty", ` { } `, nil, nil},
		{"values of every kind", `{"a":1,"b" : "x\"}" ,"c":[1,{"d":"]"}],"e":{"f":null},"g":true,"h":-1.5e3}`,
			[]string{"a", "b", "c", "e", "g", "h"}, []string{`1`, `"x\"}"`, `[1,{"d":"]"}]`, `{"f":null}`, `true`, `-1.5e3`}},
		{"escaped key", `{"mod\u0065l":"m"}`, []string{"model"}, []string{`"m"`}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			keys, vals, ok := members([]byte(row.body))
			if !ok {
				t.Fatal("not an object")
			}
			if len(keys) != len(row.keys) {
				t.Fatalf("got keys %q, want %q", keys, row.keys)
			}
			for i := range keys {
				if keys[i] != row.keys[i] || string(vals[i]) != row.vals[i] {
					t.Errorf("member %d: got %q=%s, want %q=%s", i, keys[i], vals[i], row.keys[i], row.vals[i])
				}
			}
		})
	}
	if _, ok := jsonscan.NewMembers([]byte(`[1]`), jsonscan.All([]byte(`[1]`))); ok {
		t.Error("an array iterated as an object")
	}
	arr := []byte(`[ 1, "a,b" ,{"x":[]} ,[2]]`)
	els := jsonscan.NewElements(arr, jsonscan.All(arr))
	var got []string
	for {
		v, more := els.Next()
		if !more {
			break
		}
		got = append(got, string(arr[v.Start:v.End]))
	}
	if want := []string{`1`, `"a,b"`, `{"x":[]}`, `[2]`}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Errorf("elements: got %q, want %q", got, want)
	}
}

// FuzzMembers: on any valid JSON object, the members jsonscan finds are
// encoding/json's, in order, each value the bytes encoding/json decodes
// to the same value.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":{"b":[1,"}"]},"c":"\\\"","d":null}`, `{"mod\u0065l":"x","a":1}`, `[1]`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		var m map[string]json.RawMessage
		// json.Unmarshal takes null into a map too (leaving it nil): an
		// object is one that begins with '{'.
		isObject := json.Unmarshal(body, &m) == nil && bytes.TrimSpace(body)[0] == '{'
		keys, vals, ok := members(body)
		if ok != isObject {
			t.Fatalf("%s: object %v, jsonscan %v", body, isObject, ok)
		}
		if !ok {
			return
		}
		last := map[string][]byte{}
		for i, k := range keys {
			// encoding/json turns each byte of invalid UTF-8 in a key into
			// U+FFFD, as a []rune conversion does; Key keeps raw bytes.
			last[string([]rune(k))] = vals[i]
		}
		if len(last) != len(m) {
			t.Fatalf("%s: keys %q, encoding/json %d keys", body, keys, len(m))
		}
		for k, v := range m {
			if !bytes.Equal(bytes.TrimSpace(v), last[k]) {
				t.Fatalf("%s: member %q: got %s, want %s", body, k, last[k], v)
			}
		}
	})
}

// Members and Elements allocate nothing.
func TestNoAllocs(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant"}],"n":1}`)
	n := testing.AllocsPerRun(100, func() {
		it, _ := jsonscan.NewMembers(body, jsonscan.All(body))
		for {
			k, v, more := it.Next()
			if !more {
				break
			}
			if jsonscan.KeyIs(k, "messages") {
				els := jsonscan.NewElements(body, v)
				for {
					if _, more := els.Next(); !more {
						break
					}
				}
			}
		}
	})
	if n != 0 {
		t.Errorf("got %v allocations, want 0", n)
	}
}

// FuzzAnyBytes: on any bytes, valid JSON or not, walking every object and
// array jsonscan finds never panics, every iteration ends, and every Span
// is non-empty and lies within the body (B1: surface.DecodeRequest's
// member check, called without the HTTP layer's json.Valid, sliced b[2:1]
// on `{"` and looped forever on `[1,,2]`).
func FuzzAnyBytes(f *testing.F) {
	for _, s := range []string{`{"`, `{"a"`, `{"a":`, `{"a" 1}`, `[{"`, `{"a":[1,{"b":"\`, `"`, `{`, `[`, `{"a":1,"`, `[1,,2]`, `{"a":1,,"b":2}`, `{"a":,}`, `{"model":00 "system": {"type":"`, `["`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		walkAny(t, body, jsonscan.All(body), 0)
	})
}

func walkAny(t *testing.T, b []byte, v jsonscan.Span, depth int) {
	if depth > 64 {
		return
	}
	if v.Start < 0 || v.End > len(b) || (v.OK() && v.Start >= len(b)) {
		t.Fatalf("%q: span %v outside [0, %d)", b, v, len(b))
	}
	if !v.OK() {
		return
	}
	switch jsonscan.Kind(b, v) {
	case '{':
		m, ok := jsonscan.NewMembers(b, v)
		for n := 0; ok && n <= len(b); n++ {
			key, val, more := m.Next()
			if !more {
				break
			}
			if !val.OK() {
				t.Fatalf("%q: member %q with an empty value: an iteration that may not end", b, key)
			}
			checkString(t, b, val)
			_ = jsonscan.KeyIs(key, "model")
			walkAny(t, b, val, depth+1)
		}
	case '[':
		e := jsonscan.NewElements(b, v)
		for n := 0; n <= len(b); n++ {
			val, more := e.Next()
			if !more {
				break
			}
			if !val.OK() {
				t.Fatalf("%q: an empty element: an iteration that may not end", b)
			}
			checkString(t, b, val)
			walkAny(t, b, val, depth+1)
		}
	}
}

// checkString fails t when a string Span is not quoted at both ends: its
// content b[Start+1 : End-1] must be a slice (surface typeOf and the api's
// prefix scan slice it; `{"type":"` at the end of a body once gave [31:30]).
func checkString(t *testing.T, b []byte, v jsonscan.Span) {
	t.Helper()
	if jsonscan.Kind(b, v) == '"' && (v.End-v.Start < 2 || b[v.End-1] != '"') {
		t.Fatalf("%q: string span %v is not quoted at both ends", b, v)
	}
}
