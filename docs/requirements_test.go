package docs

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// root is the repository's top directory, seen from this package's.
const root = ".."

// A requirement ID: a group letter and a number (docs/requirements.md).
var (
	// idInText finds IDs cited in comments and Markdown: "H11", "L1–L10".
	idInText = regexp.MustCompile(`\b[WILSETQHCNOPKJDFBARMXUGV][0-9]{1,2}\b`)
	// idInTestName finds IDs spelled into a test function's name:
	// TestH8Handoff, Test_L5_duplicate.
	idInTestName = regexp.MustCompile(`(?:^(?:Test|Fuzz|Benchmark)|_)([WILSETQHCNOPKJDFBARMXUGV][0-9]{1,2})(?:[A-Z_]|$)`)
	// idInRowName finds the ID a table row's name starts with:
	// {"N2 same revision is APPLIED", …}, t.Run("H8: …", …).
	idInRowName = regexp.MustCompile(`^[` + "`" + `"]([WILSETQHCNOPKJDFBARMXUGV][0-9]{1,2})(?:[ :,;/)]|["` + "`" + `]$)`)
	// anchor is how requirements.md defines an ID.
	anchor = regexp.MustCompile(`<a id="([A-Z][0-9]+)"></a>`)
	// testRef is how a page names a test: `internal/edge/api.TestStallRedispatch`.
	testRef = regexp.MustCompile("`((?:internal|edge|node|proto)(?:/[A-Za-z0-9_.-]+)*)\\.((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*)`")
)

// citation is one place that names a requirement ID.
type citation struct {
	where string // file:line, relative to the repository
	how   string // "comment", "test name", "test row", "Markdown"
	id    string
}

// definedIDs reads the IDs requirements.md gives an anchor.
func definedIDs(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("requirements.md")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, m := range anchor.FindAllStringSubmatch(string(b), -1) {
		if ids[m[1]] {
			t.Errorf("docs/requirements.md defines %s twice", m[1])
		}
		ids[m[1]] = true
	}
	if len(ids) == 0 {
		t.Fatal("docs/requirements.md defines no requirement IDs")
	}
	return ids
}

// skipDir reports the directories no citation is looked for in: VCS and
// build output, fuzz corpora and captured samples.
func skipDir(rel string, d fs.DirEntry) bool {
	n := d.Name()
	return rel != "." && (strings.HasPrefix(n, ".") || n == "bin" || n == "testdata" || n == "node_modules")
}

