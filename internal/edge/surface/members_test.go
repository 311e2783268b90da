package surface_test

import (
	"encoding/json"
	"testing"

	"iop/internal/edge/surface"
)

var table = []surface.Field{surface.Row("model", surface.Routing, "r"), surface.Row("messages", surface.Translated, "t")}

// F2: an unknown top-level member is a 400 naming it, whatever the
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
		t.Run(row.name, func(t *testing.T) {
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

var (
	partShape = &surface.Shape{
		Members: []surface.Member{surface.M("type", nil)},
		Types: []surface.Variant{
			{Type: "text", Members: []surface.Member{surface.M("text", nil)}},
			{Type: "image", Members: []surface.Member{surface.M("source", &surface.Shape{Members: []surface.Member{surface.M("data", nil)}})}},
		},
	}
	msgShape    = &surface.Shape{Members: []surface.Member{surface.M("role", nil), surface.M("content", partShape)}}
	nestedTable = []surface.Field{surface.Row("model", surface.Routing, "r"), surface.Row("messages", surface.Translated, "t").Of(msgShape),
		surface.Row("schema", surface.Translated, "the client's own object")}
)

// F2: a member the run path does not know is a 400 naming its path
// at any depth (objects, arrays of objects, a "type"'s own members); a
// type without a variant and a value without a Shape are not checked.
func TestCheckMembersNested(t *testing.T) {
	rows := []struct{ name, body, unknown string }{
		{"known at every depth", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"data":"x"}}]},{"role":"a","content":"s"}]}`, ""},
		{"unknown message member", `{"messages":[{"role":"user"},{"role":"user","cache":1}]}`, "messages[1].cache"},
		{"member of another type", `{"messages":[{"content":[{"type":"text","text":"a","source":{}}]}]}`, "messages[0].content[0].source"},
		{"unknown below a variant member", `{"messages":[{"content":[{"type":"image","source":{"data":"x","url":"u"}}]}]}`, "messages[0].content[0].source.url"},
		{"absent type has no variant", `{"messages":[{"content":[{"text":"a","anything":1}]}]}`, ""},
		{"unlisted type is the parser's", `{"messages":[{"content":[{"type":"audio","data":1}]}]}`, ""},
		{"escaped type and key", `{"messages":[{"content":[{"typ\u0065":"t\u0065xt","t\u0065xt":"a"}]}]}`, ""},
		{"arrays of arrays", `{"messages":[[{"role":"u"}],[{"x":1}]]}`, "messages[1][0].x"},
		{"a field without a shape is free", `{"schema":{"anything":{"goes":[1]}}}`, ""},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			if !json.Valid([]byte(row.body)) {
				t.Fatal("test body is not JSON")
			}
			e := surface.CheckMembers([]byte(row.body), nestedTable)
			switch {
			case row.unknown == "" && e != nil:
				t.Fatalf("got %v, want nil", e)
			case row.unknown != "" && (e == nil || e.Param != row.unknown):
				t.Fatalf("got %v, want a 400 naming %q", e, row.unknown)
			}
		})
	}
}

// A body whose members are all known costs no allocation to check.
func TestCheckMembersNestedNoAllocs(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"data":"x"}}]}]}`)
	if n := testing.AllocsPerRun(100, func() { _ = surface.CheckMembers(body, nestedTable) }); n != 0 {
		t.Errorf("got %v allocations, want 0", n)
	}
}
