package keystore

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// K4: Match agrees with the same pattern as a regular expression ('*' →
// ".*", '?' → one character, everything else literal) on any input.
func FuzzMatch(f *testing.F) {
	for _, s := range [][2]string{{"tiny*", "tiny-oa"}, {"*-oa", "x-oa"}, {"t?ny", "tüny"}, {"a*b*c", "aXbYbZ"}, {"**?", ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, p, model string) {
		if ValidatePattern(p) != nil {
			return
		}
		var re strings.Builder
		re.WriteString(`^(?s:`)
		for _, r := range p {
			switch r {
			case '*':
				re.WriteString(`.*`)
			case '?':
				re.WriteString(`.`)
			default:
				re.WriteString(regexp.QuoteMeta(string(r)))
			}
		}
		re.WriteString(`)$`)
		want := regexp.MustCompile(re.String()).MatchString(model)
		if got := Match(p, model); got != want {
			t.Fatalf("Match(%q, %q) = %v, the regular expression %s says %v", p, model, got, re.String(), want)
		}
	})
}

// K1: no input makes Parse panic, and a store it accepts saves to a file
// it accepts again with the same keys.
func FuzzParse(f *testing.F) {
	s := New()
	s.Create(Spec{Name: "a", Models: []string{"tiny*"}, Limits: Limits{TokensPerDay: 5}}, t0)
	path := f.TempDir() + "/k.json"
	s.Save(path)
	good, _ := os.ReadFile(path)
	f.Add(good)
	f.Add([]byte(`{"version":1,"keys":[],"checksum":"sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"}`))
	f.Add([]byte(`{"version":1`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := Parse(b)
		if err != nil {
			return
		}
		p := t.TempDir() + "/k.json"
		if err := st.Save(p); err != nil {
			t.Fatal(err)
		}
		again, err := Load(p)
		if err != nil {
			t.Fatalf("a store Parse accepted does not load after Save: %v", err)
		}
		if len(again.Keys()) != len(st.Keys()) {
			t.Fatalf("%d keys after the round trip, want %d", len(again.Keys()), len(st.Keys()))
		}
	})
}
