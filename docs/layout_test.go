package docs

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// Line budgets of the two top-level pages: README.md is the entry point
// (what iop is, the picture, the commands, the layout, links) and
// BENCHMARKS.md holds one current table per area; everything else belongs
// in a page under docs/ (benchmark history in docs/benchmarks-history.md).
func TestLineBudgets(t *testing.T) {
	for _, tc := range []struct {
		file string
		max  int
		move string
	}{
		{"README.md", 150, "move reference material to a page under docs/"},
		{"BENCHMARKS.md", 300, "move superseded tables and analyses to docs/benchmarks-history.md"},
	} {
		b, err := os.ReadFile(filepath.Join(root, tc.file))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > tc.max {
			t.Errorf("%s has %d lines, more than its budget of %d: %s", tc.file, n, tc.max, tc.move)
		}
	}
}

// pages returns the documentation pages, relative to the repository.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "BENCHMARKS.md"}
	for _, d := range docs {
		out = append(out, "docs/"+d)
	}
	return out
}

// Every repository path a page names in backquotes exists (the benchmark
// history excepted: it describes code as it was).
func TestNamedPathsExist(t *testing.T) {
	path := regexp.MustCompile("`((?:\\./)?(?:internal|edge|node|proto|scripts|testdata|docs)(?:/[A-Za-z0-9_.-]+)*/?)`")
	for _, p := range pages(t) {
		if p == "docs/benchmarks-history.md" {
			continue
		}
		forLines(t, p, func(n int, l string) {
			for _, m := range path.FindAllStringSubmatch(l, -1) {
				rel := strings.TrimPrefix(m[1], "./")
				if last := rel[strings.LastIndex(rel, "/")+1:]; strings.Contains(last, ".Test") ||
					strings.Contains(last, ".Fuzz") || strings.Contains(last, ".Benchmark") {
					continue // a named test: TestNamedTestsExist checks it
				}
				if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
					t.Errorf("%s:%d names `%s`, which does not exist in the repository", p, n, m[1])
				}
			}
		})
	}
}

// README.md's layout tree has one line for every Go package under
// internal/ (each module's included) and every top-level directory, and
// names no directory that is gone.
func TestReadmeLayoutListsEveryPackage(t *testing.T) {
	listed := readmeLayout(t)
	var want []string
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			want = append(want, filepath.ToSlash(rel)+"/")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range want {
		if !listed[pkg] {
			t.Errorf("README.md's layout has no line for package %s (add one under internal/: what it owns)", pkg)
		}
	}
	// Every top-level directory of the clone too (deploy/ is what an
	// operator installs from), but for hidden ones and build output.
	top, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range top {
		n := d.Name()
		if !d.IsDir() || strings.HasPrefix(n, ".") || n == "bin" || n == "dist" {
			continue
		}
		found := false
		for dir := range listed {
			found = found || strings.HasPrefix(dir, n+"/")
		}
		if !found {
			t.Errorf("README.md's layout has no line for the top-level directory %s/ (add one: what it holds)", n)
		}
	}
	for dir := range listed {
		if _, err := os.Stat(filepath.Join(root, dir)); err != nil {
			t.Errorf("README.md's layout lists %s, which does not exist", dir)
		}
	}
}

// readmeLayout reads the code block under "## Layout" in README.md: each
// line starts, after two spaces per level, with a directory name ending in
// "/"; it returns the full paths.
func readmeLayout(t *testing.T) map[string]bool {
	t.Helper()
	listed := map[string]bool{}
	var stack []string
	section, block := false, false
	forLines(t, "README.md", func(n int, l string) {
		switch {
		case strings.HasPrefix(l, "## "):
			section = l == "## Layout"
		case section && strings.HasPrefix(l, "```"):
			block = !block
		case section && block:
			trimmed := strings.TrimLeft(l, " ")
			indent := len(l) - len(trimmed)
			name, _, _ := strings.Cut(trimmed, " ")
			if !strings.HasSuffix(name, "/") || indent%2 != 0 {
				return
			}
			level := indent / 2
			if level > len(stack) {
				t.Errorf("README.md:%d: %s is indented past its parent", n, name)
				return
			}
			stack = append(stack[:level], name)
			listed[strings.Join(stack, "")] = true
		}
	})
	if len(listed) == 0 {
		t.Fatal(`README.md has no layout tree (a code block under "## Layout")`)
	}
	return listed
}

// forLines calls fn with every line of the repository file p and its number.
func forLines(t *testing.T, p string, fn func(n int, line string)) {
	t.Helper()
	f, err := os.Open(filepath.Join(root, p))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		fn(n, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// Every relative link between the pages resolves: the file exists and, when
// the link names an anchor, the page has that heading or <a id>.
func TestLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading := regexp.MustCompile(`^#+ (.*)`)
	explicit := regexp.MustCompile(`<a id="([^"]+)"></a>`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(p string) map[string]bool {
		if a, ok := anchors[p]; ok {
			return a
		}
		a := map[string]bool{}
		forLines(t, p, func(_ int, l string) {
			for _, m := range explicit.FindAllStringSubmatch(l, -1) {
				a[m[1]] = true
			}
			if m := heading.FindStringSubmatch(l); m != nil {
				a[slug(m[1])] = true
			}
		})
		anchors[p] = a
		return a
	}
	for _, p := range pages(t) {
		forLines(t, p, func(n int, l string) {
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := p
				if file != "" {
					dest = filepath.ToSlash(filepath.Join(filepath.Dir(p), file))
				}
				if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
					t.Errorf("%s:%d links to %s, which does not exist", p, n, target)
					continue
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d links to %s: %s has no heading or <a id> %q", p, n, target, dest, anchor)
				}
			}
		})
	}
}

// slug is the anchor GitHub gives a Markdown heading: lower case, HTML tags
// and punctuation other than '-' and '_' removed, spaces turned into '-'.
func slug(heading string) string {
	heading = regexp.MustCompile(`<[^>]*>`).ReplaceAllString(heading, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
