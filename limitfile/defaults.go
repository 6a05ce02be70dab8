package limitfile

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// limitKeys are the keys of a defaults entry: Boulder's three, then ours.
func limitKeys() []string {
	return []string{"burst", "count", "period", "id_format", "enum", "description", "shadow"}
}

// defaultsReader checks the entries of a defaults document against each
// other and against the stored limits.
type defaultsReader struct {
	errs []EntryError
	// existing are the stored limits by name; overrides counts theirs.
	existing  map[string]limiter.Limit
	overrides map[string]int
	// enumOwner names the stored limit of each enum.
	enumOwner map[int]string
	// seen is the line of each name in the document; claimed that of each
	// enum a new limit of the document takes.
	seen    map[string]int
	claimed map[int]claim
	limits  []limiter.Limit
}

type claim struct {
	name string
	line int
}

func readDefaults(root *yaml.Node, stored []limiter.Limit, overrides map[string]int) ([]limiter.Limit, []EntryError) {
	if root.Kind != yaml.MappingNode {
		return nil, []EntryError{{Line: root.Line, Message: "a defaults document is a map from limit names to their parameters, not " + describe(root)}}
	}
	r := &defaultsReader{
		existing:  make(map[string]limiter.Limit, len(stored)),
		overrides: overrides,
		enumOwner: make(map[int]string, len(stored)),
		seen:      map[string]int{},
		claimed:   map[int]claim{},
	}
	for _, l := range stored {
		r.existing[l.Name] = l
		r.enumOwner[l.Enum] = l.Name
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		r.entry(root.Content[i], root.Content[i+1])
	}
	return r.limits, r.errs
}

func (r *defaultsReader) entry(k, v *yaml.Node) {
	if k.Kind != yaml.ScalarNode {
		r.errs = append(r.errs, EntryError{Line: k.Line, Message: "limit names must be plain text, not " + describe(k)})
		return
	}
	name := k.Value
	e := newEntry(&r.errs, k.Line, name)
	if k.ShortTag() == "!!merge" {
		e.fail(0, "", "merge keys (<<) are not supported")
		return
	}
	if first, dup := r.seen[name]; dup {
		e.fail(0, "", "defined twice; first at line "+strconv.Itoa(first))
		return
	}
	r.seen[name] = k.Line
	if v.Kind != yaml.MappingNode {
		e.fail(0, "", "must be a map of "+strings.Join(limitKeys(), ", ")+"; not "+describe(v))
		return
	}
	f := readFields(e, v, limitKeys()...)
	old, exists := r.existing[name]
	if msg := boulderProblem(old); exists && msg != "" {
		e.fail(0, "", msg+"; change it with PUT /v1/limits/"+name)
		return
	}
	// Boulder's format has no unit: a limit keeps its own, and a new one
	// counts the default.
	l := limiter.Limit{Name: name, Unit: old.Unit}

	l.Params = limiter.Params{Burst: requiredInt(e, f, "burst"), Count: requiredInt(e, f, "count"), Period: requiredDuration(e, f, "period")}
	// A field reported missing or unreadable is not reported again.
	for _, fe := range l.Params.Validate(false) {
		e.fail(lineOf(f, fe.Field), fe.Field, fe.Message)
	}
	l.IDFormat = r.idFormat(e, f, name, old, exists)
	l.Enum = r.enum(e, f, name, old, exists)

	if s, present, ok := readText(e, f, "description"); ok {
		l.Description = s
	} else if !present && exists {
		l.Description = old.Description
	}
	if b, present, ok := readBool(e, f, "shadow"); ok {
		l.Shadow = b
	} else if !present && exists {
		l.Shadow = old.Shadow
	}
	// What is left to check: the name and the lengths of the texts.
	for _, fe := range l.Validate() {
		e.fail(lineOf(f, fe.Field), fe.Field, fe.Message)
	}
	// A bad entry is kept too: any error means nothing is written.
	r.limits = append(r.limits, l)
}

