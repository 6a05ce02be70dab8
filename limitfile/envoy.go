package limitfile

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// Envoy documents are envoyproxy/ratelimit configuration files: a domain
// and its nested descriptors, which become limits, rules and overrides.
const Envoy Kind = "envoy"

// EnvoyStore is what the import and export of Envoy's configurations need
// of the database; *db.DB satisfies it.
type EnvoyStore interface {
	ListLimits(ctx context.Context) ([]limiter.Limit, error)
	ListRules(ctx context.Context, domain string) ([]limiter.Rule, error)
	// ImportRules writes limits, rules and overrides in one transaction,
	// making the rules of domain exactly those given, or with merge adding
	// them to the domain's (a descriptor it has is ErrRuleExists), or with
	// dryRun only counts what it would write and remove.
	ImportRules(ctx context.Context, actor, domain string, limits []limiter.Limit, rules []limiter.Rule, overrides []limiter.Override, merge, dryRun bool) (limiter.ImportCounts, error)
	// Full streams every limit, then every enabled override.
	Full(ctx context.Context, onLimit func(limiter.Limit) error, onOverride func(limiter.Override) error) (int64, error)
}

// envoyUnits are the units of envoyproxy/ratelimit, with a month of 30
// days and a year of 365, as Envoy's rate limit service counts them.
var envoyUnits = []struct {
	name string
	d    time.Duration
}{
	{"year", 365 * 24 * time.Hour},
	{"month", 30 * 24 * time.Hour},
	{"week", 7 * 24 * time.Hour},
	{"day", 24 * time.Hour},
	{"hour", time.Hour},
	{"minute", time.Minute},
	{"second", time.Second},
}

func unitNames() string {
	names := make([]string, len(envoyUnits))
	for i, u := range envoyUnits {
		names[len(envoyUnits)-1-i] = u.name
	}
	return strings.Join(names, ", ")
}

// pattern is one descriptor of the file that says something: its entries
// from the top, and what applies to requests that match them.
type pattern struct {
	entries []limiter.DescriptorEntry
	line    int
	label   string
	// unlimited is also true for a descriptor with neither a limit nor
	// nested descriptors, which envoyproxy/ratelimit lets through.
	unlimited bool
	params    limiter.Params
	shadow    bool
	name      string
	// replaces names the limits the pattern's rule replaces, and quota is
	// its quota_mode.
	replaces []string
	quota    bool
	// own holds what ratelimitd's own metadata keys say.
	own ownKeys
	// rule is set once the pattern has become a rule, and limit is its
	// limit.
	rule  *limiter.Rule
	limit *limiter.Limit
}

// ownKeys are what a descriptor's `metadata: {ratelimitd: {...}}` says
// of the limit or override it becomes, where Envoy's format has no word
// for it: an export writes them, so that importing the export changes
// nothing. envoyproxy/ratelimit accepts any metadata and ignores it.
//
// calendar and timeZone make the limit a calendar quota, whose windows
// start at the boundaries of the zone; the peer reads the same
// descriptor's unit as its own fixed window, aligned to UTC. Without
// them a unit is always a rate: a file of the peer's never makes a quota.
type ownKeys struct {
	idFormat    limiter.IDFormat
	burst       int64
	description *string
	comment     *string
	calendar    limiter.Calendar
	timeZone    string
}

// ownKeyNames are the keys of ownKeys, as the file spells them.
var ownKeyNames = []string{"id_format", "burst", "description", "comment", "calendar", "time_zone"}

// quota returns the calendar quota of the keys, with its parameters
// unset; a rate limit when they name no calendar.
func (k ownKeys) quota() limiter.Limit {
	return limiter.Limit{Calendar: k.calendar, TimeZone: k.timeZone}
}

// envoyReader reads one document.
type envoyReader struct {
	errs     []EntryError
	notes    []string
	domain   string
	patterns []*pattern
	// tops are the top-level descriptors, which a merge may not repeat.
	tops []top
}

// top is a top-level descriptor of a document: its entry, line and label.
type top struct {
	entry limiter.DescriptorEntry
	line  int
	label string
}

