package web

import (
	"bytes"
	"fmt"
	"io/fs"
	"mime"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// inspection is what checkHTML finds in a page: the local files it
// references and what the admin page's Content-Security-Policy would
// refuse, or what would load from elsewhere.
type inspection struct {
	refs     []string
	problems []string
}

// urlAttrs are the attributes that load or navigate to a URL.
var urlAttrs = map[string]bool{"src": true, "href": true, "action": true, "formaction": true, "srcset": true, "poster": true, "data": true}

// checkHTML tokenises a page, template contents included, and reports
// inline scripts and styles, event handler attributes, javascript: URLs
// and references to other origins, each of which the CSP forbids or the
// page must not have.
func checkHTML(doc []byte) inspection {
	var in inspection
	z := html.NewTokenizer(bytes.NewReader(doc))
	inScript := ""
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			return in
		case html.TextToken:
			if inScript != "" && strings.TrimSpace(string(z.Text())) != "" {
				in.problems = append(in.problems, "inline script in <script"+inScript+">")
			}
		case html.EndTagToken:
			if name, _ := z.TagName(); string(name) == "script" {
				inScript = ""
			}
		case html.StartTagToken, html.SelfClosingTagToken:
			tok := z.Token()
			where := "<" + tok.Data + ">"
			src := ""
			for _, a := range tok.Attr {
				name, value := strings.ToLower(a.Key), strings.TrimSpace(a.Val)
				switch {
				case strings.HasPrefix(name, "on"):
					in.problems = append(in.problems, fmt.Sprintf("event handler attribute %s on %s", name, where))
				case name == "style":
					in.problems = append(in.problems, "style attribute on "+where)
				case urlAttrs[name]:
					if name == "src" {
						src = value
					}
					// A link to a part of the page is no reference.
					if tok.Data == "a" && strings.HasPrefix(value, "#") {
						continue
					}
					if tok.Data == "form" && name == "action" && value == "" {
						continue
					}
					ref, problem := localRef(value)
					if problem != "" {
						in.problems = append(in.problems, fmt.Sprintf("%s=%q on %s: %s", name, value, where, problem))
					} else {
						in.refs = append(in.refs, ref)
					}
				}
			}
			switch tok.Data {
			case "style":
				in.problems = append(in.problems, "inline <style> element")
			case "script":
				if src == "" {
					in.problems = append(in.problems, "<script> without src")
				}
				if tt == html.StartTagToken {
					inScript = fmt.Sprintf(" src=%q", src)
				}
			}
		}
	}
}

// localRef returns the file a reference names within the page's files, or
// why it is not a file of ours.
func localRef(ref string) (string, string) {
	u, err := url.Parse(ref)
	switch {
	case err != nil:
		return "", err.Error()
	case u.Scheme != "" || u.Host != "" || strings.HasPrefix(ref, "//"):
		return "", "not a file of this page (the page loads nothing from elsewhere)"
	case u.Path == "" || strings.HasPrefix(u.Path, "/"):
		return "", "want a relative path to a file of the page"
	}
	name := path.Clean(u.Path)
	if !fs.ValidPath(name) {
		return "", "leaves the page's directory"
	}
	return name, ""
}

func TestAdminCheckHTMLFindsWhatTheCSPForbids(t *testing.T) {
	bad := map[string]string{
		"inline script":        `<script>alert(1)</script>`,
		"script without src":   `<script type="module"></script>`,
		"src and body":         `<script src="a.js">alert(1)</script>`,
		"event handler":        `<button onclick="go()">Go</button>`,
		"handler in template":  `<template><img src="a.png" onerror="x()"></template>`,
		"style attribute":      `<p style="color:red">x</p>`,
		"style element":        `<style>p{}</style>`,
		"javascript URL":       `<a href="javascript:go()">Go</a>`,
		"CDN script":           `<script src="https://cdn.example/lib.js"></script>`,
		"protocol-relative":    `<link rel="stylesheet" href="//fonts.example/a.css">`,
		"absolute path":        `<link rel="stylesheet" href="/app.css">`,
		"outside the page dir": `<img src="../secret.png">`,
	}
	for name, doc := range bad {
		if in := checkHTML([]byte(doc)); len(in.problems) == 0 {
			t.Errorf("%s: %s passed the check", name, doc)
		}
	}
	good := `<!doctype html><link rel="stylesheet" href="app.css"><script type="module" src="app.js"></script>
		<a href="#main">Skip</a><form method="post"></form><template><button type="button" data-act="x">x</button></template>`
	in := checkHTML([]byte(good))
	if len(in.problems) > 0 {
		t.Errorf("a clean page has problems: %q", in.problems)
	}
	if want := []string{"app.css", "app.js"}; !slices.Equal(in.refs, want) {
		t.Errorf("refs = %q, want %q", in.refs, want)
	}
}

