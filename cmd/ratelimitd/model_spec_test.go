package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// This file is the reference model of TestModel: what the REST contract
// says the service answers, written from the contract, not from the
// service's code. The model keeps its own limits, overrides,
// tokens and bucket TATs, and its own GCRA in integer microseconds.

// modelParams are a limit's or an override's GCRA parameters.
type modelParams struct {
	Burst, Count int64
	Period       time.Duration
}

// interval is T = period/count in µs. The generator only picks periods
// that count divides into whole milliseconds, so no rounding is involved
// and every duration of a decision is a whole number of milliseconds.
func (p modelParams) interval() int64 { return p.Period.Microseconds() / p.Count }

func (p modelParams) String() string {
	return fmt.Sprintf("%d/%d per %s", p.Burst, p.Count, p.Period)
}

// catalogueEntry is a name of Let's Encrypt's catalogue: its enum and id
// format are fixed.
type catalogueEntry struct {
	enum   int
	format string
}

// modelCatalogue holds the catalogue names the test uses.
var modelCatalogue = map[string]catalogueEntry{
	"NewRegistrationsPerIPAddress": {1, "ip_address"},
	"NewOrdersPerAccount":          {3, "reg_id"},
	"CertificatesPerDomain":        {5, "domain_or_cidr"},
}

// maxEnum is the largest enum the contract allows.
const maxEnum = 2147483647

// canonicalIDs gives, for each bucket id the test sends outside the
// string format, its canonical form under each id format that accepts it;
// a format not listed refuses the id with 422. The string format takes
// any id of 1 to 256 bytes of UTF-8 without control characters, as given.
var canonicalIDs = map[string]map[string]string{
	"example.com":            dns("example.com", "example.com"),
	"Example.COM":            dns("example.com", "example.com"),
	"example.com.":           dns("example.com", "example.com"),
	"shop.example.com":       dns("shop.example.com", "example.com"),
	"SHOP.example.com.":      dns("shop.example.com", "example.com"),
	"www.example.co.uk":      dns("www.example.co.uk", "example.co.uk"),
	"WWW.Example.co.uk.":     dns("www.example.co.uk", "example.co.uk"),
	"bücher.example":         dns("xn--bcher-kva.example", "xn--bcher-kva.example"),
	"xn--bcher-kva.example":  dns("xn--bcher-kva.example", "xn--bcher-kva.example"),
	"XN--BCHER-KVA.EXAMPLE.": dns("xn--bcher-kva.example", "xn--bcher-kva.example"),
	// An A-label that does not round-trip, and invalid Punycode.
	"xn--bucher-xyd.example": {},
	"xn--zz.example":         {},
	"192.0.2.1":              ip("192.0.2.1", "192.0.2.1/32"),
	"::ffff:192.0.2.1":       ip("192.0.2.1", "192.0.2.1/32"),
	"2001:db8::1":            ip("2001:db8::1", "2001:db8::/64"),
	"2001:DB8:0:0::1":        ip("2001:db8::1", "2001:db8::/64"),
	"2001:db8::1:2":          ip("2001:db8::1:2", "2001:db8::/64"),
	"42":                     {"reg_id": "42"},
	"0042":                   {"reg_id": "42"},
	"00000042":               {"reg_id": "42"},
	"7":                      {"reg_id": "7"},
	"007":                    {"reg_id": "7"},
	"18446744073709551615":   {"reg_id": "18446744073709551615"},
	"18446744073709551616":   {},
	"0":                      {},
}

// dns is a DNS name's canonical forms: the name itself, and its eTLD+1
// under domain_or_cidr.
func dns(name, registered string) map[string]string {
	return map[string]string{"domain": name, "ident_value": name, "domain_or_cidr": registered}
}

// ip is an address's canonical forms: the address itself, and its /32 or
// /64 under domain_or_cidr.
func ip(addr, prefix string) map[string]string {
	return map[string]string{"ip_address": addr, "ident_value": addr, "domain_or_cidr": prefix}
}

// canonical returns id canonical under format, or the status that refuses
// it: 400 for a body that is not UTF-8, else 422.
func canonical(format, id string) (string, int) {
	if !utf8.ValidString(id) {
		return "", 400
	}
	if format == "string" {
		if id == "" || len(id) > 256 || strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }) {
			return "", 422
		}
		return id, 0
	}
	if c, ok := canonicalIDs[id][format]; ok {
		return c, 0
	}
	return "", 422
}

