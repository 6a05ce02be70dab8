package limitfile

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
)

// listKeys are the keys of an override entry in the list format; mapKeys
// those in the map format, and idKeys those of one id of the list format
// given as a map. "unlimited" is ours: Boulder has no unlimited overrides.
func listKeys() []string { return []string{"burst", "count", "period", "unlimited", "comment", "ids"} }
func mapKeys() []string  { return []string{"burst", "count", "period", "unlimited", "comment"} }
func idKeys() []string   { return []string{"id", "comment"} }

// overridesReader checks the entries of an overrides document against each
// other and against the stored limits.
type overridesReader struct {
	errs   []EntryError
	limits map[string]limiter.Limit
	// seen is the line of each bucket the document names so far.
	seen      map[bucket]int
	overrides []limiter.Override
}

// bucket is what an override is unique on.
type bucket struct{ limit, id string }

// overrideParams is what one entry gives all its buckets.
type overrideParams struct {
	limiter.Params
	unlimited bool
	comment   string
}

func readOverrides(root *yaml.Node, stored []limiter.Limit) ([]limiter.Override, []EntryError) {
	r := &overridesReader{limits: make(map[string]limiter.Limit, len(stored)), seen: map[bucket]int{}}
	for _, l := range stored {
		r.limits[l.Name] = l
	}
	switch root.Kind {
	case yaml.SequenceNode:
		for _, item := range root.Content {
			r.listEntry(item)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(root.Content); i += 2 {
			r.mapEntry(root.Content[i], root.Content[i+1])
		}
	default:
		r.errs = append(r.errs, EntryError{Line: root.Line,
			Message: "an overrides document is a list of limits with their ids, or a map from <limit>:<id> to parameters; not " + describe(root)})
	}
	return r.overrides, r.errs
}

// listEntry reads "- Name: {burst, count, period, ids: [...]}".
func (r *overridesReader) listEntry(item *yaml.Node) {
	if item.Kind != yaml.MappingNode || len(item.Content) != 2 || item.Content[0].Kind != yaml.ScalarNode {
		what := describe(item)
		if item.Kind == yaml.MappingNode {
			what = "a map with " + strconv.Itoa(len(item.Content)/2) + " keys"
		}
		r.errs = append(r.errs, EntryError{Line: item.Line, Message: "a list entry is a map with one key, the limit's name; not " + what})
		return
	}
	k, v := item.Content[0], item.Content[1]
	name := k.Value
	e := newEntry(&r.errs, k.Line, name)
	if v.Kind != yaml.MappingNode {
		e.fail(0, "", "must be a map of "+strings.Join(listKeys(), ", ")+"; not "+describe(v))
		return
	}
	f := readFields(e, v, listKeys()...)
	limit, known := r.limit(e, name)
	p := readOverrideParams(e, f)
	ids := f.get("ids")
	switch {
	case e.failed["ids"]:
		return
	case ids == nil:
		e.fail(0, "ids", "required: the ids these parameters apply to")
		return
	case ids.Kind != yaml.SequenceNode:
		e.fail(ids.Line, "ids", "must be a list of ids; not "+describe(ids))
		return
	case len(ids.Content) == 0:
		e.fail(ids.Line, "ids", "must list at least one id")
		return
	}
	for i, n := range ids.Content {
		prefix := "ids[" + strconv.Itoa(i) + "]"
		switch n.Kind {
		case yaml.ScalarNode:
			id, _ := scalarText(n)
			part := e.part(n.Line, prefix, name+":"+id)
			r.add(part, limit, known, id, n.Line, p, func(msg string) { part.fail(0, "", msg) }, func(msg string) {
				e.fail(lineOf(f, "comment"), "comment", msg)
			})
		case yaml.MappingNode:
			r.idMap(e, f, n, prefix, name, limit, known, p)
		default:
			e.part(n.Line, prefix, name).fail(0, "", "must be an id, or a map of id and comment; not "+describe(n))
		}
	}
}

// idMap reads one id of a list entry written "{id: ..., comment: ...}";
// its comment replaces the entry's.
func (r *overridesReader) idMap(e *entry, f fields, n *yaml.Node, prefix, name string, limit limiter.Limit, known bool, p overrideParams) {
	label := name
	if v := peek(n, "id"); v != nil && v.Kind == yaml.ScalarNode {
		label += ":" + v.Value
	}
	part := e.part(n.Line, prefix, label)
	idf := readFields(part, n, idKeys()...)
	idNode := idf.get("id")
	if part.failed["id"] {
		return
	}
	if idNode == nil {
		part.fail(0, "id", "required")
		return
	}
	id, ok := scalarText(idNode)
	if !ok {
		part.fail(idNode.Line, "id", "must be text, not "+describe(idNode))
		return
	}
	commentBad := func(msg string) { e.fail(lineOf(f, "comment"), "comment", msg) }
	if c, present, ok := readText(part, idf, "comment"); present {
		if !ok {
			return
		}
		p.comment = c
		commentBad = func(msg string) { part.fail(lineOf(idf, "comment"), "comment", msg) }
	}
	r.add(part, limit, known, id, idNode.Line, p, func(msg string) { part.fail(idNode.Line, "id", msg) }, commentBad)
}

// peek returns the value of key in the map m, nil when absent.
func peek(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Kind == yaml.ScalarNode && m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// mapEntry reads "Name:id: {burst, count, period}".
func (r *overridesReader) mapEntry(k, v *yaml.Node) {
	if k.Kind != yaml.ScalarNode {
		r.errs = append(r.errs, EntryError{Line: k.Line, Message: "keys must be <limit>:<id> written as plain text, not " + describe(k)})
		return
	}
	e := newEntry(&r.errs, k.Line, k.Value)
	if k.ShortTag() == "!!merge" {
		e.fail(0, "", "merge keys (<<) are not supported")
		return
	}
	// Ids may hold colons (IPv6 addresses, <reg_id>:<domain>); names never do.
	name, id, found := strings.Cut(k.Value, ":")
	if !found {
		e.fail(0, "", "the key must be a limit name and a bucket id joined by a colon, such as NewOrdersPerAccount:12345")
		return
	}
	if v.Kind != yaml.MappingNode {
		e.fail(0, "", "must be a map of "+strings.Join(mapKeys(), ", ")+"; not "+describe(v))
		return
	}
	f := readFields(e, v, mapKeys()...)
	limit, known := r.limit(e, name)
	p := readOverrideParams(e, f)
	r.add(e, limit, known, id, k.Line, p, func(msg string) { e.fail(0, "id", msg) }, func(msg string) {
		e.fail(lineOf(f, "comment"), "comment", msg)
	})
}

// limit returns the stored limit an entry names, reporting when there is
// none (overrides documents never create limits, because a limit needs an
// id format, which they cannot give) or when Boulder's format cannot
// describe it.
func (r *overridesReader) limit(e *entry, name string) (limiter.Limit, bool) {
	if !limiter.ValidName(name) {
		e.fail(0, "", fmt.Sprintf("%q is not a limit name: %s", clip(name), limiter.NameProblem(name)))
		return limiter.Limit{}, false
	}
	l, ok := r.limits[name]
	if !ok {
		e.fail(0, "", "limit "+name+" does not exist; import it with the defaults first")
		return l, false
	}
	if msg := boulderProblem(l); msg != "" {
		e.fail(0, "", msg+"; set its overrides with POST /v1/overrides")
		return l, false
	}
	return l, true
}

// readOverrideParams reads what an entry gives its buckets. Parameters
// given with "unlimited: true" mean nothing, as the database keeps none for
// an unlimited override; they are still read, so that a typo is reported.
func readOverrideParams(e *entry, f fields) overrideParams {
	var p overrideParams
	unlimited, present, ok := readBool(e, f, "unlimited")
	p.unlimited = unlimited
	p.comment, _, _ = readText(e, f, "comment")
	if unlimited || present && !ok {
		// Unlimited, or unreadable and reported: parameters are optional.
		readInt(e, f, "burst")
		readInt(e, f, "count")
		readDuration(e, f, "period")
		return p
	}
	p.Params = limiter.Params{Burst: requiredInt(e, f, "burst"), Count: requiredInt(e, f, "count"), Period: requiredDuration(e, f, "period")}
	// A field reported missing or unreadable is not reported again.
	for _, fe := range p.Params.Validate(true) {
		e.fail(lineOf(f, fe.Field), fe.Field, fe.Message)
	}
	return p
}

// add checks one override and keeps it. idBad reports a bad id and
// commentBad a bad comment, each where the document wrote it; parameters
// have been checked once for their entry.
func (r *overridesReader) add(e *entry, limit limiter.Limit, known bool, id string, line int, p overrideParams, idBad, commentBad func(string)) {
	if !known {
		return
	}
	o := limiter.Override{Limit: limit.Name, BucketID: id, Params: p.Params, Unlimited: p.unlimited, Comment: p.comment}
	if msg := limiter.TextProblem(o.Comment); msg != "" {
		commentBad(msg)
	}
	idOK := true
	for _, fe := range bucketid.NormalizeOverride(&o, limit) {
		if fe.Field == "bucket_id" {
			idBad(fe.Message)
			idOK = false
		}
	}
	if !idOK {
		return
	}
	k := bucket{o.Limit, o.BucketID}
	if first, dup := r.seen[k]; dup {
		e.fail(line, "", fmt.Sprintf("the same bucket as line %d", first))
		return
	}
	r.seen[k] = line
	// The database canonicalises the id again under its write lock, by
	// the limit's format then, which a concurrent change may have made
	// another than the one read here.
	o.BucketID = id
	r.overrides = append(r.overrides, o)
}
