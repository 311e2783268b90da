package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// An outside reference is a citation a reader of a clone cannot follow: an
// issue tracker's number or a file of the development machine's shared
// folder (M1). Full URLs are removed from a line before it is matched, so an
// upstream project's issue cited by its URL is fine.
var (
	fullURL = regexp.MustCompile(`[a-z][a-z0-9+.-]*://\S+`)
	outside = []struct {
		re   *regexp.Regexp
		what string
	}{
		// The word issue or issues, then a number (after a space, "#" or "-");
		// not "tissue" or "reissue".
		{regexp.MustCompile(`(?i)\bissues?(?:\s+#?|-|#)[0-9]+\b`), "an issue number"},
		// "#" and a number in parentheses or brackets or after a tracker's
		// word (see, PR, fixes, …); not after "PKCS", not a CSS colour.
		{regexp.MustCompile(`(?i)(?:\b(?:prs?|pull request|pull|fix(?:es|ed)?|close[sd]?|resolve[sd]?|see|refs?|bug|ticket|gh)\s*|[(\[]\s*)#[0-9]{1,5}\b`), "an issue number"},
		// owner/repository, "#" and a number, without the URL.
		{regexp.MustCompile(`\b[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+#[0-9]+\b`), "an issue number"},
		// The development machine's shared folder and the files in it.
		{regexp.MustCompile(`(?:\.\./|/work/)shared\b|\bshared/(?:samples|spec|tools)\b`), "the shared folder outside the repository"},
		{regexp.MustCompile(`\b(?:DESIGN|STYLE)\.md\b|\bSTYLE [0-9]+\b|\bDESIGN(?: "|: )|\bbackends\.md\b`), "a design note outside the repository"},
	}
)

// outsideRefs returns, for one line, what each outside reference in it is.
func outsideRefs(line string) []string {
	if !maybeOutside(line) {
		return nil
	}
	line = fullURL.ReplaceAllString(line, "")
	var out []string
	for _, o := range outside {
		for _, m := range o.re.FindAllString(line, -1) {
			out = append(out, o.what+" ("+strings.TrimSpace(m)+")")
		}
	}
	return out
}

// maybeOutside is a cheap filter before the expressions: every outside
// reference contains one of these.
func maybeOutside(line string) bool {
	for _, s := range []string{"ssue", "SSUE", "#", "shared", "DESIGN", "STYLE", "backends."} {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// skipForReferences reports what the scan does not read: VCS data, build
// and run output, generated code, dependency checksums, and the third-party
// bytes under testdata (captures, fuzz corpora; a testdata README is read).
func skipForReferences(rel string, d fs.DirEntry) bool {
	if d.IsDir() {
		switch d.Name() {
		case ".git", ".run", "bin", "dist", "node_modules", "tmp":
			return rel != "."
		}
		return rel == "proto/gen"
	}
	if strings.Contains("/"+rel, "/testdata/") && !strings.HasSuffix(rel, ".md") {
		return true
	}
	return strings.HasSuffix(rel, "go.sum") || strings.HasSuffix(rel, ".test") || strings.HasSuffix(rel, ".prof")
}

// M1: no text file of the repository — code and its comments, test names
// and messages, scripts, CI, deploy files, the documentation — cites an
// issue number or a path outside the repository; it names a requirement ID
// (requirements.md), a page under docs/ or a file in the repository instead.
func TestNoReferencesOutsideTheRepository(t *testing.T) {
	files := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if skipForReferences(rel, d) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
			return nil // binary
		}
		files++
		for i, l := range strings.Split(string(b), "\n") {
			for _, what := range outsideRefs(l) {
				t.Errorf("%s:%d cites %s, which does not resolve in a clone "+
					"(name the requirement ID, docs/requirements.md, or a page under docs/, or say the thing itself)",
					rel, i+1, what)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d text files scanned: the walk is broken", files)
	}
}

// M1: the scan finds each kind of outside reference and leaves alone what
// only looks like one. The planted lines are built by concatenation so that
// this file passes its own scan.
func TestOutsideReferenceScan(t *testing.T) {
	const is, sh = "iss" + "ue", "sha" + "red"
	for _, row := range []struct {
		line string
		want int
	}{
		{"// " + is + " 20: reasoning on the run path", 1},
		{"// H8 (" + is + "s 11, 12)", 1},
		{"t.Run(\"" + is + " 14 \"+row.name", 1},
		{"The " + is + "-14 captures", 1},
		{"# fixed in " + is + " #7", 1},
		{"see #" + "12 and (#" + "16)", 2},
		{"ollama/ollama#" + "1234", 1},
		{"// the captures in ../" + sh + "/samples/", 1},
		{"copied from " + sh + "/samples/", 1},
		{"(DE" + "SIGN.md \"Defaults\")", 1},
		{"(ST" + "YLE 3)", 1},
		{"// tissue 5, reissue 7, the issues of load", 0},
		{"PKCS #8 PEM, PKCS #10 request", 0},
		{"stroke: #059669; background: #475467", 0},
		{"// https://github.com/ollama/ollama/" + is + "s/1234 explains the workaround", 0},
		{"a " + sh + " 2-core VM; the " + sh + " system prompt", 0},
		{"round 16's review; r16", 0},
	} {
		if got := outsideRefs(row.line); len(got) != row.want {
			t.Errorf("%q: found %d outside references %q, want %d", row.line, len(got), got, row.want)
		}
	}
}
