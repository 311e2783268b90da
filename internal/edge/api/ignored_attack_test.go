package api

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/edge/access"
	"iop/internal/edge/surface"
	"iop/internal/protocol"
)

// SPEC A1, F2, attacked: on the run path (unknown_fields "report") 40
// requests each carry 2,000 unknown members, every name new — at the top
// level and inside a message — of 64 KiB, of escapes that decode to NUL,
// CR, LF and U+2028, of quotes, commas, backslashes and what looks like
// the header's own "+N" and another entry. Iop-Ignored-Fields lists at
// most surface.MaxIgnored sanitized paths of at most MaxIgnoredPath
// bytes, printable ASCII without the bytes a list or a log line splits
// on, and the count of the rest; iop_edge_ignored_fields_total keeps one
// series per surface and table row (here top_level and messages), never
// a name a client sent, however many it sends.
func TestA1HostileIgnoredFieldNamesStayBounded(t *testing.T) {
	m := access.NewMetrics()
	r := newAccessRig(t, protocol.TypeOllama, &accessSink{}, m, longWait)
	r.cfg.HTTP.MaxBodyBytes = 4 << 20
	names := func(req, n int) []string {
		out := []string{strings.Repeat("g", 64<<10), `n\u0000ul\r\nx`, `ls\u2028x`, `q\"uote,comma\\back`, "+5", "a, b", ""}
		for i := len(out); i < n; i++ {
			out = append(out, fmt.Sprintf("k%d_%d_é", req, i))
		}
		return out
	}
	const requests, members = 40, 2000
	for req := range requests {
		// 4 top-level names, 1,000 in the message, 996 more top-level:
		// the 8 listed are the first 4 of each.
		var b strings.Builder
		top := names(req, members/2)
		b.WriteString(`{"model":"tiny"`)
		for i, n := range top[:surface.MaxIgnored/2] {
			fmt.Fprintf(&b, `,"%s":%d`, n, i)
		}
		b.WriteString(`,"messages":[{"role":"user","content":"hi"`)
		for i, n := range names(req, members/2) {
			fmt.Fprintf(&b, `,"%s":%d`, n, i)
		}
		b.WriteString(`}]`)
		for i, n := range top[surface.MaxIgnored/2:] {
			fmt.Fprintf(&b, `,"%s":%d`, n, i)
		}
		b.WriteString(`}`)
		r.st.run(evStart(), evComplete(2, "hello", "stop", usage(1, 1), nil))
		resp, body := r.do(t, "POST", "/v1/chat/completions", b.String())
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", req, resp.StatusCode, body)
		}
		h := resp.Header.Values(surface.IgnoredHeader)
		if len(h) != 1 {
			t.Fatalf("request %d: %d %s headers", req, len(h), surface.IgnoredHeader)
		}
		entries := strings.Split(h[0], ", ")
		if len(entries) != surface.MaxIgnored+1 || entries[len(entries)-1] != fmt.Sprintf("+%d", members-surface.MaxIgnored) {
			t.Fatalf("request %d: %s lists %d entries %q, want %d and +%d", req, surface.IgnoredHeader, len(entries), h[0],
				surface.MaxIgnored, members-surface.MaxIgnored)
		}
		for _, e := range entries[:surface.MaxIgnored] {
			if len(e) > surface.MaxIgnoredPath || strings.ContainsFunc(e, func(c rune) bool {
				return c <= ' ' || c >= 0x7f || c == ',' || c == '"' || c == '\\'
			}) {
				t.Fatalf("request %d: entry %q: over %d bytes or unsanitized", req, e, surface.MaxIgnoredPath)
			}
		}
	}
	var buf bytes.Buffer
	if err := m.WritePrometheus(&buf); err != nil {
		t.Fatal(err)
	}
	var series []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.HasPrefix(l, "iop_edge_ignored_fields_total{") {
			series = append(series, l)
		}
	}
	want := []string{
		fmt.Sprintf(`iop_edge_ignored_fields_total{surface="chat_completions",field="messages"} %d`, requests*surface.MaxIgnored/2),
		fmt.Sprintf(`iop_edge_ignored_fields_total{surface="chat_completions",field="top_level"} %d`, requests*surface.MaxIgnored/2),
	}
	if strings.Join(series, "\n") != strings.Join(want, "\n") {
		t.Errorf("iop_edge_ignored_fields_total series:\n%s\nwant:\n%s", strings.Join(series, "\n"), strings.Join(want, "\n"))
	}
	t.Logf("A1: %d requests of %d hostile member names: %d series", requests, members, len(series))
}
