// Package rules holds what a rule of descriptors means beyond its data:
// the bounds of domains, keys and values, a rule's validation, which of
// its entries form the bucket id, and the index that finds the most
// specific rule for a descriptor. It is a leaf: the engine does not import
// it, but a snapshot is handed Validate and Index as limiter.Parsers.
package rules

import (
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimitd/limiter"
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

// The kinds of match of one rule entry, most specific first.
const (
	matchExact = iota
	matchWildcard
	matchFree
)

// kind says how an entry of a rule matches values.
func kind(e limiter.DescriptorEntry) int {
	switch {
	case e.Value == "":
		return matchFree
	case strings.Contains(e.Value, "*"):
		return matchWildcard
	}
	return matchExact
}

// Fixed reports whether the entry of a rule adds nothing to the bucket id:
// it matches one value only, or the values it matches share a bucket.
func Fixed(e limiter.DescriptorEntry) bool { return kind(e) == matchExact || e.Shared }

// FreeEntries counts the entries of r whose values form the bucket id.
func FreeEntries(r limiter.Rule) int {
	n := 0
	for _, e := range r.Descriptor {
		if !Fixed(e) {
			n++
		}
	}
	return n
}

// SelfReplaced words a rule that would replace its own limit, which
// envoyproxy/ratelimit refuses in its files ("replaces should not contain
// name of same descriptor"): its descriptors would replace themselves.
const SelfReplaced = "names the rule's own limit: a rule cannot replace itself (envoyproxy/ratelimit refuses it too)"

// Validate returns the field errors of r, named as in the REST API. Whether
// the limit exists and suits the rule is the caller's to check, with
// CheckLimit, since it depends on the limits stored.
func Validate(r limiter.Rule) []limiter.FieldError {
	ve := limiter.ValidationError{Fields: ValidateDescriptor(r.Domain, r.Descriptor)}
	if msg := limiter.NameProblem(r.Limit); msg != "" {
		ve.Add("limit", msg)
	}
	if len(r.Replaces) > MaxReplaces {
		ve.Add("replaces", "must hold at most "+strconv.Itoa(MaxReplaces)+" limit names")
	}
	for i, name := range r.Replaces[:min(len(r.Replaces), MaxReplaces)] {
		field := "replaces[" + strconv.Itoa(i) + "].name"
		switch {
		case limiter.NameProblem(name) != "":
			ve.Add(field, limiter.NameProblem(name))
		case slices.Contains(r.Replaces[:i], name):
			ve.Add(field, "names "+strconv.Quote(name)+" twice")
		case name == r.Limit:
			ve.Add(field, SelfReplaced)
		}
	}
	return ve.Fields
}

// ValidateDescriptor returns the field errors of a domain and descriptor,
// of a rule or of a request, named as in the REST API.
func ValidateDescriptor(domain string, entries []limiter.DescriptorEntry) []limiter.FieldError {
	var ve limiter.ValidationError
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
		if e.Shared && kind(e) == matchExact {
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
// a concurrency limit, whose leases a ShouldRateLimit call cannot hold
// (nothing would release them); or several non-fixed values, or none,
// which make a bucket id that only the string format accepts.
func CheckLimit(r limiter.Rule, l limiter.Limit) string {
	if l.KindOf() == limiter.KindConcurrency {
		return "is a concurrency limit: Envoy's ShouldRateLimit cannot acquire and release leases; a rule needs a rate limit or a calendar quota"
	}
	if FreeEntries(r) != 1 && l.IDFormat != limiter.String {
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
func SameDescriptor(r, o limiter.Rule) bool {
	return r.Domain == o.Domain && slices.EqualFunc(r.Descriptor, o.Descriptor, func(a, b limiter.DescriptorEntry) bool {
		return a.Key == b.Key && a.Value == b.Value
	})
}

// BucketID forms the bucket id of a request descriptor that rule r matched
// from the values of the rule's entries that are not fixed: one value as it is, for
// the limit's id format to canonicalise; several joined by '/', each with
// '%' and '/' percent-encoded, so that no two tuples share an id; none,
// "*".
func BucketID(r limiter.Rule, values []limiter.DescriptorEntry) string {
	single := FreeEntries(r) == 1
	var b strings.Builder
	n := 0
	for i, e := range r.Descriptor {
		if Fixed(e) {
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