// ImportEnvoy reads an envoyproxy/ratelimit configuration file into
// limits, rules and overrides, and writes them in one call of st, or
// nothing: as Import, bad entries come back as EntryErrors with their
// lines, and the error is for failures of st.
//
// Each descriptor with a rate_limit becomes a rule of the domain and a
// limit (named by rate_limit.name, or after the domain and descriptor) of
// the id format string, with burst and count requests_per_unit and period
// the unit (times unit_multiplier). A descriptor that fixes every value,
// where a less specific rule of the file would answer its requests,
// becomes instead an override of that rule's limit for its bucket, when it
// can be one: same shadow_mode, quota_mode and replaces, no name of its
// own, and a limit no rule replaces. rate_limit.replaces and quota_mode
// go on the rule. A blocked
// (requests_per_unit 0) or unlimited descriptor that no override can
// express gets a rule whose values share one bucket, and an override of
// that bucket. share_threshold shares the values of a wildcard entry.
// metadata.ratelimitd carries what the format cannot hold (id_format,
// burst, description, comment, and a calendar quota's calendar and
// time_zone, whose unit must be the calendar), as ExportEnvoy writes it.
// The rules of the domain that the file does not name are deleted, unless
// opts.Merge adds the file to them (see ImportOptions). What ratelimitd
// cannot express with the same meaning is an error naming the line: units
// it does not know. So is a replaces entry without a name, or naming its
// own descriptor, as envoyproxy/ratelimit refuses both.
func ImportEnvoy(ctx context.Context, st EnvoyStore, actor string, data []byte, opts ImportOptions) (limiter.ImportCounts, []EntryError, error) {
	root, bad := decode(data)
	switch {
	case bad == errEmpty:
		return limiter.ImportCounts{}, nil, nil
	case bad != nil:
		return limiter.ImportCounts{}, []EntryError{*bad}, nil
	}
	r := &envoyReader{}
	r.document(root)
	if opts.Merge && len(r.errs) == 0 {
		if err := r.mergeable(ctx, st); err != nil {
			return limiter.ImportCounts{}, nil, err
		}
	}
	var limits []limiter.Limit
	var rules []limiter.Rule
	var overrides []limiter.Override
	if len(r.errs) == 0 {
		limits, rules, overrides = r.resolve()
	}
	if len(r.errs) > 0 {
		slices.SortStableFunc(r.errs, func(a, b EntryError) int { return a.Line - b.Line })
		return limiter.ImportCounts{}, r.errs, nil
	}
	counts, err := st.ImportRules(ctx, actor, r.domain, limits, rules, overrides, opts.Merge, opts.DryRun)
	if err != nil {
		return limiter.ImportCounts{}, nil, err
	}
	counts.Notes = r.notes
	return counts, nil, nil
}

func (r *envoyReader) document(root *yaml.Node) {
	e := newEntry(&r.errs, root.Line, "")
	if root.Kind != yaml.MappingNode {
		e.fail(0, "", "an Envoy rate limit configuration is a map with domain and descriptors, not "+describe(root))
		return
	}
	f := readFields(e, root, "domain", "descriptors")
	domain, present, ok := readText(e, f, "domain")
	switch {
	case !present:
		e.fail(0, "domain", "is required")
	case ok:
		if msg := rules.DescriptorTextProblem(domain); msg != "" {
			e.fail(lineOf(f, "domain"), "domain", msg)
		}
	}
	r.domain = domain
	if n := f.get("descriptors"); n != nil {
		r.list(e, n, nil, "descriptors")
	}
}

// list reads a list of descriptors nested under the entries above.
func (r *envoyReader) list(e *entry, n *yaml.Node, above []limiter.DescriptorEntry, field string) {
	if n.Kind != yaml.SequenceNode {
		e.fail(n.Line, field, "must be a list of descriptors, not "+describe(n))
		return
	}
	if len(above) >= rules.MaxDescriptorEntries {
		e.fail(n.Line, field, "descriptors nest at most "+strconv.Itoa(rules.MaxDescriptorEntries)+" deep")
		return
	}
	for _, item := range n.Content {
		r.descriptor(item, above)
	}
}

func (r *envoyReader) descriptor(n *yaml.Node, above []limiter.DescriptorEntry) {
	e := newEntry(&r.errs, n.Line, label(r.domain, above, limiter.DescriptorEntry{}))
	if n.Kind != yaml.MappingNode {
		e.fail(0, "", "a descriptor is a map with key, value, rate_limit and descriptors, not "+describe(n))
		return
	}
	f := readFields(e, n, "key", "value", "rate_limit", "shadow_mode", "descriptors", "detailed_metric", "share_threshold",
		"value_to_metric", "metadata", "quota_mode")
	var entry limiter.DescriptorEntry
	key, present, ok := readText(e, f, "key")
	switch {
	case !present:
		e.fail(0, "key", "is required")
	case ok:
		if msg := rules.DescriptorTextProblem(key); msg != "" {
			e.fail(lineOf(f, "key"), "key", msg)
		}
	}
	entry.Key = key
	if value, present, ok := readText(e, f, "value"); present && ok {
		if msg := rules.DescriptorTextProblem(value); msg != "" {
			e.fail(lineOf(f, "value"), "value", msg+"; leave it out to match any value")
		}
		entry.Value = value
	}
	e.label = clip(label(r.domain, above, entry))
	if len(above) == 0 {
		r.tops = append(r.tops, top{entry: entry, line: n.Line, label: e.label})
	}
	if v, _, ok := readBool(e, f, "share_threshold"); ok && v {
		if !strings.Contains(entry.Value, "*") {
			e.fail(lineOf(f, "share_threshold"), "share_threshold", "is only for a value with a wildcard '*'")
		}
		entry.Shared = true
	}
	for _, k := range []string{"detailed_metric", "value_to_metric"} {
		if v, _, ok := readBool(e, f, k); ok && v {
			r.note(lineOf(f, k), e.label, k+" is accepted and has no effect: ratelimitd's metrics count decisions by limit and never carry descriptor values")
		}
	}
	var own ownKeys
	if m := f.get("metadata"); m != nil {
		own = r.metadata(e, m)
	}
	shadow, _, _ := readBool(e, f, "shadow_mode")
	quota, _, _ := readBool(e, f, "quota_mode")
	entries := append(slices.Clip(above), entry)
	p := &pattern{entries: entries, line: n.Line, label: e.label, shadow: shadow, quota: quota, own: own}
	rl := f.get("rate_limit")
	nested := f.get("descriptors")
	switch {
	case rl != nil:
		if !r.rateLimit(e, rl, p) {
			return
		}
	case nested == nil:
		p.unlimited = true
	}
	if rl != nil || nested == nil {
		r.patterns = append(r.patterns, p)
	}
	if nested != nil {
		r.list(e, nested, entries, "descriptors")
	}
}

