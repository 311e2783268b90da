package surface_test

import (
	"strings"
	"testing"

	"iop/internal/edge/surface"
)

var nested = []surface.Field{
	surface.Row("model", surface.Routing, "r"),
	surface.Row("messages", surface.Translated, "t").Of(&surface.Shape{Members: []surface.Member{surface.M("role", nil), surface.M("content", nil)}}),
}

// T5: under ReportUnknown every unknown member, at any depth, is reported
// with its path and the table row it is under (a bounded metric label),
// and nothing is refused; under RejectUnknown the first is a 400 naming it.
func TestScanMembersReport(t *testing.T) {
	body := []byte(`{"model":"m","foo":1,"messages":[{"role":"user","content":"x","bar":{"deep":1}},{"role":"user","baz":2}]}`)
	var ig surface.Ignored
	if e := surface.ScanMembers(body, nested, surface.ReportUnknown, &ig); e != nil {
		t.Fatalf("report: %v", e)
	}
	want := []surface.IgnoredField{{Path: "foo", Row: ""}, {Path: "messages[0].bar", Row: "messages"}, {Path: "messages[1].baz", Row: "messages"}}
	if ig.Total != 3 || len(ig.Fields) != 3 {
		t.Fatalf("got %+v, want %+v", ig, want)
	}
	for i := range want {
		if ig.Fields[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, ig.Fields[i], want[i])
		}
	}
	if h := ig.Header(); h != "foo, messages[0].bar, messages[1].baz" {
		t.Errorf("header %q", h)
	}
	if e := surface.ScanMembers(body, nested, surface.RejectUnknown, nil); e == nil || e.Param != "foo" {
		t.Errorf("reject: got %v, want a 400 naming foo", e)
	}
}

// T5: a client sending many, long or hostile member names costs a bounded
// report: at most MaxIgnored paths of at most MaxIgnoredPath bytes, no byte
// a header or a log line could be split on, and a count of the rest.
func TestIgnoredBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m"`)
	for i := range 100 {
		b.WriteString(`,"k` + strings.Repeat("x", 200) + string(rune('a'+i%26)) + `\r\n, \"ev\u00e9il` + strings.Repeat("y", i) + `":1`)
	}
	b.WriteString(`}`)
	var ig surface.Ignored
	if e := surface.ScanMembers([]byte(b.String()), nested, surface.ReportUnknown, &ig); e != nil {
		t.Fatal(e)
	}
	if ig.Total != 100 || len(ig.Fields) != surface.MaxIgnored {
		t.Fatalf("total %d, kept %d; want 100 and %d", ig.Total, len(ig.Fields), surface.MaxIgnored)
	}
	for _, f := range ig.Fields {
		if len(f.Path) > surface.MaxIgnoredPath || strings.ContainsAny(f.Path, "\r\n,\" \\") {
			t.Fatalf("path %q: over %d bytes or unsanitized", f.Path, surface.MaxIgnoredPath)
		}
	}
	h := ig.Header()
	if !strings.HasSuffix(h, ", +92") || strings.ContainsAny(h, "\r\n") {
		t.Fatalf("header %q: want the kept paths, then +92", h)
	}
}

// T5: a member named "" is reported as "?" (an unprintable name), never as
// an empty entry of the header's list.
func TestIgnoredEmptyName(t *testing.T) {
	var ig surface.Ignored
	if e := surface.ScanMembers([]byte(`{"model":"m","":1}`), nested, surface.ReportUnknown, &ig); e != nil {
		t.Fatal(e)
	}
	if h := ig.Header(); h != "?" {
		t.Fatalf("header %q, want %q", h, "?")
	}
}

// T5: the reasoning carrier round-trips the text; anything else — another
// provider's signature, an edited or truncated carrier, bytes that are not
// UTF-8 — yields nothing, so a client-sent signature is harmless.
func TestReasoningCarrier(t *testing.T) {
	text := "Let me think: \"quotes\", é, \n."
	got, ok := surface.DecodeReasoning(surface.EncodeReasoning(text))
	if !ok || got != text {
		t.Fatalf("round trip: %q %v", got, ok)
	}
	enc := surface.EncodeReasoning(text)
	for _, bad := range []string{"", "EqoBCkgIBxABGAIqQK…anthropic", enc[:len(enc)-3], "iop1.!!!", "iop1." + "/w==", "iop2." + enc[5:]} {
		if s, ok := surface.DecodeReasoning(bad); ok || s != "" {
			t.Errorf("DecodeReasoning(%q) = %q, %v; want nothing", bad, s, ok)
		}
	}
}
