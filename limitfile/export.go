package limitfile

import (
	"bytes"
	"cmp"
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// The documents are written by hand rather than by yaml.v3's encoder, for
// two reasons. The encoder keeps every event of a document until its end,
// some kilobytes per override, so an export of a million overrides would
// take gigabytes; by hand it takes the size of the output. And it writes
// some texts in a form it cannot read back the same (a leading line break
// in a literal block is lost, a tab starting a line is refused); here every
// text that is not plainly safe is double-quoted, with escapes.

func exportDefaults(ctx context.Context, st Store) ([]byte, error) {
	limits, err := st.ListLimits(ctx)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(limits, func(a, b limiter.Limit) int { return cmp.Compare(a.Name, b.Name) })
	var w writer
	var left []string
	limits = slices.DeleteFunc(limits, func(l limiter.Limit) bool {
		if msg := boulderProblem(l); msg != "" {
			left = append(left, msg)
			return true
		}
		return false
	})
	w.leftOut("Left out, as Boulder's format describes rate limits only:", left)
	if len(limits) == 0 {
		w.line(0, "{}")
		return w.Bytes(), nil
	}
	for _, l := range limits {
		// Boulder's three keys first, then ours. The enum is always
		// written, so that the limit gets the same one wherever the file
		// is imported.
		w.line(0, scalar(l.Name)+":")
		w.params(2, l.Params)
		w.line(2, "id_format: "+scalar(string(l.IDFormat)))
		w.line(2, "enum: "+strconv.Itoa(l.Enum))
		if l.Shadow {
			w.line(2, "shadow: true")
		}
		if l.Description != "" {
			w.line(2, "description: "+scalar(l.Description))
		}
	}
	return w.Bytes(), nil
}

// exported is what an export keeps of an override: an export of a million
// of them holds them all at once, to sort them.
type exported struct {
	limit, id, comment string
	params             limiter.Params
	unlimited          bool
}

// group orders overrides by limit, then parameters (unlimited last), which
// is also the order of the entries written.
func group(a, b exported) int {
	if c := cmp.Compare(a.limit, b.limit); c != 0 {
		return c
	}
	if a.unlimited != b.unlimited {
		if a.unlimited {
			return 1
		}
		return -1
	}
	if c := cmp.Compare(a.params.Burst, b.params.Burst); c != 0 {
		return c
	}
	if c := cmp.Compare(a.params.Count, b.params.Count); c != 0 {
		return c
	}
	return cmp.Compare(a.params.Period, b.params.Period)
}

func exportOverrides(ctx context.Context, st Store) ([]byte, error) {
	var all []exported
	// Full streams every limit before the overrides.
	unfit := map[string]string{}
	left := map[string]bool{}
	onLimit := func(l limiter.Limit) error {
		if msg := boulderProblem(l); msg != "" {
			unfit[l.Name] = msg
		}
		return nil
	}
	_, err := st.Full(ctx, onLimit, func(o limiter.Override) error {
		if _, ok := unfit[o.Limit]; ok {
			left[o.Limit] = true
			return nil
		}
		x := exported{limit: o.Limit, id: o.BucketID, comment: o.Comment, params: o.Params, unlimited: o.Unlimited}
		if x.unlimited {
			x.params = limiter.Params{}
		}
		all = append(all, x)
		return nil
	})
	if err != nil {
		return nil, err
	}
	var w writer
	var msgs []string
	for _, name := range slices.Sorted(maps.Keys(left)) {
		msgs = append(msgs, unfit[name])
	}
	w.leftOut("The overrides of these limits are left out, as Boulder's format describes rate limits only:", msgs)
	if len(all) == 0 {
		w.line(0, "[]")
		return w.Bytes(), nil
	}
	slices.SortFunc(all, func(a, b exported) int {
		if c := group(a, b); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	for i, x := range all {
		if i == 0 || group(all[i-1], x) != 0 {
			// A new entry: the ids of one limit that share parameters.
			w.line(0, "- "+scalar(x.limit)+":")
			if x.unlimited {
				w.line(4, "unlimited: true")
			} else {
				w.params(4, x.params)
			}
			w.line(4, "ids:")
		}
		if x.comment == "" {
			w.line(6, "- "+scalar(x.id))
			continue
		}
		w.line(6, "- id: "+scalar(x.id))
		w.line(8, "comment: "+scalar(x.comment))
	}
	return w.Bytes(), nil
}

// writer lays out a document line by line, indented by two spaces a level
// as Boulder's files are.
type writer struct{ bytes.Buffer }

func (w *writer) line(indent int, s string) {
	for range indent {
		w.WriteByte(' ')
	}
	w.WriteString(s)
	w.WriteByte('\n')
}

// leftOut writes, as comments, head and why each limit is not in the
// document (msgs), when any is not.
func (w *writer) leftOut(head string, msgs []string) {
	if len(msgs) == 0 {
		return
	}
	w.line(0, "# "+head)
	for _, msg := range msgs {
		// A limit name is plain text: nothing in msg can end the comment.
		w.line(0, "#   "+msg)
	}
}

// params writes Boulder's three keys; the period in Go's canonical form,
// which is plain YAML text.
func (w *writer) params(indent int, p limiter.Params) {
	w.line(indent, "burst: "+strconv.FormatInt(p.Burst, 10))
	w.line(indent, "count: "+strconv.FormatInt(p.Count, 10))
	w.line(indent, "period: "+p.Period.String())
}

// scalar writes s as YAML text: plain when that is plainly safe, which
// covers limit names, domains and most comments, else double-quoted.
func scalar(s string) string {
	if plain(s) {
		return s
	}
	return quote(s)
}

// plain reports whether s reads back as the same text when written
// without quotes, by a rule simple enough to see that it holds: a letter,
// then letters, digits, '.', '_', '-', ',' and single inner spaces (the
// output is all block style, where a comma is text); and none of
// the words YAML 1.1 or 1.2 reads as a boolean or null, since Boulder may
// read the file too.
func plain(s string) bool {
	if s == "" || !isLetter(s[0]) || s[len(s)-1] == ' ' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case isLetter(c), c >= '0' && c <= '9', c == '.', c == '_', c == '-', c == ',':
		case c == ' ' && s[i-1] != ' ':
		default:
			return false
		}
	}
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "on", "off", "y", "n", "null":
		return false
	}
	return true
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// quote writes s as a YAML double-quoted scalar. What YAML would not read
// back as itself inside double quotes is escaped: the backslash and the
// quote; line breaks (YAML folds them), including NEL, LS and PS; the
// control characters and the other characters YAML does not allow in a
// document (C1 controls, U+FEFF, U+FFFE, U+FFFF); and bytes that are not
// UTF-8, which become U+FFFD: neither database stores them.
func quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == '"':
			b.WriteString(`\"`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			b.WriteString(`\x`)
			b.WriteByte(hex[r>>4])
			b.WriteByte(hex[r&0xf])
		case r >= 0x80 && r <= 0x9f, r == 0x2028, r == 0x2029, r == 0xfeff, r == 0xfffe, r == 0xffff:
			b.WriteString(`\u`)
			for shift := 12; shift >= 0; shift -= 4 {
				b.WriteByte(hex[(r>>shift)&0xf])
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

const hex = "0123456789ABCDEF"
