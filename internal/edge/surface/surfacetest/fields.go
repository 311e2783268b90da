package surfacetest

import (
	"slices"
	"strings"
	"testing"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// CheckFieldTable checks a surface's request field table against the
// fields its parser knows (F2): every parsed field has exactly one
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
// struct decodes (F2): a member the parser reads but the shape
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

// CheckReported checks one request with an unknown member at path under
// surface.ReportUnknown: it is never a 400 for that member; when the
// request is otherwise valid, the member is in the Ignored report and its
// key is in none of the JSON the RunInput carries to the node (tools,
// tool_choice, response_format, each message's tool_calls): reported,
// not forwarded.
func CheckReported(t testing.TB, in *iop.RunInput, ig surface.Ignored, e *surface.Error, path string) {
	t.Helper()
	if e != nil {
		if strings.Contains(e.Message, "unknown field") {
			t.Fatalf("report mode: got %v, want the unknown member %q accepted", e, path)
		}
		return // the body is invalid for another reason; the member itself passed
	}
	found := false
	for _, f := range ig.Fields {
		found = found || f.Path == path
	}
	if !found {
		t.Fatalf("report mode: Ignored %+v does not name %q", ig, path)
	}
	key := path[strings.LastIndexAny(path, ".")+1:]
	needle := `"` + key + `":`
	raws := [][]byte{in.GetToolsJson(), in.GetToolChoiceJson(), in.GetResponseFormatJson()}
	for _, m := range in.GetMessages() {
		raws = append(raws, m.GetToolCallsJson())
	}
	for _, r := range raws {
		if strings.Contains(string(r), needle) {
			t.Fatalf("report mode: the unknown member %q reaches the node in %s", path, r)
		}
	}
}