// repoFiles walks the repository and calls fn for every file whose name
// ends in one of exts, with its path relative to the repository.
func repoFiles(t *testing.T, fn func(rel string, src []byte), exts ...string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if skipDir(rel, d) {
				return filepath.SkipDir
			}
			return nil
		}
		for _, e := range exts {
			if strings.HasSuffix(rel, e) {
				src, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				fn(rel, src)
				return nil
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// goCitations lists the IDs a Go file cites in its comments, its test
// functions' names and (in a _test.go file) the names of its table rows
// and subtests.
func goCitations(rel string, src []byte) []citation {
	var out []citation
	fset := token.NewFileSet()
	file := fset.AddFile(rel, -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, func(token.Position, string) {}, scanner.ScanComments)
	isTest := strings.HasSuffix(rel, "_test.go")
	afterFunc := false
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		where := func(line int) string { return rel + ":" + itoa(line) }
		switch {
		case tok == token.COMMENT:
			start := fset.Position(pos).Line
			for i, l := range strings.Split(lit, "\n") {
				for _, id := range idInText.FindAllString(l, -1) {
					out = append(out, citation{where(start + i), "comment", id})
				}
			}
		case tok == token.IDENT && afterFunc:
			for _, m := range idInTestName.FindAllStringSubmatch(lit, -1) {
				out = append(out, citation{where(fset.Position(pos).Line), "test name", m[1]})
			}
		case tok == token.STRING && isTest:
			if m := idInRowName.FindStringSubmatch(lit); m != nil {
				out = append(out, citation{where(fset.Position(pos).Line), "test row", m[1]})
			}
		}
		afterFunc = tok == token.FUNC
	}
	return out
}

// protoCitations lists the IDs the schema's comments cite.
func protoCitations(rel string, src []byte) []citation {
	var out []citation
	for i, l := range strings.Split(string(src), "\n") {
		if _, c, ok := strings.Cut(l, "//"); ok {
			for _, id := range idInText.FindAllString(c, -1) {
				out = append(out, citation{rel + ":" + itoa(i+1), "comment", id})
			}
		}
	}
	return out
}

// markdownCitations lists the IDs a documentation page cites.
func markdownCitations(rel string, src []byte) []citation {
	var out []citation
	for i, l := range strings.Split(string(src), "\n") {
		for _, id := range idInText.FindAllString(l, -1) {
			out = append(out, citation{rel + ":" + itoa(i+1), "Markdown", id})
		}
	}
	return out
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// Every requirement ID that code comments, test names, the schema and the
// documentation cite is defined in docs/requirements.md, so that each one
// resolves inside the repository.
func TestCitedRequirementIDsAreDefined(t *testing.T) {
	ids := definedIDs(t)
	var cites []citation
	repoFiles(t, func(rel string, src []byte) {
		switch {
		case strings.HasSuffix(rel, ".go"):
			cites = append(cites, goCitations(rel, src)...)
		case strings.HasSuffix(rel, ".proto"):
			cites = append(cites, protoCitations(rel, src)...)
		case strings.HasSuffix(rel, ".md") && (!strings.Contains(rel, "/") || strings.HasPrefix(rel, "docs/")):
			cites = append(cites, markdownCitations(rel, src)...)
		}
	}, ".go", ".proto", ".md")
	if len(cites) == 0 {
		t.Fatal("no requirement ID cited anywhere: the scan is broken")
	}
	for _, c := range cites {
		if !ids[c.id] {
			t.Errorf("%s: %s cites requirement %s, which docs/requirements.md does not define "+
				"(add an entry with <a id=%q></a>, or correct the ID)", c.where, c.how, c.id, c.id)
		}
	}
}

// Every test a documentation page names as proof (`pkg.TestName`) exists
// in that package, so the lists do not go stale when tests are renamed.
func TestNamedTestsExist(t *testing.T) {
	pages, _ := filepath.Glob("*.md")
	funcs := map[string]map[string]bool{} // package dir → test functions
	testsIn := func(dir string) map[string]bool {
		if f, ok := funcs[dir]; ok {
			return f
		}
		f := map[string]bool{}
		files, _ := filepath.Glob(filepath.Join(root, dir, "*_test.go"))
		decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*)\(`)
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range decl.FindAllSubmatch(b, -1) {
				f[string(m[1])] = true
			}
		}
		funcs[dir] = f
		return f
	}
	n := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			for _, m := range testRef.FindAllStringSubmatch(l, -1) {
				n++
				if !testsIn(m[1])[m[2]] {
					t.Errorf("docs/%s:%d names %s.%s, which does not exist (renamed or removed? update the page)",
						page, i+1, m[1], m[2])
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no test named in docs/*.md: the scan is broken")
	}
}

// The scanner finds citations in each of the places they are written.
func TestCitationScan(t *testing.T) {
	src := []byte("package p\n\n" +
		"// H8: the handoff (SPEC L1–L10).\n" +
		"func TestE3Order(t *testing.T) {\n" +
		"\trows := []struct{ name string }{{\"N2 same revision\"}, {\"svg PHN2Zy8+\"}, {\"E2E run\"}}\n" +
		"\t_ = \"P256\" // P256 and HTTP/2 are not IDs; neither is E2E\n" +
		"}\n")
	var got []string
	for _, c := range goCitations("p_test.go", src) {
		got = append(got, c.how+" "+c.id+" "+c.where)
	}
	sort.Strings(got)
	want := []string{
		"comment H8 p_test.go:3", "comment L1 p_test.go:3", "comment L10 p_test.go:3",
		"test name E3 p_test.go:4", "test row N2 p_test.go:5",
	}
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("citations =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
