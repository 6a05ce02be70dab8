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
	// or with dryRun only counts what it would write.
	ImportRules(ctx context.Context, actor string, limits []limiter.Limit, rules []limiter.Rule, overrides []limiter.Override, dryRun bool) (limiter.ImportCounts, error)
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
	// rule is set once the pattern has become a rule, and limit is its
	// limit.
	rule  *limiter.Rule
	limit *limiter.Limit
}

// envoyReader reads one document.
type envoyReader struct {
	errs     []EntryError
	domain   string
	patterns []*pattern
}

// ImportEnvoy reads an envoyproxy/ratelimit configuration file into
// limits, rules and overrides, and writes them in one call of st, or
// nothing: as Import, bad entries come back as EntryErrors with their
// lines, and the error is for failures of st.
//
// Each descriptor with a rate_limit becomes a rule of the domain and a
// limit (named by rate_limit.name, or after the domain and descriptor) of
// the id format string, with burst and count requests_per_unit and period
// the unit (times unit_multiplier). A descriptor with a value that a less
// specific descriptor of the file also matches becomes instead an override
// of that descriptor's limit for the bucket of its values, when it can be
// one: same shadow_mode, no name of its own. unlimited: true, and a
// descriptor with neither a limit nor nested descriptors, becomes an
// unlimited override of the less specific descriptor's limit, or nothing
// at all when no other descriptor would match its requests (ratelimitd
// answers those OK anyway). requests_per_unit 0 blocks. What ratelimitd
// cannot express with the same meaning is an error naming the line:
// replaces, share_threshold, detailed_metric, units it does not know, and
// descriptors whose requests it could only partly tell apart.
func ImportEnvoy(ctx context.Context, st EnvoyStore, actor string, data []byte, dryRun bool) (limiter.ImportCounts, []EntryError, error) {
	root, bad := decode(data)
	if bad != nil {
		return limiter.ImportCounts{}, []EntryError{*bad}, nil
	}
	if root == nil {
		return limiter.ImportCounts{}, nil, nil
	}
	r := &envoyReader{}
	r.document(root)
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
	if len(limits)+len(rules)+len(overrides) == 0 {
		return limiter.ImportCounts{}, nil, nil
	}
	counts, err := st.ImportRules(ctx, actor, limits, rules, overrides, dryRun)
	if err != nil {
		return limiter.ImportCounts{}, nil, err
	}
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
		if msg := limiter.DescriptorTextProblem(domain); msg != "" {
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
	if len(above) >= limiter.MaxDescriptorEntries {
		e.fail(n.Line, field, "descriptors nest at most "+strconv.Itoa(limiter.MaxDescriptorEntries)+" deep")
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
	f := readFields(e, n, "key", "value", "rate_limit", "shadow_mode", "descriptors", "detailed_metric", "share_threshold")
	var entry limiter.DescriptorEntry
	key, present, ok := readText(e, f, "key")
	switch {
	case !present:
		e.fail(0, "key", "is required")
	case ok:
		if msg := limiter.DescriptorTextProblem(key); msg != "" {
			e.fail(lineOf(f, "key"), "key", msg)
		}
	}
	entry.Key = key
	if value, present, ok := readText(e, f, "value"); present && ok {
		if msg := limiter.DescriptorTextProblem(value); msg != "" {
			e.fail(lineOf(f, "value"), "value", msg+"; leave it out to match any value")
		}
		entry.Value = value
	}
	e.label = clip(label(r.domain, above, entry))
	for _, k := range []string{"detailed_metric", "share_threshold"} {
		if v, _, ok := readBool(e, f, k); ok && v {
			e.fail(lineOf(f, k), k, "is not supported: ratelimitd cannot express it with the same meaning")
		}
	}
	shadow, _, _ := readBool(e, f, "shadow_mode")
	entries := append(slices.Clip(above), entry)
	p := &pattern{entries: entries, line: n.Line, label: e.label, shadow: shadow}
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

// rateLimit reads a rate_limit block into p.
func (r *envoyReader) rateLimit(parent *entry, n *yaml.Node, p *pattern) bool {
	e := parent.part(n.Line, "rate_limit", parent.label)
	if n.Kind != yaml.MappingNode {
		e.fail(0, "", "must be a map, not "+describe(n))
		return false
	}
	before := len(r.errs)
	f := readFields(e, n, "unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces")
	if f.get("replaces") != nil {
		e.fail(lineOf(f, "replaces"), "replaces", "is not supported: ratelimitd applies every matching rule, and cannot drop one for another")
	}
	if name, present, ok := readText(e, f, "name"); present && ok {
		if msg := limiter.NameProblem(name); msg != "" {
			e.fail(lineOf(f, "name"), "name", msg+" (it names the limit)")
		}
		p.name = name
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

// kindOf is how an entry matches values: 0 exact, 1 prefix, 2 any.
func kindOf(e limiter.DescriptorEntry) int {
	switch {
	case e.Value == "":
		return 2
	case strings.HasSuffix(e.Value, "*"):
		return 1
	}
	return 0
}

// covers reports whether every request descriptor that p matches, q
// matches too.
func covers(q, p *pattern) bool {
	if len(q.entries) != len(p.entries) {
		return false
	}
	for i, qe := range q.entries {
		pe := p.entries[i]
		if qe.Key != pe.Key {
			return false
		}
		switch kindOf(qe) {
		case 0:
			if kindOf(pe) != 0 || pe.Value != qe.Value {
				return false
			}
		case 1:
			prefix := strings.TrimSuffix(qe.Value, "*")
			if kindOf(pe) == 2 || !strings.HasPrefix(strings.TrimSuffix(pe.Value, "*"), prefix) {
				return false
			}
		}
	}
	return true
}

// moreSpecific orders patterns as the rule index does: comparing entries
// from the first, exact before prefix (longer first) before any.
func moreSpecific(a, b *pattern) int {
	for i := range a.entries {
		ka, kb := kindOf(a.entries[i]), kindOf(b.entries[i])
		if ka != kb {
			return ka - kb
		}
		if ka == 1 && len(a.entries[i].Value) != len(b.entries[i].Value) {
			return len(b.entries[i].Value) - len(a.entries[i].Value)
		}
	}
	return 0
}

// generality sorts patterns so that one that covers another comes first.
func generality(p *pattern) (score, prefixes int) {
	for _, e := range p.entries {
		k := kindOf(e)
		score += k
		if k == 1 {
			prefixes += len(e.Value)
		}
	}
	return score, prefixes
}

// resolve turns the patterns into limits, rules and overrides.
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
	order := slices.Clone(r.patterns)
	slices.SortStableFunc(order, func(a, b *pattern) int {
		sa, pa := generality(a)
		sb, pb := generality(b)
		if sa != sb {
			return sb - sa
		}
		return pa - pb
	})
	names := map[string]int{}
	var limits []limiter.Limit
	var rules []limiter.Rule
	var overrides []limiter.Override
	var ruled []*pattern
	for _, p := range order {
		var catcher *pattern
		for _, q := range ruled {
			if covers(q, p) && (catcher == nil || moreSpecific(q, catcher) < 0) {
				catcher = q
			}
		}
		fail := func(msg string) { r.errs = append(r.errs, EntryError{Line: p.line, Entry: p.label, Message: msg}) }
		bucket, single := "", false
		if catcher != nil {
			bucket, single = singleBucket(catcher, p)
		}
		switch {
		case p.unlimited && catcher == nil:
			// No other descriptor matches its requests: unmatched,
			// they are answered OK, as an unlimited one is.
		case p.unlimited && !single:
			fail("unlimited, but the less specific descriptor on line " + strconv.Itoa(catcher.line) + " also matches its requests, and they are not one bucket of its limit that an override could exempt")
		case p.unlimited:
			overrides = append(overrides, r.override(catcher, bucket, p, limiter.Params{}, true))
		case single && p.name == "" && p.shadow == catcher.shadow:
			overrides = append(overrides, r.override(catcher, bucket, p, p.params, false))
		case p.params.Burst == 0:
			fail("requests_per_unit 0 blocks, which ratelimitd can express only as an override of a less specific descriptor's limit for one bucket")
		default:
			name := p.name
			if name == "" {
				name = generatedName(r.domain, p.entries)
			}
			if line, taken := names[name]; taken {
				fail("the limit name " + strconv.Quote(name) + " is taken by the descriptor on line " + strconv.Itoa(line))
				continue
			}
			names[name] = p.line
			l := limiter.Limit{Name: name, IDFormat: limiter.String, Params: p.params, Shadow: p.shadow,
				Description: clip("Envoy rate limit of " + label(r.domain, p.entries, limiter.DescriptorEntry{}))}
			rule := limiter.Rule{Domain: r.domain, Descriptor: p.entries, Limit: name}
			p.limit, p.rule = &l, &rule
			limits = append(limits, l)
			rules = append(rules, rule)
			ruled = append(ruled, p)
		}
	}
	return limits, rules, overrides
}

// singleBucket returns the bucket of catcher's limit that every request of
// p falls in, when there is one: p fixes every value that catcher does not.
func singleBucket(catcher, p *pattern) (string, bool) {
	for i, e := range catcher.entries {
		if kindOf(e) != 0 && kindOf(p.entries[i]) != 0 {
			return "", false
		}
	}
	id := catcher.rule.BucketID(p.entries)
	if _, err := limiter.String.Canonical(id); err != nil {
		return "", false
	}
	return id, true
}

func (r *envoyReader) override(catcher *pattern, bucket string, p *pattern, params limiter.Params, unlimited bool) limiter.Override {
	return limiter.Override{Limit: catcher.limit.Name, BucketID: bucket, Params: params, Unlimited: unlimited, Enabled: true,
		Comment: clip("Envoy rate limit of " + label(r.domain, p.entries, limiter.DescriptorEntry{}))}
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
	entry    limiter.DescriptorEntry
	set      bool
	rate     limiter.Params
	limit    string
	shadow   bool
	blocked  bool
	free     bool
	notes    []string
	children []*envoyNode
}

func (n *envoyNode) child(e limiter.DescriptorEntry) *envoyNode {
	for _, c := range n.children {
		if c.entry == e {
			return c
		}
	}
	c := &envoyNode{entry: e}
	n.children = append(n.children, c)
	return c
}

// ExportEnvoy writes the rules of domain as an envoyproxy/ratelimit
// configuration file, each with its limit's rate and name, and the
// overrides of those limits as descriptors with the values of their
// buckets, so that ImportEnvoy of the export changes nothing. What the
// format cannot say is written as a comment: a burst other than the
// count (Envoy's format has none, and an import sets the burst to
// requests_per_unit), a period that is not a whole number of seconds, a
// bucket id that is no value of the rule.
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
	for _, r := range rules {
		byLimit[r.Limit] = append(byLimit[r.Limit], r)
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
	switch n := r.FreeEntries(); {
	case n == 0:
		return nil, false // the bucket is the rule itself
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
		if e.Fixed() {
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
		if n.set {
			writeRateLimit(w, in, n)
		}
		if n.shadow {
			w.line(in, "shadow_mode: true")
		}
		if len(n.children) > 0 {
			w.line(in, "descriptors:")
			writeEnvoyNodes(w, in+2, n.children)
		}
	}
}

func writeRateLimit(w *writer, indent int, n *envoyNode) {
	if n.free {
		w.line(indent, "rate_limit:")
		w.line(indent+2, "unlimited: true")
		return
	}
	unit, mult := envoyUnit(n.rate.Period)
	if unit == "" {
		w.line(indent, "# a period of "+n.rate.Period.String()+" is no whole number of seconds: this rate limit is left out")
		return
	}
	rpu := n.rate.Count
	if n.blocked {
		rpu = 0
	} else if n.rate.Burst != n.rate.Count {
		w.line(indent, "# burst "+strconv.FormatInt(n.rate.Burst, 10)+": Envoy's format has none, and an import sets it to requests_per_unit")
	}
	w.line(indent, "rate_limit:")
	if n.limit != "" {
		w.line(indent+2, "name: "+scalar(n.limit))
	}
	w.line(indent+2, "unit: "+unit)
	if mult > 1 {
		w.line(indent+2, "unit_multiplier: "+strconv.FormatInt(mult, 10))
	}
	w.line(indent+2, "requests_per_unit: "+strconv.FormatInt(rpu, 10))
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