// importRE finds the modules a script imports, statically or dynamically.
var importRE = regexp.MustCompile(`(?m)(?:^\s*import\b[^'"]*?\bfrom\s*|^\s*import\s*|\bimport\s*\(\s*)['"]([^'"]+)['"]`)

// cssURLRE finds what a style sheet loads.
var cssURLRE = regexp.MustCompile(`url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]`)

// references returns every local file that the page, its scripts and its
// style sheets reference, following each file once, and the problems met.
func references(t *testing.T, files fs.FS) (map[string]string, []string) {
	t.Helper()
	found := map[string]string{"index.html": "the root"}
	queue := []string{"index.html"}
	var problems []string
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		body, err := fs.ReadFile(files, name)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s (referenced by %s) does not exist: %v", name, found[name], err))
			continue
		}
		var refs []string
		switch path.Ext(name) {
		case ".html":
			in := checkHTML(body)
			for _, p := range in.problems {
				problems = append(problems, name+": "+p)
			}
			refs = in.refs
		case ".js":
			for _, m := range importRE.FindAllStringSubmatch(string(body), -1) {
				refs = append(refs, m[1])
			}
		case ".css":
			for _, m := range cssURLRE.FindAllStringSubmatch(string(body), -1) {
				refs = append(refs, m[1]+m[2])
			}
		}
		for _, raw := range refs {
			ref, problem := localRef(raw)
			if problem != "" {
				problems = append(problems, fmt.Sprintf("%s references %q: %s", name, raw, problem))
				continue
			}
			ref = path.Join(path.Dir(name), ref)
			if _, ok := found[ref]; !ok {
				found[ref] = name
				queue = append(queue, ref)
			}
		}
	}
	return found, problems
}

// TestAdminPageIsComplete checks that every file the page references, through
// its HTML, its module imports and its style sheets, exists, and that the
// HTML has nothing inline that the Content-Security-Policy would refuse.
func TestAdminPageIsComplete(t *testing.T) {
	files := Files()
	found, problems := references(t, files)
	for _, p := range problems {
		t.Error(p)
	}
	// The page, its style, its entry module and the modules it imports.
	for _, want := range []string{"index.html", "app.css", "app.js", "api.js", "dom.js", "format.js", "limits.js", "overrides.js", "tryrequest.js", "icon.svg"} {
		if _, ok := found[want]; !ok {
			t.Errorf("%s is not referenced by the page", want)
		}
	}
	// A file nobody references is dead weight or a forgotten reference.
	err := fs.WalkDir(files, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if _, ok := found[name]; !ok {
			t.Errorf("%s is in the page's files but nothing references it", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sinkRE finds the ways a script could turn text into markup or code,
// which would let a bucket id or a comment inject a script.
var sinkRE = regexp.MustCompile(`\.innerHTML\b|\.outerHTML\b|insertAdjacentHTML|document\.write|\beval\s*\(|\bnew\s+Function\b|setAttribute\(\s*['"](?:on|style)|createContextualFragment`)

// TestAdminScriptsBuildNoMarkupFromText checks that the scripts build the DOM
// from elements and text only.
func TestAdminScriptsBuildNoMarkupFromText(t *testing.T) {
	files := Files()
	names, err := fs.Glob(files, "*.js")
	if err != nil || len(names) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, name := range names {
		body, err := fs.ReadFile(files, name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(body), "\n") {
			if m := sinkRE.FindString(line); m != "" {
				t.Errorf("%s:%d uses %s: build elements and set textContent instead", name, i+1, m)
			}
		}
	}
	if !sinkRE.MatchString(`el.innerHTML = x`) {
		t.Error("the check does not catch innerHTML")
	}
}

// TestAdminFilesHaveTypes checks that the server, which types files by their
// extension, can type every file: a module script served without a
// JavaScript type does not run.
func TestAdminFilesHaveTypes(t *testing.T) {
	want := map[string]string{".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}
	err := fs.WalkDir(Files(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ext := path.Ext(name)
		got, _, _ := strings.Cut(mime.TypeByExtension(ext), ";")
		if w, ok := want[ext]; !ok || got != w {
			t.Errorf("%s: served as %q; want one of the known types %v", name, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
