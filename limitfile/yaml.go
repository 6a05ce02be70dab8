package limitfile

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// errEmpty is decode's answer for a document with no content, or only an
// explicit null: an import of it writes nothing, and its kind cannot be
// told.
var errEmpty = &EntryError{Message: "the document is empty"}

// decode parses data into the root node of its one document, or returns
// one EntryError: errEmpty for an empty document, another for a document
// that is not YAML. The node API is used rather than decoding into structs
// because every problem must be reported with its line.
func decode(data []byte) (*yaml.Node, *EntryError) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, errEmpty
	} else if err != nil {
		return nil, syntaxError(err)
	}
	// A trailing empty document (a last "---") is accepted, as
	// envoyproxy/ratelimit's reader does; another document is not.
	var next yaml.Node
	if err := dec.Decode(&next); err == nil && !empty(&next) {
		return nil, &EntryError{Line: next.Line, Message: "a file holds one YAML document, and this is a second one"}
	} else if err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(err)
	}
	if doc.Kind != yaml.DocumentNode || empty(&doc) {
		return nil, errEmpty
	}
	return doc.Content[0], nil
}

// empty reports whether a decoded document holds nothing.
func empty(doc *yaml.Node) bool {
	return len(doc.Content) == 0 || doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].ShortTag() == "!!null"
}

// syntaxError turns an error of yaml.v3 into an EntryError, with the line
// yaml.v3 puts in its message when it does.
func syntaxError(err error) *EntryError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, problem, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(num); err == nil {
				return &EntryError{Line: line, Message: "not valid YAML: " + problem}
			}
		}
	}
	return &EntryError{Message: "not valid YAML: " + msg}
}

// entry collects the problems of one entry of a document. Each field is
// reported once: a field whose value could not be read is not also reported
// by the validation that follows.
type entry struct {
	line  int
	label string
	// prefix names the part of the entry this reports for, such as
	// "ids[2]", and is put before the fields it names.
	prefix string
	errs   *[]EntryError
	failed map[string]bool
}

func newEntry(errs *[]EntryError, line int, label string) *entry {
	return &entry{line: line, label: clip(label), errs: errs, failed: map[string]bool{}}
}

// part returns an entry that reports for one part of e, such as one id of a
// list entry, under its own label.
func (e *entry) part(line int, prefix, label string) *entry {
	return &entry{line: line, label: clip(label), prefix: prefix, errs: e.errs, failed: map[string]bool{}}
}

// fail reports that field (or, with field "", the entry or part as a whole)
// is bad; line 0 stands for the entry's line.
func (e *entry) fail(line int, field, msg string) {
	if field != "" {
		if e.failed[field] {
			return
		}
		e.failed[field] = true
		if e.prefix != "" {
			field = e.prefix + "." + field
		}
		msg = field + ": " + msg
	} else if e.prefix != "" {
		msg = e.prefix + ": " + msg
	}
	if line == 0 {
		line = e.line
	}
	*e.errs = append(*e.errs, EntryError{Line: line, Entry: e.label, Message: msg})
}

// fields are the keys of one entry's map, each with its value.
type fields struct {
	values map[string]*yaml.Node
}

// get returns the value of key; nil when it is absent or null: a key
// without a value is as if it were not there.
func (f fields) get(key string) *yaml.Node {
	n := f.values[key]
	if n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	return n
}

// readFields reads the map of an entry, reporting keys not in allowed,
// keys given twice and aliases. Only the first of repeated keys counts.
func readFields(e *entry, m *yaml.Node, allowed ...string) fields {
	f := fields{values: map[string]*yaml.Node{}}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			e.fail(k.Line, "", "keys must be plain names, not "+describe(k))
			continue
		}
		key := k.Value
		switch {
		case k.ShortTag() == "!!merge":
			e.fail(k.Line, "", "merge keys (<<) are not supported")
			continue
		case !slices.Contains(allowed, key):
			e.fail(k.Line, "", "unknown key "+strconv.Quote(clip(key))+": want "+strings.Join(allowed, ", "))
			continue
		case f.values[key] != nil:
			e.fail(k.Line, "", key+": given twice")
			continue
		case v.Kind == yaml.AliasNode:
			e.fail(v.Line, key, "YAML aliases are not supported")
		}
		f.values[key] = v
	}
	return f
}

// readInt reads an integer field. Only a YAML integer is one: "20" and 1.5
// are refused rather than converted, because a file that writes them has
// probably been mangled and its author should look. ok is false when the
// field is absent (nothing reported) or bad (reported).
func readInt(e *entry, f fields, key string) (v int64, present, ok bool) {
	n := f.get(key)
	if n == nil || e.failed[key] {
		return 0, n != nil, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && isDigits(n.Value) {
			e.fail(n.Line, key, "must be an integer between "+strconv.FormatInt(-1<<63, 10)+" and "+strconv.FormatInt(1<<63-1, 10))
		} else {
			e.fail(n.Line, key, "must be an integer, not "+describe(n))
		}
		return 0, true, false
	}
	if err := n.Decode(&v); err != nil {
		e.fail(n.Line, key, "must be an integer between "+strconv.FormatInt(-1<<63, 10)+" and "+strconv.FormatInt(1<<63-1, 10))
		return 0, true, false
	}
	return v, true, true
}

func isDigits(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// readBool reads a field that must be true or false.
func readBool(e *entry, f fields, key string) (v, present, ok bool) {
	n := f.get(key)
	if n == nil || e.failed[key] {
		return false, n != nil, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
		e.fail(n.Line, key, "must be true or false, not "+describe(n))
		return false, true, false
	}
	return v, true, true
}

// readDuration reads a Go duration such as "1s" or "3h0m0s".
func readDuration(e *entry, f fields, key string) (d time.Duration, present, ok bool) {
	n := f.get(key)
	if n == nil || e.failed[key] {
		return 0, n != nil, false
	}
	if n.Kind != yaml.ScalarNode {
		e.fail(n.Line, key, `must be a Go duration such as "1s" or "3h", not `+describe(n))
		return 0, true, false
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		e.fail(n.Line, key, `must be a Go duration such as "1s" or "3h", not `+strconv.Quote(clip(n.Value)))
		return 0, true, false
	}
	return d, true, true
}

// readText reads a free-text field. Any scalar is taken as written, so that
// "comment: 2024" means the text "2024".
func readText(e *entry, f fields, key string) (s string, present, ok bool) {
	n := f.get(key)
	if n == nil || e.failed[key] {
		return "", n != nil, false
	}
	s, ok = scalarText(n)
	if !ok {
		e.fail(n.Line, key, "must be text, not "+describe(n))
	}
	return s, true, ok
}

// scalarText returns what a scalar says as written, "" for null.
func scalarText(n *yaml.Node) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// describe names what a node is, for messages that say what was expected
// instead.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a map"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "a YAML alias, which is not supported"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return "the string " + strconv.Quote(clip(n.Value))
		}
		return clip(n.Value)
	}
	return "nothing"
}

// maxLabel bounds what of the document's own text goes into a message or
// an entry label: enough to recognise it, not enough to echo a huge value.
const maxLabel = 100

func clip(s string) string {
	if len(s) <= maxLabel {
		return s
	}
	cut := maxLabel
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