// mergeable refuses, for a merge, each top-level descriptor of the file
// that the domain has already, as envoyproxy/ratelimit refuses two files
// of one domain that hold the same one, and a rate_limit.name that names
// the limit of one of the domain's rules, which the merge would change:
// a merge adds descriptors and changes none. The domain's descriptors are
// those its export writes, overrides of a rule's limit included.
func (r *envoyReader) mergeable(ctx context.Context, st EnvoyStore) error {
	stored, err := st.ListRules(ctx, r.domain)
	if err != nil || len(stored) == 0 {
		return err
	}
	taken := map[string]bool{}
	for _, rule := range stored {
		taken[rule.Limit] = true
	}
	doc, err := ExportEnvoy(ctx, st, r.domain)
	if err != nil {
		return err
	}
	root, bad := decode(doc)
	if bad != nil {
		return fmt.Errorf("reading the export of domain %q back: %s", r.domain, bad)
	}
	held := &envoyReader{}
	held.document(root)
	has := map[limiter.DescriptorEntry]bool{}
	for _, t := range held.tops {
		has[limiter.DescriptorEntry{Key: t.entry.Key, Value: t.entry.Value}] = true
	}
	for _, t := range r.tops {
		if has[limiter.DescriptorEntry{Key: t.entry.Key, Value: t.entry.Value}] {
			r.errs = append(r.errs, EntryError{Line: t.line, Entry: t.label,
				Message: "domain " + strconv.Quote(clip(r.domain)) + " has this descriptor already: a merge adds descriptors and changes none (import without merge to replace the domain's rules)"})
		}
	}
	for _, p := range r.patterns {
		if taken[p.name] {
			r.errs = append(r.errs, EntryError{Line: p.line, Entry: p.label,
				Message: "rate_limit.name " + strconv.Quote(p.name) + " is the limit of a rule of the domain already: a merge changes none (import without merge to replace the domain's rules)"})
		}
	}
	return nil
}

// note records what the import keeps of a setting, for its answer.
func (r *envoyReader) note(line int, label, msg string) {
	r.notes = append(r.notes, "line "+strconv.Itoa(line)+" ("+label+"): "+msg)
}

// metadata reads a descriptor's metadata: ratelimitd's own keys, and a
// note for the rest, which nothing reads.
func (r *envoyReader) metadata(e *entry, m *yaml.Node) ownKeys {
	var own ownKeys
	if m.Kind != yaml.MappingNode {
		e.fail(m.Line, "metadata", "must be a map, not "+describe(m))
		return own
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Value != "ratelimitd" {
			r.note(k.Line, e.label, "metadata "+strconv.Quote(clip(k.Value))+" is accepted and not kept: ratelimitd answers no dynamic metadata")
			continue
		}
		oe := e.part(v.Line, "metadata.ratelimitd", e.label)
		if v.Kind != yaml.MappingNode {
			oe.fail(0, "", "must be a map, not "+describe(v))
			continue
		}
		f := readFields(oe, v, ownKeyNames...)
		if name, present, ok := readText(oe, f, "id_format"); present && ok {
			own.idFormat = limiter.IDFormat(name)
			if !own.idFormat.Valid() {
				oe.fail(lineOf(f, "id_format"), "id_format", "must be one of "+limiter.FormatList())
			}
		}
		if b, present, ok := readInt(oe, f, "burst"); present && ok {
			if b < 1 {
				oe.fail(lineOf(f, "burst"), "burst", "must be at least 1")
			}
			own.burst = b
		}
		for _, k := range []string{"description", "comment"} {
			if text, present, ok := readText(oe, f, k); present && ok {
				if msg := limiter.TextProblem(text); msg != "" {
					oe.fail(lineOf(f, k), k, msg)
				}
				if k == "description" {
					own.description = &text
				} else {
					own.comment = &text
				}
			}
		}
		own.calendar, own.timeZone = readQuota(oe, f)
	}
	return own
}

