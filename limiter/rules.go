package limiter

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// DescriptorEntry is one key and value of a descriptor. In a rule, an empty
// Value matches any value, and a Value with '*' in it is a wildcard, each
// '*' standing for any run of characters (`foo*`, `bar*b`, `a*b*c`), as
// envoyproxy/ratelimit reads it; in a request it is the value the proxy
// sent. Package limiter/rules says what entries mean and bounds them.
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
	// Unread, when not empty, says what of the stored rule this version
	// cannot read: members a newer version wrote. Such a rule is left out
	// of snapshots (LeftOut) rather than applied without them.
	Unread    string
	CreatedAt time.Time
	UpdatedAt time.Time
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
// false when none does. rules.BucketID of the rule and entries is the
// bucket.
func (s *Snapshot) Match(domain string, entries []DescriptorEntry) (r Rule, ok bool) {
	if s.ruleIdx == nil {
		return Rule{}, false // no rule was ever put
	}
	return s.ruleIdx.Match(domain, entries)
}

// RuleMatcher finds the most specific of a set of rules for a descriptor;
// ok is false when none matches. rules.Index builds one.
type RuleMatcher interface {
	Match(domain string, entries []DescriptorEntry) (r Rule, ok bool)
}

// PutRule adds r or replaces the rule with its id. The rule must be valid
// and its limit in the snapshot (ErrNotFound otherwise), which the database
// ensures by refusing to delete a limit that rules use. A rule refused is
// recorded as left out (LeftOut), and its previous version, if any,
// removed.
func (b *Builder) PutRule(r Rule) error {
	err := b.putRule(r)
	if err != nil {
		b.DeleteRule(r.ID)
	}
	b.leave(EntityRule, r.ID, r.Limit, err)
	return err
}

func (b *Builder) putRule(r Rule) error {
	if r.Unread != "" {
		return errors.New("holds what this version cannot read: " + r.Unread)
	}
	if fe := b.snap.parsers.ValidateRule(r); len(fe) > 0 {
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
	b.forget(EntityRule, id)
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
		b.snap.ruleIdx = b.snap.parsers.IndexRules(b.snap.Rules())
		b.rulesChanged = false
	}
	b.rulesOwned = false
}
