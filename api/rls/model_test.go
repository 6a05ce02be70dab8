package rls_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limitfile"
)

// The model's vocabulary: few domains, keys and values, so that random
// rules overlap and random descriptors match several of them at once.
var (
	modelDomains = []string{"d1", "d2"}
	modelKeys    = []string{"x", "y"}
	// modelValues are the values of descriptors and of exact rule
	// entries; '/' and '%' make bucket ids that would collide were they
	// not percent-encoded: ("a/b", "a") and ("a", "b/a"), "a/b" and
	// "a%2Fb".
	modelValues = []string{"a", "ab", "abc", "b", "ba", "acb", "a/b", "b/a", "a%2Fb"}
	// modelWildcards share literal prefixes and differ in literal count,
	// to exercise every step of the precedence among wildcards.
	modelWildcards = []string{"a*", "*b", "a*b", "a*b*c", "ab*", "*a", "a*c", "*"}
)

// Every limit has burst modelBurst, which no bucket of a sequence of
// modelSteps operations comes near, and refills one request in ten
// minutes (modelCount a week), more than a sequence lasts: a bucket's
// remaining is its burst less its hits, on the wall clock.
const (
	modelBurst = 10000
	modelCount = 1000
	modelSteps = 300
)

// ruleOpKind is the kind of one operation of a sequence.
type ruleOpKind int

const (
	opCreateRule ruleOpKind = iota
	opDeleteRule
	opDecide
	// opImport imports an Envoy configuration of rules, replacing its
	// domain's or merged into them.
	opImport
)

// ruleOp is one operation. A rule is named by its limit, which is its own,
// so that a sequence stays meaningful when shrinking drops operations.
type ruleOp struct {
	kind   ruleOpKind
	domain string
	limit  string
	// entries is the rule's pattern (create).
	entries []limiter.DescriptorEntry
	// descriptors and their hits_addend, nil for none (decide).
	descriptors [][]limiter.DescriptorEntry
	hits        []*uint64
	// imported are the rules of an import's file, each with a limit of its
	// own named by its rate_limit.name; merge adds them to the domain's.
	imported []limiter.Rule
	merge    bool
}

func (o ruleOp) String() string {
	switch o.kind {
	case opCreateRule:
		return fmt.Sprintf("create rule %s %s -> %s", o.domain, entriesText(o.entries), o.limit)
	case opDeleteRule:
		return "delete rule of " + o.limit
	case opImport:
		return fmt.Sprintf("import merge=%v:\n\t%s", o.merge, strings.ReplaceAll(strings.TrimSpace(envoyDoc(o)), "\n", "\n\t"))
	}
	var ds []string
	for i, d := range o.descriptors {
		s := entriesText(d)
		if o.hits[i] != nil {
			s += " hits " + strconv.FormatUint(*o.hits[i], 10)
		}
		ds = append(ds, s)
	}
	return fmt.Sprintf("ShouldRateLimit %s %s", o.domain, strings.Join(ds, ", "))
}