// readQuota reads the calendar and time zone of a calendar quota, UTC
// when it names no zone; "" for both when it names no calendar.
func readQuota(e *entry, f fields) (limiter.Calendar, string) {
	calendar, calendared, ok := readText(e, f, "calendar")
	zone, zoned, zoneOK := readText(e, f, "time_zone")
	switch {
	case zoned && !calendared:
		e.fail(lineOf(f, "time_zone"), "time_zone", "is only for a calendar quota: give calendar too")
		return "", ""
	case !calendared || !ok:
		return "", ""
	case !slices.Contains(calendars, limiter.Calendar(calendar)):
		e.fail(lineOf(f, "calendar"), "calendar", "must be hour, day, week, month or year")
	case !zoned:
		zone = "UTC"
	case zoneOK:
		if _, msg := limiter.LoadZone(zone); msg != "" {
			e.fail(lineOf(f, "time_zone"), "time_zone", msg)
		}
	}
	return limiter.Calendar(calendar), zone
}

// calendars are the windows of calendar quotas, each also a unit of
// envoyproxy/ratelimit.
var calendars = []limiter.Calendar{limiter.CalendarHour, limiter.CalendarDay, limiter.CalendarWeek, limiter.CalendarMonth, limiter.CalendarYear}

// rateLimit reads a rate_limit block into p.
func (r *envoyReader) rateLimit(parent *entry, n *yaml.Node, p *pattern) bool {
	e := parent.part(n.Line, "rate_limit", parent.label)
	if n.Kind != yaml.MappingNode {
		e.fail(0, "", "must be a map, not "+describe(n))
		return false
	}
	before := len(r.errs)
	f := readFields(e, n, "unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces")
	if name, present, ok := readText(e, f, "name"); present && ok {
		if msg := limiter.NameProblem(name); msg != "" {
			e.fail(lineOf(f, "name"), "name", msg+" (it names the limit)")
		}
		p.name = name
	}
	if n := f.get("replaces"); n != nil {
		r.replaces(e, n, p)
	}
	if unlimited, _, ok := readBool(e, f, "unlimited"); ok && unlimited {
		for _, k := range []string{"unit", "requests_per_unit", "unit_multiplier"} {
			if f.get(k) != nil {
				e.fail(lineOf(f, k), k, "must be left out when unlimited is true")
			}
		}
		p.unlimited = true
		return len(r.errs) == before
	}
	var unit time.Duration
	name, present, ok := readText(e, f, "unit")
	switch {
	case !present:
		e.fail(0, "unit", "is required")
	case ok:
		for _, u := range envoyUnits {
			if strings.EqualFold(name, u.name) {
				unit = u.d
			}
		}
		if unit == 0 {
			e.fail(lineOf(f, "unit"), "unit", "must be one of "+unitNames())
		}
	}
	rpu, present, ok := readInt(e, f, "requests_per_unit")
	switch {
	case !present:
		e.fail(0, "requests_per_unit", "is required")
	case ok && (rpu < 0 || rpu > 1<<32-1):
		e.fail(lineOf(f, "requests_per_unit"), "requests_per_unit", "must be between 0 and 4294967295")
	}
	mult, present, ok := readInt(e, f, "unit_multiplier")
	switch {
	case !present:
		mult = 1
	case ok && (mult < 1 || mult > 1<<32-1):
		e.fail(lineOf(f, "unit_multiplier"), "unit_multiplier", "must be between 1 and 4294967295")
	}
	if len(r.errs) > before {
		return false
	}
	if c := p.own.calendar; c != "" {
		if !strings.EqualFold(name, string(c)) || mult != 1 {
			e.fail(lineOf(f, "unit"), "unit", "must be "+string(c)+", the calendar of metadata.ratelimitd, without unit_multiplier")
			return false
		}
		p.params = limiter.Params{Burst: rpu, Count: rpu}
		if fe := p.own.quota().ParamsProblems(p.params, true); len(fe) > 0 {
			e.fail(lineOf(f, "requests_per_unit"), "requests_per_unit", "is more than a calendar quota can hold: "+fe[0].Message)
			return false
		}
		return true
	}
	p.params = limiter.Params{Burst: rpu, Count: rpu, Period: time.Duration(mult) * unit}
	if rpu == 0 {
		p.params.Count = 1 // blocked: the rate is never used
	}
	if fe := p.params.Validate(true); len(fe) > 0 || p.params.Period/time.Duration(mult) != unit {
		e.fail(lineOf(f, "requests_per_unit"), "requests_per_unit", "with the unit, is not a rate ratelimitd can hold (at most a million a second, and periods below 100 years)")
		return false
	}
	return true
}

