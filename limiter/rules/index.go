package rules

import (
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// ruleNode is a point in a domain's tree of rules: the rule whose pattern
// ends here, if any, and the patterns that go on, by the key of their next
// entry.
type ruleNode struct {
	rule *limiter.Rule
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

// index is the tree of every domain's rules, built once per change of the
// rules so that matching a descriptor costs a map look-up per entry and a
// walk of its value's bytes per level with wildcards.
type index map[string]*ruleNode

// Index indexes rs, which must be valid and of distinct patterns and are
// not changed afterwards: a snapshot indexes its rules with it
// (limiter.Parsers), and an import places the descriptors of a file with it
// before anything is stored.
func Index(rs []limiter.Rule) limiter.RuleMatcher {
	idx := index{}
	for i := range rs {
		r := &rs[i]
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
func (lv *ruleLevel) child(e limiter.DescriptorEntry) *ruleNode {
	switch kind(e) {
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
func (n *ruleNode) match(entries []limiter.DescriptorEntry) *limiter.Rule {
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
func (t *wildTrie) match(v string, i int, rest []limiter.DescriptorEntry) *limiter.Rule {
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

// Match finds the most specific rule of domain that entries match; ok is
// false when none does.
func (idx index) Match(domain string, entries []limiter.DescriptorEntry) (limiter.Rule, bool) {
	root := idx[domain]
	if root == nil {
		return limiter.Rule{}, false
	}
	found := root.match(entries)
	if found == nil {
		return limiter.Rule{}, false
	}
	return *found, true
}
