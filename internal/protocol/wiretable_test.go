package protocol

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/wire.md's failure-code table from Failures")

const (
	tableBegin = "<!-- failure-codes:begin (generated from internal/protocol by `go test ./internal/protocol -update`; do not edit) -->"
	tableEnd   = "<!-- failure-codes:end -->"
	wireDoc    = "../../docs/wire.md"
)

// table renders Failures as docs/wire.md's failure-code table.
func table() string {
	var b strings.Builder
	b.WriteString("| code | emitted by | terminal | re-dispatch ([H11](requirements.md#H11)) | passive health | client status | client code |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, f := range Failures {
		term := "ERROR"
		if f.Cancelled {
			term = "CANCELLED"
		}
		status := fmt.Sprint(f.Status)
		if !f.Fixed && f.Code != CodeCancelled {
			status += ", or by upstream_status"
		}
		fmt.Fprintf(&b, "| `%s` | node %s | %s | %s | %s | %s | `%s` |\n", f.Code, f.Emitter, term, f.Retry, f.Health, status, f.ClientCode)
	}
	return b.String()
}

// W4, H4: docs/wire.md's failure-code table is the one Failures renders
// (regenerate with -update).
func TestWireTable(t *testing.T) {
	raw, err := os.ReadFile(wireDoc)
	if err != nil {
		t.Skipf("no %s: %v", wireDoc, err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, tableBegin), strings.Index(doc, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q … %q section", wireDoc, tableBegin, tableEnd)
	}
	want := tableBegin + "\n\n" + table() + "\n" + tableEnd
	if got := doc[i : j+len(tableEnd)]; got != want {
		if !*update {
			t.Fatalf("%s's failure-code table is not Failures'; run go test ./internal/protocol -update", wireDoc)
		}
		if err := os.WriteFile(wireDoc, []byte(doc[:i]+want+doc[j+len(tableEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