// replaces reads rate_limit.replaces, a list of {name}. As
// envoyproxy/ratelimit, it refuses an entry without a name and one that
// names the descriptor's own rate_limit.name. A name that no limit can
// have (the peer accepts any) replaces nothing there either: it is left
// out, with a note.
func (r *envoyReader) replaces(e *entry, n *yaml.Node, p *pattern) {
	if n.Kind != yaml.SequenceNode {
		e.fail(n.Line, "replaces", "must be a list of {name}, not "+describe(n))
		return
	}
	for i, item := range n.Content {
		// e reports for rate_limit.
		ie := e.part(item.Line, e.prefix+".replaces["+strconv.Itoa(i)+"]", e.label)
		if item.Kind != yaml.MappingNode {
			ie.fail(0, "", "must be a map with name, not "+describe(item))
			continue
		}
		f := readFields(ie, item, "name")
		name, present, ok := readText(ie, f, "name")
		switch {
		case present && !ok:
			// Not text: readText said so.
		case name == "":
			ie.fail(lineOf(f, "name"), "name", "should not have an empty replaces entry (envoyproxy/ratelimit refuses it too)")
		case name == p.name:
			ie.fail(lineOf(f, "name"), "name", "replaces should not contain name of same descriptor: "+strconv.Quote(clip(name))+" is this rate_limit's own name")
		case limiter.NameProblem(name) != "":
			r.note(item.Line, e.label, "replaces "+strconv.Quote(clip(name))+" names no limit ratelimitd can hold ("+limiter.NameProblem(name)+"): it replaces nothing and is left out")
		case !slices.Contains(p.replaces, name):
			p.replaces = append(p.replaces, name)
		}
	}
	if len(p.replaces) > rules.MaxReplaces {
		e.fail(n.Line, "replaces", "must name at most "+strconv.Itoa(rules.MaxReplaces)+" limits")
	}
}

// label names a descriptor in messages: domain, then key=value pairs.
func label(domain string, above []limiter.DescriptorEntry, last limiter.DescriptorEntry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range append(slices.Clip(above), last) {
		if e.Key == "" {
			continue
		}
		b.WriteString(" " + e.Key)
		if e.Value != "" {
			b.WriteString("=" + e.Value)
		}
	}
	return b.String()
}

// allExact reports whether every entry of p has a value without a
// wildcard, so that p matches one request descriptor only.
func allExact(p *pattern) bool {
	for _, e := range p.entries {
		if e.Value == "" || strings.Contains(e.Value, "*") {
			return false
		}
	}
	return true
}

// resolve turns the patterns into limits, rules and overrides, in time
// linear in their number: every pattern with a free or wildcard value
// becomes a rule of its own; each pattern that fixes every value then
// becomes an override of the rule that would otherwise answer its
// requests (found in an index of those rules, as a snapshot finds it), or
// a rule of its own where no override can say the same.
func (r *envoyReader) resolve() ([]limiter.Limit, []limiter.Rule, []limiter.Override) {
	seen := map[string]*pattern{}
	for _, p := range r.patterns {
		k := label("", p.entries, limiter.DescriptorEntry{}) + "\x00" + strconv.Itoa(len(p.entries))
		if first, dup := seen[k]; dup {
			r.errs = append(r.errs, EntryError{Line: p.line, Entry: p.label, Message: "the same descriptor as on line " + strconv.Itoa(first.line)})
			continue
		}
		seen[k] = p
	}
	if len(r.errs) > 0 {
		return nil, nil, nil
	}
	out := &resolved{names: map[string]int{}}
	var general, specific []*pattern
	for _, p := range r.patterns {
		if allExact(p) {
			specific = append(specific, p)
		} else {
			general = append(general, p)
		}
	}
	// A limit some rule replaces is replaced for every descriptor it
	// serves, so it serves no descriptor of the file without a name.
	replaced := map[string]bool{}
	for _, p := range r.patterns {
		for _, name := range p.replaces {
			replaced[name] = true
		}
	}
	for _, p := range general {
		r.own(out, p)
	}
	// The index's rules carry their position, to find their pattern.
	indexed := slices.Clone(out.rules)
	for i := range indexed {
		indexed[i].ID = strconv.Itoa(i)
	}
	m := rules.Index(indexed)
	for _, p := range specific {
		var catcher *pattern
		if rule, found := m.Match(r.domain, p.entries); found {
			i, _ := strconv.Atoi(rule.ID)
			catcher = out.ruled[i]
		}
		bucket, ok := "", false
		// A descriptor of a replaced limit is replaced with it, which
		// it says by naming the limit.
		sameName := p.name != "" && p.name == catcher.limitName()
		if catcher != nil && !catcher.shares() && (p.name == "" && !replaced[catcher.limit.Name] || sameName) &&
			p.shadow == catcher.shadow && p.quota == catcher.quota && slices.Equal(p.replaces, catcher.replaces) &&
			p.own.calendar == catcher.own.calendar && p.own.timeZone == catcher.own.timeZone {
			bucket = rules.BucketID(*catcher.rule, p.entries)
			_, err := bucketid.Canonical(limiter.String, bucket)
			ok = err == nil
		}
		if !ok {
			r.own(out, p)
			continue
		}
		o := r.override(catcher, bucket, p, p.params, p.unlimited)
		if p.own.burst > 0 && !p.unlimited && p.params.Burst > 0 {
			o.Params.Burst = p.own.burst
			if fe := catcher.limit.ParamsProblems(o.Params, true); len(fe) > 0 {
				r.errs = append(r.errs, EntryError{Line: p.line, Entry: p.label, Message: "metadata.ratelimitd.burst: " + fe[0].Field + " " + fe[0].Message})
				continue
			}
		}
		if p.own.comment != nil {
			o.Comment = *p.own.comment
		}
		out.overrides = append(out.overrides, o)
	}
	return out.limits, out.rules, out.overrides
}