func entriesText(es []limiter.DescriptorEntry) string {
	var parts []string
	for _, e := range es {
		s := e.Key + "=" + strconv.Quote(e.Value)
		if e.Shared {
			s += " shared"
		}
		parts = append(parts, s)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// ruleModel is what the documentation says the service holds: the live
// rules and the hits of each bucket.
type ruleModel struct {
	rules []limiter.Rule
	hits  map[[2]string]uint64 // by limit and bucket id
	// contested counts the descriptors that several rules matched, and
	// matched those that one or more did: the log shows that a sequence
	// tested precedence at all. imports and refused count the imports and
	// those refused.
	contested, matched int
	imports, refused   int
	// twins counts the requests also sent to forward auth, compared
	// header for header with ShouldRateLimit's answer.
	twins, compared int
}

// ruleGenerator makes random operations from a seed, biased towards
// descriptors whose keys some live rule has.
type ruleGenerator struct {
	r *rand.Rand
	n int
}

func (g *ruleGenerator) next(m *ruleModel) ruleOp {
	g.n++
	switch p := g.r.IntN(12); {
	case p < 3:
		return g.create()
	case p < 4 && len(m.rules) > 0:
		return ruleOp{kind: opDeleteRule, limit: m.rules[g.r.IntN(len(m.rules))].Limit}
	case p < 5:
		return g.importFile(m)
	}
	return g.decide(m)
}

// importFile makes an import of one to three rules of a domain, merged
// into its rules or replacing them; a merged rule's top-level entry is
// often one the domain has, which the merge must refuse, and a file
// sometimes holds one descriptor twice, which it must refuse too.
func (g *ruleGenerator) importFile(m *ruleModel) ruleOp {
	o := ruleOp{kind: opImport, domain: modelDomains[g.r.IntN(len(modelDomains))], merge: g.r.IntN(3) > 0}
	for i := range 1 + g.r.IntN(3) {
		r := limiter.Rule{Domain: o.domain, Limit: "L" + strconv.Itoa(g.n) + "i" + strconv.Itoa(i)}
		for range 1 + g.r.IntN(3) {
			e := g.entry()
			r.Descriptor = append(r.Descriptor, e)
		}
		var domainRules []limiter.Rule
		for _, x := range m.rules {
			if x.Domain == o.domain {
				domainRules = append(domainRules, x)
			}
		}
		switch n := g.r.IntN(6); {
		case n < 2 && len(domainRules) > 0:
			top := domainRules[g.r.IntN(len(domainRules))].Descriptor[0]
			r.Descriptor[0] = limiter.DescriptorEntry{Key: top.Key, Value: top.Value}
		case n == 2 && len(o.imported) > 0:
			r.Descriptor = slices.Clone(o.imported[0].Descriptor)
		}
		o.imported = append(o.imported, r)
	}
	return o
}

// envoyDoc writes an import's file: its rules as a tree of descriptors,
// each limit of burst modelBurst and count modelCount a week, as the
// rules created over REST have.
func envoyDoc(o ruleOp) string {
	type node struct {
		entry    limiter.DescriptorEntry
		limit    string
		children []*node
	}
	// at finds, or makes, the node of entries under root.
	at := func(root *node, entries []limiter.DescriptorEntry) *node {
		n := root
		for _, e := range entries {
			i := slices.IndexFunc(n.children, func(c *node) bool { return c.entry == e })
			if i < 0 {
				n.children = append(n.children, &node{entry: e})
				i = len(n.children) - 1
			}
			n = n.children[i]
		}
		return n
	}
	// A descriptor the file holds twice goes under a tree of its own, as
	// a sibling, which the import refuses.
	roots := []*node{{}}
	for _, r := range o.imported {
		for i := 0; ; i++ {
			if i == len(roots) {
				roots = append(roots, &node{})
			}
			if n := at(roots[i], r.Descriptor); n.limit == "" {
				n.limit = r.Limit
				break
			}
		}
	}
	var b strings.Builder
	b.WriteString("domain: " + o.domain + "\ndescriptors:\n")
	var write func(n *node, indent string)
	write = func(n *node, indent string) {
		b.WriteString(indent + "- key: " + strconv.Quote(n.entry.Key) + "\n")
		if n.entry.Value != "" {
			b.WriteString(indent + "  value: " + strconv.Quote(n.entry.Value) + "\n")
		}
		if n.limit != "" {
			fmt.Fprintf(&b, "%s  rate_limit: {name: %s, unit: week, requests_per_unit: %d}\n", indent, n.limit, modelCount)
			fmt.Fprintf(&b, "%s  metadata: {ratelimitd: {burst: %d}}\n", indent, modelBurst)
		}
		if len(n.children) > 0 {
			b.WriteString(indent + "  descriptors:\n")
			for _, c := range n.children {
				write(c, indent+"    ")
			}
		}
	}
	for _, root := range roots {
		for _, c := range root.children {
			write(c, "  ")
		}
	}
	return b.String()
}

// importRefused says why the documentation refuses an import, "" when it
// writes it: a descriptor twice in the file, or, for a merge, a top-level
// descriptor of the file that the domain has.
func (m *ruleModel) importRefused(o ruleOp) string {
	same := func(a, b limiter.DescriptorEntry) bool { return a.Key == b.Key && a.Value == b.Value }
	for i, r := range o.imported {
		for _, x := range o.imported[:i] {
			if slices.EqualFunc(r.Descriptor, x.Descriptor, same) {
				return "the file holds " + entriesText(r.Descriptor) + " twice"
			}
		}
	}
	if !o.merge {
		return ""
	}
	for _, r := range o.imported {
		for _, x := range m.rules {
			if x.Domain == o.domain && same(r.Descriptor[0], x.Descriptor[0]) {
				return "the domain has " + entriesText(r.Descriptor[:1]) + " already"
			}
		}
	}
	return ""
}

// entry draws a rule's descriptor entry: a key, with a value, a wildcard
// or no value, each as often.
func (g *ruleGenerator) entry() limiter.DescriptorEntry {
	e := limiter.DescriptorEntry{Key: modelKeys[g.r.IntN(len(modelKeys))]}
	switch g.r.IntN(3) {
	case 0:
		e.Value = modelValues[g.r.IntN(len(modelValues))]
	case 1:
		e.Value = modelWildcards[g.r.IntN(len(modelWildcards))]
	}
	return e
}

func (g *ruleGenerator) create() ruleOp {
	o := ruleOp{kind: opCreateRule, domain: modelDomains[g.r.IntN(len(modelDomains))], limit: "L" + strconv.Itoa(g.n)}
	for range 1 + g.r.IntN(3) {
		e := g.entry()
		if !isExact(e) && g.r.IntN(4) == 0 {
			e.Shared = true
		}
		o.entries = append(o.entries, e)
	}
	return o
}

func (g *ruleGenerator) decide(m *ruleModel) ruleOp {
	o := ruleOp{kind: opDecide, domain: modelDomains[g.r.IntN(len(modelDomains))]}
	for range 1 + g.r.IntN(3) {
		var keys []string
		if len(m.rules) > 0 && g.r.IntN(4) > 0 {
			r := m.rules[g.r.IntN(len(m.rules))]
			o.domain = r.Domain
			for _, e := range r.Descriptor {
				keys = append(keys, e.Key)
			}
		} else {
			for range 1 + g.r.IntN(3) {
				keys = append(keys, modelKeys[g.r.IntN(len(modelKeys))])
			}
		}
		var d []limiter.DescriptorEntry
		for _, k := range keys {
			d = append(d, limiter.DescriptorEntry{Key: k, Value: modelValues[g.r.IntN(len(modelValues))]})
		}
		var h *uint64
		if g.r.IntN(5) == 0 {
			n := g.r.Uint64N(4)
			h = &n
		}
		o.descriptors = append(o.descriptors, d)
		o.hits = append(o.hits, h)
	}
	return o
}

func isExact(e limiter.DescriptorEntry) bool {
	return e.Value != "" && !strings.Contains(e.Value, "*")
}

// wildcardMatches says whether v fits pattern p, each '*' any run of
// characters, the empty one included: by recursion, as plainly as it
// can be said.
func wildcardMatches(p, v string) bool {
	if p == "" {
		return v == ""
	}
	if p[0] == '*' {
		for i := 0; i <= len(v); i++ {
			if wildcardMatches(p[1:], v[i:]) {
				return true
			}
		}
		return false
	}
	return v != "" && p[0] == v[0] && wildcardMatches(p[1:], v[1:])
}

// entryMatches says whether a rule entry matches a descriptor entry.
func entryMatches(e, d limiter.DescriptorEntry) bool {
	switch {
	case e.Key != d.Key:
		return false
	case e.Value == "":
		return true
	case strings.Contains(e.Value, "*"):
		return wildcardMatches(e.Value, d.Value)
	}
	return e.Value == d.Value
}

// compareEntries orders two rule entries that match one value, most
// specific first: an exact value, then wildcards (the longer literal
// prefix, then more literal characters, then byte order), then no value.
func compareEntries(a, b limiter.DescriptorEntry) int {
	rank := func(e limiter.DescriptorEntry) int {
		switch {
		case isExact(e):
			return 0
		case e.Value != "":
			return 1
		}
		return 2
	}
	if c := rank(a) - rank(b); c != 0 || rank(a) != 1 {
		return c
	}
	pa, _, _ := strings.Cut(a.Value, "*")
	pb, _, _ := strings.Cut(b.Value, "*")
	if len(pa) != len(pb) {
		return len(pb) - len(pa)
	}
	la, lb := len(a.Value)-strings.Count(a.Value, "*"), len(b.Value)-strings.Count(b.Value, "*")
	if la != lb {
		return lb - la
	}
	return strings.Compare(a.Value, b.Value)
}

// match brute-forces the rules a descriptor matches and picks the most
// specific, comparing entries from the first.
func (m *ruleModel) match(domain string, d []limiter.DescriptorEntry) (limiter.Rule, bool) {
	var best limiter.Rule
	found, candidates := false, 0
	for _, r := range m.rules {
		if r.Domain != domain || len(r.Descriptor) != len(d) {
			continue
		}
		ok := true
		for i, e := range r.Descriptor {
			ok = ok && entryMatches(e, d[i])
		}
		if !ok {
			continue
		}
		candidates++
		if !found || slices.CompareFunc(r.Descriptor, best.Descriptor, compareEntries) < 0 {
			best, found = r, true
		}
	}
	if candidates > 1 {
		m.contested++
	}
	if found {
		m.matched++
	}
	return best, found
}

// bucketOf forms the bucket id from the values of the entries that are not
// fixed (an exact value or a shared entry is): one as it is, several
// joined by '/' with '%' and '/' percent-encoded, none "*".
func bucketOf(r limiter.Rule, d []limiter.DescriptorEntry) string {
	var vals []string
	for i, e := range r.Descriptor {
		if !isExact(e) && !e.Shared {
			vals = append(vals, d[i].Value)
		}
	}
	switch len(vals) {
	case 0:
		return "*"
	case 1:
		return vals[0]
	}
	for i, v := range vals {
		vals[i] = strings.NewReplacer("%", "%25", "/", "%2F").Replace(v)
	}
	return strings.Join(vals, "/")
}

// ruleDriver applies operations to the real service and checks each
// answer against the model.
type ruleDriver struct {
	e   *env
	ids map[string]string // rule id by limit name
	m   *ruleModel
}

// apply runs o on the service and the model; it returns a description of
// the first difference, "" when they agree.
func (d *ruleDriver) apply(o ruleOp) string {
	ctx := context.Background()
	switch o.kind {
	case opCreateRule:
		l := limiter.Limit{Name: o.limit, IDFormat: limiter.String, Params: limiter.Params{Burst: modelBurst, Count: modelCount, Period: 7 * 24 * time.Hour}}
		if _, _, err := d.e.db.PutLimit(ctx, "test", l); err != nil {
			return "creating limit " + o.limit + ": " + err.Error()
		}
		r := limiter.Rule{Domain: o.domain, Limit: o.limit, Descriptor: o.entries}
		got, err := d.e.db.CreateRule(ctx, "test", r)
		exists := slices.ContainsFunc(d.m.rules, func(x limiter.Rule) bool {
			return x.Domain == r.Domain && slices.EqualFunc(x.Descriptor, r.Descriptor, func(a, b limiter.DescriptorEntry) bool {
				return a.Key == b.Key && a.Value == b.Value
			})
		})
		switch {
		case exists && !errors.Is(err, limiter.ErrRuleExists):
			return fmt.Sprintf("a rule of that domain and descriptor exists: want ErrRuleExists, got %v", err)
		case !exists && err != nil:
			return "creating the rule: " + err.Error()
		case !exists:
			d.ids[o.limit] = got.ID
			d.m.rules = append(d.m.rules, r)
			// The twin of forward auth: the same pattern in the twin
			// domain, on a limit of its own, so that its buckets are
			// spent by forward-auth calls only.
			tl := l
			tl.Name = twin(o.limit)
			if _, _, err := d.e.db.PutLimit(ctx, "test", tl); err != nil {
				return "creating limit " + tl.Name + ": " + err.Error()
			}
			tr, err := d.e.db.CreateRule(ctx, "test", limiter.Rule{Domain: twin(o.domain), Limit: tl.Name, Descriptor: o.entries})
			if err != nil {
				return "creating the twin rule: " + err.Error()
			}
			d.ids[tl.Name] = tr.ID
		}
	case opDeleteRule:
		i := slices.IndexFunc(d.m.rules, func(r limiter.Rule) bool { return r.Limit == o.limit })
		if i < 0 {
			return "" // its creation was dropped, or it failed
		}
		for _, name := range []string{o.limit, twin(o.limit)} {
			if err := d.e.db.DeleteRule(ctx, "test", d.ids[name]); err != nil {
				return "deleting the rule of " + name + ": " + err.Error()
			}
		}
		d.m.rules = slices.Delete(d.m.rules, i, i+1)
	case opDecide:
		return d.decide(o)
	case opImport:
		if msg := d.importFile(o); msg != "" {
			return msg
		}
	}
	if err := d.e.loader.Sync(ctx); err != nil {
		return "sync: " + err.Error()
	}
	return ""
}

// importFile imports o's file through the importer that the REST API
// and the command line share, and its twin (twin domain, twin limits),
// and checks that each is refused exactly when the model says so.
func (d *ruleDriver) importFile(o ruleOp) string {
	ctx := context.Background()
	refused := d.m.importRefused(o)
	d.m.imports++
	if refused != "" {
		d.m.refused++
	}
	tw := o
	tw.domain, tw.imported = twin(o.domain), slices.Clone(o.imported)
	for i := range tw.imported {
		tw.imported[i].Domain, tw.imported[i].Limit = tw.domain, twin(tw.imported[i].Limit)
	}
	for _, op := range []ruleOp{o, tw} {
		_, errs, err := limitfile.ImportEnvoy(ctx, d.e.db, "test", []byte(envoyDoc(op)), limitfile.ImportOptions{Merge: op.merge})
		switch {
		case err != nil:
			return "import: " + err.Error()
		case refused != "" && len(errs) == 0:
			return "the import of " + op.domain + " was written, though " + refused
		case refused == "" && len(errs) > 0:
			return fmt.Sprintf("the import of %s was refused: %v", op.domain, errs)
		case refused != "":
			continue
		}
		stored, err := d.e.db.ListRules(ctx, op.domain)
		if err != nil {
			return "listing the rules: " + err.Error()
		}
		for _, r := range stored {
			d.ids[r.Limit] = r.ID
		}
	}
	if refused != "" {
		return ""
	}
	if !o.merge {
		d.m.rules = slices.DeleteFunc(d.m.rules, func(r limiter.Rule) bool { return r.Domain == o.domain })
	}
	d.m.rules = append(d.m.rules, o.imported...)
	return ""
}

func (d *ruleDriver) decide(o ruleOp) string {
	req := &rlsv3.RateLimitRequest{Domain: o.domain}
	type target struct {
		rule   limiter.Rule
		bucket [2]string
		ok     bool
	}
	targets := make([]target, len(o.descriptors))
	spend := map[[2]string]uint64{}
	for i, es := range o.descriptors {
		pd := &extv3.RateLimitDescriptor{}
		for _, e := range es {
			pd.Entries = append(pd.Entries, &extv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		cost := uint64(1)
		if o.hits[i] != nil {
			pd.HitsAddend = wrapperspb.UInt64(*o.hits[i])
			cost = *o.hits[i]
		}
		req.Descriptors = append(req.Descriptors, pd)
		if r, ok := d.m.match(o.domain, es); ok {
			b := [2]string{r.Limit, bucketOf(r, es)}
			targets[i] = target{r, b, true}
			spend[b] += cost
		}
	}
	res, err := d.e.call(req)
	if err != nil {
		return "ShouldRateLimit: " + err.Error()
	}
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(res.GetStatuses()) != len(o.descriptors) {
		return fmt.Sprintf("want OK with %d statuses, got %v with %d", len(o.descriptors), res.GetOverallCode(), len(res.GetStatuses()))
	}
	for b, n := range spend {
		d.m.hits[b] += n
	}
	for i, st := range res.GetStatuses() {
		t := targets[i]
		switch {
		case st.GetCode() != rlsv3.RateLimitResponse_OK:
			return fmt.Sprintf("descriptors[%d]: want OK, got %v", i, st.GetCode())
		case !t.ok && st.GetCurrentLimit() != nil:
			return fmt.Sprintf("descriptors[%d]: the model matches no rule, the service answers limit %q", i, st.GetCurrentLimit().GetName())
		case !t.ok:
		case st.GetCurrentLimit().GetName() != t.rule.Limit:
			return fmt.Sprintf("descriptors[%d]: want the rule %s -> %s (bucket %q), got limit %q",
				i, entriesText(t.rule.Descriptor), t.rule.Limit, t.bucket[1], st.GetCurrentLimit().GetName())
		case uint64(st.GetLimitRemaining()) != modelBurst-d.m.hits[t.bucket]:
			return fmt.Sprintf("descriptors[%d]: rule %s -> %s, bucket %q: want remaining %d, got %d",
				i, entriesText(t.rule.Descriptor), t.rule.Limit, t.bucket[1], modelBurst-d.m.hits[t.bucket], st.GetLimitRemaining())
		}
	}
	if slices.ContainsFunc(o.hits, func(h *uint64) bool { return h != nil && *h != 1 }) {
		return "" // forward auth spends 1 a descriptor
	}
	return d.forwardAuth(o, spend, res)
}

// twin names the twin of a limit or domain, which forward auth spends.
func twin(name string) string { return "T" + name }

// forwardAuth sends the twin of a ShouldRateLimit request to the
// forward-auth route, each descriptor a d of literals, on the twin rules,
// whose buckets have had the same spends; its answer must render the
// same result as the gRPC one: the same RateLimit headers (but for the
// limits' names), which the model's remaining bounds.
func (d *ruleDriver) forwardAuth(o ruleOp, spend map[[2]string]uint64, grpcRes *rlsv3.RateLimitResponse) string {
	q := url.Values{}
	for _, es := range o.descriptors {
		var parts []string
		for _, e := range es {
			parts = append(parts, e.Key+"="+e.Value)
		}
		q.Add("d", strings.Join(parts, ","))
	}
	req, err := http.NewRequest(http.MethodGet, d.e.forwardAuth+"/v1/forward-auth/"+twin(o.domain)+"?"+q.Encode(), nil)
	if err != nil {
		return err.Error()
	}
	req.Header.Set("X-Ratelimit-Authorization", "Bearer "+d.e.admin)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return "forward auth: " + err.Error()
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Sprintf("forward auth of the twin request: %d %s", res.StatusCode, body)
	}
	d.m.twins++
	least, same := uint64(math.MaxUint64), true
	for b, n := range spend {
		tb := [2]string{twin(b[0]), b[1]}
		d.m.hits[tb] += n
		least = min(least, modelBurst-d.m.hits[tb])
		same = same && d.m.hits[tb] == d.m.hits[b]
	}
	if len(spend) > 0 && !strings.Contains(res.Header.Get("Ratelimit"), ";r="+strconv.FormatUint(least, 10)+";") {
		return fmt.Sprintf("forward auth of the twin request: RateLimit %q, the model's fewest left %d", res.Header.Get("Ratelimit"), least)
	}
	if !same {
		// A request of other hits spent the gRPC buckets alone.
		return ""
	}
	d.m.compared++
	want := map[string]string{}
	for _, h := range grpcRes.GetResponseHeadersToAdd() {
		// The gRPC answer names limit L, the twin TL.
		want[http.CanonicalHeaderKey(h.GetKey())] = strings.Replace(h.GetValue(), `"`, `"T`, 1)
	}
	for _, k := range []string{"Ratelimit", "Ratelimit-Policy", "Retry-After"} {
		if got := res.Header.Get(k); got != want[k] {
			return fmt.Sprintf("forward auth of the twin request: %s %q, where ShouldRateLimit's is %q", k, got, want[k])
		}
	}
	return ""
}

// runRules runs ops, or as many as next makes, on a fresh env and model;
// it returns the operations run and the index and description of the first
// mismatch, or -1.
func runRules(t *testing.T, eng engine, n int, next func(*ruleModel) ruleOp) ([]ruleOp, int, string, *ruleModel) {
	t.Helper()
	d := &ruleDriver{e: newEnv(t, eng, envOptions{}), ids: map[string]string{}, m: &ruleModel{hits: map[[2]string]uint64{}}}
	var ops []ruleOp
	for i := range n {
		ops = append(ops, next(d.m))
		if msg := d.apply(ops[i]); msg != "" {
			return ops, i, msg, d.m
		}
	}
	return ops, -1, "", d.m
}

// shrinkRules drops ever smaller runs of operations, then single
// descriptors of requests, while a replay on a fresh env still fails, and
// cuts the sequence after the failing operation.
func shrinkRules(t *testing.T, eng engine, ops []ruleOp, msg string) ([]ruleOp, string) {
	deadline := time.Now().Add(time.Minute)
	for chunk := len(ops) / 2; chunk >= 1 && time.Now().Before(deadline); {
		removed := false
		for start := 0; start < len(ops) && time.Now().Before(deadline); {
			cand := append(slices.Clone(ops[:start]), ops[min(start+chunk, len(ops)):]...)
			if at, m := replayRules(t, eng, cand); at >= 0 {
				ops, msg, removed = cand[:at+1], m, true
			} else {
				start += chunk
			}
		}
		if !removed || chunk > 1 {
			chunk /= 2
		}
	}
	// Then the descriptors of each request, one at a time.
	for i := 0; i < len(ops) && time.Now().Before(deadline); i++ {
		for j := 0; j < len(ops[i].descriptors) && len(ops[i].descriptors) > 1; {
			cand := slices.Clone(ops)
			cand[i].descriptors = slices.Delete(slices.Clone(ops[i].descriptors), j, j+1)
			cand[i].hits = slices.Delete(slices.Clone(ops[i].hits), j, j+1)
			if at, m := replayRules(t, eng, cand); at >= 0 {
				ops, msg = cand[:at+1], m
			} else {
				j++
			}
		}
	}
	return ops, msg
}

// replayRules runs ops on a fresh env and model.
func replayRules(t *testing.T, eng engine, ops []ruleOp) (int, string) {
	i := 0
	_, at, msg, _ := runRules(t, eng, len(ops), func(*ruleModel) ruleOp { i++; return ops[i-1] })
	return at, msg
}

// TestRulesModel is the model-based test of rule matching through the gRPC
// front and forward auth: random rules (exact values, wildcards, free and
// shared entries) are created and deleted, and random descriptors sent to
// ShouldRateLimit; every answer's limit and remaining is compared with a
// model written from docs/envoy.md, which brute-forces the matching rules
// and picks the most specific. Each rule has a twin in a twin domain on a
// limit of its own, and each request whose descriptors cost 1 a twin sent
// to the forward-auth route as d parameters: its RateLimit headers must be
// ShouldRateLimit's, and agree with the model. On a mismatch it prints the seed and a shortened sequence.
// RATELIMIT_MODEL_SEED replays one seed.
func TestRulesModel(t *testing.T) {
	seeds := []uint64{rand.Uint64(), rand.Uint64(), rand.Uint64()}
	if v := os.Getenv("RATELIMIT_MODEL_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("RATELIMIT_MODEL_SEED: %v", err)
		}
		seeds = []uint64{s}
	}
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			for _, seed := range seeds {
				g := &ruleGenerator{r: rand.New(rand.NewPCG(seed, seed))}
				ops, at, msg, m := runRules(t, eng, modelSteps, g.next)
				if at < 0 {
					t.Logf("seed %d: %d operations as the model says; %d descriptors matched a rule, %d of them several, %d rules live at the end; "+
						"%d imports, %d of them refused; %d requests also through forward auth, %d of them compared header for header",
						seed, len(ops), m.matched, m.contested, len(m.rules), m.imports, m.refused, m.twins, m.compared)
					continue
				}
				t.Logf("seed %d: operation %d: %s; shrinking", seed, at, msg)
				short, msg := shrinkRules(t, eng, ops[:at+1], msg)
				var lines []string
				for i, o := range short {
					lines = append(lines, fmt.Sprintf("%3d %s", i, o))
				}
				t.Fatalf("seed %d (RATELIMIT_MODEL_SEED=%d): the last operation of this shortened sequence:\n%s\n%s",
					seed, seed, strings.Join(lines, "\n"), msg)
			}
		})
	}
}
