package admin

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	iop "iop/proto/gen/iop"
)

// checkExposition parses body as the Prometheus text format (0.0.4) is
// parsed by a scraper: every sample line is name{label="value",…} value,
// a label value valid UTF-8 with no escape but \\, \" and \n. It returns
// the first line that is not, with why.
func checkExposition(body string) error {
	for i, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		bad := func(why string) error { return fmt.Errorf("line %d %q: %s", i+1, line, why) }
		j := strings.IndexAny(line, "{ ")
		if j <= 0 {
			return bad("no name")
		}
		rest := line[j:]
		if rest[0] == '{' {
			rest = rest[1:]
			for {
				eq := strings.Index(rest, `="`)
				if eq <= 0 {
					return bad("no label")
				}
				rest = rest[eq+2:]
				var val strings.Builder
				k := 0
				for ; k < len(rest) && rest[k] != '"'; k++ {
					if rest[k] == '\\' {
						if k+1 >= len(rest) || !strings.ContainsRune(`\"n`, rune(rest[k+1])) {
							return bad("an escape the format does not have")
						}
						k++
					}
					val.WriteByte(rest[k])
				}
				if k >= len(rest) {
					return bad("unterminated label value")
				}
				if !utf8.ValidString(val.String()) {
					return bad("a label value that is not UTF-8")
				}
				rest = rest[k+1:]
				if strings.HasPrefix(rest, ",") {
					rest = rest[1:]
					continue
				}
				if !strings.HasPrefix(rest, "}") {
					return bad("no closing brace")
				}
				rest = rest[1:]
				break
			}
		}
		if !strings.HasPrefix(rest, " ") || strings.Contains(rest[1:], " ") && !strings.HasPrefix(rest, " ") {
			return bad("no value")
		}
	}
	return nil
}

// SPEC U8, A2, attacked: a node reports residency for models whose names
// (up to the pool's 256 bytes of UTF-8, as protobuf decodes them) hold a
// NUL, U+2028, DEL, a tab, quotes, a backslash, a newline and label
// syntax; a model group and a routing mode with control characters reach
// /status. /metrics stays one document a scraper parses (before,
// strconv.Quote wrote \x00, \u2028, \t and \x7f, escapes the text format
// does not have, so one node's name broke every scrape), with each name's
// series; /status stays JSON (the routing mode went through %q too).
func TestU8HostileModelNamesKeepMetricsParseable(t *testing.T) {
	names := []string{"a\x00b", "line\u2028sep", `q"uote`, `back\slash`, "new\nline", `x"} 1` + "\nfake_metric 99", "tab\there", "\x7f"}
	st := status()
	var rs []*iop.ModelResidency
	for _, n := range names {
		rs = append(rs, &iop.ModelResidency{Model: n, State: "loaded", Loads: 1})
	}
	st.snaps[0].Providers = append(st.snaps[0].Providers, &iop.ProviderSnapshot{ProviderId: "llama", Residency: rs})
	srv := httptest.NewServer(New(Options{Status: st, Routing: fakeRouting{{Model: "m\x00", Mode: "mode\x00\u2028\xff", PrefixHit: 1}},
		Groups: fakeGroups{{Name: "m\x00"}}, Payloads: fakePayloads{"gpu-1": "state\x00"}}))
	defer srv.Close()
	_, body := get(t, srv.URL+"/metrics")
	if err := checkExposition(body); err != nil {
		t.Errorf("/metrics does not parse: %v", err)
	}
	if got := strings.Count(body, "iop_edge_model_loads_total{"); got != len(names) {
		t.Errorf("%d iop_edge_model_loads_total series, want %d (one per name)", got, len(names))
	}
	if strings.Contains(body, "\nfake_metric") {
		t.Error("a name wrote a sample of its own")
	}
	_, js := get(t, srv.URL+"/status")
	var v any
	if err := json.Unmarshal([]byte(js), &v); err != nil {
		t.Errorf("/status is not JSON: %v: %s", err, js)
	}
}