// resolved collects what the patterns become.
type resolved struct {
	names     map[string]int
	limits    []limiter.Limit
	rules     []limiter.Rule
	ruled     []*pattern
	overrides []limiter.Override
}

// limitName is the name of p's limit, "" when p has none.
func (p *pattern) limitName() string {
	if p == nil || p.limit == nil {
		return ""
	}
	return p.limit.Name
}

// shares reports whether the requests of p's rule all count in one
// bucket, which an override of one request's bucket would change for all.
func (p *pattern) shares() bool { return rules.FreeEntries(*p.rule) == 0 }

// own makes p a rule of its own and a limit. A blocked or unlimited p
// answers every request alike: its values share one bucket, whose
// override blocks or exempts it, since a limit itself cannot.
func (r *envoyReader) own(out *resolved, p *pattern) {
	fail := func(msg string) { r.errs = append(r.errs, EntryError{Line: p.line, Entry: p.label, Message: msg}) }
	name := p.name
	if name == "" {
		name = generatedName(r.domain, p.entries)
	}
	if line, taken := out.names[name]; taken {
		fail("the limit name " + strconv.Quote(name) + " is taken by the descriptor on line " + strconv.Itoa(line))
		return
	}
	out.names[name] = p.line
	entries := slices.Clone(p.entries)
	l := p.own.quota()
	l.Params = p.params
	alike := p.unlimited || p.params.Burst == 0
	switch {
	case alike:
		for i := range entries {
			if !rules.Fixed(entries[i]) {
				entries[i].Shared = true
			}
		}
		l.Params = limiter.Params{Burst: 1, Count: 1, Period: max(p.params.Period, time.Second)}
		if l.Quota() {
			l.Params.Period = 0
		}
	case p.own.burst > 0:
		l.Burst = p.own.burst
	}
	l.Name, l.IDFormat, l.Shadow, l.Description = name, limiter.String, p.shadow, defaultDescription(r.domain, p.entries)
	if p.own.idFormat != "" {
		l.IDFormat = p.own.idFormat
	}
	if p.own.description != nil {
		l.Description = *p.own.description
	}
	rule := limiter.Rule{Domain: r.domain, Descriptor: entries, Limit: name, Replaces: p.replaces, QuotaMode: p.quota}
	if msg := rules.CheckLimit(rule, l); msg != "" {
		fail("metadata.ratelimitd.id_format: " + msg)
		return
	}
	if fe := l.ParamsProblems(l.Params, false); len(fe) > 0 {
		fail("metadata.ratelimitd.burst: " + fe[0].Field + " " + fe[0].Message)
		return
	}
	p.limit, p.rule = &l, &rule
	out.limits = append(out.limits, l)
	out.rules = append(out.rules, rule)
	out.ruled = append(out.ruled, p)
	if alike {
		// A quota's blocked bucket has count 0, as its burst.
		blocked := limiter.Params{Count: 1, Period: l.Period}
		if l.Quota() {
			blocked.Count = 0
		}
		if p.unlimited {
			blocked = limiter.Params{}
		}
		out.overrides = append(out.overrides, r.override(p, "*", p, blocked, p.unlimited))
	}
}

// defaultDescription is the description an import gives the limit of a
// descriptor without one of ratelimitd's own.
func defaultDescription(domain string, entries []limiter.DescriptorEntry) string {
	return clip("Envoy rate limit of " + label(domain, entries, limiter.DescriptorEntry{}))
}

func (r *envoyReader) override(catcher *pattern, bucket string, p *pattern, params limiter.Params, unlimited bool) limiter.Override {
	return limiter.Override{Limit: catcher.limit.Name, BucketID: bucket, Params: params, Unlimited: unlimited, Enabled: true,
		Comment: defaultDescription(r.domain, p.entries)}
}

// generatedName names the limit of a descriptor without a name: the domain
// and the descriptor's keys and values, in the characters a limit name
// may hold; a name that would be too long, or that lost characters, ends
// with a hash of what it stands for, so that two descriptors never share
// a name and an import of the same file names the same limits.
func generatedName(domain string, entries []limiter.DescriptorEntry) string {
	full := label(domain, entries, limiter.DescriptorEntry{})
	var b strings.Builder
	// Dots stand for the spaces and '=' of the label: one in the label
	// itself would make two descriptors look alike.
	lossy := strings.Contains(full, ".")
	for _, c := range []byte(full) {
		switch {
		case isLetter(c) || c >= '0' && c <= '9' || c == '_' || c == '-':
			b.WriteByte(c)
		case c == ' ' || c == '=':
			b.WriteByte('.')
		default:
			b.WriteByte('_')
			lossy = true
		}
	}
	name := b.String()
	if !isLetter(name[0]) {
		name, lossy = "E"+name, true
	}
	if len(name) <= 64 && !lossy {
		return name
	}
	sum := sha256.Sum256([]byte(full))
	return name[:min(len(name), 55)] + "-" + fmt.Sprintf("%x", sum[:4])
}

