package limiter

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Bounds of rules and of the descriptors matched against them. Envoy's own
// descriptors rarely hold more than a handful of entries; the bounds keep a
// hostile request or rule from costing more than a few map look-ups.
const (
	// MaxDescriptorEntries bounds the entries of one descriptor.
	MaxDescriptorEntries = 16
	// MaxReplaces bounds the limits one rule replaces.
	MaxReplaces = 16
	// maxDescriptorText bounds a domain, key or value, as bucket ids are
	// bounded.
	maxDescriptorText = 256
)

// DescriptorEntry is one key and value of a descriptor. In a rule, an empty
// Value matches any value, and a Value with '*' in it is a wildcard, each
// '*' standing for any run of characters (`foo*`, `bar*b`, `a*b*c`), as
// envoyproxy/ratelimit reads it; in a request it is the value the proxy
// sent.
type DescriptorEntry struct {
	Key   string
	Value string
	// Shared, in a rule, makes every value the entry matches count in one
	// bucket (envoyproxy/ratelimit's share_threshold), as a fixed value
	// does; it is only for an entry without a fixed value.
	Shared bool
}

// Rule maps the descriptors of a domain that match its pattern onto a limit:
// the way Envoy's requests reach ratelimitd's buckets.
type Rule struct {
	// ID is opaque to clients.
	ID         string
	Domain     string
	Descriptor []DescriptorEntry
	Limit      string
	// Replaces names limits that this rule takes the place of, as
	// envoyproxy/ratelimit's rate_limit.replaces does: when a request's
	// descriptor matches this rule, its other descriptors whose limits
	// are named here are answered OK and spend nothing. A name need not
	// be a limit that exists; it then replaces nothing.
	Replaces []string
	// QuotaMode is envoyproxy/ratelimit's quota_mode: a descriptor of this
	// rule over its limit does not by itself make the request OVER_LIMIT,
	// unless every quota-mode descriptor of the request is over its limit
	// too.
	QuotaMode bool
	CreatedAt time.Time
	UpdatedAt time.Time
}

// The kinds of match of one rule entry, most specific first.
const (
	matchExact = iota
	matchWildcard
	matchFree
)

// kind says how an entry of a rule matches values.
func (e DescriptorEntry) kind() int {
	switch {
	case e.Value == "":
		return matchFree
	case strings.Contains(e.Value, "*"):
		return matchWildcard
	}
	return matchExact
}

// Fixed reports whether the entry adds nothing to the bucket id: it
// matches one value only, or the values it matches share a bucket.
func (e DescriptorEntry) Fixed() bool { return e.kind() == matchExact || e.Shared }

// FreeEntries counts the entries whose values form the bucket id.
func (r Rule) FreeEntries() int {
	n := 0
	for _, e := range r.Descriptor {
		if !e.Fixed() {
			n++
		}
	}
	return n
}

// Validate returns the field errors of r, named as in the REST API. Whether
// the limit exists and suits the rule is the caller's to check, with
// CheckLimit, since it depends on the limits stored.
func (r Rule) Validate() []FieldError {
	ve := ValidationError{Fields: ValidateDescriptor(r.Domain, r.Descriptor)}
	if msg := NameProblem(r.Limit); msg != "" {
		ve.Add("limit", msg)
	}
	if len(r.Replaces) > MaxReplaces {
		ve.Add("replaces", "must hold at most "+strconv.Itoa(MaxReplaces)+" limit names")
	}
	for i, name := range r.Replaces[:min(len(r.Replaces), MaxReplaces)] {
		field := "replaces[" + strconv.Itoa(i) + "].name"
		if msg := NameProblem(name); msg != "" {
			ve.Add(field, msg)
		} else if slices.Contains(r.Replaces[:i], name) {
			ve.Add(field, "names "+strconv.Quote(name)+" twice")
		}
	}
	return ve.Fields
}