// modelLimit is a limit as the model knows it. gen tells apart the limits
// that held one name over time: buckets belong to one generation, so a
// limit deleted and created again starts with full buckets.
type modelLimit struct {
	format string
	params modelParams
	enum   int
	gen    int
	// kind is "" for a rate limit; a quota's calendar and zone.
	kind, calendar, zone string
}

// modelOverride is an override as the model knows it. expires is in µs of
// the model's clock, 0 for never.
type modelOverride struct {
	params    modelParams
	unlimited bool
	comment   string
	enabled   bool
	expires   int64
}

// overrideKey names an override: its limit and canonical bucket id.
type overrideKey struct{ limit, bucket string }

// bucketKey names a bucket: its limit's generation and canonical id.
type bucketKey struct {
	gen    int
	bucket string
}

// model is the reference state.
type model struct {
	now       int64 // µs
	limits    map[string]*modelLimit
	overrides map[overrideKey]*modelOverride
	tats      map[bucketKey]int64
	// enums holds every enum ever given, deleted limits' included.
	enums map[int]bool
	// gens counts the limits ever created, for their generations.
	gens   int
	tokens map[string]bool // live (true) or revoked (false)
	// leases are by label; quota holds what quota buckets used;
	// acquires counts the acquires sent, for the labels.
	leases   map[string]*modelLease
	quota    map[bucketKey]quotaUse
	acquires int
}

func newModel(now time.Time) *model {
	return &model{
		now: now.UnixMicro(), limits: map[string]*modelLimit{}, overrides: map[overrideKey]*modelOverride{},
		tats: map[bucketKey]int64{}, enums: map[int]bool{}, tokens: map[string]bool{},
		leases: map[string]*modelLease{}, quota: map[bucketKey]quotaUse{},
	}
}

// answer is what the service said to one operation.
type answer struct {
	status int
	body   []byte
	// listing is GET /v1/limits read after a defaults import.
	listing []byte
	// race holds the answers of the operations of an opRace; many those
	// of an opMany, each its route's status and body.
	race, many []answer
	// order says how a problem's field errors are out of body order.
	order string
	// skipped reports an operation the driver did not send (op.ifExists).
	skipped bool
}

// mismatchf words a difference between the service and the model.
func mismatchf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// expectStatus returns a mismatch unless the answer's status is one of
// want.
func expectStatus(a answer, want ...int) string {
	if slices.Contains(want, a.status) {
		return ""
	}
	return mismatchf("status %d, want %v; body %s", a.status, want, clip(a.body))
}

// expectFields returns a mismatch unless the answer is a 422 whose
// problem names exactly the fields given.
func expectFields(a answer, fields ...string) string {
	if s := expectStatus(a, 422); s != "" {
		return s
	}
	var p struct{ Errors []struct{ Field string } }
	if err := json.Unmarshal(a.body, &p); err != nil {
		return mismatchf("body %s: %v", clip(a.body), err)
	}
	var got []string
	for _, e := range p.Errors {
		got = append(got, e.Field)
	}
	if !slices.Equal(got, fields) {
		return mismatchf("the problem names %v, want %v; body %s", got, fields, clip(a.body))
	}
	return ""
}

func clip(b []byte) string {
	if len(b) > 400 {
		return string(b[:400]) + "..."
	}
	return string(b)
}

// --- limits ---