// envoyNode is a descriptor of an exported file: its entry, what applies
// to it, and the descriptors nested under it, in the order first seen.
type envoyNode struct {
	entry limiter.DescriptorEntry
	// own holds what the node's metadata must say for an import to
	// restore the limit or override as it is.
	own   ownKeys
	set   bool
	rate  limiter.Params
	limit string
	// alias names the limit of an override's descriptor when a rule of
	// the domain replaces it, so that an import replaces it too.
	alias    string
	shadow   bool
	quota    bool
	replaces []string
	blocked  bool
	free     bool
	notes    []string
	children []*envoyNode
	// byEntry finds a child by its key and value, so that a domain of
	// many descriptors is written in time linear in their number.
	byEntry map[[2]string]*envoyNode
}

// child returns the node of the entry's key and value, shared or not.
func (n *envoyNode) child(e limiter.DescriptorEntry) *envoyNode {
	k := [2]string{e.Key, e.Value}
	if c := n.byEntry[k]; c != nil {
		return c
	}
	c := &envoyNode{entry: limiter.DescriptorEntry{Key: e.Key, Value: e.Value}}
	if n.byEntry == nil {
		n.byEntry = map[[2]string]*envoyNode{}
	}
	n.byEntry[k] = c
	n.children = append(n.children, c)
	return c
}