// idFormat returns the id format the entry gives the limit. A catalogue
// name must have the catalogue's format, unless the stored limit already
// has another one: then an export of it must import again unchanged.
func (r *defaultsReader) idFormat(e *entry, f fields, name string, old limiter.Limit, exists bool) limiter.IDFormat {
	_, catFormat, cat := limiter.Catalogued(name)
	var format limiter.IDFormat
	if n := f.get("id_format"); n != nil {
		if e.failed["id_format"] {
			return ""
		}
		s, _ := scalarText(n)
		format = limiter.IDFormat(s)
		switch {
		case n.Kind != yaml.ScalarNode || !format.Valid():
			e.fail(n.Line, "id_format", "must be one of "+limiter.FormatList()+"; not "+describe(n))
			return ""
		case cat && format != catFormat && !(exists && format == old.IDFormat):
			e.fail(n.Line, "id_format", fmt.Sprintf("%s has id_format %s in Let's Encrypt's catalogue", name, catFormat))
			return ""
		}
	} else {
		switch {
		case exists:
			return old.IDFormat
		case cat:
			return catFormat
		}
		if !e.failed["id_format"] {
			e.fail(0, "id_format", "required for a limit outside Let's Encrypt's catalogue; one of "+limiter.FormatList())
		}
		return ""
	}
	if exists && format != old.IDFormat && r.overrides[name] > 0 {
		e.fail(lineOf(f, "id_format"), "id_format", fmt.Sprintf("cannot change from %s while limit %s has overrides (%d): their bucket ids are written in it", old.IDFormat, name, r.overrides[name]))
		return ""
	}
	return format
}

// enum returns the enum the entry gives the limit, 0 to let the database
// choose one. Enums never change, and two limits never share one.
func (r *defaultsReader) enum(e *entry, f fields, name string, old limiter.Limit, exists bool) int {
	catEnum, _, cat := limiter.Catalogued(name)
	var enum int
	v, present, ok := readInt(e, f, "enum")
	line := lineOf(f, "enum")
	switch {
	case present && !ok:
		return 0
	case !present && exists:
		return old.Enum
	case !present && cat:
		enum = catEnum
	case !present:
		return 0
	case v < 1 || v > limiter.MaxEnum:
		e.fail(line, "enum", "must be between 1 and "+strconv.Itoa(limiter.MaxEnum))
		return 0
	case exists && int(v) != old.Enum:
		e.fail(line, "enum", fmt.Sprintf("limit %s has enum %d, and an enum never changes", name, old.Enum))
		return 0
	case exists:
		return old.Enum
	case limiter.CatalogueProblem(name, int(v)) != "":
		e.fail(line, "enum", limiter.CatalogueProblem(name, int(v)))
		return 0
	default:
		enum = int(v)
	}
	// A new limit with an enum: nobody else may have it.
	if owner, taken := r.enumOwner[enum]; taken {
		e.fail(line, "enum", fmt.Sprintf("%d is already the enum of limit %s", enum, owner))
		return 0
	}
	if c, taken := r.claimed[enum]; taken {
		e.fail(line, "enum", fmt.Sprintf("%d is also the enum of %s at line %d", enum, c.name, c.line))
		return 0
	}
	r.claimed[enum] = claim{name: name, line: e.line}
	return enum
}

// requiredInt reads an integer that must be given.
func requiredInt(e *entry, f fields, key string) int64 {
	v, present, _ := readInt(e, f, key)
	if !present {
		e.fail(0, key, "required")
	}
	return v
}

// requiredDuration reads a duration that must be given.
func requiredDuration(e *entry, f fields, key string) time.Duration {
	v, present, _ := readDuration(e, f, key)
	if !present {
		e.fail(0, key, "required")
	}
	return v
}

// lineOf is the line of a field's value, 0 (the entry's line) when the
// field is absent.
func lineOf(f fields, key string) int {
	if n := f.values[key]; n != nil {
		return n.Line
	}
	return 0
}
