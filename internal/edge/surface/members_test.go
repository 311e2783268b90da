package surface_test

import (
	"encoding/json"
	"testing"

	"iop/internal/edge/surface"
)

var table = []surface.Field{surface.Row("model", surface.Routing, "r"), surface.Row("messages", surface.Translated, "t")}

// Issue 14: an unknown top-level member is a 400 naming it, whatever the
// values around it hold; known members pass.
func TestCheckMembers(t *testing.T) {
	rows := []struct{ name, body, unknown string }{
		{"known only", `{"model":"m","messages":[{"role":"user","content":"a \"}\" {"}]}`, ""},
		{"unknown after nested values", `{"messages":[{"x":{"y":[1,2,"]"]}}], "modle" : "m"}`, "modle"},
		{"escaped known key", `{"mod\u0065l":"m"}`, ""},
		{"escaped unknown key", `{"fo\u006f":1}`, "foo"},
		{"not an object", `[1]`, ""},
		{"empty object", ` { } `, ""},
	}
	for _, row := range rows {
		t.Run("issue 14 "+row.name, func(t *testing.T) {
			if !json.Valid([]byte(row.body)) {
				t.Fatal("test body is not JSON")
			}
			e := surface.CheckMembers([]byte(row.body), table)
			switch {
			case row.unknown == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.unknown != "" && (e == nil || e.Param != row.unknown):
				t.Fatalf("got %v, want a 400 naming %q", e, row.unknown)
			}
		})
	}
}

// FuzzCheckMembers: on any valid JSON object, CheckMembers names an
// unknown member exactly when encoding/json finds one.
func FuzzCheckMembers(f *testing.F) {
	f.Add(`{"model":"m","x":[1,{"a":"}"}]}`)
	f.Add(`{"messages":{},"model":null}`)
	f.Fuzz(func(t *testing.T, body string) {
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &m) != nil {
			return
		}
		unknown := false
		for k := range m {
			if k != "model" && k != "messages" {
				unknown = true
			}
		}
		if e := surface.CheckMembers([]byte(body), table); (e != nil) != unknown {
			t.Fatalf("%s: CheckMembers %v, unknown %v", body, e, unknown)
		}
	})
}