// putLimit: PUT /v1/limits/{name}.
func (m *model) putLimit(o *op, a answer) string {
	if o.bad {
		// burst 0 is never valid for a limit.
		return expectStatus(a, 422)
	}
	old := m.limits[o.limit]
	cat, catalogued := modelCatalogue[o.limit]
	if old == nil {
		switch {
		case o.enum > 0 && (o.enum < 10 && cat.enum != o.enum || m.enums[o.enum]):
			// A catalogue number for another name, or an enum given before.
			return expectStatus(a, 409, 422)
		case o.enum == 0 && !catalogued && m.enums[maxEnum] && a.status == 422:
			return "" // no number left is allowed to be an answer then
		}
		if s := expectStatus(a, 201); s != "" {
			return s
		}
		var got struct{ Enum int }
		if err := json.Unmarshal(a.body, &got); err != nil {
			return mismatchf("body %s: %v", clip(a.body), err)
		}
		switch {
		case o.enum > 0 && got.Enum != o.enum:
			return mismatchf("enum %d, asked for %d", got.Enum, o.enum)
		case o.enum == 0 && catalogued && got.Enum != cat.enum:
			return mismatchf("catalogue limit got enum %d, want %d", got.Enum, cat.enum)
		case o.enum == 0 && !catalogued && (got.Enum < 100 || got.Enum > maxEnum || m.enums[got.Enum]):
			return mismatchf("enum %d assigned: not from 100 to %d, or given before", got.Enum, maxEnum)
		}
		m.enums[got.Enum] = true
		m.gens++
		m.limits[o.limit] = &modelLimit{format: o.format, params: o.params, enum: got.Enum, gen: m.gens}
		return ""
	}
	if o.enum > 0 && o.enum != old.enum {
		return expectStatus(a, 409)
	}
	if o.format != old.format && m.hasOverrides(o.limit) {
		return expectStatus(a, 409)
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	old.format, old.params = o.format, o.params
	return ""
}

func (m *model) hasOverrides(limit string) bool {
	for k := range m.overrides {
		if k.limit == limit {
			return true
		}
	}
	return false
}

// deleteLimit: DELETE /v1/limits/{name}.
func (m *model) deleteLimit(o *op, a answer) string {
	switch {
	case m.limits[o.limit] == nil:
		return expectStatus(a, 404)
	case m.hasOverrides(o.limit):
		return expectStatus(a, 409)
	}
	if s := expectStatus(a, 204); s != "" {
		return s
	}
	delete(m.limits, o.limit)
	return ""
}

// --- overrides ---

// createOverride: POST /v1/overrides.
func (m *model) createOverride(o *op, a answer) string {
	l := m.limits[o.limit]
	switch {
	case !utf8.ValidString(o.id):
		return expectStatus(a, 400) // the body is not JSON, whatever it names
	case strings.ContainsRune(o.comment, 0):
		return expectStatus(a, 422) // a comment holds no control characters
	case l == nil:
		return expectStatus(a, 404, 422)
	}
	id, bad := canonical(l.format, o.id)
	if bad != 0 {
		return expectStatus(a, bad)
	}
	k := overrideKey{o.limit, id}
	if m.overrides[k] != nil {
		return expectStatus(a, 409)
	}
	if s := expectStatus(a, 201); s != "" {
		return s
	}
	var got struct {
		BucketID string `json:"bucket_id"`
	}
	if err := json.Unmarshal(a.body, &got); err != nil || got.BucketID != id {
		return mismatchf("override stored with bucket_id %q, want %q (%v)", got.BucketID, id, err)
	}
	mo := &modelOverride{params: o.params, unlimited: o.unlimited, comment: o.comment, enabled: !o.disable}
	if mo.unlimited {
		mo.params = modelParams{}
	}
	if o.expiresIn > 0 {
		mo.expires = m.now + o.expiresIn.Microseconds()
	}
	m.overrides[k] = mo
	return ""
}

// findOverride returns the override an operation names by limit and
// notation, or nil.
func (m *model) findOverride(o *op) *modelOverride {
	l := m.limits[o.limit]
	if l == nil {
		return nil
	}
	id, bad := canonical(l.format, o.id)
	if bad != 0 {
		return nil
	}
	return m.overrides[overrideKey{o.limit, id}]
}

// patchOverride: PATCH /v1/overrides/{id}.
func (m *model) patchOverride(o *op, a answer) string {
	mo := m.findOverride(o)
	if mo == nil {
		return expectStatus(a, 404)
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	switch o.patch {
	case "params":
		mo.params, mo.unlimited = o.params, false
	case "unlimited":
		mo.params, mo.unlimited = modelParams{}, true
	case "disable":
		mo.enabled = false
	case "enable":
		mo.enabled = true
	case "expire":
		mo.expires = m.now + o.expiresIn.Microseconds()
	case "noexpiry":
		mo.expires = 0
	}
	return ""
}

// deleteOverride: DELETE /v1/overrides/{id}.
func (m *model) deleteOverride(o *op, a answer) string {
	mo := m.findOverride(o)
	if mo == nil {
		return expectStatus(a, 404)
	}
	if s := expectStatus(a, 204); s != "" {
		return s
	}
	for k, v := range m.overrides {
		if v == mo {
			delete(m.overrides, k)
		}
	}
	return ""
}

// --- imports ---

// importCounts is the answer of an import.
type importCounts struct {
	Created, Updated, Unchanged int
}

// importDefaults: POST /v1/import?kind=defaults. Every entry is checked
// first; one bad entry and nothing is written.
func (m *model) importDefaults(o *op, a answer) string {
	var want importCounts
	type write struct {
		name string
		l    modelLimit
	}
	var writes []write
	for _, e := range o.entries {
		cat, catalogued := modelCatalogue[e.limit]
		format := e.format
		if catalogued {
			format = cat.format
		}
		old := m.limits[e.limit]
		switch {
		case e.params.Burst < 1 || format == "":
			return expectStatus(a, 422)
		case old != nil && e.format != "" && e.format != old.format && m.hasOverrides(e.limit):
			return expectStatus(a, 409, 422)
		case old == nil:
			want.Created++
			writes = append(writes, write{e.limit, modelLimit{format: format, params: e.params, enum: cat.enum}})
		case old.params == e.params && (e.format == "" || e.format == old.format):
			want.Unchanged++
		default:
			want.Updated++
			if e.format != "" {
				format = e.format
			} else {
				format = old.format
			}
			writes = append(writes, write{e.limit, modelLimit{format: format, params: e.params, enum: old.enum, gen: old.gen}})
		}
	}
	if s := m.expectCounts(a, want); s != "" || o.dryRun {
		return s
	}
	enums, err := listedEnums(a.listing)
	if err != nil {
		return err.Error()
	}
	for _, w := range writes {
		l := w.l
		if l.gen == 0 {
			// A new limit: its enum is the catalogue's or a fresh one,
			// as PUT gives it; the listing read after the import shows it.
			got, ok := enums[w.name]
			switch {
			case !ok:
				return mismatchf("imported limit %s is not listed", w.name)
			case l.enum > 0 && got != l.enum:
				return mismatchf("imported catalogue limit %s got enum %d, want %d", w.name, got, l.enum)
			case l.enum == 0 && (got < 100 || got > maxEnum || m.enums[got]):
				return mismatchf("imported limit %s got enum %d: not from 100 to %d, or given before", w.name, got, maxEnum)
			}
			l.enum = got
			m.enums[got] = true
			m.gens++
			l.gen = m.gens
		}
		m.limits[w.name] = &l
	}
	return ""
}

// listedEnums reads the enums of GET /v1/limits.
func listedEnums(body []byte) (map[string]int, error) {
	var got struct {
		Limits []struct {
			Name string
			Enum int
		}
	}
	if err := json.Unmarshal(body, &got); err != nil {
		return nil, fmt.Errorf("GET /v1/limits after the import: %s: %v", clip(body), err)
	}
	enums := make(map[string]int, len(got.Limits))
	for _, l := range got.Limits {
		enums[l.Name] = l.Enum
	}
	return enums, nil
}

// importOverrides: POST /v1/import?kind=overrides.
func (m *model) importOverrides(o *op, a answer) string {
	var want importCounts
	seen := map[overrideKey]bool{}
	writes := map[overrideKey]modelOverride{}
	for _, e := range o.entries {
		l := m.limits[e.limit]
		if l == nil || (!e.unlimited && e.params.Burst < 0) {
			return expectStatus(a, 422)
		}
		for _, raw := range e.ids {
			id, bad := canonical(l.format, raw)
			if bad != 0 {
				return expectStatus(a, 422)
			}
			k := overrideKey{e.limit, id}
			if seen[k] {
				return expectStatus(a, 409, 422)
			}
			seen[k] = true
			n := modelOverride{params: e.params, unlimited: e.unlimited, enabled: true}
			if n.unlimited {
				n.params = modelParams{}
			}
			old := m.overrides[k]
			switch {
			case old == nil:
				want.Created++
			case old.params == n.params && old.unlimited == n.unlimited && old.comment == "":
				want.Unchanged++
				continue
			default:
				// An import keeps an override's enabled flag and expiry;
				// its comment is the file's, which has none.
				want.Updated++
				n.enabled, n.expires = old.enabled, old.expires
			}
			writes[k] = n
		}
	}
	if s := m.expectCounts(a, want); s != "" || o.dryRun {
		return s
	}
	for k, n := range writes {
		m.overrides[k] = &n
	}
	return ""
}

func (m *model) expectCounts(a answer, want importCounts) string {
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	var got importCounts
	if err := json.Unmarshal(a.body, &got); err != nil || got != want {
		return mismatchf("import counts %+v, want %+v (%v)", got, want, err)
	}
	return ""
}

// --- tokens ---

func (m *model) createToken(o *op, a answer) string {
	if s := expectStatus(a, 201); s != "" {
		return s
	}
	m.tokens[o.token] = true
	return ""
}

func (m *model) revokeToken(o *op, a answer) string {
	live, known := m.tokens[o.token]
	switch {
	case !known:
		return expectStatus(a, 404)
	case !live:
		return expectStatus(a, 204, 404)
	}
	if s := expectStatus(a, 204); s != "" {
		return s
	}
	m.tokens[o.token] = false
	return ""
}

// --- decisions ---

// outcome is the model's decision on one bucket. The flags say which
// fields the contract fixes for it.
type outcome struct {
	allowed    bool
	reason     string // "" when allowed
	remaining  int64
	retryMS    int64
	source     string
	held       int64
	resetMS    int64
	checkAllow bool // false where the contract leaves allowed open
	checkRest  bool // remaining is known
	checkRetry bool // retry_after_ms is known
	checkHeld  bool // held is known
	checkReset bool // reset_after_ms is known
}

// gcra is the contract's step for a spend or check of cost at now on a
// bucket whose TAT is tat (0 when it has none): the TAT to keep and the
// outcome.
func gcra(tat, now int64, p modelParams, cost int64) (int64, outcome) {
	if p.Burst == 0 {
		// An override of burst 0 blocks the bucket: every cost above 0
		// is denied, for ever.
		if cost == 0 {
			return tat, outcome{allowed: true, checkAllow: true, checkRest: true}
		}
		return tat, outcome{reason: "blocked", checkAllow: true, checkRest: true}
	}
	t := max(tat, now)
	limit := p.Burst * p.interval()
	held := floorTokens(limit-(t-now), p.interval())
	next := t + cost*p.interval()
	switch {
	case cost > p.Burst:
		return tat, outcome{reason: "cost_exceeds_burst", remaining: held, retryMS: -1, checkAllow: true, checkRest: true, checkRetry: true}
	case next-now > limit:
		return tat, outcome{reason: "limited", remaining: held, retryMS: (next - now - limit) / 1000, checkAllow: true, checkRest: true, checkRetry: true}
	}
	return next, outcome{allowed: true, remaining: floorTokens(limit-(next-now), p.interval()), checkAllow: true, checkRest: true, checkRetry: true}
}

// refund is the contract's refund of cost: tokens back, never past full;
// allowed when anything came back.
func refund(tat, now int64, p modelParams, cost int64) (int64, outcome) {
	t := max(tat, now)
	if p.Burst == 0 {
		return tat, outcome{checkAllow: true, checkRest: true} // a blocked bucket is left alone
	}
	if cost == 0 || t == now {
		return tat, outcome{remaining: floorTokens(p.Burst*p.interval()-(t-now), p.interval()), checkAllow: true, checkRest: true}
	}
	next := max(t-cost*p.interval(), now)
	return next, outcome{allowed: true, remaining: floorTokens(p.Burst*p.interval()-(next-now), p.interval()), checkAllow: true, checkRest: true}
}

// floorTokens is the whole tokens in room, never negative: a bucket in
// debt holds none.
func floorTokens(room, interval int64) int64 {
	if room <= 0 {
		return 0
	}
	return room / interval
}

// resolved is one bucket of a decision, resolved against the model.
type resolved struct {
	key    bucketKey
	params modelParams
	source string
	limit  *modelLimit
}

// resolve finds a bucket's parameters: its override when enabled and not
// expired, else its limit's defaults. It returns the status that refuses
// the request instead when the limit or the id is bad.
func (m *model) resolve(b bucketOp) (resolved, string, int) {
	l := m.limits[b.limit]
	if l == nil {
		if !utf8.ValidString(b.id) {
			return resolved{}, "", 400
		}
		return resolved{}, "", 422
	}
	id, bad := canonical(l.format, b.id)
	if bad != 0 {
		return resolved{}, "", bad
	}
	r := resolved{key: bucketKey{l.gen, id}, params: l.params, source: "default", limit: l}
	if o := m.overrides[overrideKey{b.limit, id}]; o != nil && o.enabled && (o.expires == 0 || m.now < o.expires) {
		r.params, r.source = o.params, "override"
		if o.unlimited {
			r.source = "unlimited"
		}
	}
	return r, b.limit + "\x00" + id, 0
}

// decide: POST /v1/check, /v1/spend or /v1/refund.
func (m *model) decide(o *op, a answer) string {
	if o.token != "" && !m.tokens[o.token] {
		return expectStatus(a, 401)
	}
	rs := make([]resolved, len(o.buckets))
	status := 0
	seen := map[string]bool{}
	for i, b := range o.buckets {
		r, name, bad := m.resolve(b)
		switch {
		case bad == 400 || status == 400:
			status = 400
		case bad != 0 || b.cost < 0 || seen[name]:
			status = 422
		case r.limit.kind == kindConcurrency && o.kind != opCheck:
			status = 422 // leases are acquired, released and renewed
		}
		seen[name] = true
		rs[i] = r
	}
	if status != 0 {
		return expectStatus(a, status)
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	outs := make([]outcome, len(rs))
	tats := make([]int64, len(rs))
	uses := make([]quotaUse, len(rs))
	allowed := true
	for i, r := range rs {
		cost := o.buckets[i].cost
		if r.source == "unlimited" {
			outs[i] = outcome{allowed: true, checkAllow: o.kind != opRefund}
		} else if r.limit.kind == kindConcurrency {
			outs[i] = m.leaseOutcome(r.key, r.params, cost)
		} else if r.limit.kind == kindQuota {
			uses[i], outs[i] = m.quotaOutcome(r, cost, o.kind == opRefund)
		} else if o.kind == opRefund {
			tats[i], outs[i] = refund(m.tats[r.key], m.now, r.params, cost)
		} else {
			tats[i], outs[i] = gcra(m.tats[r.key], m.now, r.params, cost)
		}
		outs[i].source = r.source
		allowed = allowed && outs[i].allowed
	}
	switch {
	case o.kind == opRefund, allowed && o.kind == opSpend:
		for i, r := range rs {
			switch {
			case r.source == "unlimited":
			case r.limit.kind == kindQuota:
				m.quota[r.key] = uses[i]
			default:
				m.tats[r.key] = tats[i]
			}
		}
	case !allowed:
		// A denied batch spends nothing: the buckets that would have
		// allowed it report what they hold.
		for i, r := range rs {
			switch {
			case !outs[i].allowed || r.source == "unlimited" || r.limit.kind == kindConcurrency:
			case r.limit.kind == kindQuota:
				_, held := m.quotaOutcome(r, 0, false)
				outs[i].remaining = held.remaining
			default:
				_, held := gcra(m.tats[r.key], m.now, r.params, 0)
				outs[i].remaining = held.remaining
			}
		}
	}
	return compareDecisions(a.body, o.kind != opRefund, allowed, outs)
}

// decisionBody is the part of a decision answer the model fixes.
type decisionBody struct {
	Allowed   bool
	Decisions []struct {
		Allowed      bool
		Reason       *string
		Remaining    int64
		RetryAfterMS int64 `json:"retry_after_ms"`
		ResetAfterMS int64 `json:"reset_after_ms"`
		Held         int64
		Source       string
	}
}

func compareDecisions(body []byte, checkTop, allowed bool, want []outcome) string {
	var got decisionBody
	if err := json.Unmarshal(body, &got); err != nil {
		return mismatchf("decision body %s: %v", clip(body), err)
	}
	if checkTop && got.Allowed != allowed {
		return mismatchf("allowed %v, want %v; body %s", got.Allowed, allowed, clip(body))
	}
	if len(got.Decisions) != len(want) {
		return mismatchf("%d decisions, want %d; body %s", len(got.Decisions), len(want), clip(body))
	}
	for i, w := range want {
		g := got.Decisions[i]
		reason := ""
		if g.Reason != nil {
			reason = *g.Reason
		}
		var diffs []string
		if g.Source != w.source {
			diffs = append(diffs, fmt.Sprintf("source %s, want %s", g.Source, w.source))
		}
		if w.checkAllow && g.Allowed != w.allowed {
			diffs = append(diffs, fmt.Sprintf("allowed %v, want %v", g.Allowed, w.allowed))
		}
		if w.checkAllow && checkTop && reason != w.reason {
			diffs = append(diffs, fmt.Sprintf("reason %q, want %q", reason, w.reason))
		}
		if w.checkRest && g.Remaining != w.remaining {
			diffs = append(diffs, fmt.Sprintf("remaining %d, want %d", g.Remaining, w.remaining))
		}
		if w.checkRetry && g.RetryAfterMS != w.retryMS {
			diffs = append(diffs, fmt.Sprintf("retry_after_ms %d, want %d", g.RetryAfterMS, w.retryMS))
		}
		if w.checkReset && g.ResetAfterMS != w.resetMS {
			diffs = append(diffs, fmt.Sprintf("reset_after_ms %d, want %d", g.ResetAfterMS, w.resetMS))
		}
		if w.checkHeld && g.Held != w.held {
			diffs = append(diffs, fmt.Sprintf("held %d, want %d", g.Held, w.held))
		}
		if len(diffs) > 0 {
			return mismatchf("bucket %d: %s; body %s", i, strings.Join(diffs, ", "), clip(body))
		}
	}
	return ""
}

// reset: POST /v1/buckets/reset.
func (m *model) reset(o *op, a answer) string {
	r, _, bad := m.resolve(o.buckets[0])
	if bad != 0 {
		return expectStatus(a, bad)
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	delete(m.tats, r.key)
	delete(m.quota, r.key)
	m.resetLeases(r.key)
	return ""
}

// apply checks the answer to o against the model, then brings the model
// to the state after o. It returns a description of the first mismatch,
// or "".
func (m *model) apply(o *op, a answer) string {
	switch o.kind {
	case opPutLimit:
		if o.limitKind != "" {
			return m.putKindLimit(o, a)
		}
		return m.putLimit(o, a)
	case opDeleteLimit:
		return m.deleteLimit(o, a)
	case opCreateOverride:
		return m.createOverride(o, a)
	case opPatchOverride:
		return m.patchOverride(o, a)
	case opDeleteOverride:
		return m.deleteOverride(o, a)
	case opImportDefaults:
		return m.importDefaults(o, a)
	case opImportOverrides:
		return m.importOverrides(o, a)
	case opCreateToken:
		return m.createToken(o, a)
	case opRevokeToken:
		return m.revokeToken(o, a)
	case opCheck, opSpend, opRefund:
		return m.decide(o, a)
	case opReset:
		return m.reset(o, a)
	case opClock:
		m.now += o.step.Microseconds()
		return ""
	case opRace:
		return m.race(o, a)
	case opAcquire:
		return m.acquire(o, a)
	case opRelease:
		return m.release(o, a)
	case opRenew:
		return m.renew(o, a)
	case opMany:
		return m.many(o, a)
	}
	return mismatchf("unknown operation %v", o.kind)
}

// race: two operations sent at once must be answered as if one had come
// after the other, in either order.
func (m *model) race(o *op, a answer) string {
	var msgs []string
	for _, order := range [][]int{{0, 1}, {1, 0}} {
		c := m.clone()
		msg := ""
		for _, i := range order {
			if msg = c.apply(&o.race[i], a.race[i]); msg != "" {
				break
			}
		}
		if msg == "" {
			*m = *c
			return ""
		}
		msgs = append(msgs, fmt.Sprintf("in the order %v: %s", order, msg))
	}
	return strings.Join(msgs, "; ")
}

// clone copies the model.
func (m *model) clone() *model {
	c := *m
	c.limits = make(map[string]*modelLimit, len(m.limits))
	for k, v := range m.limits {
		l := *v
		c.limits[k] = &l
	}
	c.overrides = make(map[overrideKey]*modelOverride, len(m.overrides))
	for k, v := range m.overrides {
		o := *v
		c.overrides[k] = &o
	}
	c.tats, c.enums, c.tokens = maps.Clone(m.tats), maps.Clone(m.enums), maps.Clone(m.tokens)
	m.cloneKinds(&c)
	return &c
}
