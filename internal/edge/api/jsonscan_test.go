package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"iop/internal/edge/exchange"
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
			got := string(exchange.SpliceModel([]byte(row.body), hd.modelSpans, row.target))
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
			for k := range m {
				if k != "model" && strings.EqualFold(k, "model") {
					return // refused: a key another decoder reads as "model" (Q1)
				}
			}
			t.Fatalf("parseHead(%q): %v", body, e)
		}
		if hd.model != want {
			t.Fatalf("model: got %q, want %q", hd.model, want)
		}
		out := exchange.SpliceModel(body, hd.modelSpans, "T\"")
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

// Q1: a top-level key that spells a head field ("model", "stream",
// "stream_options", the endpoint's array) in another case is a 400 naming
// it. Go's encoding/json (Ollama) folds key case and the last key wins, so
// on the tunnel {"model":"tiny-oa","Model":"other"} was routed to tiny-oa's
// provider and served by the backend's model "other", a target no group
// names.
func TestParseHeadRefusesCaseFoldedKeys(t *testing.T) {
	rows := []struct {
		name  string
		ep    *endpoint
		body  string
		param string // "" = accepted
	}{
		{"Q1 Model after model", &epChat, `{"model":"tiny","Model":"other","messages":[]}`, "Model"},
		{"Q1 MODEL before model", &epResponses, `{"MODEL":"other","model":"tiny","input":"x"}`, "MODEL"},
		{"Q1 escaped mOdel", &epEmbeddings, `{"model":"tiny","m\u004fdel":"other","input":"x"}`, "mOdel"},
		{"Q1 Stream", &epChat, `{"model":"tiny","stream":false,"Stream":true,"messages":[]}`, "Stream"},
		{"Q1 long s folds to s", &epChat, `{"model":"tiny","\u017ftream":true,"messages":[]}`, "\u017ftream"},
		{"Q1 Stream_Options", &epChat, `{"model":"tiny","Stream_Options":{},"messages":[]}`, "Stream_Options"},
		{"Q1 Messages", &epMessages, `{"model":"tiny","max_tokens":1,"messages":[],"Messages":[]}`, "Messages"},
		{"Q1 Input on responses is not a head field", &epResponses, `{"model":"tiny","Input":"x"}`, ""},
		{"Q1 exact keys accepted", &epChat, `{"model":"tiny","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, ""},
		{"Q1 nested Model untouched", &epChat, `{"model":"tiny","metadata":{"Model":"x"},"messages":[]}`, ""},
		{"Q1 other fields keep their case", &epChat, `{"model":"tiny","Temperature":1,"messages":[]}`, ""},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var hd head
			e := parseHead([]byte(row.body), row.ep, &hd)
			if row.param == "" {
				if e != nil {
					t.Fatalf("refused: %v", e.Message)
				}
				return
			}
			if e == nil {
				t.Fatalf("accepted; want a 400 naming %s", row.param)
			}
			var want string
			if err := json.Unmarshal([]byte(`"`+row.param+`"`), &want); err != nil {
				t.Fatal(err)
			}
			if e.Status != 400 || e.Param != want || !strings.Contains(e.Message, "case-sensitive") {
				t.Fatalf("got %d param %q %q; want 400 naming %q", e.Status, e.Param, e.Message, want)
			}
		})
	}
}