// ValidateDescriptor returns the field errors of a domain and descriptor,
// of a rule or of a request, named as in the REST API.
func ValidateDescriptor(domain string, entries []DescriptorEntry) []FieldError {
	var ve ValidationError
	if msg := DescriptorTextProblem(domain); msg != "" {
		ve.Add("domain", msg)
	}
	if msg := DescriptorSizeProblem(len(entries)); msg != "" {
		ve.Add("descriptor", msg)
	}
	for i, e := range entries {
		field := "descriptor[" + strconv.Itoa(i) + "]"
		if msg := DescriptorTextProblem(e.Key); msg != "" {
			ve.Add(field+".key", msg)
		}
		if e.Value != "" {
			if msg := DescriptorTextProblem(e.Value); msg != "" {
				ve.Add(field+".value", msg)
			}
		}
		if e.Shared && e.kind() == matchExact {
			ve.Add(field+".shared", "is only for an entry without a value or with a wildcard: one value is one bucket anyway")
		}
	}
	return ve.Fields
}

// DescriptorSizeProblem says what is wrong with a descriptor of n
// entries, "" when nothing is.
func DescriptorSizeProblem(n int) string {
	if n == 0 || n > MaxDescriptorEntries {
		return "must hold 1 to " + strconv.Itoa(MaxDescriptorEntries) + " entries"
	}
	return ""
}

// CheckLimit says what keeps limit l from serving r, "" when nothing does:
// several non-fixed values, or none, make a bucket id that only the string
// format accepts.
func (r Rule) CheckLimit(l Limit) string {
	if r.FreeEntries() != 1 && l.IDFormat != String {
		return "the limit's id_format must be string: a rule with no entry or several entries without a fixed value joins their values into the bucket id"
	}
	return ""
}

// DescriptorTextProblem says what is wrong with a domain, key or value of a
// descriptor, "" when nothing is: it must be 1 to 256 bytes of UTF-8
// without control characters, like a bucket id of the string format.
func DescriptorTextProblem(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > maxDescriptorText:
		return "must be at most " + strconv.Itoa(maxDescriptorText) + " bytes"
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.ContainsFunc(s, unicode.IsControl):
		return "must not hold control characters"
	}
	return ""
}

// SameDescriptor reports whether two rules have the same pattern, which
// one domain may hold once: the same keys and values, shared or not.
func (r Rule) SameDescriptor(o Rule) bool {
	return r.Domain == o.Domain && slices.EqualFunc(r.Descriptor, o.Descriptor, func(a, b DescriptorEntry) bool {
		return a.Key == b.Key && a.Value == b.Value
	})
}

// BucketID forms the bucket id of a matched request descriptor from the
// values of the rule's entries that are not fixed: one value as it is, for
// the limit's id format to canonicalise; several joined by '/', each with
// '%' and '/' percent-encoded, so that no two tuples share an id; none,
// "*".
func (r Rule) BucketID(values []DescriptorEntry) string {
	single := r.FreeEntries() == 1
	var b strings.Builder
	n := 0
	for i, e := range r.Descriptor {
		if e.Fixed() {
			continue
		}
		v := values[i].Value
		if single {
			return v
		}
		if n > 0 {
			b.WriteByte('/')
		}
		n++
		for j := 0; j < len(v); j++ {
			switch c := v[j]; c {
			case '%':
				b.WriteString("%25")
			case '/':
				b.WriteString("%2F")
			default:
				b.WriteByte(c)
			}
		}
	}
	if n == 0 {
		return "*"
	}
	return b.String()
}

// ruleNode is a point in a domain's tree of rules: the rule whose pattern
// ends here, if any, and the patterns that go on, by the key of their next
// entry.
type ruleNode struct {
	rule *Rule
	next map[string]*ruleLevel
}

// ruleLevel holds the patterns that go on with one key at one position.
type ruleLevel struct {
	exact map[string]*ruleNode
	// wild holds the wildcard values, in a trie on their literal prefix
	// (the text before the first '*').
	wild *wildTrie
	free *ruleNode
}

// wildTrie is a node of a radix tree of wildcard values on their literal
// prefix: the values whose literal prefix ends here, most specific first,
// and the longer prefixes by the first byte of the rest, each edge holding
// a run of bytes. Looking a value up compares its bytes once, so the cost
// does not grow with the number of prefixes, only with the wildcards that
// share one literal prefix.
type wildTrie struct {
	// label is the run of bytes on the edge into this node.
	label string
	here  []wildValue
	next  map[byte]*wildTrie
}

// wildValue is one wildcard value: its literal parts, split on '*', and
// where a match leads.
type wildValue struct {
	value string
	parts []string
	// literal counts the characters of value that are not '*'.
	literal int
	node    *ruleNode
}

