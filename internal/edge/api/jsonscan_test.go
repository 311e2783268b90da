package api

import (
	"encoding/json"
	"reflect"
	"testing"
)

// Q3: the tunnel body is the client's with only the top-level "model"
// value replaced; every other byte stays as the client sent it.
func TestSpliceModel(t *testing.T) {
	rows := []struct {
		name, body, target, want string
	}{
		{"Q3 plain", `{"model":"tiny","messages":[]}`, "tiny:latest", `{"model":"tiny:latest","messages":[]}`},
		{"Q3 spacing and order kept", "{\n \"messages\" : [ ],\t\"model\" :  \"tiny\" , \"n\":1.50 }", "t2",
			"{\n \"messages\" : [ ],\t\"model\" :  \"t2\" , \"n\":1.50 }"},
		{"Q3 nested model untouched", `{"tools":[{"model":"tiny"}],"meta":{"model":"x"},"model":"tiny"}`, "T",
			`{"tools":[{"model":"tiny"}],"meta":{"model":"x"},"model":"T"}`},
		{"Q3 model inside a string untouched", `{"prompt":"\"model\":\"tiny\"","model":"tiny"}`, "T",
			`{"prompt":"\"model\":\"tiny\"","model":"T"}`},
		{"Q3 escaped key", `{"mod\u0065l":"tiny"}`, "T", `{"mod\u0065l":"T"}`},
		{"Q3 escaped value", `{"model":"ti\u006ey"}`, "T", `{"model":"T"}`},
		{"Q3 duplicate keys all replaced", `{"model":"a","x":1,"model":"tiny"}`, "T", `{"model":"T","x":1,"model":"T"}`},
		{"Q3 target needing escapes", `{"model":"tiny"}`, "a\"b\\c\u2028é", `{"model":"a\"b\\c\u2028é"}`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var hd head
			if e := parseHead([]byte(row.body), &epResponses, &hd); e != nil {
				t.Fatal(e)
			}
			if hd.model != "tiny" && row.name != "Q3 duplicate keys all replaced" {
				t.Errorf("model: got %q, want tiny", hd.model)
			}
			got := string(spliceModel([]byte(row.body), hd.modelSpans, row.target))
			if got != row.want {
				t.Errorf("got  %s\nwant %s", got, row.want)
			}
		})
	}
}

// FuzzSpliceModel: for any JSON object with a string "model", parseHead
// finds the value encoding/json finds (exact, case-sensitive key; last one
// wins), and the splice changes that value only.
func FuzzSpliceModel(f *testing.F) {
	for _, s := range []string{`{"model":"tiny"}`, `{ "a":[1,{"model":2}], "model" : "x\"y" }`, `{"model":"a","model":"b"}`,
		`{"MODEL":"a","model":"b","s":"\\\"{["}`, `{"mod\u0065l":"q"}`, `[]`, `{"model":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var hd head
		e := parseHead(body, &epResponses, &hd)
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil {
			if e == nil {
				t.Fatalf("parseHead accepted what encoding/json rejects: %q", body)
			}
			return
		}
		var want string
		if raw, ok := m["model"]; !ok || json.Unmarshal(raw, &want) != nil || want == "" {
			if e == nil {
				t.Fatalf("parseHead accepted %q without a string model", body)
			}
			return
		}
		if e != nil {
			t.Fatalf("parseHead(%q): %v", body, e)
		}
		if hd.model != want {
			t.Fatalf("model: got %q, want %q", hd.model, want)
		}
		out := spliceModel(body, hd.modelSpans, "T\"")
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("splice made invalid JSON %q: %v", out, err)
		}
		var orig map[string]any
		_ = json.Unmarshal(body, &orig)
		if got["model"] != "T\"" {
			t.Fatalf("model after splice: %v", got["model"])
		}
		delete(got, "model")
		delete(orig, "model")
		if !reflect.DeepEqual(got, orig) {
			t.Fatalf("splice changed other members: %q → %q", body, out)
		}
	})
}
