package openai

import (
	"slices"
	"testing"
)

// Issue 14: every field the chat parser knows has exactly one row in
// ChatFields and every row is a field the parser knows; a field added to
// chatRequest without a row fails here.
func TestChatFieldTableComplete(t *testing.T) {
	parsed := ChatRequestFields()
	var rows []string
	for _, f := range ChatFields {
		if slices.Contains(rows, f.Name) {
			t.Errorf("field %q has two rows", f.Name)
		}
		rows = append(rows, f.Name)
		if !slices.Contains(parsed, f.Name) {
			t.Errorf("row %q is not a field the parser knows", f.Name)
		}
		if f.Disposition == 0 || f.Note == "" {
			t.Errorf("row %q: disposition %v, note %q", f.Name, f.Disposition, f.Note)
		}
	}
	for _, name := range parsed {
		if !slices.Contains(rows, name) {
			t.Errorf("parsed field %q has no row in ChatFields", name)
		}
	}
}