// ExportEnvoy writes the rules of domain as an envoyproxy/ratelimit
// configuration file, each with its limit's rate and name, and the
// overrides of those limits as descriptors with the values of their
// buckets, so that ImportEnvoy of the export changes nothing. A calendar
// quota is written with its calendar as the unit, which the peer reads as
// a fixed window aligned to UTC, and its calendar and time zone in
// ratelimitd's metadata. What the format cannot say is written as a
// comment: a burst other than the count (Envoy's format has none, and an
// import sets the burst to requests_per_unit), a period that is not a
// whole number of seconds, a bucket id that is no value of the rule.
func ExportEnvoy(ctx context.Context, st EnvoyStore, domain string) ([]byte, error) {
	rules, err := st.ListRules(ctx, domain)
	if err != nil {
		return nil, err
	}
	stored, err := st.ListLimits(ctx)
	if err != nil {
		return nil, err
	}
	limits := make(map[string]limiter.Limit, len(stored))
	for _, l := range stored {
		limits[l.Name] = l
	}
	byLimit := map[string][]limiter.Rule{}
	replaced := map[string]bool{}
	for _, r := range rules {
		byLimit[r.Limit] = append(byLimit[r.Limit], r)
		for _, name := range r.Replaces {
			replaced[name] = true
		}
	}
	root := &envoyNode{}
	at := func(entries []limiter.DescriptorEntry) *envoyNode {
		n := root
		for _, e := range entries {
			n = n.child(e)
		}
		return n
	}
	for _, r := range rules {
		l := limits[r.Limit]
		n := at(r.Descriptor)
		n.set, n.rate, n.limit, n.shadow = true, l.Params, l.Name, l.Shadow
		n.quota, n.replaces = r.QuotaMode, r.Replaces
		// The entries of a rule of one bucket are shared by import again
		// when it is blocked or unlimited; a wildcard says it itself.
		for i, e := range r.Descriptor {
			at(r.Descriptor[:i+1]).entry.Shared = e.Shared && strings.Contains(e.Value, "*")
		}
		if l.IDFormat != limiter.String {
			n.own.idFormat = l.IDFormat
		}
		n.own.calendar, n.own.timeZone = l.Calendar, l.TimeZone
		if l.Burst != l.Count {
			n.own.burst = l.Burst
		}
		if d := defaultDescription(domain, r.Descriptor); l.Description != d {
			n.own.description = &l.Description
		}
	}
	_, err = st.Full(ctx, func(limiter.Limit) error { return nil }, func(o limiter.Override) error {
		for _, r := range byLimit[o.Limit] {
			entries, ok := overrideEntries(r, o.BucketID)
			if !ok {
				n := at(r.Descriptor)
				n.notes = append(n.notes, "the override of bucket "+strconv.Quote(o.BucketID)+" is no value of this descriptor and is left out")
				continue
			}
			n := at(entries)
			n.set, n.rate, n.free, n.blocked = true, o.Params, o.Unlimited, !o.Unlimited && o.Burst == 0
			n.shadow = limits[o.Limit].Shadow
			// The override's requests are decided by r, as the
			// descriptor's are in the file.
			n.quota, n.replaces = r.QuotaMode, r.Replaces
			if replaced[o.Limit] {
				n.alias = o.Limit
			}
			n.own.burst = 0
			if !n.free && !n.blocked && o.Burst != o.Count {
				n.own.burst = o.Burst
			}
			// The peer reads the descriptor's unit as a rate; the
			// metadata keeps it an override of the quota.
			n.own.calendar, n.own.timeZone = limits[o.Limit].Calendar, limits[o.Limit].TimeZone
			if d := defaultDescription(domain, entries); o.Comment != d && n.limit == "" {
				n.own.comment = &o.Comment
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var w writer
	w.line(0, "domain: "+scalar(domain))
	if len(root.children) == 0 {
		w.line(0, "descriptors: []")
		return w.Bytes(), nil
	}
	w.line(0, "descriptors:")
	writeEnvoyNodes(&w, 2, root.children)
	return w.Bytes(), nil
}

// overrideEntries returns the descriptor of a rule's bucket: the rule's
// entries with the bucket's values in place of those not fixed.
func overrideEntries(r limiter.Rule, bucket string) ([]limiter.DescriptorEntry, bool) {
	var values []string
	switch n := rules.FreeEntries(r); {
	case n == 0:
		// The rule's one bucket: the rule itself.
		return r.Descriptor, bucket == "*"
	case n == 1:
		values = []string{bucket}
	default:
		for _, v := range strings.Split(bucket, "/") {
			v = strings.ReplaceAll(strings.ReplaceAll(v, "%2F", "/"), "%25", "%")
			values = append(values, v)
		}
		if len(values) != n {
			return nil, false
		}
	}
	out := slices.Clone(r.Descriptor)
	i := 0
	for k, e := range out {
		if rules.Fixed(e) {
			continue
		}
		v := values[i]
		i++
		if v == "" || strings.HasSuffix(v, "*") || !strings.HasPrefix(v, strings.TrimSuffix(e.Value, "*")) {
			return nil, false
		}
		out[k].Value = v
	}
	return out, true
}

func writeEnvoyNodes(w *writer, indent int, nodes []*envoyNode) {
	for _, n := range nodes {
		for _, note := range n.notes {
			w.line(indent, "# "+note)
		}
		w.line(indent, "- key: "+scalar(n.entry.Key))
		in := indent + 2
		if n.entry.Value != "" {
			w.line(in, "value: "+scalar(n.entry.Value))
		}
		if n.entry.Shared {
			w.line(in, "share_threshold: true")
		}
		if n.set {
			writeRateLimit(w, in, n)
		}
		if n.shadow {
			w.line(in, "shadow_mode: true")
		}
		if n.quota {
			w.line(in, "quota_mode: true")
		}
		writeOwnKeys(w, in, n.own)
		if len(n.children) > 0 {
			w.line(in, "descriptors:")
			writeEnvoyNodes(w, in+2, n.children)
		}
	}
}

func writeRateLimit(w *writer, indent int, n *envoyNode) {
	name := n.limit
	if name == "" {
		name = n.alias
	}
	if n.free {
		w.line(indent, "rate_limit:")
		if name != "" {
			w.line(indent+2, "name: "+scalar(name))
		}
		writeReplaces(w, indent+2, n.replaces)
		w.line(indent+2, "unlimited: true")
		return
	}
	unit, mult := envoyUnit(n.rate.Period)
	if c := n.own.calendar; c != "" {
		unit, mult = string(c), 1
	}
	if unit == "" {
		w.line(indent, "# a period of "+n.rate.Period.String()+" is no whole number of seconds: this rate limit is left out")
		return
	}
	rpu := n.rate.Count
	if n.blocked {
		rpu = 0
	}
	w.line(indent, "rate_limit:")
	if name != "" {
		w.line(indent+2, "name: "+scalar(name))
	}
	w.line(indent+2, "unit: "+unit)
	if mult > 1 {
		w.line(indent+2, "unit_multiplier: "+strconv.FormatInt(mult, 10))
	}
	w.line(indent+2, "requests_per_unit: "+strconv.FormatInt(rpu, 10))
	writeReplaces(w, indent+2, n.replaces)
}

func writeReplaces(w *writer, indent int, names []string) {
	if len(names) == 0 {
		return
	}
	w.line(indent, "replaces:")
	for _, name := range names {
		w.line(indent+2, "- name: "+scalar(name))
	}
}

// writeOwnKeys writes ratelimitd's own keys in the descriptor's metadata,
// which envoyproxy/ratelimit accepts and ignores.
func writeOwnKeys(w *writer, indent int, own ownKeys) {
	if own == (ownKeys{}) {
		return
	}
	w.line(indent, "metadata:")
	w.line(indent+2, "ratelimitd:")
	in := indent + 4
	if own.idFormat != "" {
		w.line(in, "id_format: "+string(own.idFormat))
	}
	if own.burst > 0 {
		w.line(in, "burst: "+strconv.FormatInt(own.burst, 10))
	}
	if own.description != nil {
		w.line(in, "description: "+scalar(*own.description))
	}
	if own.comment != nil {
		w.line(in, "comment: "+scalar(*own.comment))
	}
	if own.calendar != "" {
		w.line(in, "calendar: "+string(own.calendar))
		w.line(in, "time_zone: "+scalar(own.timeZone))
	}
}

// envoyUnit returns the largest unit that divides d, and how many of it d
// is; "" when d is no whole number of seconds.
func envoyUnit(d time.Duration) (string, int64) {
	for _, u := range envoyUnits {
		if d%u.d == 0 {
			return u.name, int64(d / u.d)
		}
	}
	return "", 0
}
