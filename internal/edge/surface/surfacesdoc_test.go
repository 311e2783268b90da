package surface_test

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"iop/internal/edge/surface"
	"iop/internal/edge/surface/anthropic"
	"iop/internal/edge/surface/openai"
	"iop/internal/edge/surface/responses"
)

var update = flag.Bool("update", false, "rewrite docs/surfaces.md's field tables from the surfaces' field tables")

const (
	fieldsBegin = "<!-- field-tables:begin (generated from internal/edge/surface by `go test ./internal/edge/surface -update`; do not edit) -->"
	fieldsEnd   = "<!-- field-tables:end -->"
	surfacesDoc = "../../../docs/surfaces.md"
)

// docSurfaces are the run path's field tables in the order
// docs/surfaces.md shows them, each under its endpoint.
var docSurfaces = []struct {
	heading, intro string
	table          []surface.Field
}{
	{"`POST /v1/chat/completions`", "The table is `openai.ChatFields`.", openai.ChatFields},
	{"`POST /v1/messages`, `POST /v1/messages/count_tokens`", "The table is `anthropic.Fields`. " +
		"count_tokens takes the same fields except `max_tokens`, `stop_sequences`, `stream`, the sampling fields, " +
		"`metadata` and `service_tier` (a 400 naming the field, as Anthropic answers).", anthropic.Fields},
	{"`POST /v1/responses`", "The table is `responses.Fields`.", responses.Fields},
	{"`POST /v1/embeddings`", "The table is `openai.EmbeddingsFields`.", openai.EmbeddingsFields},
}

// dispositions are the words the doc's second column uses, in the order of
// its legend.
var dispositions = []struct {
	d          surface.Disposition
	word, says string
}{
	{surface.Translated, "translated", "sent to the backend in its native form (`options`, `format`, `think`, `images`, `tools` are fields of Ollama's `/api/chat`; `input`, `dimensions` of its `/api/embed`), or enforced by the edge itself"},
	{surface.Routing, "read by the edge", "the edge reads it to route or relay the request"},
	{surface.Advisory, "accepted, no effect", "checked as the API checks it, then without effect: by the API's own definition it does not change the answer"},
	{surface.Refused, "refused", "a 400 naming the field, for every value or for the values the note names (the others are translated)"},
}

func word(t *testing.T, d surface.Disposition) string {
	for _, w := range dispositions {
		if w.d == d {
			return w.word
		}
	}
	t.Fatalf("disposition %v has no word in the doc's legend", d)
	return ""
}

// cell makes s safe inside a Markdown table cell: a '|' would end the
// cell and '<' open an HTML tag ("format <schema>" would lose the
// placeholder).
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}

// fieldTables renders the tables as docs/surfaces.md's per-surface field
// tables: one row per field, then, for a field whose objects have a Shape,
// one "members" row per nested object naming the members it may carry
// (dotted paths; a path through an array names each of its objects).
func fieldTables(t *testing.T) string {
	var b strings.Builder
	b.WriteString("The second column says what the run path does with a field:\n\n")
	for _, w := range dispositions {
		fmt.Fprintf(&b, "- **%s**: %s.\n", w.word, w.says)
	}
	b.WriteString("\nA *members* row lists what the objects at a path may carry " +
		"(a path through an array names each of its objects: `messages.content` is every content part of every message; " +
		"\"by `type`\" lists what each value of the object's `type` adds, and a path under such a member names the types that carry it); " +
		"what happens to them is the note of the field they are under, and any other member is an " +
		"[unknown field](#unknown-fields).\n")
	for _, s := range docSurfaces {
		fmt.Fprintf(&b, "\n### %s\n\n%s\n\n", s.heading, s.intro)
		b.WriteString("| field | on the run path | what happens, and why |\n|---|---|---|\n")
		seen := map[*surface.Shape]string{}
		for _, f := range s.table {
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", f.Name, word(t, f.Disposition), cell(f.Note))
			if f.Shape != nil {
				members(&b, f.Name, "`"+f.Name+"`", f.Shape, seen)
			}
		}
	}
	return b.String()
}

// members writes the members row of the objects at path and, below it,
// those of the objects nested in them. label is how the row names path
// (with the types of the objects the member is under). A Shape met again
// on the same surface is named by its first label, not listed twice.
func members(b *strings.Builder, path, label string, sh *surface.Shape, seen map[*surface.Shape]string) {
	if first, ok := seen[sh]; ok {
		fmt.Fprintf(b, "| %s | *members* | as %s |\n", label, first)
		return
	}
	seen[sh] = label
	list := func(ms []surface.Member) string {
		names := make([]string, len(ms))
		for i, m := range ms {
			names[i] = "`" + m.Name + "`"
		}
		return strings.Join(names, ", ")
	}
	row := list(sh.Members)
	for i, v := range sh.Types {
		if i == 0 {
			row += "; by `type`: "
		} else {
			row += "; "
		}
		add := list(v.Members)
		if add == "" {
			add = "nothing more"
		}
		row += typeName(v.Type) + " → " + add
	}
	fmt.Fprintf(b, "| %s | *members* | %s |\n", label, row)
	for _, m := range sh.Members {
		if m.Shape != nil {
			members(b, path+"."+m.Name, "`"+path+"."+m.Name+"`", m.Shape, seen)
		}
	}
	// A member of the objects' types is listed once per shape, with the
	// types that carry it in that shape: a Responses message's content and
	// a reasoning item's differ, text's and document's citations do not.
	type group struct {
		m     surface.Member
		types []string
	}
	var groups []*group
	for _, v := range sh.Types {
		typ := typeName(v.Type)
		for _, m := range v.Members {
			if m.Shape == nil {
				continue
			}
			i := slices.IndexFunc(groups, func(g *group) bool { return g.m == m })
			if i < 0 {
				groups = append(groups, &group{m: m})
				i = len(groups) - 1
			}
			groups[i].types = append(groups[i].types, typ)
		}
	}
	for _, g := range groups {
		sub := path + "." + g.m.Name
		members(b, sub, "`"+sub+"` (`type` "+strings.Join(g.types, ", ")+")", g.m.Shape, seen)
	}
}

// typeName is how a row names a value of an object's "type": backquoted,
// or "absent" for the Variant of objects without one.
func typeName(typ string) string {
	if typ == "" {
		return "absent"
	}
	return "`" + typ + "`"
}

// The doc's per-surface field tables are the ones the run path enforces
// (ChatFields, anthropic.Fields, responses.Fields, EmbeddingsFields and
// their Shapes; regenerate with -update): a row added, a note reworded or a
// member allowed in code without the doc following fails here.
func TestSurfacesDocFieldTables(t *testing.T) {
	raw, err := os.ReadFile(surfacesDoc)
	if err != nil {
		t.Skipf("no %s: %v", surfacesDoc, err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, fieldsBegin), strings.Index(doc, fieldsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q … %q section", surfacesDoc, fieldsBegin, fieldsEnd)
	}
	want := fieldsBegin + "\n\n" + fieldTables(t) + "\n" + fieldsEnd
	if got := doc[i : j+len(fieldsEnd)]; got != want {
		if !*update {
			t.Fatalf("%s's field tables are not the code's; run go test ./internal/edge/surface -update", surfacesDoc)
		}
		if err := os.WriteFile(surfacesDoc, []byte(doc[:i]+want+doc[j+len(fieldsEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
