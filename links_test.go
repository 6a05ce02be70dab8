package ratelimitd

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/text"
)

// TestDocLinks fails when a relative link in README.md or docs/*.md names a
// file that does not exist, or a heading that its page does not have, so
// that moving or renaming a page or a section cannot leave links behind.
func TestDocLinks(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"README.md"}, pages...)
	for _, p := range pages {
		for _, problem := range brokenLinks(t, p) {
			t.Errorf("%s: %s", p, problem)
		}
	}
}

// TestBrokenLinks shows that the check reports a missing file and a
// missing heading, and accepts what exists.
func TestBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	page := filepath.Join(dir, "page.md")
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("other.md", "# Other\n\n## Shutdown, Docker and `Compose`\n")
	write("page.md", "# Page\n\n## Here\n\n"+
		"[ok](other.md) [ok](other.md#shutdown-docker-and-compose) [ok](#here) [ok](https://example.com/x)\n"+
		"[bad](missing.md) [bad](other.md#nowhere) [bad](#there)\n\n"+
		"```\n[not a link](code.md)\n```\n")
	got := brokenLinks(t, page)
	want := []string{
		"missing.md: no such file",
		"other.md#nowhere: no such heading",
		"#there: no such heading",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// brokenLinks lists the relative links and images of the page at p whose
// target is missing.
func brokenLinks(t *testing.T, p string) []string {
	t.Helper()
	var problems []string
	for _, dest := range destinations(t, p) {
		u, err := url.Parse(dest)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", dest, err))
			continue
		}
		if u.Scheme != "" || u.Host != "" {
			continue
		}
		target := p
		if u.Path != "" {
			target = filepath.Join(filepath.Dir(p), filepath.FromSlash(u.Path))
			if _, err := os.Stat(target); err != nil {
				problems = append(problems, dest+": no such file")
				continue
			}
		}
		if u.Fragment == "" {
			continue
		}
		if filepath.Ext(target) != ".md" {
			problems = append(problems, dest+": an anchor into a file that is not markdown")
			continue
		}
		if !anchors(t, target)[u.Fragment] {
			problems = append(problems, dest+": no such heading")
		}
	}
	return problems
}

// parse reads and parses the markdown file at p.
func parse(t *testing.T, p string) (ast.Node, []byte) {
	t.Helper()
	src, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return goldmark.DefaultParser().Parse(text.NewReader(src)), src
}

// destinations lists the targets of the links and images of the markdown
// file at p, in the order they appear.
func destinations(t *testing.T, p string) []string {
	t.Helper()
	doc, _ := parse(t, p)
	var out []string
	err := ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Link:
			out = append(out, string(n.Destination))
		case *ast.Image:
			out = append(out, string(n.Destination))
		}
		return ast.WalkContinue, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// anchors returns the anchors GitHub gives the headings of the markdown
// file at p: the heading's text in lower case, without punctuation, spaces
// turned into hyphens, and "-1", "-2" and so on added to repeats.
func anchors(t *testing.T, p string) map[string]bool {
	t.Helper()
	doc, src := parse(t, p)
	seen := map[string]int{}
	out := map[string]bool{}
	err := ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		h, ok := n.(*ast.Heading)
		if !entering || !ok {
			return ast.WalkContinue, nil
		}
		slug := slugify(plainText(h, src))
		if k := seen[slug]; k > 0 {
			out[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
		return ast.WalkSkipChildren, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// plainText is the text of a heading, code spans included, without markup.
func plainText(n ast.Node, src []byte) string {
	var b bytes.Buffer
	for c := n.FirstChild(); c != nil; c = c.NextSibling() {
		if s, ok := c.(*ast.Text); ok {
			b.Write(s.Segment.Value(src))
			continue
		}
		b.WriteString(plainText(c, src))
	}
	return b.String()
}

// slugify turns a heading's text into its anchor as GitHub does.
func slugify(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