// matches reports whether v fits the wildcard: each '*' stands for any run
// of characters, the empty one included. Taking the first place each
// middle part fits is enough, as a later part can only gain from more
// room.
func (w wildValue) matches(v string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(v) < w.literal || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// ruleIndex is the tree of every domain's rules, built once per change of
// the rules so that matching a descriptor costs a map look-up per entry
// and a walk of its value's bytes per level with wildcards.
type ruleIndex map[string]*ruleNode

func buildRuleIndex(rules map[string]*Rule) ruleIndex {
	idx := ruleIndex{}
	for _, r := range rules {
		n := idx[r.Domain]
		if n == nil {
			n = &ruleNode{}
			idx[r.Domain] = n
		}
		for _, e := range r.Descriptor {
			if n.next == nil {
				n.next = map[string]*ruleLevel{}
			}
			lv := n.next[e.Key]
			if lv == nil {
				lv = &ruleLevel{}
				n.next[e.Key] = lv
			}
			n = lv.child(e)
		}
		n.rule = r
	}
	for _, root := range idx {
		root.sortWildcards()
	}
	return idx
}

// child returns the node an entry leads to, making it when missing.
func (lv *ruleLevel) child(e DescriptorEntry) *ruleNode {
	switch e.kind() {
	case matchExact:
		if lv.exact == nil {
			lv.exact = map[string]*ruleNode{}
		}
		if lv.exact[e.Value] == nil {
			lv.exact[e.Value] = &ruleNode{}
		}
		return lv.exact[e.Value]
	case matchWildcard:
		if lv.wild == nil {
			lv.wild = &wildTrie{}
		}
		prefix, _, _ := strings.Cut(e.Value, "*")
		t := lv.wild.at(prefix)
		for _, w := range t.here {
			if w.value == e.Value {
				return w.node
			}
		}
		w := wildValue{value: e.Value, parts: strings.Split(e.Value, "*"),
			literal: len(e.Value) - strings.Count(e.Value, "*"), node: &ruleNode{}}
		t.here = append(t.here, w)
		return w.node
	}
	if lv.free == nil {
		lv.free = &ruleNode{}
	}
	return lv.free
}

// at returns the node of a literal prefix, splitting an edge or adding one
// when the prefix ends or leaves the tree in the middle of an edge.
func (t *wildTrie) at(prefix string) *wildTrie {
	for prefix != "" {
		c := t.next[prefix[0]]
		if c == nil {
			c = &wildTrie{label: prefix}
			if t.next == nil {
				t.next = map[byte]*wildTrie{}
			}
			t.next[prefix[0]] = c
			return c
		}
		n := 0
		for n < len(c.label) && n < len(prefix) && c.label[n] == prefix[n] {
			n++
		}
		if n < len(c.label) {
			// The edge goes on past the common part: split it there.
			mid := &wildTrie{label: c.label[:n], next: map[byte]*wildTrie{c.label[n]: c}}
			c.label = c.label[n:]
			t.next[prefix[0]] = mid
			c = mid
		}
		t, prefix = c, prefix[n:]
	}
	return t
}

func (n *ruleNode) sortWildcards() {
	for _, lv := range n.next {
		for _, c := range lv.exact {
			c.sortWildcards()
		}
		if lv.wild != nil {
			lv.wild.sort()
		}
		if lv.free != nil {
			lv.free.sortWildcards()
		}
	}
}

// sort orders the wildcards sharing a literal prefix most specific first:
// more literal characters, then byte order, so that the choice never
// depends on the order rules were made in.
func (t *wildTrie) sort() {
	slices.SortFunc(t.here, func(a, b wildValue) int {
		if a.literal != b.literal {
			return b.literal - a.literal
		}
		return strings.Compare(a.value, b.value)
	})
	for _, w := range t.here {
		w.node.sortWildcards()
	}
	for _, c := range t.next {
		c.sort()
	}
}

// match finds the most specific rule for the entries from position i on:
// trying an exact value before wildcards (the longest literal prefix
// first) before a free entry, and backtracking only when a branch has no
// rule of the right length, so that the first rule found is the most
// specific comparing entries from the first.
func (n *ruleNode) match(entries []DescriptorEntry) *Rule {
	if len(entries) == 0 {
		return n.rule
	}
	lv := n.next[entries[0].Key]
	if lv == nil {
		return nil
	}
	v, rest := entries[0].Value, entries[1:]
	if c := lv.exact[v]; c != nil {
		if r := c.match(rest); r != nil {
			return r
		}
	}
	if lv.wild != nil {
		if r := lv.wild.match(v, 0, rest); r != nil {
			return r
		}
	}
	if lv.free != nil {
		return lv.free.match(rest)
	}
	return nil
}

// match tries the wildcards whose literal prefix is a prefix of v, from
// the node that ends at v[:i] down: the deeper ones first.
func (t *wildTrie) match(v string, i int, rest []DescriptorEntry) *Rule {
	if i < len(v) {
		if c := t.next[v[i]]; c != nil && strings.HasPrefix(v[i:], c.label) {
			if r := c.match(v, i+len(c.label), rest); r != nil {
				return r
			}
		}
	}
	for _, w := range t.here {
		if w.matches(v) {
			if r := w.node.match(rest); r != nil {
				return r
			}
		}
	}
	return nil
}

// Rules returns every rule, sorted by domain, then id.
func (s *Snapshot) Rules() []Rule {
	out := make([]Rule, 0, len(s.rules))
	for _, r := range s.rules {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Rule) int {
		if c := strings.Compare(a.Domain, b.Domain); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Match finds the most specific rule of domain that entries match; ok is
// false when none does. The rule's BucketID of entries is the bucket.
func (s *Snapshot) Match(domain string, entries []DescriptorEntry) (r Rule, ok bool) {
	return s.ruleIdx.match(domain, entries)
}

// Matcher finds the most specific of a set of rules for a descriptor, as
// a snapshot does, without limits: an import places the descriptors of a
// file with it before anything is stored.
type Matcher struct{ idx ruleIndex }

// NewMatcher indexes rules, which must be valid and of distinct patterns.
func NewMatcher(rules []Rule) Matcher {
	m := make(map[string]*Rule, len(rules))
	for i := range rules {
		m[strconv.Itoa(i)] = &rules[i]
	}
	return Matcher{idx: buildRuleIndex(m)}
}

// Match finds the most specific rule of domain that entries match; ok is
// false when none does.
func (m Matcher) Match(domain string, entries []DescriptorEntry) (Rule, bool) {
	return m.idx.match(domain, entries)
}

func (idx ruleIndex) match(domain string, entries []DescriptorEntry) (r Rule, ok bool) {
	root := idx[domain]
	if root == nil {
		return Rule{}, false
	}
	found := root.match(entries)
	if found == nil {
		return Rule{}, false
	}
	return *found, true
}

// PutRule adds r or replaces the rule with its id. The rule must be valid
// and its limit in the snapshot (ErrNotFound otherwise), which the database
// ensures by refusing to delete a limit that rules use.
func (b *Builder) PutRule(r Rule) error {
	if fe := r.Validate(); len(fe) > 0 {
		return fmt.Errorf("rule %q: %w", r.ID, &ValidationError{Fields: fe})
	}
	if _, ok := b.snap.byName[r.Limit]; !ok {
		return fmt.Errorf("rule %q of unknown limit %q: %w", r.ID, r.Limit, ErrNotFound)
	}
	b.ownRules()
	r.Descriptor, r.Replaces = slices.Clone(r.Descriptor), slices.Clone(r.Replaces)
	b.snap.rules[r.ID] = &r
	return nil
}

// DeleteRule removes the rule with the id, if any.
func (b *Builder) DeleteRule(id string) {
	if _, ok := b.snap.rules[id]; !ok {
		return
	}
	b.ownRules()
	delete(b.snap.rules, id)
}

// ownRules copies the rules before the first change; the index is rebuilt
// when the snapshot is taken, which is cheap as rules are few.
func (b *Builder) ownRules() {
	if !b.rulesOwned {
		b.snap.rules = maps.Clone(b.snap.rules)
		if b.snap.rules == nil {
			b.snap.rules = map[string]*Rule{}
		}
		b.rulesOwned = true
	}
	b.rulesChanged = true
}

// indexRules rebuilds the rule index if the rules changed since the last
// snapshot.
func (b *Builder) indexRules() {
	if b.rulesChanged {
		b.snap.ruleIdx = buildRuleIndex(b.snap.rules)
		b.rulesChanged = false
	}
	b.rulesOwned = false
}
