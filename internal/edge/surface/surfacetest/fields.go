package surfacetest

import (
	"slices"
	"testing"

	"iop/internal/edge/surface"
)

// CheckFieldTable checks a surface's request field table against the
// fields its parser knows (issue 14): every parsed field has exactly one
// row with a disposition and a note, and every row is a parsed field. A
// field added to a parser without a row fails here.
func CheckFieldTable(t testing.TB, parsed []string, rows []surface.Field) {
	t.Helper()
	var names []string
	for _, f := range rows {
		if slices.Contains(names, f.Name) {
			t.Errorf("field %q has two rows", f.Name)
		}
		names = append(names, f.Name)
		if !slices.Contains(parsed, f.Name) {
			t.Errorf("row %q is not a field the parser knows", f.Name)
		}
		if f.Disposition == 0 || f.Note == "" {
			t.Errorf("row %q: disposition %v, note %q", f.Name, f.Disposition, f.Note)
		}
	}
	for _, name := range parsed {
		if !slices.Contains(names, name) {
			t.Errorf("parsed field %q has no row in the field table", name)
		}
	}
}

// CheckShape checks that a Shape allows exactly the members a parser's
// struct decodes (issue 14): a member the parser reads but the shape
// refuses, or one the shape lets through but the parser drops, fails here.
// parsed is surface.JSONNames of the struct.
func CheckShape(t testing.TB, what string, sh *surface.Shape, parsed []string) {
	t.Helper()
	allowed := sh.AllNames()
	for _, n := range parsed {
		if !slices.Contains(allowed, n) {
			t.Errorf("%s: the parser reads %q but the shape refuses it", what, n)
		}
	}
	for _, n := range allowed {
		if !slices.Contains(parsed, n) {
			t.Errorf("%s: the shape allows %q but the parser drops it", what, n)
		}
	}
}
